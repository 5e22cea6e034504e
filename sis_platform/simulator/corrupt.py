"""Invalid messages, one maker per reason code, each a corrupted copy of a plausible message.

None of these is applied to the simulator's model: a whole-message reason makes the consumer
dead-letter the message, an orphan update names no master, and an invalid patch is atomic
(docs/feed.md, "Update messages"), so it changes nothing either.
"""

from __future__ import annotations

import random
from datetime import date

from sis_platform.domain.reasons import Reason
from sis_platform.simulator.model import (
    LADDER,
    LADDER_INDEX,
    Event,
    add_attribute_op,
    attr,
    event_selector,
    market_selector,
    master_body,
    replace_op,
    selection_selector,
    update_body,
)
from sis_platform.simulator.names import CLOSED_COURSE_CODES

_ROOT_END = b"</sportsdata>"


def _price_update_ops(rng: random.Random, event: Event, at: str) -> list[str]:
    """A believable price move for `event` (not applied to it)."""
    win = event.markets["WIN"]
    priced = [s for s in win.selections.values() if s.price is not None]
    if not priced:
        return [replace_op(event_selector() + "/@status", event.status)]
    selection = rng.choice(priced)
    assert selection.price is not None
    rung = LADDER_INDEX[(selection.price.num, selection.price.den)]
    num, den = LADDER[max(0, min(len(LADDER) - 1, rung + rng.choice((-1, 1))))]
    base = selection_selector("WIN", selection.id) + "/price"
    return [
        replace_op(base + "/@num", str(num)),
        replace_op(base + "/@den", str(den)),
        replace_op(base + "/@at", at),
    ]


def _alternative_id(event_id: str, avoid: str) -> str:
    """Another master id on the same card, different from both arguments."""
    stem, hhmm = event_id[:-4], event_id[-4:]
    minute = (int(hhmm[:2]) * 60 + int(hhmm[2:]) + 1) % (24 * 60)
    candidate = f"{stem}{minute // 60:02d}{minute % 60:02d}"
    if candidate == avoid:
        minute = (minute + 1) % (24 * 60)
        candidate = f"{stem}{minute // 60:02d}{minute % 60:02d}"
    return candidate


def orphan_update(rng: random.Random, day: date, at: str) -> str:
    """An update for a master that never existed: a card at a closed track."""
    minute = rng.randint(11 * 60, 21 * 60)
    master_id = (
        f"{rng.choice(CLOSED_COURSE_CODES)}-{day:%Y%m%d}-{minute // 60:02d}{minute % 60:02d}"
    )
    num, den = rng.choice(LADDER)
    base = selection_selector("WIN", str(rng.randint(1, 8))) + "/price"
    ops = [
        replace_op(base + "/@num", str(num)),
        replace_op(base + "/@den", str(den)),
        replace_op(base + "/@at", at),
    ]
    return update_body(master_id, at, ops)


