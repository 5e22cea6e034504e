"""sis-live's fold workers: processes that fold some masters of a long stretch beside sis-live.

Masters fold independently (sis_platform/domain/pipeline.py), so a catch-up stretch's masters can
be folded on several cores: sis-live folds the first share of them itself while each worker folds
a later share, and `fold_stretch` takes the workers' results as if it had folded those masters
itself (it puts everything back in feed order). The result is the same as one process's: the
same `fold_skipping` and `fold_master` under the same per-item budget. Only stretches of at
least `PARALLEL_MIN_ITEMS` items are shared; a live feed's small groups never leave the process
(a round trip to a worker would only add to their latency).

A worker is a spawned process (`SIS_LIVE_FOLD_WORKERS` of them) with its own `Guard`: its marker
is `<pid>.inflight` in sis-live's fold marker folder and its watchdog SIGKILLs the worker, not
sis-live, when an item overruns the budget. sis-live then reads that marker as it reads an
earlier process's at start (`LiveBudget.worker_died`), so the item ends `too-complex`, or the
master's death counts towards its quarantine, and the stretch is folded again. A fold that raises
in a worker comes back as its failure text and is counted as one in sis-live would be.
Quarantined masters are not shared (sis-live holds their items back itself).

A worker holds nothing between requests: each request carries its masters' states and items, and
the reply their `MasterFoldResult`s (documents are a few kilobytes; a 12,000-message stretch sends
and receives a few tens of megabytes). Requests are numbered and a reply names its request, so a
reply left unread (its stretch abandoned) is never taken for a later request's. A worker whose
parent dies sees its pipe close and exits.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

from sis_platform.domain.fold import (
    ItemKey,
    ItemSelector,
    MasterFoldResult,
    MasterState,
    PatchCache,
)
from sis_platform.domain.items import Item
from sis_platform.domain.limits import Limits
from sis_platform.domain.pipeline import MasterFolder
from sis_platform.domain.poison import failure_detail
from sis_platform.runtime.faults import InjectedFailure, injected_fold_failure
from sis_platform.runtime.guard import Guard, fold_watched

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

    from sis_platform.live.budget import LiveBudget

log = logging.getLogger(__name__)

# The fewest items a stretch has for its masters to be shared with the workers.
PARALLEL_MIN_ITEMS = 256
_READY = "ready"  # a worker's first message: it has imported everything and waits for work


@dataclass(frozen=True)
class WorkerSetup:
    """What every request of a worker's life shares: how to fold and its guard."""

    selector: ItemSelector | None
    limits: Limits
    marker_folder: str  # sis-live's fold marker folder (sis_platform/live/budget.py)
    budget_seconds: float


@dataclass(frozen=True)
class FoldTask:
    """One master to fold: its state before the stretch (None: none) and its items."""

    master_id: str
    state: MasterState | None
    items: list[Item]


@dataclass(frozen=True)
class Folded:
    """A worker's reply: every task's result, in the order given."""

    results: list[MasterFoldResult]


@dataclass(frozen=True)
class FoldFailed:
    """A worker's reply: the fold of `master_id` raised (`failure_detail`); the tasks after it
    were not folded."""

    master_id: str
    detail: str


@dataclass(frozen=True)
class WorkerDied:
    """A worker ended before replying (its watchdog, a crash, the OOM killer)."""

    pid: int


Reply = Folded | FoldFailed | WorkerDied


def split_shares(
    sizes: Mapping[str, int], shares: int, first: float | None = None
) -> list[list[str]]:
    """`sizes`' keys (masters in fold order, with their item counts) cut into at most `shares`
    consecutive runs; the first run is sis-live's own. The runs hold about equal items, or the
    first about `first` of them (a fraction) and the others equal parts of the rest."""
    total = sum(sizes.values())
    own = 1 / shares if first is None else first
    others = (1 - own) / (shares - 1) if shares > 1 else 0.0
    runs: list[list[str]] = [[]]
    done = 0
    for master_id, size in sizes.items():
        if runs[-1] and len(runs) < shares and done >= total * (own + others * (len(runs) - 1)):
            runs.append([])
        runs[-1].append(master_id)
        done += size
    return [run for run in runs if run]


