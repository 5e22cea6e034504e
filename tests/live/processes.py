"""Running the `sis-live` console script's code (python -m sis_platform.cli.live) in its own
process over a test's data folder, with a clean SIS_* environment, and reading its store."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from sis_platform.serving import ServingReader, StoreNotReady, open_reader

REPO = Path(__file__).resolve().parents[2]
SIGKILLED = -signal.SIGKILL


def live_env(data: Path, **variables: str) -> dict[str, str]:
    """The environment of a sis-live process over `data`: this checkout on the path, no SIS_*
    variable but those given (groups of 20, batches of 70, no metrics endpoint unless told
    otherwise: tests in parallel would contend for its default port)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIS_")}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p
    )
    env.update(
        {
            "SIS_DATA_DIR": str(data),
            "SIS_LIVE_GROUP_MAX_MESSAGES": "20",
            "SIS_BATCH_MAX_MESSAGES": "70",
            "SIS_METRICS_ADDRESS": "off",
            **variables,
        }
    )
    return env


def start_live(data: Path, log: Path, **variables: str) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "sis_platform.cli.live"],
            cwd=REPO,
            env=live_env(data, **variables),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Kill the process's group (SIGKILL) unless it has exited, and reap it."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)


def finish(proc: subprocess.Popen[bytes], timeout: float, log: Path) -> int:
    """The process's exit code, killing its group first if it outlives `timeout`."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError(
            f"sis-live did not exit within {timeout}s; log tail:\n"
            + log.read_text(errors="replace")[-4000:]
        ) from None


def open_store_once_created(
    url: str, proc: subprocess.Popen[bytes], timeout: float, log: Path
) -> ServingReader:
    """A reader of the serving store at `url` once the sis-live process `proc` has created it
    (a reader cannot create it); the process must not exit meanwhile."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return open_reader(url)
        except StoreNotReady:
            tail = log.read_text(errors="replace")[-3000:]
            assert proc.poll() is None, f"sis-live exited before creating its store:\n{tail}"
            assert time.monotonic() < deadline, f"sis-live never created its store:\n{tail}"
        # Waiting on the process (it must not exit): a store not yet created has no event to
        # await.
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=0.1)
