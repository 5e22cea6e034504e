"""The guard around per-item work: an in-flight marker and a wall-clock watchdog per process,
and the reading of markers a dead process left. Used by Spark's Python workers (the fold's
masters, message_items' messages) and by sis-live, which folds in its own process; no Spark or
Dagster import.

Working side (`Guard`): before working on a key (a master id, a message id) the process writes
it to a marker file named after its pid; it clears the file when done. A process that dies
mid-item (a segfault, the OOM killer, SIGKILL) so leaves the key behind, structured, for the
next attempt to read: no error text is ever searched for it. Each item is armed with a deadline
(`Limits.item_budget_seconds`); the watchdog, one daemon thread per process, waits for the
deadline and, if the same item is still armed, writes a `timeout` record naming the key and the
item to the marker and SIGKILLs its own process. A SIGKILL, not an exception: the work may be
inside C code (lxml) that no Python exception interrupts.

The watchdog needs the GIL to run. lxml releases it while it parses and evaluates XPath, and
Python code yields it every switch interval; C code that holds it without end (a catastrophic
`re` pattern) is beyond this guard. Arming an item costs a lock and a clock read, no wake-up:
the thread sleeps until the deadline of the item it last saw and, finding a later one, sleeps
again.

Reading side (`InFlightFolder`): the lake gives each guarded Spark job a folder of its own,
read by the driver after the job fails and removed after the job. Markers need a file system
the driver and the workers share (a local lake, a shared mount); on object storage there is no
folder, a worker that dies is not attributed, and its job fails as a transient failure would.
sis-live keeps one private folder and reads it when it starts (sis_platform/live/budget.py).
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import signal
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, overload

from sis_platform.domain.fold import (
    ItemKey,
    ItemSelector,
    MasterFoldResult,
    MasterState,
    PatchCache,
    fold_master,
    fold_skipping,
)
from sis_platform.domain.items import Item
from sis_platform.domain.limits import Limits
from sis_platform.domain.pipeline import DeadLetter, LoggedMessage, classify_message
from sis_platform.domain.poison import Held, classify_error_detail
from sis_platform.domain.reasons import Reason
from sis_platform.runtime.faults import InjectedFailure, fail_as_injected

RUNNING = "running"
TIMEOUT = "timeout"


@dataclass(frozen=True)
class InFlightRecord:
    """What a process left in its marker: the key it was on and, for a timeout, the item."""

    key: str  # master id (fold) or message id (message_items)
    state: str  # RUNNING: the process died on it; TIMEOUT: the watchdog killed it
    message_id: str | None = None
    position: int | None = None
    budget_seconds: float | None = None

    def to_json(self) -> str:
        if self.state == RUNNING:  # written per key (per message in message_items): the short way
            return f'{{"key": {json.dumps(self.key)}, "state": "{RUNNING}"}}'
        return json.dumps(
            {
                "key": self.key,
                "state": self.state,
                "message_id": self.message_id,
                "position": self.position,
                "budget_seconds": self.budget_seconds,
            }
        )

    @staticmethod
    def from_json(text: str) -> InFlightRecord:
        data = json.loads(text)
        position = data.get("position")
        budget = data.get("budget_seconds")
        return InFlightRecord(
            key=str(data["key"]),
            state=str(data["state"]),
            message_id=None if data.get("message_id") is None else str(data["message_id"]),
            position=None if position is None else int(position),
            budget_seconds=None if budget is None else float(budget),
        )


@dataclass(frozen=True)
class _Armed:
    deadline: float  # time.monotonic()
    guard: Guard
    key: str
    message_id: str
    position: int | None


class _Watchdog:
    """One daemon thread per process: kills the process when an armed item overruns."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self._armed: _Armed | None = None
        self._idle = True
        threading.Thread(target=self._run, name="sis-item-watchdog", daemon=True).start()

    def arm(self, armed: _Armed | None) -> None:
        with self.lock:
            self._armed = armed
            if armed is not None and self._idle:
                self.lock.notify()

    def _run(self) -> None:
        with self.lock:
            while True:
                armed = self._armed
                if armed is None:
                    self._idle = True
                    self.lock.wait()
                    self._idle = False
                    continue
                remaining = armed.deadline - time.monotonic()
                if remaining > 0:
                    self.lock.wait(remaining)
                    continue
                # Still the same item past its deadline (under the lock: the work cannot
                # move on meanwhile): leave the item in the marker, then die.
                armed.guard.write(
                    InFlightRecord(
                        armed.key,
                        TIMEOUT,
                        armed.message_id,
                        armed.position,
                        armed.guard.budget_seconds,
                    )
                )
                os.kill(os.getpid(), signal.SIGKILL)