class FoldWorkers:
    """`count` worker processes, started when first asked for (`ready`): only a backlog has
    stretches long enough to share, so a live feed never starts them. A worker that died is
    started again the same way. Until a worker has started (its imports take about a second),
    sis-live folds alone rather than wait for it."""

    def __init__(self, count: int, setup: WorkerSetup) -> None:
        if count < 1:
            raise ValueError(f"count must be at least 1, got {count}")
        self.count = count
        self.setup = setup
        self.shared = 0  # masters the workers have been sent (for tests and figures)
        self._context = multiprocessing.get_context("spawn")
        self._workers: list[_Worker | None] = [None] * count
        self._requests = 0  # requests sent, which numbers them

    def ready(self, wait_seconds: float = 0.0) -> bool:
        """Start the workers not running; whether every one has started (waiting up to
        `wait_seconds` for them)."""
        deadline = time.monotonic() + wait_seconds
        ready = True
        for index, worker in enumerate(self._workers):
            if worker is None or not worker.process.is_alive():
                if worker is not None:
                    worker.close()
                worker = self._workers[index] = self._start()
            if not worker.started:
                worker.started = self._started(worker, max(0.0, deadline - time.monotonic()))
                if worker.started:
                    log.info(
                        "fold worker %d of %d started (pid %s)",
                        index + 1,
                        self.count,
                        worker.process.pid,
                    )
                elif not worker.process.is_alive():
                    log.error("a fold worker (pid %s) exited while starting", worker.process.pid)
            ready = ready and worker.started
        return ready

    def _start(self) -> _Worker:
        ours, theirs = self._context.Pipe()
        process = self._context.Process(
            target=_serve, args=(theirs, self.setup), name="sis-live-fold-worker", daemon=True
        )
        process.start()
        theirs.close()
        return _Worker(process, ours)

    @staticmethod
    def _started(worker: _Worker, wait_seconds: float) -> bool:
        try:
            return worker.conn.poll(wait_seconds) and worker.conn.recv() == _READY
        except (OSError, EOFError):
            return False  # died while starting: `ready` starts another next time

    def fold(
        self, shares: list[list[FoldTask]], timed_out: Mapping[ItemKey, str]
    ) -> list[PendingFold]:
        """Send each share to a worker of its own (call when `ready`); the pending replies."""
        if len(shares) > self.count:
            raise ValueError(f"{len(shares)} shares for {self.count} workers")
        pending = []
        for index, tasks in enumerate(shares):
            worker = self._workers[index]
            if worker is None or not worker.started:
                raise RuntimeError(f"fold worker {index} has not started")
            self._requests += 1
            try:
                worker.conn.send((self._requests, tasks, dict(timed_out)))
            except (OSError, EOFError):
                pass  # it died meanwhile: its reply says so
            self.shared += len(tasks)
            pending.append(PendingFold(self, index, worker, self._requests))
        return pending

    def _died(self, index: int, worker: _Worker) -> WorkerDied:
        pid = worker.process.pid or 0
        worker.process.join(timeout=5)
        worker.close()
        if self._workers[index] is worker:
            self._workers[index] = None  # started again when next needed
        return WorkerDied(pid)

    def close(self) -> None:
        for index, worker in enumerate(self._workers):
            if worker is None:
                continue
            self._workers[index] = None
            try:
                worker.conn.send(None)
            except (OSError, EOFError):
                pass
            worker.process.join(timeout=5)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()
            worker.close()


@dataclass
class _Worker:
    process: BaseProcess
    conn: Connection
    started: bool = False  # it has said it is ready

    def close(self) -> None:
        self.conn.close()


class PendingFold:
    """A share sent to a worker; `reply` waits for it (bounded: the worker's watchdog ends any
    item that overruns its budget)."""

    def __init__(self, workers: FoldWorkers, index: int, worker: _Worker, request: int) -> None:
        self._workers = workers
        self._index = index
        self._worker = worker
        self._request = request
        self._reply: Reply | None = None

    def reply(self) -> Reply:
        """The worker's reply to this request (earlier requests' replies still in the pipe are
        dropped: their stretches were abandoned)."""
        while self._reply is None:
            try:
                request, reply = self._worker.conn.recv()
            except (OSError, EOFError):
                self._reply = self._workers._died(self._index, self._worker)
                break
            if request == self._request:
                self._reply = reply
            else:
                log.debug("dropped fold worker reply %d (waiting for %d)", request, self._request)
        return self._reply


