"""The sis-live loop: the queue's resident consumer, landing small groups and applying them.

While it holds the consumer lease (sis_platform.intake.lease, renewed well before it expires; lost
or taken over: it stops consuming and stands by, as intake does), the service:

1. after taking the lease, seals a batch a crash or an earlier holder left open
   (`GroupWriter.recover`) and catches the serving store up from its position (`Applier`);
2. then, per group: a get that waits for the first message (bounded by the open batch's seal
   deadline, the lease renewal, the store's next retry or heartbeat, and `idle_wait_seconds`
   for seeing a stop request), then the messages available now, claimed together, until none
   is (on a broker, once the group holds two, until a get waiting `group_wait_seconds` finds
   none), the group holds `group_max_messages`, or the open batch would pass its bounds;
   crash point `live.after_get`; `GroupWriter.land` (durable part file); `live.after_land`;
   fold and store commit (`Applier.apply`, with `live.store_commit` inside the store's
   transaction; a backlog's full groups are pipelined, each committed during the next
   group's `apply`: see applier.py); `live.before_queue_commit`; queue commit;
   `live.after_queue_commit`; the open batch sealed when it reached a bound (messages,
   bytes, or age, the last also when no message comes);
3. in a turn where no message came within the wait (an idle turn), after the seal that may be
   due: a bounded step of merging sealed batches' parts into one file each (`Merger`,
   sis_platform/log/landing/merge.py), then of expiring merged batches past the retention that
   the lake has folded and checked (`Expirer`, sis_platform/log/landing/expiry.py): never on a
   group's way to the store, never the open batch.

Landing comes first, as in the consumer (sis_platform/intake/consumer.py, invariant 1): a crash
before the land leaves every message on the queue (backed out by it). From the land on, the landed
log is what counts: the store records the landing position it has applied, and a restart folds the
log after it. So the queue commit can wait until the store has committed, which keeps the queue's
round trip (a remote queue manager's, on the feed) out of the time to the store. A crash after the
land and before the queue commit, wherever the store was, leaves the messages landed and on the
queue: they are redelivered, landed again, and their second copies end `duplicate` (invariant 2). A
body over the per-message bound is moved aside as the consumer does it. Waits are the queue get's
own; nothing sleeps on the hot path.

A serving store beyond the landing zone's last message halts everything (applier.py): while
`Applier.halted`, the service gets nothing, holds the lease (so that no standby consumes
either) and checks again with growing delays, reading the landing's tail afresh each time.

Outages: the source (SourceUnavailable) is reconnected with growing delays; the landing zone
(OSError) is probed before anything more is got; the store (ServingUnavailable) is the
applier's: landing and queue commits go on and the store catches up when it is back.
`request_stop` (from a signal handler) ends the loop after the group in hand, leaving the open
batch for the next start to seal.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, NamedTuple

from sis_platform.domain.pipeline import LoggedMessage
from sis_platform.intake.consumer import move_aside
from sis_platform.intake.lease import ConsumerLease, Lease, LeaseError
from sis_platform.live.applier import Applier
from sis_platform.live.budget import BudgetConfig
from sis_platform.live.config import LiveConfig, Retry
from sis_platform.live.lakelag import LakeWatch
from sis_platform.live.metrics import LiveRecorder, LiveState
from sis_platform.log.landing import (
    ClosedBy,
    GroupWriter,
    LandedGroup,
    LandedMessage,
    LandingZone,
    LogPosition,
    MovedAside,
    landing_bytes_bound,
)
from sis_platform.log.landing.expiry import Expirer
from sis_platform.log.landing.merge import Merger
from sis_platform.queues.base import (
    FencedOff,
    QueueSession,
    QueueSource,
    ReceivedMessage,
    SourceUnavailable,
)
from sis_platform.runtime.faults import crash_point
from sis_platform.runtime.heartbeat import Health, Heartbeat
from sis_platform.runtime.logs import concerning

if TYPE_CHECKING:
    from sis_platform.serving import ServingWriter

log = logging.getLogger(__name__)

# Renew the lease when this share of its length has passed since the last renewal: a holder
# paused for less than the rest keeps it.
_RENEW_SHARE = 0.25

Received = ReceivedMessage | MovedAside


class LiveService:
    """sis-live (see the module docstring). `run` until `request_stop`."""

    def __init__(
        self,
        source: QueueSource,
        zone: LandingZone,
        lease: ConsumerLease,
        open_writer: Callable[[], ServingWriter],
        config: LiveConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        budget: BudgetConfig | None = None,
        heartbeat: Heartbeat | None = None,
        metrics: LiveRecorder | None = None,
        tracing: Callable[[LiveRecorder], LiveRecorder] | None = None,
    ) -> None:
        self.source = source
        self.zone = zone
        self.lease = lease
        self.config = config
        # What the loop and the applier record (sis_platform/live/metrics.py; by default nothing).
        self.metrics = metrics if metrics is not None else LiveRecorder()
        # What the loop and the applier call: the metrics, or the traces around them
        # (`tracing`, sis_platform/live/traces.py), which draw their spans from the same calls.
        self.recorder = tracing(self.metrics) if tracing is not None else self.metrics
        # `budget`: the fold's per-item budget and in-flight folder (sis_platform/live/budget.py)
        self.applier = Applier(
            zone.catalog, open_writer, config, clock=clock, budget=budget, metrics=self.recorder
        )
        self._clock = clock
        # Beaten each time the loop goes round (sis_platform/runtime/heartbeat.py): liveness.
        self._heartbeat = heartbeat
        self._stop = threading.Event()
        self._session: QueueSession | None = None
        self._source_retry = Retry(config.retry_first_seconds, config.retry_last_seconds)
        self._landing_retry = Retry(config.retry_first_seconds, config.retry_last_seconds)
        self._lease_retry = Retry(config.retry_first_seconds, config.retry_last_seconds)
        self._renew_at = 0.0  # monotonic: when to renew the lease next
        self._expires_at = 0.0  # monotonic: when the lease held runs out unless renewed
        self._landed_to = LogPosition(0, -1)
        self._opened: _Opened | None = None  # when the open batch was opened (monotonic)
        self._merger: Merger | None = None  # the lease holder's merging (idle turns)
        self._expirer: Expirer | None = None  # the lease holder's landing expiry (idle turns)
        self._progress = _Progress(clock(), config.progress_seconds)
        self._stepped = threading.Condition()  # notified after every step (see `wait_until`)
        self.landed_messages = 0  # messages this process has landed
        self.holding = False  # consuming under the lease now (False: standing by)
        self._behind_since: float | None = None  # monotonic: since when the store is behind
        # The lake's progress and lag (sis_platform/live/lakelag.py), read by the lease holder
        # at the store heartbeat's pace.
        self._lake = LakeWatch(zone.catalog, config.heartbeat_seconds, clock)

    def request_stop(self) -> None:
        """End `run` after the group in hand (safe from a signal handler)."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def landed_to(self) -> LogPosition:
        """The last message landed (as far as this process knows)."""
        return self._landed_to

    def wait_until(self, done: Callable[[LiveService], bool], timeout: float) -> bool:
        """Wait (from another thread) until `done(self)` holds after a step, or `timeout`
        seconds pass; whether it holds."""
        with self._stepped:
            return self._stepped.wait_for(lambda: done(self), timeout)

    def _stepped_once(self) -> None:
        self._beat()
        with self._stepped:
            self._stepped.notify_all()

    def _beat(self) -> None:
        """The loop went round: tell the heartbeat, with whether the store has caught up and
        whether intake is halted; note since when the store is behind (`state`)."""
        halted = self.applier.halted
        caught_up = (
            self.holding
            and halted is None
            and self.applier.available
            and not self.applier.behind(self._landed_to)
        )
        if caught_up or not self.holding:
            self._behind_since = None
        elif self._behind_since is None:
            self._behind_since = self._clock()
        if self._heartbeat is not None:
            self._heartbeat.beat(holding=self.holding, caught_up=caught_up, halted=halted)

    def health(self, stall_seconds: float) -> Health:
        """The heartbeat's verdict on this process now (`Heartbeat.health`); without a
        heartbeat, never alive."""
        if self._heartbeat is None:
            return Health(False, False, "no heartbeat configured")
        return self._heartbeat.health(stall_seconds)

    def state(self, stall_seconds: float) -> LiveState:
        """What a scrape exports (sis_platform/live/metrics.py), read from another thread: each
        attribute is one reference, read as it stands."""
        applier = self.applier
        applied = applier.applied
        landed = self._landed_to
        behind = self._behind_since
        beat = self._heartbeat.current() if self._heartbeat is not None else None
        verdict = self.health(stall_seconds)
        now = self._clock()
        return LiveState(
            holding=self.holding,
            landed=(landed.batch_seq, landed.msg_seq) if landed.msg_seq >= 0 else None,
            applied=(applied.batch_seq, applied.msg_seq) if applied is not None else None,
            behind_seconds=0.0 if behind is None else max(0.0, now - behind),
            source_connected=self._session is not None,
            store_available=applier.available,
            halted=applier.halted is not None,
            heartbeat_age_seconds=None if beat is None else max(0.0, now - beat.at),
            alive=verdict.alive,
            ready=verdict.ready,
            # The lease holder's only: a standby's would be stale, and counted twice.
            lake=self._lake.current if self.holding else None,
        )

    def run(self) -> None:
        """Consume while holding the lease, stand by otherwise, until a stop is requested."""
        try:
            while not self.stopping:
                self._stepped_once()  # a beat standing by too (and before a first get)
                current = self._acquire()
                if current is None or not self.lease.holds(current):
                    self._stop.wait(self._standby_seconds())
                    continue
                self.holding = True
                try:
                    self._hold(current)
                finally:
                    self.holding = False
                    self._stepped_once()
        finally:
            self._close_session()
            self.applier.close()
            self.recorder.close()
        if self._held_at_stop():
            self.lease.release()  # a planned stop: a standby need not wait for the expiry

    def _acquire(self) -> Lease | None:
        """Take or renew the lease; None when it cannot be read or written now."""
        now = self._clock()
        try:
            current = self.lease.acquire()
        except (LeaseError, OSError) as error:
            if self._lease_retry.failed(now):
                log.error(
                    "consumer lease in %s unavailable: %s; retrying", self.zone.catalog.root, error
                )
            self._renew_at = self._lease_retry.due
            return None
        if self._lease_retry.succeeded():
            log.warning("consumer lease in %s available again", self.zone.catalog.root)
        if self.lease.holds(current):
            self._renew_at = now + self.lease.seconds * _RENEW_SHARE
            self._expires_at = now + self.lease.seconds
        return current

    def _still_held(self) -> bool:
        """Renew the lease when due; False once it is lost: taken over, or not renewed before
        it ran out (a standby may hold it by then), when this process must stop consuming."""
        if self._clock() < self._renew_at:
            return True
        renewed = self._acquire()
        if renewed is None:
            if self._clock() < self._expires_at:
                return True
            log.error("could not renew the consumer lease before it ran out: standing by")
            self.recorder.lease_lost()
            return False
        if not self.lease.holds(renewed):
            log.error("lost the consumer lease to %s: standing by", renewed.holder)
            self.recorder.lease_lost()
            return False
        return True

    def _keep_catching_up(self) -> bool:
        self._beat()  # a stretch was committed: a long catch-up is progress
        return not self.stopping and self._still_held()

    def _standby_seconds(self) -> float:
        return max(self.config.idle_wait_seconds, self.lease.seconds * _RENEW_SHARE)

    def _halted_seconds(self) -> float:
        """How long to wait while halted: until the applier's next check, at most a share of
        the lease (renewed between waits)."""
        due = self.applier.next_due()
        wait = due - self._clock() if due else self.config.idle_wait_seconds
        return min(max(0.0, wait), self.lease.seconds * _RENEW_SHARE)

    def _held_at_stop(self) -> bool:
        try:
            return self.lease.holds(self.lease.read())
        except (LeaseError, OSError):
            return False

    def _hold(self, current: Lease) -> None:
        """Consume under `current` until the lease is lost or a stop is requested."""
        self.recorder.lease_held(current.token, acquired=current.acquired_at == current.renewed_at)
        if current.acquired_at == current.renewed_at:
            log.warning(
                "%s acquired the consumer lease with fencing token %d%s",
                self.lease.holder,
                current.token,
                f", taking over from {current.previous_holder}" if current.previous_holder else "",
            )
        writer = GroupWriter(self.zone.writer, self.lease.fence(current))
        sealed = writer.recover()
        if sealed is not None:
            log.warning(
                "sealed batch %s left open (%d messages)",
                sealed.key,
                sealed.messages,
                extra=concerning(batch=sealed.key),
            )
        self._merger = self.zone.upkeep.merger(writer.fence, self.config.merge_grace_seconds)
        self._expirer = self.zone.upkeep.expirer(
            writer.fence, self.config.landing_retain.total_seconds()
        )
        self._landed_to = self.zone.catalog.last_position()
        self.applier.catch_up(self._landed_to, self._keep_catching_up)
        try:
            while not self.stopping:
                if self.applier.halted is not None:
                    # Back to `run`, which renews the lease, and here again with the landing's
                    # tail read afresh once the halt's next check is due.
                    self._close_session()
                    self._stop.wait(self._halted_seconds())
                    return
                if not self._still_held():
                    self._close_session()
                    return
                try:
                    self._step(writer)
                except FencedOff as error:
                    log.error("fenced off: %s; standing by", error)
                    self.recorder.lease_lost()
                    self._close_session()
                    return
                finally:
                    self._stepped_once()
        finally:
            # A pipelined group (applier.py) is committed at a planned stop; holding no lease
            # any more, it is left to the next holder, which refolds it from the log.
            if self.stopping and self._still_held():
                self.applier.flush()
            else:
                self.applier.abandon()

    def _step(self, writer: GroupWriter) -> None:
        """One group, or one wait for one."""
        self._lake.turn(self.applier.lake_progress, self._landed_to, writer.open_batch)
        if self.applier.behind(self._landed_to):
            self.applier.catch_up(self._landed_to, self._keep_catching_up)
            if self.applier.halted is not None:
                return  # `_hold` stands still (nothing is got)
        session = self._connected()
        if session is None or not self._landing_ready(writer):
            self.applier.flush()  # nothing more comes for now: commit a pipelined group
            self._stop.wait(self._wait_seconds(writer))
            return
        try:
            first = session.get(wait_seconds=self._wait_seconds(writer))
            if first is None:
                self._idle(writer)
                return
            started = time.perf_counter()
            group = self._gather(session, writer, first)
            gathered = time.perf_counter()
            self.recorder.got(len(group), gathered - started)
            crash_point("live.after_get")
            opened = self._clock()  # the batch's opening, if this group opens one
            landed = writer.land(group)
            self.recorder.landed(len(group), time.perf_counter() - gathered)
        except SourceUnavailable as error:
            self._source_down(error)
            return
        except OSError as error:
            self._backout(session)
            if self._landing_retry.failed(self._clock()):
                log.error(
                    "landing zone %s unavailable: %s; retrying", self.zone.catalog.root, error
                )
            return
        except BaseException:
            self._backout(session)
            raise
        if landed.part == 0:
            self._opened = _Opened(landed.batch_key, opened)
        crash_point("live.after_land")
        messages = _landed_messages(landed, group)
        self.recorder.group(messages, landed.batch_key)
        before, self._landed_to = self._landed_to, landed.last_position
        self.landed_messages += len(group)
        # A full group says more is waiting: a backlog (SIS_PRIORITY folds it in windows).
        backlog = len(group) >= self.config.group_max_messages
        # The landed part is what the store's position counts from, so the store may commit
        # before the queue does (module docstring): the queue's round trip is then not part of
        # the time to the store. The queue is committed whatever the fold did.
        try:
            # The fold's time is the apply's less the store commits within it (a pipelined
            # group's commit, and this one's).
            committing, applying = self.recorder.commit_seconds, time.perf_counter()
            self.applier.apply(messages, before, backlog=backlog)
            committed = self.recorder.commit_seconds - committing
            self.recorder.folded(time.perf_counter() - applying - committed)
            crash_point("live.before_queue_commit")
        finally:
            self._commit_queue(session)
        crash_point("live.after_queue_commit")
        self._seal_if_bound(writer)
        self._progress.group(len(group), self._landed_to, self.applier, self._clock())

    def _gather(
        self, session: QueueSession, writer: GroupWriter, first: ReceivedMessage
    ) -> list[Received]:
        """The group started by `first`: the messages available now, claimed together
        (`QueueSession.get_available`), up to the group's and the open batch's bounds; when
        none is, the group ends at once on a queue that knows (`knows_available`, the embedded
        queue), and on a broker after a get waiting the group wait for one. A message with
        none behind it when it is got is a group of its own at once: at the feed's rates
        nearly every message is, and the wait would only delay it; in a burst more are
        already on their way, and the group gathers them."""
        config = self.config
        open_batch = writer.open_batch
        held, size = (open_batch.messages, open_batch.bytes) if open_batch else (0, 0)
        room = min(config.group_max_messages, config.batch_max_messages - held)
        deadline = self._seal_deadline(writer)
        group: list[Received] = []
        arrived: list[ReceivedMessage] = [first]
        del first  # hold no body beyond the group's own reference
        while arrived:
            for message in arrived:
                if len(message.body) > config.message_limits.max_message_bytes:
                    group.append(move_aside(self.zone.writer, message))
                else:
                    group.append(message)
                    size += len(message.body)
            arrived.clear()
            if len(group) >= room or size >= config.batch_max_bytes:
                break
            if deadline is not None and self._clock() >= deadline:
                break
            arrived = session.get_available(room - len(group), config.batch_max_bytes - size)
            if arrived or session.knows_available or config.group_wait_seconds <= 0:
                continue
            if len(group) == 1:
                break  # a lone message
            waited = session.get(wait_seconds=config.group_wait_seconds)
            if waited is not None:
                arrived.append(waited)
        return group

    def _commit_queue(self, session: QueueSession) -> None:
        """Commit what was landed; a source failing here leaves the landed messages on the
        queue to come back as duplicates (invariant 2): the group stays applied."""
        try:
            started = time.perf_counter()
            session.commit()
            self.recorder.queue_committed(time.perf_counter() - started)
        except SourceUnavailable as error:
            self._source_down(error)

    def _idle(self, writer: GroupWriter) -> None:
        """No message within the wait: seal an open batch whose time is up, heartbeat, and a
        bounded step of merging sealed batches and of expiring old ones."""
        deadline = self._seal_deadline(writer)
        if deadline is not None and self._clock() >= deadline:
            self._seal(writer, ClosedBy.DRAINED)
        if self.applier.deferred:
            self.applier.catch_up(self._landed_to, self._keep_catching_up)
        self.applier.idle()
        if self._merger is not None:
            self._merger.turn()
        if self._expirer is not None and self.applier.checked_batch:
            self._expirer.turn(self.applier.checked_batch)

    def _seal_if_bound(self, writer: GroupWriter) -> None:
        open_batch = writer.open_batch
        if open_batch is None:
            return
        deadline = self._seal_deadline(writer)
        if open_batch.messages >= self.config.batch_max_messages:
            self._seal(writer, ClosedBy.MESSAGES)
        elif open_batch.bytes >= self.config.batch_max_bytes:
            self._seal(writer, ClosedBy.BYTES)
        elif deadline is not None and self._clock() >= deadline:
            self._seal(writer, ClosedBy.SECONDS)

    def _seal(self, writer: GroupWriter, closed_by: ClosedBy) -> None:
        try:
            batch = writer.seal(closed_by)
        except OSError as error:
            # The batch stays open; it is sealed once the zone is proved writable again (or by
            # the next start). Until then nothing more is got (`_landing_ready`).
            if self._landing_retry.failed(self._clock()):
                log.error(
                    "cannot seal the open batch in %s: %s; retrying", self.zone.catalog.root, error
                )
            return
        if batch is not None:
            if self._merger is not None:
                self._merger.sealed(batch.key)
            log.info(
                "sealed batch %s: %d message(s), %d bytes (%s)",
                batch.key,
                batch.messages,
                batch.bytes,
                closed_by,
                extra=concerning(batch=batch.key),
            )

    def _seal_deadline(self, writer: GroupWriter) -> float | None:
        """The monotonic time at which the open batch is max_seconds old (None: none open).
        Its age is counted on the monotonic clock from when this process opened it (or first
        saw it open): a wall clock stepped back would hold the batch open, and the lake's
        intake with it, for as long as the step."""
        open_batch = writer.open_batch
        if open_batch is None:
            return None
        if self._opened is None or self._opened.key != open_batch.key:
            # Not opened by this process's last land: its age from the wall clock, once,
            # bounded (a batch is open at least from now on, and at most max_seconds already).
            age = (datetime.now(UTC) - open_batch.opened_at).total_seconds()
            age = min(max(age, 0.0), self.config.batch_max_seconds)
            self._opened = _Opened(open_batch.key, self._clock() - age)
        return self._opened.at + self.config.batch_max_seconds

    def _wait_seconds(self, writer: GroupWriter) -> float:
        """How long the first get of a group may wait: until the next thing is due."""
        now = self._clock()
        due = [now + self.config.idle_wait_seconds, self._renew_at, self.applier.next_due()]
        deadline = self._seal_deadline(writer)
        if deadline is not None and not self._landing_retry.failing:
            due.append(deadline)  # while the zone fails, its retry is what is due instead
        for retry in (self._source_retry, self._landing_retry):
            if retry.failing:
                due.append(retry.due)
        return max(0.0, min(d for d in due if d > 0) - now)

    def _landing_ready(self, writer: GroupWriter) -> bool:
        """Whether a group may be got now: the zone has room for the largest group that may
        come (checked before every get), and after a landing failure it was proved writable
        again. A backout raises every message's backout count (intake/consumer.py), so a full disk
        pauses intake here, before the get, rather than backing groups out: nothing is got
        until space returns (logged once as an ERROR, checked with growing delays)."""
        now = self._clock()
        if self._landing_retry.failing and not self._landing_retry.ready(now):
            return False
        try:
            if self._landing_retry.failing:
                self.zone.writer.probe()
            self.zone.writer.ensure_room(self._group_bound(writer))
        except OSError as error:
            if self._landing_retry.failed(now):
                log.error(
                    "landing zone %s cannot take a group: %s; intake paused (nothing is got "
                    "from the queue), retrying with backoff up to %.0f s",
                    self.zone.catalog.root,
                    error,
                    self.config.retry_last_seconds,
                )
            else:
                log.debug("landing zone still unavailable: %s", error)
            return False
        if self._landing_retry.succeeded():
            log.warning("landing zone %s available again", self.zone.catalog.root)
        return True

    def _group_bound(self, writer: GroupWriter) -> int:
        """The most disk space the next group can take (`_gather`'s bounds): as many messages
        as the group and the open batch have room for, their bodies up to the open batch's
        remaining bytes plus the one body that may pass them (a larger one is moved aside,
        and a body over the queue's own get bound never arrives)."""
        config = self.config
        open_batch = writer.open_batch
        held, size = (open_batch.messages, open_batch.bytes) if open_batch else (0, 0)
        room = min(config.group_max_messages, config.batch_max_messages - held)
        bodies = max(0, config.batch_max_bytes - size) + config.message_limits.max_message_bytes
        return landing_bytes_bound(max(1, room), bodies)

    def _connected(self) -> QueueSession | None:
        if self._session is not None:
            return self._session
        if not self._source_retry.ready(self._clock()):
            return None
        try:
            self._session = self.source.connect()
        except SourceUnavailable as error:
            self._source_down(error)
            return None
        self.recorder.source_connected()
        if self._source_retry.succeeded():
            log.warning("queue available again: %s", self.source.description)
        return self._session

    def _source_down(self, error: SourceUnavailable) -> None:
        self.recorder.source_failed()
        self._close_session()
        if self._source_retry.failed(self._clock()):
            log.error(
                "queue unavailable (%s): %s; reconnecting with backoff up to %.0f s",
                self.source.description,
                error,
                self.config.retry_last_seconds,
            )

    def _backout(self, session: QueueSession) -> None:
        try:
            session.backout()
        except SourceUnavailable as error:
            self._source_down(error)  # the queue backs the unit out itself when it is lost

    def _close_session(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            try:
                session.close()
            except SourceUnavailable as error:
                log.debug("closing the queue session: %s", error)


def _landed_messages(landed: LandedGroup, group: list[Received]) -> list[LandedMessage]:
    """The group as the log now holds it, without reading it back: each message at its
    position, a moved-aside body as the log keeps it (empty, with its size and location)."""
    out = []
    for offset, entry in enumerate(group):
        position = LogPosition(landed.batch_seq, landed.first_msg_seq + offset)
        if isinstance(entry, MovedAside):
            received = entry.message
            logged = LoggedMessage(
                received.message_id,
                b"",
                received.delivery_count,
                entry.body.size,
                entry.body.location,
                batch_seq=landed.batch_seq,
            )
        else:
            received = entry
            logged = LoggedMessage(
                received.message_id,
                received.body,
                received.delivery_count,
                batch_seq=landed.batch_seq,
            )
        out.append(LandedMessage(position, logged, received.put_time))
    return out


class _Opened(NamedTuple):
    """The open batch's key and the monotonic time it was opened."""

    key: str
    at: float


class _Progress:
    """A log line at most every `seconds` while messages flow (never one per message)."""

    def __init__(self, now: float, seconds: float) -> None:
        self.seconds = seconds
        self.due = now + seconds
        self.groups = 0
        self.messages = 0

    def group(self, messages: int, landed: LogPosition, applier: Applier, now: float) -> None:
        self.groups += 1
        self.messages += messages
        if now < self.due:
            return
        log.info(
            "landed %d message(s) in %d group(s) since the last report; landed to %s, store at %s",
            self.messages,
            self.groups,
            landed,
            applier.applied,
        )
        self.due, self.groups, self.messages = now + self.seconds, 0, 0
