"""The message writer: renders a planned action as the XML of a master or update message,
applying the same change to the simulator's model of each master (`model.py`), so every
selector names a node that exists in the master at that point."""

from __future__ import annotations

import math
import random
from typing import NamedTuple

from sis_platform.simulator.generator.events import (
    GREYHOUND_MARKET_ORDER,
    HORSE_MARKET_ORDER,
    MARKET_IDS,
    Action,
    ActionKind,
    Day,
    Race,
    greyhound_name,
    market_for,
    person,
)
from sis_platform.simulator.generator.message import (
    KIND_MASTER_NEW,
    KIND_MASTER_REFRESH,
    KIND_UPDATE,
)
from sis_platform.simulator.model import (
    LADDER,
    LADDER_INDEX,
    PLACE_RUNG,
    Price,
    Selection,
    add_attribute_op,
    add_element_op,
    event_selector,
    market_selector,
    master_body,
    remove_op,
    replace_op,
    selection_selector,
    update_body,
)


class Written(NamedTuple):
    """One base message's body and its kind label (KIND_MASTER_NEW, ...)."""

    body: str
    kind: str


class MessageWriter:
    """Writes the base messages of a day. Its draws (which prices move, which runner is
    withdrawn, the finishing order, ...) come from `rng`, in the order messages are written."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def write(self, day: Day, action: Action, at: str) -> Written:
        """The message for `action`, sent at `at`; updates the day's model and race state."""
        kind, payload = action.kind, action.races
        races = [day.races[i] for i in payload]
        ids = " ".join(r.event.id for r in races)

        if kind == ActionKind.NEW or kind == ActionKind.REFRESH:
            for index, race in zip(payload, races, strict=True):
                if not race.created:
                    race.created = True
                    day.created.append(index)
                race.stale = False
                race.refresh_countdown = 0
            if kind == ActionKind.REFRESH and len(races) == 1:
                races[0].remaining -= 1
            events = "".join(r.event.xml() for r in races)
            label = "new" if kind == ActionKind.NEW else "refresh"
            return Written(
                master_body(label, ids, at, events),
                KIND_MASTER_NEW if kind == ActionKind.NEW else KIND_MASTER_REFRESH,
            )

        if kind == ActionKind.GOING:
            ops = self._going(races)
            return Written(update_body(ids, at, ops), KIND_UPDATE)

        race = races[0]
        race.remaining -= 1
        ops = self._race_update(kind, race, at)
        if race.refresh_countdown > 0:
            race.refresh_countdown -= 1
            if race.refresh_countdown == 0:
                # The provider answers the consumer's stale master with the full document.
                race.stale = False
                return Written(
                    master_body("refresh", ids, at, race.event.xml()), KIND_MASTER_REFRESH
                )
        return Written(update_body(ids, at, ops), KIND_UPDATE)

    def _race_update(self, kind: ActionKind, race: Race, at: str) -> list[str]:
        if kind == ActionKind.PRICE:
            return self._price_move(race, at)
        if kind == ActionKind.ACTIVE:
            return self._set_status(race, "active", "open")
        if kind == ActionKind.OFF:
            return self._set_status(race, "off", "suspended")
        if kind == ActionKind.FINISHED:
            race.event.status = "finished"
            return [replace_op(event_selector() + "/@status", "finished")]
        if kind == ActionKind.RESULT:
            return self._result(race)
        if kind == ActionKind.NONRUNNER:
            return self._nonrunner(race, at)
        if kind == ActionKind.RESERVE:
            return self._reserve(race, at)
        if kind == ActionKind.SUSPEND or kind == ActionKind.OPEN:
            win = race.event.markets["WIN"]
            win.status = "suspended" if kind == ActionKind.SUSPEND else "open"
            return [replace_op(market_selector("WIN") + "/@status", win.status)]
        if kind == ActionKind.ADD_MARKET:
            return self._add_market(race, at)
        raise AssertionError(f"unknown action kind {kind}")

    def _set_status(self, race: Race, event_status: str, market_status: str) -> list[str]:
        race.event.status = event_status
        ops = [replace_op(event_selector() + "/@status", event_status)]
        for market in race.event.markets.values():
            if market.status != market_status:
                market.status = market_status
                ops.append(replace_op(market_selector(market.id) + "/@status", market_status))
        return ops

    def _price_ops(self, market_id: str, selection: Selection, rung: int, at: str) -> list[str]:
        price = selection.price
        assert price is not None
        num, den = LADDER[rung]
        base = selection_selector(market_id, selection.id) + "/price"
        ops = []
        if num != price.num:
            ops.append(replace_op(base + "/@num", str(num)))
        if den != price.den:
            ops.append(replace_op(base + "/@den", str(den)))
        if price.at is None:
            ops.append(add_attribute_op(base, "at", at))
        else:
            ops.append(replace_op(base + "/@at", at))
        price.num, price.den, price.at = num, den, at
        return ops

    def _price_move(self, race: Race, at: str) -> list[str]:
        markets = race.event.markets
        win = markets["WIN"]
        movers = [s for s in win.selections.values() if s.status == "runner" and s.price]
        if not movers:  # nothing left to price: a harmless no-op keeps the message count
            return [replace_op(event_selector() + "/@status", race.event.status)]
        rng = self._rng
        k = min(len(movers), rng.choices((1, 2, 3), weights=(60, 30, 10))[0])
        ops: list[str] = []
        for selection in rng.sample(movers, k):
            assert selection.price is not None
            rung = LADDER_INDEX[(selection.price.num, selection.price.den)]
            rung = max(0, min(len(LADDER) - 1, rung + rng.choice((-2, -1, -1, 1, 1, 2))))
            ops += self._price_ops("WIN", selection, rung, at)
            for market in markets.values():
                other = market.selections.get(selection.id)
                if market.id == "WIN" or other is None or other.price is None:
                    continue
                market_rung = PLACE_RUNG[rung] if market.type == "place" else rung
                ops += self._price_ops(market.id, other, market_rung, at)
        return ops

    def _nonrunner(self, race: Race, at: str) -> list[str]:
        win = race.event.markets["WIN"]
        runners = [s for s in win.selections.values() if s.status == "runner"]
        if len(runners) <= 2:
            return self._price_move(race, at)
        rng = self._rng
        chosen = rng.choice(runners).id
        status = "non-runner" if race.horse else "withdrawn"
        # Both ways the provider writes it: replace the attribute, or remove and add it back
        # in one atomic update (the intermediate document lacks a required attribute; only
        # the result is validated).
        as_add = rng.random() < 0.5
        ops: list[str] = []
        for market in race.event.markets.values():
            selection = market.selections.get(chosen)
            if selection is None or selection.status != "runner":
                continue
            sel = selection_selector(market.id, chosen)
            if as_add:
                ops.append(remove_op(sel + "/@status"))
                ops.append(add_attribute_op(sel, "status", status))
            else:
                ops.append(replace_op(sel + "/@status", status))
            selection.status = status
            if selection.price is not None:
                ops.append(remove_op(sel + "/price"))
                selection.price = None
        return ops

    def _reserve(self, race: Race, at: str) -> list[str]:
        """A greyhound reserve runs from the trap of a withdrawn dog: a new selection added
        right after the withdrawn one in every market that has it."""
        win = race.event.markets["WIN"]
        vacant = [
            s
            for s in win.selections.values()
            if s.status == "withdrawn"
            and not s.id.startswith("R")
            and f"R{s.id}" not in win.selections
        ]
        if not vacant:
            return self._price_move(race, at)
        rng = self._rng
        withdrawn = vacant[0]
        names = {s.name for s in win.selections.values()}
        name = greyhound_name(rng)
        while name in names:
            name = greyhound_name(rng)
        prices = [s.price for s in win.selections.values() if s.price is not None]
        longest = max((LADDER_INDEX[(p.num, p.den)] for p in prices), default=30)
        rung = max(0, min(len(LADDER) - 1, longest - rng.randint(0, 6)))
        num, den = LADDER[rung]
        reserve = Selection(
            f"R{withdrawn.id}",
            name,
            "runner",
            withdrawn.number,
            None,
            person(rng),
            Price(num, den, at),
        )
        ops: list[str] = []
        for market in race.event.markets.values():
            if withdrawn.id not in market.selections:
                continue
            copy = reserve.copy()
            if market.type == "forecast":
                copy.price = None
            elif market.type == "place":
                p_num, p_den = LADDER[PLACE_RUNG[rung]]
                copy.price = Price(p_num, p_den, at)
            market.insert_after(withdrawn.id, copy)
            ops.append(
                add_element_op(selection_selector(market.id, withdrawn.id), copy.xml(), "after")
            )
        return ops

    def _add_market(self, race: Race, at: str) -> list[str]:
        markets = race.event.markets
        order = HORSE_MARKET_ORDER if race.horse else GREYHOUND_MARKET_ORDER
        missing = [m for m in order if MARKET_IDS[m] not in markets]
        win = markets["WIN"]
        if not missing:
            return self._price_move(race, at)
        market_type = missing[0]
        runners: list[Selection] = []
        rungs: list[int] = []
        for selection in win.selections.values():
            copy = selection.copy()
            if copy.price is not None:
                copy.price.at = at
                rungs.append(LADDER_INDEX[(copy.price.num, copy.price.den)])
            else:
                rungs.append(0)
            runners.append(copy)
        market = market_for(market_type, win.status, race.places, runners, rungs)
        markets[market.id] = market
        return [add_element_op(event_selector(), market.xml())]

    def _result(self, race: Race) -> list[str]:
        """Settle every market: finishing order drawn with the favourites likelier to win."""
        rng = self._rng
        win = race.event.markets["WIN"]
        keys: dict[str, float] = {}
        for selection in win.selections.values():
            if selection.status != "runner":
                continue
            price = selection.price
            chance = 1.0 if price is None else price.den / (price.num + price.den)
            keys[selection.id] = -math.log(1.0 - rng.random()) / chance
        finish = {sid: pos for pos, sid in enumerate(sorted(keys, key=keys.__getitem__))}
        ops: list[str] = []
        for market in race.event.markets.values():
            placed = {"win": 1, "forecast": 2}.get(market.type, market.places or 1)
            for selection in market.selections.values():
                pos = finish.get(selection.id)
                if pos is None or selection.status != "runner":
                    continue
                status = "winner" if pos == 0 else "placed" if pos < placed else "loser"
                selection.status = status
                ops.append(
                    replace_op(selection_selector(market.id, selection.id) + "/@status", status)
                )
            market.status = "closed"
            ops.append(replace_op(market_selector(market.id) + "/@status", "closed"))
        return ops

    def _going(self, races: list[Race]) -> list[str]:
        meeting = races[0].meeting
        scale = meeting.going_scale
        rng = self._rng
        # Rain is the commoner change: softer more often than firmer.
        step = rng.choice((-1, -1, 1))
        index = meeting.going_index + step
        if not 0 <= index < len(scale):
            index = meeting.going_index - step
        meeting.going_index = index
        going = scale[index]
        for race in races:
            race.event.going = going
        return [replace_op(event_selector() + "/@going", going)]

    # -- invalid messages and duplicates ------------------------------------------------------