class _ProcessWatchdog(NamedTuple):
    """The watchdog of the process `pid`: a forked child makes its own."""

    pid: int
    watchdog: _Watchdog


_WATCHDOG: _ProcessWatchdog | None = None


def _watchdog() -> _Watchdog:
    global _WATCHDOG
    if _WATCHDOG is None or _WATCHDOG.pid != os.getpid():
        _WATCHDOG = _ProcessWatchdog(os.getpid(), _Watchdog())
    return _WATCHDOG.watchdog


class Guard:
    """A process's marker and watchdog for one run of work (a Spark partition; sis-live's
    lifetime). `folder` None (object storage): no
    marker, the watchdog still bounds each item.

    The marker file is memory-mapped (shared) for the partition: marking a key is a copy into
    the page cache, no system call (a write per key measured ~25 us, which message_items pays
    per message), and the kernel keeps the page when the process dies. Its record is padded
    with spaces over whatever a longer record left; the file's unused tail is NUL bytes."""

    def __init__(self, folder: str | None, budget_seconds: float) -> None:
        self.budget_seconds = budget_seconds
        self._watchdog = _watchdog()
        self._key: str | None = None
        self._marker = _Marker(os.path.join(folder, f"{os.getpid()}.inflight")) if folder else None

    def start(self, key: str) -> None:
        """Work on `key` begins: it is in the marker until `done`."""
        self._key = key
        self.write(InFlightRecord(key, RUNNING))

    def item(self, message_id: str, position: int | None) -> None:
        """An item of the current key begins: it has `budget_seconds` from now (the previous
        item, if any, is done)."""
        assert self._key is not None, "item() outside start()/done()"
        self._watchdog.arm(
            _Armed(time.monotonic() + self.budget_seconds, self, self._key, message_id, position)
        )

    def done(self) -> None:
        """Work on the current key ended (in a result or a failure row): disarm, clear."""
        self._watchdog.arm(None)
        self._key = None
        self.write(None)

    def write(self, record: InFlightRecord | None) -> None:
        if self._marker is None:
            return
        with self._watchdog.lock:
            self._marker.store(b"" if record is None else record.to_json().encode("utf-8"))

    def close(self) -> None:
        self._watchdog.arm(None)
        if self._marker is not None:
            self._marker.close()


