"""Supervision of the platform's processes: start them, restart the ones that die, stop them all.

`Supervisor.run` starts each `Program` in a session (and so a process group) of its own, prefixes
every line of its output with its name on one stream (the supervisor's stderr), restarts a
long-running program whenever it exits (after an exponential backoff that a stable run resets)
and a one-shot only when it fails, and stops everything on SIGTERM, SIGINT or SIGHUP: SIGTERM to
every child's process group and to every other descendant, a bounded grace period, then SIGKILL
to whatever is left. The handlers of those signals are set explicitly, so a supervisor started
with SIGINT ignored (a background job of a non-interactive shell) still stops on Ctrl-C.

The supervisor makes itself a child subreaper (Linux `PR_SET_CHILD_SUBREAPER`): a process that a
child starts and abandons (a daemonized grandchild, a Dagster run worker whose code server died)
is re-parented to the supervisor instead of init, so it is still among the supervisor's
descendants when everything stops, and the supervisor reaps it when it exits.

A program with `liveness` is watched for progress, not only for its exit: it writes a heartbeat
(sis_platform/runtime/heartbeat.py) each time its loop goes round, and once its last beat (or its
start, before a first beat) is older than `stall_seconds`, the supervisor sends its process
group SIGTERM, SIGKILL after the grace period, and restarts it as if it had died. A process
that exists but hangs (a deadlock, a call that never returns, SIGSTOP) is so told apart from a
slow one that still goes round.

One thread, one event loop: `selectors` over the children's output pipes and a self-pipe the
signal handlers write to (`signal.set_wakeup_fd`; SIGCHLD wakes it when a child exits). Timers
(a restart after its backoff, a readiness probe, a liveness check, a watchdog's SIGKILL, the
stop deadline) are the select timeout. Imports neither Dagster nor Spark.
"""

from __future__ import annotations

import ctypes
import os
import selectors
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import psutil

from sis_platform.runtime.backoff import Backoff as ExponentialBackoff
from sis_platform.runtime.heartbeat import read_beat

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# A line longer than this is passed on in pieces of this size: a child that writes megabytes
# without a newline costs the supervisor this much memory, not the whole run.
MAX_LINE_BYTES = 16 * 1024
READ_BYTES = 64 * 1024
DRAIN_READS = 64  # at most 4 MiB of a pipe's last output passed on when stopping
PR_SET_CHILD_SUBREAPER = 36
# After SIGKILL: how long to wait for the kernel to take the processes down before giving up.
KILL_WAIT_SECONDS = 5.0
# How often liveness is checked while stopping: descendants that are not the supervisor's own
# children signal nothing when they exit.
STOP_POLL_SECONDS = 0.1
# The most time between two reads of a watched program's heartbeat (a quarter of its bound if
# that is less): how much later than its bound a hang is seen.
LIVENESS_CHECK_SECONDS = 5.0


@dataclass(frozen=True)
class Endpoint:
    """A TCP address a program listens on once it is ready."""

    host: str
    port: int


@dataclass(frozen=True)
class Liveness:
    """Where a program writes its heartbeat, and how old its last beat may be before the program
    counts as hung (killed and restarted)."""

    heartbeat: Path
    stall_seconds: float

    @property
    def check_seconds(self) -> float:
        return min(LIVENESS_CHECK_SECONDS, self.stall_seconds / 4)


@dataclass(frozen=True)
class Program:
    """One supervised command.

    `one_shot`: exit status 0 ends it; a failure is restarted like any long-running program.
    Ready: when an output line contains `ready_line` (if set), then when `ready_port` accepts a
    connection (if set); a program with neither is ready once started. `ready_message` is
    printed each time it becomes ready. `gate`: the programs listed after it start only once it
    has been ready (the first time). `quiet`: an output line containing one of these is not
    echoed (a program's own routine chatter, e.g. a line per scheduler tick). `liveness`: its
    heartbeat is watched, and a stale one restarts it (module docstring).
    """

    name: str
    argv: tuple[str, ...]
    one_shot: bool = False
    ready_line: str | None = None
    ready_port: Endpoint | None = None
    ready_message: str | None = None
    gate: bool = False
    cwd: Path | None = None
    quiet: tuple[str, ...] = ()
    liveness: Liveness | None = None


