"""A supervisor process under test: its stderr read line by line on a thread, so a test awaits
the line that reports an event (a start, a restart, readiness) instead of sleeping."""

from __future__ import annotations

import queue
import re
import subprocess
import threading
import time
from collections.abc import Sequence
from typing import IO

import psutil


class SupervisedProcess:
    """`argv` started with its stderr captured; `lines` is everything it wrote so far."""

    def __init__(self, argv: Sequence[str], **popen: object) -> None:
        self.proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            **popen,  # type: ignore[arg-type]
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        assert self.proc.stderr is not None
        threading.Thread(target=self._pump, args=(self.proc.stderr,), daemon=True).start()

    def _pump(self, stream: IO[bytes]) -> None:
        for raw in stream:
            self._queue.put(raw.decode(errors="replace").rstrip("\n"))
        self._queue.put(None)

    def expect(self, pattern: str, timeout: float, *, seen: bool = False) -> re.Match[str]:
        """The first line from now on that matches `pattern` (re.search); with `seen`, a line
        already read counts too (one that may come before an earlier expected line). Fails
        with the output so far if the process ends or `timeout` seconds pass first."""
        wanted = re.compile(pattern)
        if seen:
            for line in self.lines:
                match = wanted.search(line)
                if match:
                    return match
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                what = f"no line matching {pattern!r} in {timeout}s"
                raise AssertionError(self._report(what)) from None
            if line is None:
                self._queue.put(None)  # the end stays visible to the next expect
                raise AssertionError(self._report(f"ended before a line matching {pattern!r}"))
            self.lines.append(line)
            match = wanted.search(line)
            if match:
                return match

    def finish(self, timeout: float) -> int:
        """Wait for the exit and the end of its output (collected); the exit status."""
        deadline = time.monotonic() + timeout
        code = self.proc.wait(timeout=timeout)
        while True:
            line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            if line is None:
                self._queue.put(None)
                return code
            self.lines.append(line)

    def _report(self, what: str) -> str:
        tail = "\n".join(self.lines[-80:])
        return f"{what}; output so far:\n{tail}"

    def kill(self, grace_seconds: float = 30.0) -> None:
        """Stop it whatever state the test left it in: SIGTERM (its own stop, which stops what
        it started), then SIGKILL to it and every descendant still alive after `grace_seconds`
        (its children run in sessions of their own, out of reach of a signal to its group)."""
        if self.proc.poll() is not None:
            return
        try:
            family = [psutil.Process(self.proc.pid)]
            family += family[0].children(recursive=True)
        except psutil.NoSuchProcess:
            family = []
        self.proc.terminate()
        _, alive = psutil.wait_procs(family, timeout=grace_seconds)
        for proc in alive:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        self.proc.wait()
