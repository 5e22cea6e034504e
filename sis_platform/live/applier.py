"""The store side of sis-live: folding landed messages into the serving store, exactly once.

The live path's stages after the land (docs/live.md, "The stages") run here in order: classify
(`classify.py`), fold (`fold.py`), commit (`_commit`: one store transaction). `apply` takes a
group just landed through them (`_pipeline`, or `_commit_stretch` with a priority), and
`catch_up` a stretch of the landing zone at a time (`_commit_stretch`).

The store holds the log position it has applied, committed in the same transaction as the
group's results (`ServingWriter.commit`). The applier folds a group landed right after that
position straight from memory; anything else (the first start, a restart after a crash, the
store back after an outage) is caught up from the landing zone: `landed_after(store position)`
in chunks, each committed with its position. So a crash anywhere leaves the store at a position
it committed whole, and the next start refolds exactly what follows it (docs/design.md,
invariants 2 and 7).

With a priority (`SIS_PRIORITY`, sis_platform/domain/priority.py) a stretch is committed in parts:
the masters of each priority class ahead of the rest (`Fold.parts`), the store recording
them as ahead of its position until the stretch's last part moves it. A stretch cut short by a
crash between parts is refolded whole without the masters already ahead. While the queue has a
backlog (groups arrive full), landed groups are left to the catch-up until `priority_window`
messages wait, so that priority masters go ahead across that many messages, not one group.

A store beyond the landing zone's last message (the landing put back to an earlier copy, a
replica promoted, while the store kept its state), or behind the batches the landing zone has
expired (a store restored from an old backup: sis_platform/log/landing/expiry.py), stops
everything instead: new messages would
land at positions the store has passed and never be applied. The applier records the halt in
the store (`StoreStatus.halt`, which the live_store_fresh check reports as an ERROR), logs it
once as an ERROR, folds nothing, and `halted` tells the service to get nothing from the queue;
it checks again with growing delays, and clears the halt once the landing reaches the store's
position again (the landing put right, or the store rebuilt from it).

A store outage (`ServingUnavailable`) never stops intake: the applier logs it once, drops the
connection and its master cache (a commit whose acknowledgement was lost may have happened),
retries with growing delays, and catches up when the store is back.

A group long enough for the fold workers (a backlog's full groups) is pipelined: its fold is
launched (the workers' shares sent, sis-live's own small share folded) and `apply` returns, so
that sis-live lands and classifies the next group while the workers fold; that next `apply`
completes and commits it first. Anything else the applier does completes it first too: a
catch-up, `idle` (no next group came), `flush` (a planned stop). Until then the store is one
group behind the landed log, which a restart refolds as after any crash; a group abandoned
(the lease lost, a failure) is refolded the same way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, NamedTuple

from sis_platform.live.budget import BudgetConfig, LiveBudget
from sis_platform.live.classify import Classify
from sis_platform.live.config import LiveConfig, Retry
from sis_platform.live.fold import Fold, LaunchedFold
from sis_platform.live.metrics import LiveRecorder
from sis_platform.live.workers import FoldWorkers, WorkerFoldError
from sis_platform.log.landing import (
    START_POSITION,
    Catalog,
    LandedMessage,
    LogPosition,
    batch_key,
)
from sis_platform.log.landing.expiry import LogExpired, reading_from
from sis_platform.runtime.faults import LIVE_BETWEEN_PARTS, crash_point
from sis_platform.runtime.logs import concerning
from sis_platform.serving.records import (
    STORE_BEYOND_LANDING,
    GroupCommit,
    LakeProgress,
    ServingUnavailable,
)

if TYPE_CHECKING:
    from sis_platform.serving import ServingWriter

log = logging.getLogger(__name__)

# sis-live's own share of a pipelined group's fold (the workers fold the rest): it also gets,
# lands and classifies the next group, and completes and commits each group. Over a
# 120,000-message backlog on 2 cores with one worker, a tenth left sis-live a little the busier
# process, and none made the worker the busier one, which then waits between groups for
# sis-live to launch the next ("Pipelined groups" in git show 8720fd4:BENCHMARKS.md).
PIPELINED_OWN_SHARE = 0.1


class Applier:
    """Keeps the serving store at the landing zone's last position (see the module docstring).
    `open_writer` opens the store (raises ServingUnavailable); the applier owns what it opens."""

    def __init__(
        self,
        catalog: Catalog,
        open_writer: Callable[[], ServingWriter],
        config: LiveConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        budget: BudgetConfig | None = None,
        metrics: LiveRecorder | None = None,
    ) -> None:
        self.catalog = catalog
        self._metrics = metrics if metrics is not None else LiveRecorder()
        self.config = config
        self._open_writer = open_writer
        self._clock = clock
        # The store as opened, with the classify and fold stages that read it (None: closed).
        self._stages: _Stages | None = None
        # The per-item budget (None: unguarded, e.g. a fold in a test's own thread); opened
        # with the first fold, which is when the markers of an earlier process are read.
        self._budget_config = budget
        self._budget: LiveBudget | None = None
        # Started with the budget when config.fold_workers asks for them.
        self._workers: FoldWorkers | None = None
        self._retry = Retry(config.retry_first_seconds, config.retry_last_seconds)
        # The store's position as last read or committed by this process (None: not known).
        self.applied: LogPosition | None = None
        # Masters the store holds as committed ahead of its position, and to where.
        self._ahead: dict[str, LogPosition] = {}
        # Messages landed in a backlog and left for the catch-up (SIS_PRIORITY's window).
        self.deferred = 0
        self._heartbeat_due = 0.0
        self._prune_due = 0.0
        # The store's live == lake gate as last read (with each prune look): how far landed
        # batches may be expired (sis_platform/log/landing/expiry.py); 0: not read yet.
        self.checked_batch = 0
        # A pipelined group: launched, to be completed and committed (module docstring).
        self._launched: LaunchedFold | None = None
        self.messages = 0  # messages committed to the store by this process
        # Why nothing may be applied or got now (the store beyond the landing), or None.
        self.halted: str | None = None
        # Whether a halt recorded in the store was looked for since the store was opened.
        self._halt_checked = False
        self.pipelined = 0  # groups of them committed during the next group's `apply`

    @property
    def available(self) -> bool:
        return self._stages is not None

    @property
    def in_flight(self) -> bool:
        """Whether a pipelined group waits to be committed (module docstring)."""
        return self._launched is not None

    def next_due(self) -> float:
        """The monotonic time of the applier's next own action (a retry, completing a
        pipelined group, or a heartbeat); 0: none."""
        if self._retry.failing:
            return self._retry.due
        if self._launched is not None:
            return self._clock()  # now: a group is waiting to be committed
        return self._heartbeat_due if self._stages is not None else 0.0

    @property
    def _applying_to(self) -> LogPosition | None:
        """Where the store is once the pipelined group, if any, is committed."""
        return self._launched.end if self._launched is not None else self.applied

    def behind(self, landed: LogPosition) -> bool:
        """Whether the store must catch up to `landed` before the next group (not when the
        messages after it are left to a backlog's catch-up)."""
        return self._stages is None or (self._applying_to != landed and not self.deferred)

    def apply(
        self, messages: Sequence[LandedMessage], before: LogPosition, *, backlog: bool = False
    ) -> None:
        """`messages` were just landed right after `before`: fold and commit them, or catch up
        when the store is not at `before`. `backlog`: more messages are waiting on the queue
        (with a priority, the group is left for the catch-up while the window has room)."""
        window = self.config.priority_window
        if self.config.fold.priority is not None and backlog and self._stages is not None:
            if self.deferred + len(messages) < window and self.applied is not None:
                self.deferred += len(messages)
                return
        if self._stages is None or self._applying_to != before or self._ahead:
            self.catch_up(messages[-1].position)
            return
        if self.config.fold.priority is None:
            self._attempt(lambda: self._pipeline(messages))
        else:
            self._attempt(lambda: self._commit_stretch(messages, prioritize=False))

    def _attempt(self, action: Callable[[], None]) -> None:
        """Run `action` (a fold and commit), turning its failure into the applier's retry."""
        try:
            action()
        except ServingUnavailable as error:
            self._unavailable(error)
        except Exception as error:
            self._failed(error)

    def _pipeline(self, messages: Sequence[LandedMessage]) -> None:
        """The stages for a group just landed: classify `messages` (while the workers fold the
        group before them, if any), fold (complete that one, launch this one), commit (that
        one, while the workers fold this one). `messages` are committed now unless workers
        fold part of them (then they wait for the next `apply`)."""
        stages = self._connected()
        pending, self._launched = self._launched, None
        seen = pending.classified.copies if pending is not None else None
        classified = stages.classify(messages, also_seen=seen)
        previous = stages.fold.complete(pending) if pending is not None else None
        launched = stages.fold.launch(classified, own_share=PIPELINED_OWN_SHARE)
        if launched.with_workers:
            self._launched = launched
            self.pipelined += 1
        if pending is not None and previous is not None:
            self._commit(stages.store, previous, pending.classified.messages)
        if not launched.with_workers:
            self._commit(stages.store, stages.fold.complete(launched), messages)

    def catch_up(self, landed: LogPosition, keep_going: Callable[[], bool] = lambda: True) -> None:
        """Bring the store to `landed` (the landing zone's last position) from its own position,
        if the store is reachable now (or due for a retry). `keep_going` is asked between
        chunks (a long catch-up must renew the lease and see a stop request); False ends it
        there, the store at the last chunk committed."""
        if not self._retry.ready(self._clock()):
            return
        try:
            self._complete()
            store = self._connected().store
            position = store.position()
            beyond = self._beyond_landing(store, position, landed)
            if beyond is not None:
                self._halt(store, beyond)
                return
            self._resume(store)
            caught_up = 0
            self.deferred = 0
            for chunk in _stretches(
                self.catalog.landed_after(position, self.config.message_limits),
                self.config.longest_stretch,
                self._ahead.values(),
            ):
                self._commit_stretch(chunk, prioritize=True)
                caught_up += len(chunk)
                if not keep_going():
                    break
            self.applied = position if not caught_up else self.applied
        except ServingUnavailable as error:
            self._unavailable(error)
            return
        except Exception as error:
            self._failed(error)
            return
        if self._retry.succeeded():
            log.warning("serving store available again: caught up %d message(s)", caught_up)
        elif caught_up:
            log.info("caught up %d landed message(s) into the serving store", caught_up)

    def _beyond_landing(
        self, store: ServingWriter, position: LogPosition, landed: LogPosition
    ) -> str | None:
        """Why the store's position is not a place in this landing log, or None: the position
        must be within the log, and the message there the one the store applied (a landing
        rolled back and landed past the position again holds another one). One row of the
        store and the landing file holding the position are read."""
        until = (
            "nothing is got from the queue or applied until the landing reaches the store's "
            "position again or the store is rebuilt from it"
        )
        try:
            reading_from(self.catalog, position)
        except LogExpired as error:
            return f"{error}: {until}"
        if position > landed:
            return (
                f"the serving store is at {position}, beyond the landing zone's last message "
                f"{landed} (the landing rolled back under the store, or the store belongs to "
                f"another landing zone): {until}"
            )
        applied = store.message_at(position) if position != START_POSITION else None
        if applied is None or not self.catalog.batch_files(batch_key(position.batch_seq)):
            return None  # nothing to compare (a position before any outcome, a batch removed)
        before = LogPosition(position.batch_seq, position.msg_seq - 1)
        first = next(iter(self.catalog.landed_after(before, self.config.message_limits)), None)
        there = first.message.message_id if first and first.position == position else None
        if there == applied:
            return None
        return (
            f"the landing zone's message at {position} ({there or 'none'}) differs from the "
            f"one the store applied there ({applied}): the landing rolled back under the store "
            f"and was landed again past its position, and catching up from there would skip "
            f"what was landed after the rollback: {until}"
        )

    def _halt(self, store: ServingWriter, detail: str) -> None:
        """The store is beyond the landing (`detail`): record and log it, fold nothing, check
        again later (module docstring). Raises ServingUnavailable when it cannot be
        recorded."""
        # Halted before the store is told: if recording it fails (an outage), intake must
        # stop all the same.
        if self.halted is None:
            log.error("halted: %s", detail)
        self.halted = detail
        self._retry.failed(self._clock())
        store.halt(STORE_BEYOND_LANDING, detail)

    def _resume(self, store: ServingWriter) -> None:
        """The store is not beyond the landing: clear a halt recorded earlier, if any."""
        if self.halted is None and self._halt_checked:
            return
        cleared = store.clear_halt()
        self._halt_checked = True
        if cleared is not None or self.halted is not None:
            log.warning(
                "the landing zone reaches the serving store's position again: halt since "
                "%s cleared, going on",
                cleared.raised_at.isoformat() if cleared is not None else "this start",
            )
            self._retry.succeeded()  # the retries were the halt's, not an outage's
        self.halted = None

    def idle(self) -> None:
        """Nothing arrived: commit a pipelined group, heartbeat the store when due, or retry
        it when it was down; then prune a chunk of the store's history when due."""
        self.flush()
        now = self._clock()
        if self._retry.failing or self._stages is None:
            return  # the service catches up (which retries) when due
        store = self._stages.store
        try:
            if now >= self._heartbeat_due:
                self._heartbeat_due = now + self.config.heartbeat_seconds
                store.heartbeat()
            if now >= self._prune_due:
                self._prune(store, now)
                self.checked_batch = store.retention().checked_batch
        except ServingUnavailable as error:
            self._unavailable(error)

    def lake_progress(self) -> LakeProgress | None:
        """The lake's progress as the fold last recorded it in the store (None: never
        recorded, or the store unavailable now). An outage seen here is left to the next
        commit or idle turn to handle, so a pipelined group is never abandoned for it."""
        if self._retry.failing or self._stages is None:
            return None
        try:
            return self._stages.store.lake_progress()
        except ServingUnavailable as error:
            log.debug("the lake's progress not read: %s", error)
            return None

    def _prune(self, store: ServingWriter, now: float) -> None:
        """One bounded prune step (ServingWriter.prune): again at the next idle turn while
        history is left to prune, else after `prune_seconds`."""
        pruned = store.prune(self.config.serving_history, dedup=self.config.fold.window)
        self._prune_due = now if pruned.more else now + self.config.prune_seconds
        if pruned.changes or pruned.dead_letters or pruned.outcomes:
            log.debug(
                "serving store history pruned: %d change(s), %d dead letter(s), %d outcome(s)",
                pruned.changes,
                pruned.dead_letters,
                pruned.outcomes,
            )

    def flush(self) -> None:
        """Complete and commit a pipelined group now (nothing more follows it for a while: an
        idle queue, a planned stop)."""
        if self._launched is not None:
            self._attempt(self._complete)

    def abandon(self) -> None:
        """Forget a pipelined group without committing it (the lease is lost: the next holder
        refolds it from the log)."""
        launched, self._launched = self._launched, None
        if launched is not None:
            launched.abandon()

    def close(self) -> None:
        self.abandon()
        stages, self._stages = self._stages, None
        budget, self._budget = self._budget, None
        workers, self._workers = self._workers, None
        if workers is not None:
            workers.close()
        if budget is not None:
            budget.close()
        if stages is not None:
            stages.store.close()

    def _connected(self) -> _Stages:
        """The store and the stages that read it, opened if closed (raises
        ServingUnavailable)."""
        if self._stages is None:
            if self._budget is None and self._budget_config is not None:
                self._budget = LiveBudget.open(self._budget_config)
            if self._workers is None and self._budget is not None and self.config.fold_workers:
                options = self.config.fold
                setup = self._budget.worker_setup(selector=options.selector, limits=options.limits)
                self._workers = FoldWorkers(self.config.fold_workers, setup)
            store = self._open_writer()
            options = self.config.fold
            self._stages = _Stages(
                store,
                Classify(store, options, self._budget),
                Fold(store, options, self._budget, self._workers),
            )
            self.applied = None
            self._halt_checked = False
            self._ahead = store.ahead()
            if self._ahead:
                log.warning(
                    "%d master(s) were committed ahead of the store's position by an "
                    "interrupted stretch; refolding it without them",
                    len(self._ahead),
                )
        return self._stages

    def _complete(self) -> None:
        """Commit the pipelined group, if any (raises as `_commit_stretch`)."""
        launched, self._launched = self._launched, None
        if launched is not None:
            stages = self._connected()
            commit = stages.fold.complete(launched)
            self._commit(stages.store, commit, launched.classified.messages)

    def _commit(
        self,
        store: ServingWriter,
        commit: GroupCommit,
        messages: Sequence[LandedMessage] | None = None,
    ) -> None:
        """The commit stage: one store transaction, timed and counted
        (sis_platform/live/metrics.py). `messages`: the stretch it completes, now visible to
        readers (None: a part ahead of the position)."""
        started = time.perf_counter()
        store.commit(commit)
        self._metrics.committed(commit, time.perf_counter() - started)
        if messages is not None:
            self._metrics.visible(messages)
            self.applied = messages[-1].position
            self.messages += len(messages)
            self._heartbeat_due = self._clock() + self.config.heartbeat_seconds

    def _commit_stretch(self, messages: Sequence[LandedMessage], *, prioritize: bool) -> None:
        """Fold `messages` (the log right after the store's position) and commit them, in parts
        if `prioritize` (a catch-up; a group just landed commits at once in one part, which is
        as soon as any part of it could); raises ServingUnavailable, after which the connection
        is dropped (`_unavailable`)."""
        stages = self._connected()
        end = messages[-1].position
        ahead = [master_id for master_id, to in self._ahead.items() if to >= end]
        classified = stages.classify(messages, ahead=ahead)
        for part in stages.fold.parts(classified, prioritize=prioritize):
            if part.ahead:
                self._commit(stages.store, part)
                self._ahead.update(dict.fromkeys(part.ahead, end))
                crash_point(LIVE_BETWEEN_PARTS)
            else:
                self._commit(stages.store, part, messages)
        self._ahead = {master_id: to for master_id, to in self._ahead.items() if to > end}

    def _unavailable(self, error: ServingUnavailable) -> None:
        if self._retry.failed(self._clock()):
            log.error(
                "serving store unavailable: %s; landing goes on, the store catches up when it "
                "is back (retrying with backoff up to %.0f s)",
                error,
                self.config.retry_last_seconds,
            )
        else:
            log.debug("serving store still unavailable: %s", error)
        self._drop()

    def _failed(self, error: Exception) -> None:
        """Folding or committing failed otherwise (a bug, a second writer's PositionConflict,
        memory): the store stays at its position and is retried like an outage, so that
        landing, which the lake needs, goes on instead of the process failing in a loop on the
        same message. The store's lag shows it (Dagster's live_store_fresh check)."""
        if self._retry.failed(self._clock()):
            # A fold worker's failure carries its own story (the budget logged which master
            # or item); sis-live's side of it is no traceback worth reading.
            log.error(
                "cannot apply landed messages to the serving store: %s; landing goes on, the "
                "store is retried with backoff up to %.0f s",
                error,
                self.config.retry_last_seconds,
                exc_info=not isinstance(error, WorkerFoldError),
                extra=concerning(
                    master_id=error.master_id if isinstance(error, WorkerFoldError) else None
                ),
            )
        else:
            log.debug("applying to the serving store failed again: %s", error)
        self._drop()

    def _drop(self) -> None:
        """Forget the connection, its master cache and a pipelined group: the next try starts
        from the store."""
        self.abandon()
        stages, self._stages = self._stages, None
        self.applied = None
        if stages is not None:
            try:
                stages.store.close()
            except ServingUnavailable:
                pass  # already broken: nothing of it is needed any more


class _Stages(NamedTuple):
    """The serving store as opened, with the classify and fold stages that read it (dropped
    together: the fold's cache is only as good as the connection it was read through)."""

    store: ServingWriter
    classify: Classify
    fold: Fold


def _stretches(
    messages: Iterator[LandedMessage], size: int, ends: Iterable[LogPosition] = ()
) -> Iterator[list[LandedMessage]]:
    """`messages` in stretches of at most `size`, none running across one of `ends` (where a
    stretch committed in parts ended: the masters ahead are skipped up to there only)."""
    stops = set(ends)
    chunk: list[LandedMessage] = []
    for message in messages:
        chunk.append(message)
        if len(chunk) >= size or message.position in stops:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