@dataclass(frozen=True)
class Backoff(ExponentialBackoff):
    """The delay before restart n (1, 2, ...) (runtime/backoff.py, without jitter); a program
    that ran `stable` seconds before it died starts again from restart 1."""

    stable: float = 60.0


@dataclass(frozen=True)
class SupervisorSettings:
    backoff: Backoff = field(default_factory=Backoff)
    grace_seconds: float = 20.0  # SIGTERM to SIGKILL
    ready_poll_seconds: float = 0.25  # how often a ready_port is tried


@dataclass
class _Child:
    """A program's state: its current process, restarts, readiness."""

    program: Program
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restarts: int = 0  # consecutive failures since the last stable run
    restart_at: float | None = None
    line_seen: bool = False
    ready: bool = False
    been_ready: bool = False
    finished: bool = False  # a one-shot that exited 0
    next_probe: float = 0.0
    next_check: float = 0.0  # when its heartbeat is read next (a program with liveness)
    hung: bool = False  # stopped making progress: being killed, to be restarted
    kill_at: float | None = None  # hung and sent SIGTERM: when SIGKILL follows


@dataclass
class _Stream:
    """The read end of one process's output pipe and its unfinished line."""

    child: _Child
    fd: int
    pending: bytearray = field(default_factory=bytearray)


