"""A deterministic simulation of the SIS Sportsdata feed for UK and Irish racing days.

`generate_feed(seed, messages)` yields exactly `messages` messages, lazily, in time order. The
same arguments give byte-identical output (message ids included: they come from a seeded RNG),
so a feed can be regenerated instead of stored.

How a feed is built:
- The regular ("base") messages come from racing days. A day is planned up front (meetings,
  races, and the time and kind of every message for every race), sorted by time, and rendered
  one message at a time against the simulator's own model of each master (`model.py`), so each
  selector names a node that exists in the master at that point. Only one day's plan is held in
  memory; a long feed is a run of consecutive days of about 12,000 messages each.
- Invalid messages and redelivered duplicates are mixed in with selection sampling (Knuth's
  Algorithm S): at each slot, a kind with k messages still owed out of r slots left is drawn with
  probability k/r, which places exactly the requested number of each kind at uniformly random
  positions without holding any list of positions.
- An invalid patch (`unlocated-node`, `invalid-result`) is never applied by the consumer, and it
  makes the master stale (docs/feed.md, "Invalid messages and items"): updates to that
  master are dead-lettered as `master-stale` until the next master message for it. The
  simulator therefore turns one of the race's next few messages into a master `refresh`
  carrying its model, after which the consumer's master and the model agree again.
"""

from __future__ import annotations

import math
import random
import time
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Final

