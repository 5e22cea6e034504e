"""The feed simulator: the stream of messages (`FeedSimulator`, `generate_feed`), which mixes
the planned days' base messages with invalid messages and redelivered duplicates.

Invalid messages and duplicates are placed with selection sampling (Knuth's Algorithm S): at
each slot, a kind with k messages still owed out of r slots left is drawn with probability
k/r, which places exactly the requested number of each kind at uniformly random positions
without holding any list of positions.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Iterator, Mapping
from datetime import UTC, date, datetime, timedelta

from sis_platform.domain.reasons import Reason
from sis_platform.simulator import corrupt
from sis_platform.simulator.generator.day_plan import plan_day
from sis_platform.simulator.generator.events import Day, iso_utc
from sis_platform.simulator.generator.message import (
    DAY_MESSAGES,
    DEFAULT_MAX_BYTES,
    DEFAULT_START,
    DUPLICATE_WINDOW,
    INVALID_PREFIX,
    INVALID_REASONS,
    KIND_DUPLICATE,
    MIN_MAX_BYTES,
    STALE_MAKING_REASONS,
    SimulatedMessage,
)
from sis_platform.simulator.generator.writer import MessageWriter
from sis_platform.simulator.model import update_body


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
        self._day: Day | None = None
        self._now = 0
        self._writer = MessageWriter(random.Random(f"sis-feed/{seed}/render"))
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

    def _ensure_day(self) -> Day:
        day = self._day
        if day is None or (day.cursor >= len(day.actions) and self._day_index + 1 < self._days):
            self._day_index += 1
            k = self._day_index
            budget = (self._base_total * (k + 1)) // self._days - (
                self._base_total * k
            ) // self._days
            day = plan_day(
                self._seed,
                k,
                self._start + timedelta(days=k),
                budget,
                self._max_bytes,
            )
            self._day = day
            if self._now == 0 and day.actions:
                self._now = day.actions[0].at
        return day

    # -- base messages ------------------------------------------------------------------------

    def _next_base(self) -> SimulatedMessage:
        day = self._ensure_day()
        action = day.actions[day.cursor]
        day.cursor += 1
        self._now = max(self._now, action.at)
        written = self._writer.write(day, action, iso_utc(self._now))
        return self._message(written.body, written.kind)

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
        at = iso_utc(self._now)
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
        self, day: Day, reason: Reason, at: str, *, forced: bool
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