def become_subreaper() -> bool:
    """Make orphaned descendants this process's children (Linux); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with {code}"


def _port_open(endpoint: Endpoint) -> bool:
    try:
        with socket.create_connection((endpoint.host, endpoint.port), timeout=0.5):
            return True
    except OSError:
        return False


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _group(proc: psutil.Process) -> int | None:
    return _pgid(proc.pid)


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class Supervisor:
    """Runs `programs` until a stop signal (or until every one of them is a finished one-shot),
    writing their output and its own lines to `out`. Call `run` once, from the main thread."""

    def __init__(
        self,
        programs: Sequence[Program],
        settings: SupervisorSettings | None = None,
        out: BinaryIO | None = None,
    ) -> None:
        names = [p.name for p in programs]
        if len(set(names)) != len(names):
            raise ValueError(f"program names must be unique: {names}")
        self._children = [_Child(p) for p in programs]
        self._settings = settings or SupervisorSettings()
        self._out = out if out is not None else sys.stderr.buffer
        self._selector = selectors.DefaultSelector()
        self._wakeup_read = -1
        self._stop_requested = 0  # stop signals received
        self._child_exited = False  # SIGCHLD since the last reap
        self._me = psutil.Process()

    # -- output --------------------------------------------------------------------------

    def say(self, text: str) -> None:
        self._emit("supervisor", text.encode())

    def _emit(self, name: str, line: bytes) -> None:
        self._out.write(b"[" + name.encode() + b"] " + line.rstrip(b"\r\n") + b"\n")
        self._out.flush()

    def _read(self, stream: _Stream, now: float) -> bool:
        """Read what the pipe holds (at most READ_BYTES) and pass on its whole lines; at the
        end, the rest, and close it. True if something was read (there may be more)."""
        try:
            data = os.read(stream.fd, READ_BYTES)
        except BlockingIOError:
            return False
        if not data:
            if stream.pending:
                self._line(stream.child, bytes(stream.pending), now)
            self._selector.unregister(stream.fd)
            os.close(stream.fd)
            return False
        stream.pending += data
        # Bounded: each pass removes at least one byte, and the chunk read is at most READ_BYTES.
        while stream.pending:
            end = stream.pending.find(b"\n")
            if end < 0:
                if len(stream.pending) < MAX_LINE_BYTES:
                    break
                end = MAX_LINE_BYTES - 1
            line = bytes(stream.pending[: end + 1])
            del stream.pending[: end + 1]
            self._line(stream.child, line, now)
        return True

    def _line(self, child: _Child, line: bytes, now: float) -> None:
        if not any(q.encode() in line for q in child.program.quiet):
            self._emit(child.program.name, line)
        ready_line = child.program.ready_line
        if ready_line is not None and not child.line_seen and ready_line.encode() in line:
            child.line_seen = True
            self._probe(child, now)

    # -- starting, readiness, restarts ----------------------------------------------------

    def _startable(self) -> list[_Child]:
        """The programs not held back by a gate that has not been ready yet."""
        allowed = []
        for child in self._children:
            allowed.append(child)
            if child.program.gate and not child.been_ready:
                break
        return allowed

    def _start_due(self, now: float) -> None:
        """Start what is due; again while a start opened a gate (at most once per program)."""
        for _ in self._children:
            due = [
                child
                for child in self._startable()
                if child.proc is None
                and not child.finished
                and (child.restart_at is None or child.restart_at <= now)
            ]
            if not due:
                return
            for child in due:
                self._start(child, now)

    def _start(self, child: _Child, now: float) -> None:
        program = child.program
        child.restart_at = None
        child.line_seen = child.ready = False
        read_end, write_end = os.pipe()
        try:
            child.proc = subprocess.Popen(
                program.argv,
                stdin=subprocess.DEVNULL,
                stdout=write_end,
                stderr=write_end,
                cwd=program.cwd,
                start_new_session=True,
            )
        except OSError as error:
            os.close(read_end)
            restart = self._schedule_restart(child, now, ran_for=0.0)
            self.say(f"{program.name}: cannot start {program.argv[0]}: {error}; {restart}")
            return
        finally:
            os.close(write_end)
        os.set_blocking(read_end, False)
        self._selector.register(read_end, selectors.EVENT_READ, _Stream(child, read_end))
        child.started_at = now
        child.next_probe = now
        if program.liveness is not None:
            child.next_check = now + program.liveness.check_seconds
        command = shlex.join(program.argv).replace("\n", "\\n")
        self.say(f"{program.name}: started (pid {child.proc.pid}): {command}")
        if program.ready_line is None:
            self._probe(child, now)

    def _probe(self, child: _Child, now: float) -> None:
        """Ready once its line was seen (if it has one) and its port accepts (if it has one)."""
        program = child.program
        if child.ready or child.proc is None:
            return
        if program.ready_line is not None and not child.line_seen:
            return
        if program.ready_port is not None and not _port_open(program.ready_port):
            child.next_probe = now + self._settings.ready_poll_seconds
            return
        child.ready = child.been_ready = True
        if program.ready_message:
            self.say(program.ready_message)

    def _schedule_restart(self, child: _Child, now: float, ran_for: float) -> str:
        """Set the restart's time; returns what to log about it."""
        backoff = self._settings.backoff
        child.restarts = 1 if ran_for >= backoff.stable else child.restarts + 1
        delay = backoff.delay(child.restarts)
        child.restart_at = now + delay
        return f"restart {child.restarts} in {delay:.1f} s"

    def _collect_exits(self, now: float) -> None:
        for child in self._children:
            if child.proc is None or child.proc.poll() is None:
                continue
            code = child.proc.returncode
            pid = child.proc.pid
            child.proc = None
            child.ready = False
            child.hung, child.kill_at = False, None
            ran_for = now - child.started_at
            # Whatever it left in its process group goes with it (a restart starts afresh).
            self._signal_group(pid, signal.SIGTERM)
            exited = f"{child.program.name}: {_describe_exit(code)} after {ran_for:.1f} s"
            if self._stop_requested:
                self.say(exited)
            elif child.program.one_shot and code == 0:
                child.finished = True
                self.say(f"{exited}; done")
            else:
                self.say(f"{exited}; {self._schedule_restart(child, now, ran_for)}")

    def _reap_orphans(self) -> None:
        """Reap exited processes re-parented to the supervisor (it is their subreaper)."""
        managed = {c.proc.pid for c in self._children if c.proc is not None}
        try:
            children = self._me.children()
        except psutil.Error:
            return
        for proc in children:
            if proc.pid in managed:
                continue
            try:
                if proc.status() == psutil.STATUS_ZOMBIE:
                    os.waitpid(proc.pid, os.WNOHANG)
            except (psutil.Error, ChildProcessError):
                pass

    def _signal_group(self, pgid: int, sig: signal.Signals) -> None:
        if pgid == os.getpgrp():
            return
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    # -- liveness ----------------------------------------------------------------------------

    def _watched(self, child: _Child) -> Liveness | None:
        """Its liveness, if it is running, watched, and not already being killed."""
        if child.proc is None or child.hung:
            return None
        return child.program.liveness

    @staticmethod
    def _last_progress(liveness: Liveness, pid: int, started_at: float) -> float:
        """The monotonic time of the last beat of process group `pid` (the child's: the program
        itself, or a process it runs it under), or `started_at` if it has not beaten since."""
        beat = read_beat(liveness.heartbeat)
        if beat is None or not (beat.pid == pid or _pgid(beat.pid) == pid):
            return started_at  # none yet, or a previous process's
        return max(started_at, beat.at)

    def _check_liveness(self, child: _Child, now: float) -> None:
        """Read its heartbeat; a hung process gets SIGTERM, and SIGKILL after the grace."""
        liveness = self._watched(child)
        if liveness is None or child.proc is None or now < child.next_check:
            return
        child.next_check = now + liveness.check_seconds
        pid = child.proc.pid
        silent = now - self._last_progress(liveness, pid, child.started_at)
        if silent <= liveness.stall_seconds:
            return
        grace = self._settings.grace_seconds
        self.say(
            f"{child.program.name}: no progress for {silent:.1f} s (bound "
            f"{liveness.stall_seconds:g} s): SIGTERM, SIGKILL after {grace:g} s"
        )
        self._signal_group(pid, signal.SIGTERM)
        child.hung, child.kill_at = True, now + grace

    def _kill_hung(self, child: _Child, now: float) -> None:
        """SIGKILL a hung process whose grace has run out (its exit restarts it)."""
        if child.proc is None or child.kill_at is None or now < child.kill_at:
            return
        child.kill_at = None  # once: its exit follows, and restarts it
        self.say(f"{child.program.name}: still running after the grace: SIGKILL")
        self._signal_group(child.proc.pid, signal.SIGKILL)

    # -- the loop ----------------------------------------------------------------------------

    def _install_signals(self) -> None:
        read_end, write_end = os.pipe()
        os.set_blocking(read_end, False)
        os.set_blocking(write_end, False)
        self._wakeup_read = read_end
        signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        for sig in (*STOP_SIGNALS, signal.SIGCHLD):
            # A Python-level handler (not SIG_IGN, not SIG_DFL): the wakeup fd gets the number.
            signal.signal(sig, lambda signum, frame: None)
        self._selector.register(read_end, selectors.EVENT_READ, None)

    def _read_signals(self) -> None:
        try:
            data = os.read(self._wakeup_read, 1024)
        except BlockingIOError:
            return
        for signum in data:
            if signum == signal.SIGCHLD:
                self._child_exited = True
            elif signum in STOP_SIGNALS:
                self._stop_requested += 1
                if self._stop_requested == 1:
                    self.say(f"{signal.Signals(signum).name}: stopping everything")

    @staticmethod
    def _probing(child: _Child) -> bool:
        """Its port is to be tried (its ready line, if any, was seen)."""
        program = child.program
        return (
            child.proc is not None
            and not child.ready
            and program.ready_port is not None
            and (child.line_seen or program.ready_line is None)
        )

    def _timeout(self, now: float) -> float | None:
        times = [c.restart_at for c in self._children if c.restart_at is not None]
        times += [c.next_probe for c in self._children if self._probing(c)]
        times += [c.next_check for c in self._children if self._watched(c) is not None]
        times += [c.kill_at for c in self._children if c.kill_at is not None]
        return max(0.0, min(times) - now) if times else None

    def _wait(self, timeout: float | None) -> None:
        """Wait for output, a signal or the timeout; handle what arrived."""
        for key, _ in self._selector.select(timeout):
            if key.data is None:
                self._read_signals()
            else:
                self._read(key.data, time.monotonic())

    def _done(self) -> bool:
        return all(c.finished for c in self._children)

    def run(self) -> int:
        """Supervise until stopped; returns 0 once everything it started is gone, 1 if a
        process survived SIGKILL."""
        self._install_signals()
        if not become_subreaper():
            self.say("not a subreaper here: an abandoned grandchild may escape the stop")
        self._start_due(time.monotonic())
        while not self._stop_requested and not self._done():
            self._wait(self._timeout(time.monotonic()))
            now = time.monotonic()
            self._collect_exits(now)
            if self._child_exited:
                self._child_exited = False
                self._reap_orphans()
            for child in self._children:
                if self._probing(child) and child.next_probe <= now:
                    self._probe(child, now)
                self._check_liveness(child, now)
                self._kill_hung(child, now)
            self._start_due(now)
        return self._stop_everything()

    # -- stopping ----------------------------------------------------------------------------

    def _descendants(self) -> list[psutil.Process]:
        try:
            return self._me.children(recursive=True)
        except psutil.Error:
            return []

    def _stop_everything(self) -> int:
        """SIGTERM every group and descendant, wait up to the grace period, SIGKILL the rest."""
        tracked = {p.pid: p for p in self._descendants()}  # before any parent dies
        groups = {c.proc.pid for c in self._children if c.proc is not None}
        for pgid in groups:
            self._signal_group(pgid, signal.SIGTERM)
        for proc in tracked.values():
            if _group(proc) not in groups:  # left its group: no SIGTERM reached it
                self._send(proc, signal.SIGTERM)
        grace = self._settings.grace_seconds
        left = self._wait_gone(tracked, time.monotonic() + grace, kill_on_second_signal=True)
        if left:
            self.say(f"{len(left)} process(es) still running after {grace:.0f} s: SIGKILL")
            for pgid in groups:
                self._signal_group(pgid, signal.SIGKILL)
            for proc in left:
                self._send(proc, signal.SIGKILL)
            left = self._wait_gone(tracked, time.monotonic() + KILL_WAIT_SECONDS)
        # The last exits may still be unreaped (a zombie counts as gone above).
        self._collect_exits(time.monotonic())
        self._reap_orphans()
        self._drain_output()
        if left:
            pids = ", ".join(str(p.pid) for p in left)
            self.say(f"still running after SIGKILL: {pids}")
            return 1
        self.say("stopped: every process it started is gone")
        return 0

    def _wait_gone(
        self,
        tracked: dict[int, psutil.Process],
        deadline: float,
        kill_on_second_signal: bool = False,
    ) -> list[psutil.Process]:
        """Drain output and reap until every tracked process (and any new descendant) is gone
        or the deadline passes; returns those still alive. A second stop signal ends the wait."""
        stops = self._stop_requested
        while True:
            now = time.monotonic()
            self._collect_exits(now)
            self._reap_orphans()
            for proc in self._descendants():
                if proc.pid not in tracked:
                    tracked[proc.pid] = proc
                    self._send(proc, signal.SIGTERM)  # started while stopping
            left = [p for p in tracked.values() if _alive(p)]
            if not left or now >= deadline:
                return left
            if kill_on_second_signal and self._stop_requested > stops:
                self.say("stop signal again: not waiting any longer")
                return left
            # Output keeps flowing (a child blocked on a full pipe would never exit).
            self._wait(min(STOP_POLL_SECONDS, deadline - now))

    def _drain_output(self) -> None:
        """Pass on what is left in the pipes (their writers are gone), then close them."""
        for key in list(self._selector.get_map().values()):
            stream = key.data
            if stream is None:
                continue
            # A pipe without writers holds at most its buffer (64 KiB by default, 1 MiB at most
            # unprivileged): DRAIN_READS reads take it all, and bound a writer that escaped.
            for _ in range(DRAIN_READS):
                if not self._read(stream, time.monotonic()):
                    break
            if stream.fd in self._selector.get_map():
                if stream.pending:
                    self._line(stream.child, bytes(stream.pending), time.monotonic())
                self._selector.unregister(stream.fd)
                os.close(stream.fd)
        self._selector.close()

    @staticmethod
    def _send(proc: psutil.Process, sig: signal.Signals) -> None:
        try:
            proc.send_signal(sig)
        except psutil.Error:
            pass