def _serve(conn: Connection, setup: WorkerSetup) -> None:
    """A worker's life: fold each request's tasks until the pipe closes or None arrives.
    Ctrl-C in a terminal reaches the whole process group: sis-live decides when this ends."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    guard = Guard(setup.marker_folder, setup.budget_seconds)
    patches = PatchCache(setup.limits)
    injected = injected_fold_failure()
    try:
        conn.send(_READY)
        while True:
            try:
                request = conn.recv()
            except (OSError, EOFError):
                return  # sis-live is gone
            if request is None:
                return
            number, tasks, timed_out = request
            reply = _fold_tasks(tasks, timed_out, setup, guard, patches, injected)
            try:
                conn.send((number, reply))
            except OSError:
                return  # sis-live died while this worker folded
    finally:
        guard.close()
        try:
            os.unlink(os.path.join(setup.marker_folder, f"{os.getpid()}.inflight"))
        except OSError:
            pass


def _fold_tasks(
    tasks: list[FoldTask],
    timed_out: Mapping[ItemKey, str],
    setup: WorkerSetup,
    guard: Guard,
    patches: PatchCache,
    injected: InjectedFailure | None,
) -> Folded | FoldFailed:
    results = []
    for task in tasks:
        guard.start(task.master_id)
        try:
            results.append(
                fold_watched(
                    task.master_id,
                    task.state,
                    task.items,
                    guard=guard,
                    injected=injected,
                    timed_out=timed_out,
                    selector=setup.selector,
                    patches=patches,
                    limits=setup.limits,
                )
            )
        except Exception as error:
            return FoldFailed(task.master_id, failure_detail(error))
        finally:
            guard.done()
    return Folded(results)


class SharedFold:
    """The `MasterFolder` of one stretch whose later masters the workers fold (module
    docstring): `local` (the budget's folder) folds the first share and any quarantined
    master; a worker's master is taken from its reply, waited for when first needed. Call
    `close` whatever happens, so that no reply is left in a pipe for the next stretch."""

    def __init__(
        self,
        local: MasterFolder,
        budget: LiveBudget,
        workers: FoldWorkers,
        groups: Mapping[str, list[Item]],
        state_of: Callable[[str], MasterState | None],
        own_share: float | None = None,
    ) -> None:
        self._local = local
        self._budget = budget
        sizes = {m: len(items) for m, items in groups.items() if not budget.held(m)}
        own, *shares = split_shares(sizes, workers.count + 1, own_share) or [[]]
        self._own = [(m, state_of(m), groups[m]) for m in own]
        tasks = [[FoldTask(m, state_of(m), groups[m]) for m in share] for share in shares]
        self._share_of = {m: index for index, share in enumerate(shares) for m in share}
        self._pending = workers.fold(tasks, budget.failures.timed_out_items)
        self._results: dict[str, MasterFoldResult] = {}
        self._taken: set[int] = set()

    def fold_own(self) -> None:
        """Fold sis-live's own share now, while the workers fold theirs (a pipelined group,
        sis_platform/live/applier.py, is completed later: meanwhile sis-live lands the next)."""
        own, self._own = self._own, []
        for master_id, state, items in own:
            self._results[master_id] = self._local(master_id, state, items)

    def __call__(
        self, master_id: str, state: MasterState | None, items: list[Item]
    ) -> MasterFoldResult:
        folded = self._results.get(master_id)
        if folded is not None:
            return folded
        share = self._share_of.get(master_id)
        if share is None:
            return self._local(master_id, state, items)
        if share not in self._taken:
            self._take(share)
        return self._results[master_id]

    def _take(self, share: int) -> None:
        self._taken.add(share)
        reply = self._pending[share].reply()
        if isinstance(reply, Folded):
            for result in reply.results:
                self._results[result.state.master_id] = result
            return
        if isinstance(reply, FoldFailed):
            self._budget.fold_failed(reply.master_id, reply.detail)
            raise WorkerFoldError(
                f"the fold of master {reply.master_id} failed: {reply.detail}",
                master_id=reply.master_id,
            )
        self._budget.worker_died(reply.pid)
        raise WorkerFoldError(f"fold worker {reply.pid} died; the stretch is folded again")

    def close(self) -> None:
        """Take every reply not yet taken (the stretch failed before it needed them); a death
        among them is still read from its marker."""
        for share, pending in enumerate(self._pending):
            if share in self._taken:
                continue
            self._taken.add(share)
            reply = pending.reply()
            if isinstance(reply, WorkerDied):
                self._budget.worker_died(reply.pid)


class WorkerFoldError(RuntimeError):
    """A worker's fold of the stretch failed or the worker died: the stretch is not committed
    and is folded again (what the failure taught is already recorded). `master_id`: the master
    whose fold failed (None: a worker died), for the log line that reports it."""

    def __init__(self, text: str, *, master_id: str | None = None) -> None:
        super().__init__(text)
        self.master_id = master_id