class _Marker:
    """One marker file, mapped shared into memory (see `Guard`)."""

    _PAGE = 4096

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        self._map: mmap.mmap | None = None
        self._used = 0
        self._grow(self._PAGE)

    def _grow(self, size: int) -> None:
        if self._map is not None:
            self._map.close()
        os.ftruncate(self._fd, size)
        self._map = mmap.mmap(self._fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)

    def store(self, data: bytes) -> None:
        assert self._map is not None
        if len(data) > len(self._map):
            self._grow(-(-len(data) // self._PAGE) * self._PAGE)
            assert self._map is not None
        self._map[: len(data)] = data
        if self._used > len(data):
            self._map[len(data) : self._used] = b" " * (self._used - len(data))
        self._used = len(data)

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
        os.close(self._fd)


def read_marker(path: str) -> InFlightRecord | None:
    """The record one marker file holds; None when it is empty (the process was between keys)
    or was cut short by the death itself (between truncate and write): no fact to use."""
    with open(path, "rb") as f:
        text = f.read().strip(b" \x00").decode("utf-8", "replace")
    if not text:
        return None
    try:
        return InFlightRecord.from_json(text)
    except (ValueError, KeyError):
        return None


@dataclass(frozen=True)
class InFlightFolder:
    """The reading side: where guarded processes leave their markers (one Spark job's
    workers, or sis-live)."""

    path: str | None  # None: object storage, no markers

    @staticmethod
    def create(base_path: str, job: str) -> InFlightFolder:
        """A new, empty folder for one attempt of `job` under the lake at `base_path` (every
        attempt its own: a fold and several message_items runs may be in flight at once)."""
        base = base_path.removeprefix("file:")
        if "://" in base:
            return InFlightFolder(None)
        path = os.path.join(base, "_inflight", f"{job}-{uuid.uuid4().hex}")
        os.makedirs(path)
        return InFlightFolder(path)

    def records(self) -> list[InFlightRecord]:
        """The keys processes were on when they died, one record per marker left non-empty."""
        if self.path is None:
            return []
        found: list[InFlightRecord] = []
        for name in sorted(os.listdir(self.path)):
            record = read_marker(os.path.join(self.path, name))
            if record is not None:
                found.append(record)
        return found

    def remove(self) -> None:
        if self.path is not None:
            shutil.rmtree(self.path, ignore_errors=True)


class WatchedItems(Sequence[Item]):
    """A master's items as `fold_master` takes them: it iterates them once, in order, so taking
    an item is where that item's budget starts (and the previous item's ends). The injected
    test failure (sis_platform.runtime.faults) strikes there too, inside the fold of its item."""

    def __init__(self, items: list[Item], guard: Guard, injected: InjectedFailure | None) -> None:
        self._items = items
        self._guard = guard
        self._injected = injected

    def __iter__(self) -> Iterator[Item]:
        for item in self._items:
            self._guard.item(item.message_id, item.position)
            if self._injected is not None and self._injected.target in (
                item.master_id,
                item.message_id,
            ):
                fail_as_injected(self._injected.how, quoting=item.payload)
            yield item

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, index: int) -> Item: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Item]: ...
    def __getitem__(self, index: int | slice) -> Item | Sequence[Item]:
        return self._items[index]


def fold_watched(
    master_id: str,
    state: MasterState | None,
    items: list[Item],
    *,
    guard: Guard,
    injected: InjectedFailure | None,
    timed_out: Mapping[ItemKey, str],
    selector: ItemSelector | None,
    patches: PatchCache,
    limits: Limits,
) -> MasterFoldResult:
    """`fold_master` over a master's items, each under `guard`'s budget (`WatchedItems`); an
    item that overran the budget in an earlier attempt (`timed_out`) is dead-lettered
    `too-complex` without being folded (`fold_skipping`). The one guarded fold of the lake's
    Python workers, sis-live and sis-live's fold workers; the caller marks the master
    (`guard.start`/`done`) and decides what a raise means."""

    def fold(current: MasterState, part: list[Item]) -> MasterFoldResult:
        return fold_master(
            master_id,
            current,
            WatchedItems(part, guard, injected),
            selector=selector,
            patches=patches,
            limits=limits,
        )

    return fold_skipping(master_id, state, items, timed_out, fold)


def classify_watched(
    message: LoggedMessage,
    *,
    guard: Guard,
    injected: InjectedFailure | None,
    limits: Limits,
    redelivery_limit: int,
) -> list[Item] | DeadLetter | Held:
    """`classify_message` under `guard`: in the marker and on the budget while it runs. The
    one guarded classification of the lake's Python workers (message_items) and sis-live. An
    exception it raises holds the message back `quarantined` (classification is a pure
    function of the message: another attempt would raise again); a MemoryError may be the
    process's, not the message's, so it is raised, the marker left to count it if the process
    dies of it."""
    guard.start(message.message_id)
    guard.item(message.message_id, None)
    try:
        if injected is not None and injected.target == message.message_id:
            fail_as_injected(injected.how, quoting=message.body)
        outcome: list[Item] | DeadLetter | Held = classify_message(
            message, limits=limits, redelivery_limit=redelivery_limit
        )
    except MemoryError:
        raise
    except Exception as error:
        outcome = Held(Reason.QUARANTINED, classify_error_detail(error))
    guard.done()
    return outcome
