"""Intake: one tick of taking the feed off the queue into the landing zone, without Dagster.

A tick, in order (docs/design.md invariants 1, 5 and 8):
1. take or renew the consumer lease (sis_platform.intake.lease); a deployment that does not hold it
is
   a standby and reports who does;
2. as the holder, remove partial landing files a crash left behind (a standby must not: they
   may be the holder's file in progress);
3. hand on batches landed but not yet taken by the caller (a crash between landing and the
   end of a tick) before consuming anything new;
4. otherwise decide backpressure from the number of batch runs in flight, which the caller
   counts (intake knows nothing of Dagster);
5. consume one bounded batch under syncpoint, land it durably through the lease's fence and
   commit the queue (sis_platform.intake.consumer);
6. give every batch it hands on its chain anchor, writing a missing anchor file from the
   landing file's metadata (a crash between the claim and the anchor).

The result is a `TickOutcome`: the batches to take on, or why nothing was landed (standby,
backpressure, queue empty, or a failure: the lease, the landing zone or the source unavailable,
or fenced off), with the error and a description for logs and the UI. Failures are returned,
not raised: the caller decides whether a failed tick is an error (the sensor raises
`dg.Failure`) and ticks again later. Anything else (e.g. the lease lock staying busy while a
batch is claimed, or a landing file that cannot be read) propagates, as an unexpected error.

The queue sensor builds an `Intake` per tick; a resident process can keep one, with
`keep_session=True` to hold its queue connection between ticks, and `close()` it at the end.
`ready_batch` gives a landed batch its anchor the same way for the landed-batches sensor,
which registers what sis-live landed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import TracebackType
from typing import Protocol, Self

from sis_platform.domain.limits import DEFAULT_LIMITS, Limits
from sis_platform.intake.consumer import BatchLimits, consume_batch
from sis_platform.intake.lease import ConsumerLease, Lease, LeaseError
from sis_platform.log.chain import Anchor
from sis_platform.log.landing import ClosedBy, LandedBatch, LandingZone, batch_seq_of
from sis_platform.queues.base import FencedOff, QueueSession, QueueSource, SourceUnavailable
from sis_platform.runtime.logs import concerning

# How a batch that did not fill up ended, in an operator's words (a skip reason).
_WHY_NOT_FULL: dict[ClosedBy | None, str] = {
    ClosedBy.SECONDS: "was sealed by age (SIS_BATCH_MAX_SECONDS) before it filled",
    ClosedBy.DRAINED: "was sealed when the queue ran dry",
}


class IntakeLog(Protocol):
    """Where a tick reports what it did besides its result (a `logging.Logger`, or a Dagster
    sensor's `context.log`)."""

    def info(self, msg: str, *, extra: Mapping[str, object] | None = None) -> None: ...

    def warning(self, msg: str, *, extra: Mapping[str, object] | None = None) -> None: ...

    def error(self, msg: str, *, extra: Mapping[str, object] | None = None) -> None: ...


class TickStatus(StrEnum):
    """What a tick came to."""

    BATCHES = "batches"  # batches to take on: landed now, or left untaken by an earlier tick
    STANDBY = "standby"  # another deployment holds the consumer lease
    BACKPRESSURE = "backpressure"  # enough batch runs in flight: messages wait on the queue
    QUEUE_EMPTY = "queue empty"  # no message within the get wait
    # Failures: nothing was committed off the queue; the next tick tries again.
    LEASE_UNAVAILABLE = "lease unavailable"
    FENCED_OFF = "fenced off"  # lost the lease during the tick: what it got was backed out
    LANDING_UNAVAILABLE = "landing unavailable"
    SOURCE_UNAVAILABLE = "source unavailable"
    # The caller has taken batches beyond the zone's last one (the zone restored from an
    # earlier copy): a batch landed now would reuse a number already taken, and never run.
    LANDING_WENT_BACK = "landing went back"

    @property
    def failed(self) -> bool:
        return self in _FAILURES


_FAILURES = frozenset(
    {
        TickStatus.LEASE_UNAVAILABLE,
        TickStatus.FENCED_OFF,
        TickStatus.LANDING_UNAVAILABLE,
        TickStatus.SOURCE_UNAVAILABLE,
        TickStatus.LANDING_WENT_BACK,
    }
)


@dataclass(frozen=True)
class ReadyBatch:
    """A landed batch handed on to the caller, with its chain anchor (None: neither an anchor
    file nor the landing file's metadata holds one, so its chain check will fail)."""

    key: str
    anchor: Anchor | None

    @property
    def seq(self) -> int:
        return batch_seq_of(self.key)


@dataclass(frozen=True)
class TickOutcome:
    """The result of one tick. `batches` are the landed batches after the caller's position,
    in landing order (only with `TickStatus.BATCHES`); `landed` is the one this tick landed,
    if any. Otherwise `detail` says why nothing was landed, and `error` is the failure's cause."""

    status: TickStatus
    detail: str = ""
    batches: tuple[ReadyBatch, ...] = ()
    landed: LandedBatch | None = None
    error: Exception | None = None
    lease: Lease | None = None  # the lease as this tick found or left it

    @property
    def failed(self) -> bool:
        return self.status.failed

    @property
    def last_seq(self) -> int | None:
        """The number of the last batch handed on (the caller's new position), or None."""
        return self.batches[-1].seq if self.batches else None


@dataclass(frozen=True)
class IntakeLimits:
    """How much one tick may take: the batch bounds, the batch runs in flight at which it lands
    nothing (backpressure), and the per-message bounds (a larger body is moved aside)."""

    max_runs_in_flight: int
    batch: BatchLimits = field(default_factory=BatchLimits)
    message: Limits = DEFAULT_LIMITS


def ready_batch(zone: LandingZone, key: str, log: IntakeLog) -> ReadyBatch:
    """The landed batch `key` with its anchor, written from its landing file's metadata if a
    crash right after the claim left it without an anchor file (what both intake sensors hand
    on to Dagster)."""
    had_anchor = zone.catalog.anchors.path(key).exists()
    anchor = zone.writer.ensure_anchor(key)
    if anchor is None:
        log.error(
            f"batch {key} has no chain anchor and its landing file carries "
            "none: its run's hash_chain_intact check will fail",
            extra=concerning(batch=key),
        )
    elif not had_anchor:
        log.warning(
            f"batch {key} had no anchor file (a crash right after it "
            "landed): written from its landing file's metadata",
            extra=concerning(batch=key),
        )
    return ReadyBatch(key, anchor)


class Intake:
    """Ticks of intake from `source` into `zone` under `lease` (see the module docstring)."""

    def __init__(
        self,
        source: QueueSource,
        zone: LandingZone,
        lease: ConsumerLease,
        limits: IntakeLimits,
        *,
        log: IntakeLog | None = None,
        keep_session: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source = source
        self.zone = zone
        self.lease = lease
        self.limits = limits
        self.log: IntakeLog = log if log is not None else logging.getLogger(__name__)
        self.keep_session = keep_session
        self._clock = clock
        self._session: QueueSession | None = None

    def tick(self, runs_in_flight: int = 0, *, registered: int = 0) -> TickOutcome:
        """One tick. `runs_in_flight`: batch runs queued or running now (counted by the caller,
        up to at least `limits.max_runs_in_flight`). `registered`: the number of the last batch
        the caller has taken on (the sensor's cursor); later ones are handed on first."""
        zone = self.zone
        try:
            zone.writer.ensure()
        except OSError as exc:
            return self._landing_unavailable(exc, None)
        try:
            current = self.lease.acquire()
        except (LeaseError, OSError) as exc:
            # Without the lease nothing may be consumed; an unreadable lease is an outage to see.
            return TickOutcome(
                TickStatus.LEASE_UNAVAILABLE,
                f"consumer lease in {zone.catalog.root} unavailable: {exc}; retrying next tick",
                error=exc,
            )
        if not self.lease.holds(current):
            return TickOutcome(TickStatus.STANDBY, self._standby(current), lease=current)
        if current.acquired_at == current.renewed_at:
            self.log.warning(self._acquired(current))
        # Only the holder cleans up: a standby must not delete the holder's file in progress.
        if removed := zone.writer.clean_partials():
            self.log.warning(f"removed {removed} partial batch file(s) left by a crash")
        # Batches landed but not yet taken on (a crash between landing and the end of a tick)
        # are handed on before anything new is consumed.
        pending = zone.catalog.keys_after(registered)
        landed = None
        if not pending:
            last_seq, _ = zone.catalog.last()
            if registered > last_seq:
                return TickOutcome(
                    TickStatus.LANDING_WENT_BACK,
                    f"the caller has taken batches up to {registered}, beyond the zone's last "
                    f"one ({last_seq}) in {zone.catalog.root}: the zone went back (restored from "
                    "an earlier copy?) or is not the caller's; nothing is got until it is put "
                    "right, since a batch landed now would take a number already taken",
                    lease=current,
                )
            held = self._backpressure(runs_in_flight)
            if held is not None:
                return TickOutcome(TickStatus.BACKPRESSURE, held, lease=current)
            outcome = self._consume(current, registered)
            if outcome.status is not TickStatus.BATCHES:
                return outcome
            landed = outcome.landed
            pending = zone.catalog.keys_after(registered)
        batches = tuple(self._ready(key) for key in pending)
        return TickOutcome(TickStatus.BATCHES, batches=batches, landed=landed, lease=current)

    def _acquired(self, current: Lease) -> str:
        text = f"{self.lease.holder} acquired the consumer lease with fencing token {current.token}"
        if current.previous_holder:
            text += f", taking over from {current.previous_holder}"
        return text

    def _standby(self, current: Lease) -> str:
        # Loud but not a failure: standing by is this deployment's job until the holder stops.
        return (
            f"standby: the consumer lease in {self.zone.catalog.root} is held by {current.holder} "
            f"(fencing token {current.token}) until {current.expires_at:%Y-%m-%d %H:%M:%S} UTC; "
            f"{self.lease.holder} takes over if it is not renewed by then"
        )

    def _backpressure(self, runs_in_flight: int) -> str | None:
        """Why no batch may be landed now, or None.

        While enough batch runs wait or run, messages stay on the queue. The next batch is then
        larger (up to its bounds), so batch size follows processing speed instead of the run
        queue growing without bound behind a slow fold. Landing ahead of the run in flight pays
        only in a backlog (the last batch filled up to a bound). A live feed keeping up ends its
        batches by time or by running dry: a batch landed now would wait behind the run in
        flight, and the messages after it behind both, so the next batch waits for that run
        instead and takes them all at once."""
        limit = self.limits.max_runs_in_flight
        last = self.zone.catalog.keys()[-1:]
        closed_by = self.zone.catalog.closed_by(last[0]) if last else None
        live = limit > 1 and closed_by in (ClosedBy.SECONDS, ClosedBy.DRAINED)
        if live:
            limit = 1
        if runs_in_flight < limit:
            return None
        return (
            f"backpressure: {runs_in_flight} batch run(s) queued or running "
            + (
                f"and the last batch, {last[0]}, {_WHY_NOT_FULL.get(closed_by, 'was not full')}: "
                "the feed is live, and a batch landed now would only wait for the run in flight"
                if live
                else f"(SIS_MAX_RUNS_IN_FLIGHT={limit})"
            )
            + "; messages wait on the queue and the next batch takes more of them"
        )

    def _consume(self, current: Lease, registered: int) -> TickOutcome:
        """Get, land and commit one batch; `BATCHES` with `landed` set, or why not."""
        where = self.source.description
        try:
            session = self._open()
            try:
                batch = consume_batch(
                    session,
                    self.zone.writer,
                    self.limits.batch,
                    clock=self._clock,
                    fence=self.lease.fence(current),
                    message_limits=self.limits.message,
                )
            finally:
                if not self.keep_session:
                    self.close()
        except FencedOff as exc:
            self.close()
            return TickOutcome(
                TickStatus.FENCED_OFF,
                f"lost the consumer lease during the tick (paused past its expiry?): {exc}; the "
                f"messages got in this tick were backed out and stay on {where} for the holder",
                error=exc,
                lease=current,
            )
        except OSError as exc:
            # The landing zone is probed before the first get, so an outage found there got
            # nothing; one found while landing backed out what it got (it stays on the queue).
            self.close()
            return self._landing_unavailable(exc, current)
        except SourceUnavailable as exc:
            # A failure, not a skip: an outage must be visible.
            self.close()
            return TickOutcome(
                TickStatus.SOURCE_UNAVAILABLE,
                f"queue unavailable ({where}): {exc}; retrying next tick",
                error=exc,
                lease=current,
            )
        if batch is None:
            return TickOutcome(
                TickStatus.QUEUE_EMPTY,
                f"queue empty: no message within {self.limits.batch.get_wait_seconds}s "
                f"({where}); {registered} batch(es) registered so far",
                lease=current,
            )
        self.log.info(
            f"landed batch {batch.key}: {batch.messages} message(s), {batch.bytes} bytes "
            f"from {where}",
            extra=concerning(batch=batch.key),
        )
        return TickOutcome(TickStatus.BATCHES, landed=batch, lease=current)

    def _landing_unavailable(self, exc: OSError, current: Lease | None) -> TickOutcome:
        return TickOutcome(
            TickStatus.LANDING_UNAVAILABLE,
            f"landing zone {self.zone.catalog.root} unavailable: {exc}; nothing was committed off "
            f"{self.source.description}; retrying next tick",
            error=exc,
            lease=current,
        )

    def _open(self) -> QueueSession:
        if self._session is None:
            self._session = self.source.connect()
        return self._session

    def _ready(self, key: str) -> ReadyBatch:
        return ready_batch(self.zone, key, self.log)

    def close(self) -> None:
        """Close the queue session kept between ticks, if any (an open unit of work is backed
        out by the queue)."""
        session, self._session = self._session, None
        if session is not None:
            session.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