from sis_platform.domain.reasons import Reason
from sis_platform.simulator import corrupt
from sis_platform.simulator.model import (
    LADDER,
    LADDER_INDEX,
    PLACE_RUNG,
    Event,
    Market,
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
from sis_platform.simulator.names import (
    ALL_WEATHER_CODES,
    GOING_ALL_WEATHER,
    GOING_GREYHOUND,
    GOING_TURF,
    GREYHOUND_COURSES,
    GREYHOUND_DISTANCES,
    GREYHOUND_GRADES,
    GREYHOUND_PREFIXES,
    GREYHOUND_SUFFIXES,
    HORSE_COURSES,
    HORSE_NAME_FIRST,
    HORSE_NAME_SECOND,
    HORSE_RACE_SPONSORS,
    HORSE_RACE_TYPES,
    INITIALS,
    SURNAMES,
    Course,
)

KIND_MASTER_NEW: Final = "master-new"
KIND_MASTER_REFRESH: Final = "master-refresh"
KIND_UPDATE: Final = "update"
KIND_DUPLICATE: Final = "duplicate"
INVALID_PREFIX: Final = "invalid:"

# The invalid kinds the generator can make, by reason code. The first five are whole-message
# reasons; the rest are item reasons of a well-formed, schema-valid update.
INVALID_REASONS: Final[tuple[Reason, ...]] = (
    Reason.NOT_WELL_FORMED,
    Reason.SCHEMA_INVALID,
    Reason.INVALID_ENVELOPE,
    Reason.IDS_MISMATCH,
    Reason.TOO_LARGE,
    Reason.UNLOCATED_NODE,
    Reason.INVALID_RESULT,
    Reason.ORPHAN_UPDATE,
)
# Invalid patches: the consumer marks the master stale, so a refresh must follow.
STALE_MAKING_REASONS: Final[frozenset[Reason]] = frozenset(
    {Reason.UNLOCATED_NODE, Reason.INVALID_RESULT}
)

DEFAULT_START: Final = date(2026, 11, 21)
DEFAULT_MAX_BYTES: Final = 4 * 1024 * 1024
MIN_MAX_BYTES: Final = 64 * 1024
# About one realistic UK/IE day (roughly 17 meetings, 170 races); longer feeds run more days.
DAY_MESSAGES: Final = 12_000
# Redeliveries repeat one of the last few messages ("a little later").
DUPLICATE_WINDOW: Final = 32


@dataclass(frozen=True, slots=True)
class SimulatedMessage:
    """One message as the provider puts it on the queue.

    `kind` is "master-new", "master-refresh", "update", "duplicate" (a redelivery: same id and
    body as an earlier message) or "invalid:<reason>" with a reason code from
    `sis_platform.domain.reasons`. `sent` is the put time (UTC).
    """

    message_id: str
    body: bytes
    kind: str
    sent: datetime


def generate_feed(
    seed: int = 1,
    messages: int = 12_000,
    *,
    start: date | None = None,
    invalid: Mapping[str, float] | None = None,
    duplicates: float = 0.0,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> Iterator[SimulatedMessage]:
    """Yield exactly `messages` simulated messages, lazily, in time order.

    `invalid` maps a reason code (see INVALID_REASONS) to the share of all messages that are
    invalid for that reason; `duplicates` is the share that are redeliveries. Counts are
    `round(share * messages)` each, exactly, with one exception: an invalid patch
    (`unlocated-node`, `invalid-result`) needs a master that is not already stale, and in a
    tiny feed with a large share of them the last ones can find none left; such a message is
    labelled "invalid:master-stale", the reason the consumer will give. `max_bytes` is the
    consumer's body limit: regular messages stay under it and `too-large` ones go over it.
    """
    return iter(
        FeedSimulator(
            seed,
            messages,
            start=start,
            invalid=invalid,
            duplicates=duplicates,
            max_bytes=max_bytes,
        )
    )


# --- planning ---------------------------------------------------------------------------------

# Action kinds: what one planned base message does.
NEW, REFRESH, ACTIVE, PRICE, NONRUNNER, RESERVE, SUSPEND, OPEN, ADD_MARKET, OFF, RESULT = range(11)
FINISHED, GOING = 11, 12

# (time in UTC epoch seconds, tie-break sequence, kind, race indexes in the day)
Action = tuple[int, int, int, tuple[int, ...]]

MARKET_IDS: Final[dict[str, str]] = {
    "win": "WIN",
    "place": "PLACE",
    "each-way": "EW",
    "forecast": "FC",
}
HORSE_MARKET_ORDER: Final = ("win", "each-way", "place", "forecast")
GREYHOUND_MARKET_ORDER: Final = ("win", "forecast", "place")


@dataclass(slots=True)
class _Meeting:
    course: Course
    horse: bool
    going_scale: tuple[str, ...]
    going_index: int
    races: list[int] = field(default_factory=list)


@dataclass(slots=True)
class _Race:
    event: Event
    meeting: _Meeting
    horse: bool
    places: int
    new_at: int
    off_at: int  # actual off (the scheduled one is the event's start)
    created: bool = False
    stale: bool = False
    # Convertible (single-id, non-new) messages of this race still to come in the plan.
    remaining: int = 0
    # When > 0: the countdown-th next convertible message becomes a master refresh.
    refresh_countdown: int = 0


@dataclass(slots=True)
class _Day:
    day: date
    races: list[_Race]
    actions: list[Action]
    cursor: int = 0
    created: list[int] = field(default_factory=list)


def _uk_utc_offset_hours(day: date) -> int:
    """Hours UK and Irish local time is ahead of UTC on `day` (BST/IST from the last Sunday
    of March to the last Sunday of October). Written out rather than read from the system's
    tz database so output does not depend on the machine. Racing never runs at 01:00 UTC, when
    the clocks change, so one offset holds for the whole racing day."""

    def last_sunday(month: int) -> date:
        last = date(day.year, month, 31)
        return last - timedelta(days=(last.weekday() + 1) % 7)

    return 1 if last_sunday(3) <= day < last_sunday(10) else 0


def _iso_utc(t: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _horse_name(rng: random.Random) -> str:
    return f"{rng.choice(HORSE_NAME_FIRST)} {rng.choice(HORSE_NAME_SECOND)}"


def _greyhound_name(rng: random.Random) -> str:
    return f"{rng.choice(GREYHOUND_PREFIXES)} {rng.choice(GREYHOUND_SUFFIXES)}"


def _person(rng: random.Random) -> str:
    return f"{rng.choice(INITIALS)} {rng.choice(SURNAMES)}"


def _market_for(
    market_type: str, status: str, places: int, runners: list[Selection], rungs: list[int]
) -> Market:
    """A market over the race's runners. Jockey and trainer are only carried in the win market;
    place odds are a quarter of the win odds; forecast selections have no fixed price."""
    market = Market(
        MARKET_IDS[market_type],
        market_type,
        status,
        places if market_type in ("place", "each-way") else None,
    )
    for runner, rung in zip(runners, rungs, strict=True):
        copy = runner.copy()
        if market_type != "win":
            copy.jockey = None
            copy.trainer = None
        if market_type == "forecast" or copy.price is None:
            copy.price = None
        else:
            num, den = LADDER[PLACE_RUNG[rung] if market_type == "place" else rung]
            copy.price = Price(num, den, copy.price.at)
        market.selections[copy.id] = copy
    return market


def _build_event(
    rng: random.Random,
    meeting: _Meeting,
    event_id: str,
    start: str,
    at: str,
) -> tuple[Event, int]:
    horse = meeting.horse
    if horse:
        n = rng.choice((6, 7, 8, 8, 9, 9, 10, 10, 11, 12, 12, 13, 14, 15, 16))
        name = f"{rng.choice(HORSE_RACE_SPONSORS)} {rng.choice(HORSE_RACE_TYPES)}"
        if rng.random() < 0.4:
            name += f" (Class {rng.randint(1, 6)})"
        places = 2 if n <= 7 else 3 if n <= 15 else 4
        fav = rng.randint(LADDER_INDEX[(5, 4)], LADDER_INDEX[(4, 1)])
        steps = (0, 1, 1, 2, 2, 3)
    else:
        n = 6
        name = (
            f"{rng.choice(HORSE_RACE_SPONSORS)} {rng.choice(GREYHOUND_GRADES)} Stakes "
            f"{rng.choice(GREYHOUND_DISTANCES)}m"
        )
        places = 2
        fav = rng.randint(LADDER_INDEX[(1, 1)], LADDER_INDEX[(5, 2)])
        steps = (0, 1, 2, 2, 3, 4)
    rungs = [fav]
    for _ in range(n - 1):
        rungs.append(min(len(LADDER) - 1, rungs[-1] + rng.choice(steps)))
    rng.shuffle(rungs)

    names: set[str] = set()
    runners: list[Selection] = []
    for number in range(1, n + 1):
        runner_name = _horse_name(rng) if horse else _greyhound_name(rng)
        while runner_name in names:
            runner_name = _horse_name(rng) if horse else _greyhound_name(rng)
        names.add(runner_name)
        num, den = LADDER[rungs[number - 1]]
        runners.append(
            Selection(
                str(number),
                runner_name,
                "runner",
                number,
                _person(rng) if horse else None,
                _person(rng),
                Price(num, den, at),
            )
        )

    if horse:
        types = ["win"]
        if rng.random() < 0.8:
            types.append("each-way")
        if rng.random() < 0.5:
            types.append("place")
        if rng.random() < 0.5:
            types.append("forecast")
    else:
        types = ["win"]
        if rng.random() < 0.85:
            types.append("forecast")
        if rng.random() < 0.3:
            types.append("place")
    course = meeting.course
    event = Event(
        event_id,
        "horse-racing" if horse else "greyhounds",
        course.country,
        course.name,
        name,
        start,
        "dormant",
        meeting.going_scale[meeting.going_index],
    )
    for market_type in types:
        market = _market_for(market_type, "suspended", places, runners, rungs)
        event.markets[market.id] = market
    return event, places


# A realistic full day: (horse?, session) per meeting.
_FULL_DAY: Final[tuple[tuple[bool, str], ...]] = (
    *((True, "afternoon"),) * 4,
    *((True, "evening"),) * 2,
    *((False, "morning"),) * 3,
    *((False, "afternoon"),) * 4,
    *((False, "evening"),) * 4,
)
_LAST_RACE_MINUTE: Final = 22 * 60 + 45


def _first_race_minute(rng: random.Random, horse: bool, session: str) -> int:
    if horse:
        if session == "afternoon":
            return 12 * 60 + 15 + 5 * rng.randint(0, 19)
        return 16 * 60 + 30 + 5 * rng.randint(0, 18)
    if session == "morning":
        return 10 * 60 + 45 + rng.randint(0, 45)
    if session == "afternoon":
        return 13 * 60 + rng.randint(0, 90)
    return 18 * 60 + rng.randint(0, 75)


def _plan_day(seed: int, day_index: int, day: date, budget: int, max_bytes: int) -> _Day:
    """Plan one racing day of exactly `budget` base messages (fewer only if even one race's
    fixed messages do not fit, in which case the day is cut short in time order: a prefix of
    a valid feed is valid)."""
    rng = random.Random(f"sis-feed/{seed}/day/{day_index}")
    offset = _uk_utc_offset_hours(day)
    tz = f"+{offset:02d}:00"
    day_epoch = int(datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp())
    ymd = day.strftime("%Y%m%d")

    # Fewer, shorter races for small budgets; about 70 messages a race on a full day.
    per_race = 20 + 50 * min(1.0, budget / DAY_MESSAGES)
    target_races = max(1, round(budget / per_race))

    specs = list(_FULL_DAY)
    rng.shuffle(specs)
    horse_courses = list(HORSE_COURSES)
    greyhound_courses = list(GREYHOUND_COURSES)
    rng.shuffle(horse_courses)
    rng.shuffle(greyhound_courses)

    races: list[_Race] = []
    meetings: list[_Meeting] = []
    actions: list[Action] = []
    seq = 0

    def add(t: int, kind: int, payload: tuple[int, ...]) -> None:
        nonlocal seq
        actions.append((t, seq, kind, payload))
        seq += 1

    spec_index = 0
    while len(races) < target_races and (horse_courses or greyhound_courses):
        if spec_index < len(specs):
            horse, session = specs[spec_index]
        else:  # a very busy day: more cards, from whichever courses are left
            horse = not greyhound_courses
            session = ("morning", "afternoon", "evening")[spec_index % 3]
            if horse and session == "morning":
                session = "afternoon"
        spec_index += 1
        pool = horse_courses if horse else greyhound_courses
        if not pool:
            continue
        course = pool.pop()
        if horse:
            scale = GOING_ALL_WEATHER if course.code in ALL_WEATHER_CODES else GOING_TURF
            weights = (1, 2, 4, 3, 2, 1)[: len(scale)]
            going_index = rng.choices(range(len(scale)), weights=weights)[0]
            n_races = rng.choice((6, 7, 7, 7, 8))
        else:
            scale = GOING_GREYHOUND
            going_index = 2
            n_races = rng.randint(10, 14)
        n_races = min(n_races, target_races - len(races))
        meeting = _Meeting(course, horse, scale, going_index)

        # Off times (local minutes), and when the card is published: hours before the first
        # race, as one multi-id master `new` for some meetings, race by race otherwise.
        minute = _first_race_minute(rng, horse, session)
        minutes: list[int] = []
        while len(minutes) < n_races and minute <= _LAST_RACE_MINUTE:
            minutes.append(minute)
            minute += rng.choice((30, 30, 35)) if horse else rng.randint(15, 18)
        first_off = day_epoch + minutes[0] * 60 - offset * 3600
        card_at = first_off - (rng.randint(150, 300) if horse else rng.randint(45, 120)) * 60
        card_iso = _iso_utc(card_at)
        new_at = card_at
        for minute in minutes:
            hhmm = f"{minute // 60:02d}{minute % 60:02d}"
            start = f"{day.isoformat()}T{hhmm[:2]}:{hhmm[2:]}:00{tz}"
            event, places = _build_event(
                rng, meeting, f"{course.code}-{ymd}-{hhmm}", start, card_iso
            )
            late = rng.randint(0, 150) if horse else rng.randint(0, 40)
            off_at = day_epoch + minute * 60 - offset * 3600 + late
            meeting.races.append(len(races))
            races.append(_Race(event, meeting, horse, places, new_at, off_at))
            new_at += rng.randint(2, 15)
        meetings.append(meeting)

        multi_card = (
            len(meeting.races) > 1
            and rng.random() < 0.3
            and sum(len(races[i].event.xml()) for i in meeting.races) < max_bytes // 4
        )
        if multi_card:
            for index in meeting.races:
                races[index].new_at = card_at
            add(card_at, NEW, tuple(meeting.races))
        else:
            for index in meeting.races:
                add(races[index].new_at, NEW, (index,))

    # Race-level fixed messages.
    for index, race in enumerate(races):
        one = (index,)
        new_at, off = race.new_at, race.off_at
        lead = rng.randint(40, 75) if race.horse else rng.randint(12, 25)
        active_at = max(new_at + 120, off - lead * 60)
        add(active_at, ACTIVE, one)
        if race.horse:
            nonrunners = rng.choices((0, 1, 2, 3), weights=(55, 30, 12, 3))[0]
            n_runners = len(race.event.markets["WIN"].selections)
            for _ in range(min(nonrunners, n_runners - 4)):
                add(rng.randint(new_at + 60, off - 300), NONRUNNER, one)
        elif rng.random() < 0.12:
            withdrawn_at = rng.randint(new_at + 60, off - 300)
            add(withdrawn_at, NONRUNNER, one)
            if rng.random() < 0.6 and withdrawn_at + 60 < off - 120:
                add(rng.randint(withdrawn_at + 60, off - 120), RESERVE, one)
        if rng.random() < 0.3 and active_at + 30 < off - 300:
            suspended_at = rng.randint(active_at + 30, off - 300)
            add(suspended_at, SUSPEND, one)
            add(min(suspended_at + rng.randint(30, 180), off - 60), OPEN, one)
        order = HORSE_MARKET_ORDER if race.horse else GREYHOUND_MARKET_ORDER
        missing = [m for m in order if MARKET_IDS[m] not in race.event.markets]
        if missing and rng.random() < 0.06 and active_at + 30 < off - 300:
            add(rng.randint(active_at + 30, off - 300), ADD_MARKET, one)
        if rng.random() < 0.03:
            add(rng.randint(new_at + 60, off - 120), REFRESH, one)
        add(off, OFF, one)
        result_at = off + (rng.randint(70, 480) if race.horse else rng.randint(25, 45))
        result_at += rng.randint(20, 90)
        add(result_at, RESULT, one)
        add(result_at + rng.randint(120, 600), FINISHED, one)

    # Meeting-level multi-id messages: going changes for every race still to run, and the
    # occasional refresh of the next few races in one message.
    for meeting in meetings:
        card_at = races[meeting.races[0]].new_at
        last_off = races[meeting.races[-1]].off_at
        changes = rng.choices((0, 1, 2), weights=(50, 35, 15) if meeting.horse else (80, 20, 0))
        for _ in range(changes[0]):
            if card_at + 600 >= last_off - 1800:
                break
            t = rng.randint(card_at + 600, last_off - 1800)
            ids = tuple(
                i for i in meeting.races if races[i].new_at <= t - 1 and races[i].off_at >= t + 60
            )
            if ids:
                add(t, GOING, ids)
        if rng.random() < 0.15 and card_at + 600 < last_off - 600:
            t = rng.randint(card_at + 600, last_off - 600)
            ids = tuple(
                i for i in meeting.races if races[i].new_at <= t - 1 and races[i].off_at >= t + 60
            )[: rng.randint(2, 3)]
            if len(ids) >= 2:
                add(t, REFRESH, ids)

    # Price moves fill the rest of the budget, more for horse races, denser towards the off.
    spare = budget - len(actions)
    if spare > 0:
        activity = [(1.5 if r.horse else 1.0) * rng.uniform(0.5, 1.5) for r in races]
        total = sum(activity)
        quotas = [spare * a / total for a in activity]
        counts = [math.floor(q) for q in quotas]
        by_remainder = sorted(range(len(races)), key=lambda i: counts[i] - quotas[i])
        for i in by_remainder[: spare - sum(counts)]:
            counts[i] += 1
        for index, (race, count) in enumerate(zip(races, counts, strict=True)):
            lo, hi = race.new_at + 30, race.off_at - 1
            for _ in range(count):
                add(hi - int((hi - lo) * rng.random() ** 2), PRICE, (index,))

    actions.sort()
    del actions[budget:]
    for _, _, kind, payload in actions:
        if kind not in (NEW, GOING) and len(payload) == 1:
            races[payload[0]].remaining += 1
    return _Day(day, races, actions)


# --- the simulator ----------------------------------------------------------------------------


class FeedSimulator:
    """The feed as an iterable of SimulatedMessage (see `generate_feed`).

    Iterate once. `masters()` gives the simulator's model of every master created so far on the
    current day, for comparing with what a consumer folded.
    """

    def __init__(
        self,
        seed: int = 1,
        messages: int = 12_000,
        *,
        start: date | None = None,
        invalid: Mapping[str, float] | None = None,
        duplicates: float = 0.0,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        if messages < 0:
            raise ValueError(f"messages must be >= 0, got {messages}")
        if max_bytes < MIN_MAX_BYTES:
            raise ValueError(f"max_bytes must be at least {MIN_MAX_BYTES}, got {max_bytes}")
        self._seed = seed
        self._messages = messages
        self._start = DEFAULT_START if start is None else start
        self._max_bytes = max_bytes

        shares: dict[str, float] = {}
        for key, share in (invalid or {}).items():
            try:
                reason = Reason(key)
            except ValueError:
                reason = None
            if reason not in INVALID_REASONS:
                supported = ", ".join(INVALID_REASONS)
                raise ValueError(f"unknown invalid kind {key!r}; supported: {supported}")
            shares[INVALID_PREFIX + key] = share
        shares[KIND_DUPLICATE] = duplicates
        for kind, share in shares.items():
            if not 0.0 <= share <= 1.0 or math.isnan(share):
                raise ValueError(f"share for {kind} must be within [0, 1], got {share}")
        if sum(shares.values()) > 1.0 + 1e-9:
            raise ValueError("invalid and duplicate shares add up to more than 1")
        # Fixed order so the draw is deterministic whatever order the mapping came in.
        order = [INVALID_PREFIX + r for r in INVALID_REASONS] + [KIND_DUPLICATE]
        self._owed_kinds = [kind for kind in order if kind in shares]
        self._owed = [round(shares[kind] * messages) for kind in self._owed_kinds]
        special = sum(self._owed)
        if special > messages:  # rounding can overshoot by one per kind
            for i in reversed(range(len(self._owed))):
                cut = min(self._owed[i], special - messages)
                self._owed[i] -= cut
                special -= cut
        self._base_total = messages - special
        if self._base_total == 0 and special:
            raise ValueError("at least one regular message is needed besides invalid/duplicates")

        self._days = max(1, math.ceil(self._base_total / DAY_MESSAGES))
        self._day_index = -1
        self._day: _Day | None = None
        self._now = 0
        self._render = random.Random(f"sis-feed/{seed}/render")
        self._special = random.Random(f"sis-feed/{seed}/special")
        self._ids = random.Random(f"sis-feed/{seed}/ids")
        self._recent: deque[tuple[str, bytes]] = deque(maxlen=DUPLICATE_WINDOW)
        self._iterated = False

    # -- public -------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[SimulatedMessage]:
        if self._iterated:
            raise RuntimeError("a FeedSimulator can be iterated once; make a new one")
        self._iterated = True
        return self._run()

    def masters(self) -> dict[str, str]:
        """The model of every master created so far on the current day, as XML."""
        if self._day is None:
            return {}
        return {
            self._day.races[i].event.id: self._day.races[i].event.xml() for i in self._day.created
        }

    # -- the stream ---------------------------------------------------------------------------

    def _run(self) -> Iterator[SimulatedMessage]:
        kinds, owed = self._owed_kinds, self._owed
        base_left = self._base_total
        draw = self._special.random
        for slot in range(self._messages):
            left = self._messages - slot
            message: SimulatedMessage | None = None
            pick = draw() * left
            for i, count in enumerate(owed):
                if pick < count:
                    message = self._make_special(kinds[i], forced=base_left == 0)
                    if message is not None:
                        owed[i] -= 1
                    break
                pick -= count
            if message is None:
                if base_left == 0:  # cannot happen: a forced special is always made
                    raise AssertionError("no message to emit")
                message = self._next_base()
                base_left -= 1
            if not message.kind.startswith(INVALID_PREFIX) and message.kind != KIND_DUPLICATE:
                self._recent.append((message.message_id, message.body))
            yield message

    def _new_id(self) -> str:
        return "ID:" + self._ids.getrandbits(192).to_bytes(24, "big").hex()

    def _message(self, body: str | bytes, kind: str) -> SimulatedMessage:
        data = body.encode("utf-8") if isinstance(body, str) else body
        return SimulatedMessage(self._new_id(), data, kind, datetime.fromtimestamp(self._now, UTC))

    def _ensure_day(self) -> _Day:
        day = self._day
        if day is None or (day.cursor >= len(day.actions) and self._day_index + 1 < self._days):
            self._day_index += 1
            k = self._day_index
            budget = (self._base_total * (k + 1)) // self._days - (
                self._base_total * k
            ) // self._days
            day = _plan_day(
                self._seed,
                k,
                self._start + timedelta(days=k),
                budget,
                self._max_bytes,
            )
            self._day = day
            if self._now == 0 and day.actions:
                self._now = day.actions[0][0]
        return day

    # -- base messages ------------------------------------------------------------------------

    def _next_base(self) -> SimulatedMessage:
        day = self._ensure_day()
        t, _, kind, payload = day.actions[day.cursor]
        day.cursor += 1
        self._now = max(self._now, t)
        at = _iso_utc(self._now)
        races = [day.races[i] for i in payload]
        ids = " ".join(r.event.id for r in races)

        if kind == NEW or kind == REFRESH:
            for index, race in zip(payload, races, strict=True):
                if not race.created:
                    race.created = True
                    day.created.append(index)
                race.stale = False
                race.refresh_countdown = 0
            if kind == REFRESH and len(races) == 1:
                races[0].remaining -= 1
            events = "".join(r.event.xml() for r in races)
            label = "new" if kind == NEW else "refresh"
            return self._message(
                master_body(label, ids, at, events),
                KIND_MASTER_NEW if kind == NEW else KIND_MASTER_REFRESH,
            )

        if kind == GOING:
            ops = self._going(races)
            return self._message(update_body(ids, at, ops), KIND_UPDATE)

        race = races[0]
        race.remaining -= 1
        ops = self._race_update(kind, race, at)
        if race.refresh_countdown > 0:
            race.refresh_countdown -= 1
            if race.refresh_countdown == 0:
                # The provider answers the consumer's stale master with the full document.
                race.stale = False
                return self._message(
                    master_body("refresh", ids, at, race.event.xml()), KIND_MASTER_REFRESH
                )
        return self._message(update_body(ids, at, ops), KIND_UPDATE)

    def _race_update(self, kind: int, race: _Race, at: str) -> list[str]:
        if kind == PRICE:
            return self._price_move(race, at)
        if kind == ACTIVE:
            return self._set_status(race, "active", "open")
        if kind == OFF:
            return self._set_status(race, "off", "suspended")
        if kind == FINISHED:
            race.event.status = "finished"
            return [replace_op(event_selector() + "/@status", "finished")]
        if kind == RESULT:
            return self._result(race)
        if kind == NONRUNNER:
            return self._nonrunner(race, at)
        if kind == RESERVE:
            return self._reserve(race, at)
        if kind == SUSPEND or kind == OPEN:
            win = race.event.markets["WIN"]
            win.status = "suspended" if kind == SUSPEND else "open"
            return [replace_op(market_selector("WIN") + "/@status", win.status)]
        if kind == ADD_MARKET:
            return self._add_market(race, at)
        raise AssertionError(f"unknown action kind {kind}")

    def _set_status(self, race: _Race, event_status: str, market_status: str) -> list[str]:
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

    def _price_move(self, race: _Race, at: str) -> list[str]:
        markets = race.event.markets
        win = markets["WIN"]
        movers = [s for s in win.selections.values() if s.status == "runner" and s.price]
        if not movers:  # nothing left to price: a harmless no-op keeps the message count
            return [replace_op(event_selector() + "/@status", race.event.status)]
        rng = self._render
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

    def _nonrunner(self, race: _Race, at: str) -> list[str]:
        win = race.event.markets["WIN"]
        runners = [s for s in win.selections.values() if s.status == "runner"]
        if len(runners) <= 2:
            return self._price_move(race, at)
        rng = self._render
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

    def _reserve(self, race: _Race, at: str) -> list[str]:
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
        rng = self._render
        withdrawn = vacant[0]
        names = {s.name for s in win.selections.values()}
        name = _greyhound_name(rng)
        while name in names:
            name = _greyhound_name(rng)
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
            _person(rng),
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

    def _add_market(self, race: _Race, at: str) -> list[str]:
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
        market = _market_for(market_type, win.status, race.places, runners, rungs)
        markets[market.id] = market
        return [add_element_op(event_selector(), market.xml())]

    def _result(self, race: _Race) -> list[str]:
        """Settle every market: finishing order drawn with the favourites likelier to win."""
        rng = self._render
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

    def _going(self, races: list[_Race]) -> list[str]:
        meeting = races[0].meeting
        scale = meeting.going_scale
        rng = self._render
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

    def _make_special(self, kind: str, *, forced: bool) -> SimulatedMessage | None:
        """One invalid or duplicate message, or None when it cannot be made yet (no message to
        repeat, no live master to break): the slot then takes a regular message and the kind
        stays owed. `forced` (no regular messages left) always makes one."""
        rng = self._special
        if kind == KIND_DUPLICATE:
            if not self._recent:
                return None
            message_id, body = rng.choice(self._recent)
            return SimulatedMessage(
                message_id, body, KIND_DUPLICATE, datetime.fromtimestamp(self._now, UTC)
            )
        day = self._ensure_day()
        at = _iso_utc(self._now)
        reason = Reason(kind[len(INVALID_PREFIX) :])
        if reason in STALE_MAKING_REASONS:
            return self._invalid_patch(day, reason, at, forced=forced)
        if reason == Reason.ORPHAN_UPDATE:
            return self._message(corrupt.orphan_update(rng, day.day, at), kind)
        # Whole-message reasons: a corrupted copy of a message about a real race, never
        # applied to the model (the consumer dead-letters the whole message).
        pool = day.created or range(len(day.races))
        race = day.races[rng.choice(pool)]
        other = day.races[rng.randrange(len(day.races))].event
        body = corrupt.whole_message(
            rng, reason, race.event, other, race.created, at, self._max_bytes
        )
        return self._message(body, kind)

    def _invalid_patch(
        self, day: _Day, reason: Reason, at: str, *, forced: bool
    ) -> SimulatedMessage | None:
        rng = self._special
        live = [i for i in day.created if not day.races[i].stale and day.races[i].remaining > 0]
        if not live:
            if not forced:
                return None
            # End of the feed: no later message can refresh it, so the master stays stale.
            live = [i for i in day.created if not day.races[i].stale]
            if not live:
                # Every master is already stale: the consumer would answer master-stale.
                race = day.races[rng.choice(day.created)]
                ops = corrupt.invalid_patch_ops(rng, reason, race.event)
                body = update_body(race.event.id, at, ops)
                return self._message(body, INVALID_PREFIX + Reason.MASTER_STALE)
        race = day.races[rng.choice(live)]
        ops = corrupt.invalid_patch_ops(rng, reason, race.event)
        race.stale = True
        if race.remaining > 0:
            race.refresh_countdown = rng.randint(1, min(3, race.remaining))
        return self._message(update_body(race.event.id, at, ops), INVALID_PREFIX + reason)