def whole_message(
    rng: random.Random,
    reason: Reason,
    event: Event,
    other: Event,
    created: bool,
    at: str,
    max_bytes: int,
) -> bytes:
    """A message the consumer must reject as a whole with `reason`. `event` is the race it is
    about (`created`: its master exists, so a master copy is a refresh), `other` another race
    of the day."""
    master_type = "refresh" if created else "new"
    master = master_body(master_type, event.id, at, event.xml())
    update = update_body(event.id, at, _price_update_ops(rng, event, at))

    if reason == Reason.NOT_WELL_FORMED:
        variant = rng.randrange(4)
        if variant == 0:  # cut short in transit: the root end tag is always incomplete
            data = (master if rng.random() < 0.5 else update).encode()
            return data[: rng.randint(len(data) // 3, len(data) - 2)]
        if variant == 1:  # bytes that are not UTF-8 inside a name
            data = master.encode()
            at_name = data.index(b' name="') + len(b' name="')
            bad = rng.choice((b"\xff", b"\xc3\x28", b"\xe2\x82", b"\x80"))
            return data[:at_name] + bad + data[at_name:]
        if variant == 2:  # an unescaped ampersand in an attribute
            name = f' name="{attr(event.name)}"'
            return master.replace(name, name[:-1] + ' & Co"', 1).encode()
        return master.replace("</market>", "</markets>", 1).encode()  # mismatched end tag

    if reason == Reason.SCHEMA_INVALID:
        variant = rng.randrange(4)
        if variant == 3 and ' status="runner"' not in master:
            variant = 2
        if variant == 0:  # an attribute the vocabulary does not have
            return master.replace("<selection ", '<selection colours="royal blue" ', 1).encode()
        if variant == 1:
            events = event.xml(event_extra=' surface="turf"')
            return master_body(master_type, event.id, at, events).encode()
        if variant == 2:  # the first status attribute is the event's
            wrong = master.replace(f' status="{event.status}"', ' status="running"', 1)
            return wrong.encode()
        return master.replace(' status="runner"', ' status="scratched"', 1).encode()

    if reason == Reason.INVALID_ENVELOPE:
        variant = rng.randrange(3)
        if variant == 0:  # `type` is forbidden on an update
            ops = _price_update_ops(rng, event, at)
            return update_body(event.id, at, ops, extra_root=' type="refresh"').encode()
        if variant == 1:  # `type` is required on a master
            return master_body(None, event.id, at, event.xml()).encode()
        ops = _price_update_ops(rng, event, at)  # an id listed twice
        return update_body(f"{event.id} {event.id}", at, ops).encode()

    if reason == Reason.IDS_MISMATCH:
        if rng.random() < 0.5 or other.id == event.id:
            wrong = other.id if other.id != event.id else _alternative_id(event.id, event.id)
            return master_body(master_type, event.id, at, event.xml(override_id=wrong)).encode()
        # Two ids listed, the second event carries an id not in the list.
        wrong = _alternative_id(other.id, event.id)
        events = event.xml() + other.xml(override_id=wrong)
        return master_body(master_type, f"{event.id} {other.id}", at, events).encode()

    if reason == Reason.TOO_LARGE:
        data = (master if rng.random() < 0.7 else update).encode()
        target = max_bytes + rng.randint(1, 64 * 1024)
        need = target - len(data)
        body = data[: -len(_ROOT_END)]
        if rng.random() < 0.5:
            line = b"SIS diagnostic trace: feed handler buffer dump follows; ignore.\n"
            filler = (line * (need // len(line) + 1))[: max(0, need - 9)]
            padding = b"<!-- " + filler + b" -->"
        else:
            padding = b"\n" + b" " * max(0, need - 1)
        return body + padding + _ROOT_END

    raise ValueError(f"not a whole-message reason the simulator makes: {reason}")


def invalid_patch_ops(rng: random.Random, reason: Reason, event: Event) -> list[str]:
    """Patch operations for `event` that fail with `reason` (`unlocated-node`: a selector
    that matches nothing; `invalid-result`: a patch that applies but leaves a document the
    schema rejects). Half the time a valid operation goes first, which the consumer must not
    keep (updates are atomic)."""
    win = event.markets["WIN"]
    ops: list[str] = []
    priced = [s for s in win.selections.values() if s.price is not None and s.price.at]
    if priced and rng.random() < 0.5:
        selection = rng.choice(priced)
        assert selection.price is not None and selection.price.at is not None
        base = selection_selector("WIN", selection.id) + "/price/@at"
        ops.append(replace_op(base, selection.price.at))

    if reason == Reason.UNLOCATED_NODE:
        variant = rng.randrange(3)
        unpriced = [s for s in win.selections.values() if s.price is None]
        if variant == 2 and not unpriced:
            variant = 0
        if variant == 0:  # a runner number the race does not have
            missing = str(len(win.selections) + rng.randint(1, 9))
            while missing in win.selections:
                missing = str(int(missing) + 1)
            ops.append(replace_op(selection_selector("WIN", missing) + "/price/@num", "5"))
        elif variant == 1:  # a market the race does not have
            ops.append(replace_op(market_selector("TRI") + "/@status", "open"))
        else:  # the price of a non-runner, removed earlier
            sel = selection_selector("WIN", rng.choice(unpriced).id)
            ops.append(replace_op(sel + "/price/@num", "7"))
        return ops

    if reason == Reason.INVALID_RESULT:
        variant = rng.randrange(3)
        if variant == 0:
            ops.append(replace_op(event_selector() + "/@status", "postponed"))
        elif variant == 1:
            ops.append(add_attribute_op(event_selector(), "surface", "turf"))
        else:
            selection = rng.choice(list(win.selections.values()))
            ops.append(
                replace_op(selection_selector("WIN", selection.id) + "/@status", "scratched")
            )
        return ops

    raise ValueError(f"not an invalid-patch reason: {reason}")
