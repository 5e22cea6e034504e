"""A heartbeat file: a small file beside a process (sis-live) that says it is making progress.

The service beats each time its loop goes round: a group landed and applied, a get that waited
on an empty queue and came back empty, a stretch of a catch-up, a standby's wait for the lease.
A process that exists but no longer goes round (a deadlock, a call that never returns, a
SIGSTOP) stops beating. Readers: the supervisor's watchdog (`sis-run` kills and restarts a
process whose beat is older than its bound), `sis-live health` (the Kubernetes liveness and
readiness probes), and any later HTTP /healthz or /readyz. Reading it touches neither the serving
store nor Dagster, so a probe answers while the database is down and never waits on it.

The file is JSON replaced atomically (written beside it, then renamed over it) and never
fsync'd: it describes the running process only, and a crash makes it stale anyway. Beat times
are CLOCK_MONOTONIC (`time.monotonic` on Linux, one clock for every process of the host or
container), so a step of the wall clock neither fakes a beat nor condemns a healthy process.
It lives on a path private to the process's host or pod (SIS_LIVE_HEARTBEAT_FILE), never on a
volume another sis-live shares. Imports nothing of the platform but the private-folder helper.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from sis_platform.runtime.private import make_private_folder

log = logging.getLogger(__name__)

# At most one write per this many seconds while nothing but the beat's time changes: the loop
# goes round once per message at the feed's rate, and a rename per turn would be wasted.
BEAT_SECONDS = 1.0


@dataclass(frozen=True)
class Beat:
    """One beat: which process, when (time.monotonic), and what it was doing."""

    pid: int
    at: float
    holding: bool  # consuming under the consumer lease (False: standing by)
    caught_up: bool  # holding, and the serving store has applied everything landed
    halted: str | None = None  # why intake and the fold are halted (applier.py), if they are


@dataclass(frozen=True)
class Health:
    """What a probe answers: `alive` (a fresh beat), `ready` (alive, holding the lease and
    caught up), and why, in a line for the probe's output."""

    alive: bool
    ready: bool
    reason: str


class Heartbeat:
    """Writes this process's beats to `path` (its folder made private if missing)."""

    def __init__(
        self,
        path: Path,
        every: float = BEAT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self._every = every
        self._clock = clock
        self._written: tuple[bool, bool, str | None] | None = None  # the state last written
        self._next = 0.0
        self._failing = False
        # The last beat, written or not (`current`): what the in-process health endpoint
        # (sis_platform/live/endpoint.py) answers from, without reading the file back.
        self._last: tuple[float, tuple[bool, bool, str | None]] | None = None

    def current(self) -> Beat | None:
        """The last beat of this process (None before the first), as the file would hold it
        if every beat were written."""
        last = self._last
        if last is None:
            return None
        at, (holding, caught_up, halted) = last
        return Beat(os.getpid(), at, holding, caught_up, halted)

    def health(self, stall_seconds: float) -> Health:
        """This process's verdict now, from its last beat (see `health`)."""
        return health(self.current(), self._clock(), stall_seconds)

    def beat(self, *, holding: bool, caught_up: bool, halted: str | None = None) -> None:
        """The loop went round: write a beat if the state changed or `every` has passed. A
        failure to write is logged once, not raised: the beat going stale is what tells it."""
        now = self._clock()
        state = (holding, caught_up, halted)
        self._last = (now, state)  # one reference swapped: read whole by another thread
        if state == self._written and now < self._next:
            return
        try:
            write_beat(self.path, Beat(os.getpid(), now, holding, caught_up, halted))
        except OSError as error:
            if not self._failing:
                log.error("cannot write the heartbeat %s: %s", self.path, error)
            self._failing = True
            return
        self._failing = False
        self._written, self._next = state, now + self._every


def write_beat(path: Path, beat: Beat) -> None:
    """Replace the file at `path` with `beat`, atomically."""
    make_private_folder(path.parent)
    partial = path.with_name(f".{path.name}.{beat.pid}")
    partial.write_text(json.dumps(asdict(beat)))
    os.replace(partial, path)


def read_beat(path: Path) -> Beat | None:
    """The last beat written to `path`; None if there is none (or it is not a beat)."""
    try:
        fields = json.loads(path.read_text())
        return Beat(
            pid=int(fields["pid"]),
            at=float(fields["at"]),
            holding=bool(fields["holding"]),
            caught_up=bool(fields["caught_up"]),
            halted=None if fields.get("halted") is None else str(fields["halted"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def health(beat: Beat | None, now: float, stall_seconds: float) -> Health:
    """Alive: a beat at most `stall_seconds` old at `now` (time.monotonic). Ready: alive, and
    the beat says the process holds the lease, is not halted and its store has caught up. A
    halted process is alive: restarting it would not put the landing right."""
    if beat is None:
        return Health(False, False, "no heartbeat yet")
    age = now - beat.at
    if age > stall_seconds:
        return Health(
            False, False, f"no progress for {age:.1f} s (bound {stall_seconds:g} s, pid {beat.pid})"
        )
    if beat.halted is not None:  # between two checks of the halt the lease is renewed too
        return Health(True, False, f"alive ({age:.1f} s ago), halted: {beat.halted}")
    if not beat.holding:
        return Health(True, False, f"alive ({age:.1f} s ago), standing by for the lease")
    if not beat.caught_up:
        return Health(True, False, f"alive ({age:.1f} s ago), catching the serving store up")
    return Health(True, True, f"alive ({age:.1f} s ago), consuming and caught up")
