"""The worker-side guard (sis_platform/runtime/guard.py): the in-flight marker names the key a
process is on, and the watchdog kills a process whose item overruns its budget, leaving the
item in the marker. Each case that may kill runs in a child process of its own."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from sis_platform.runtime.guard import RUNNING, TIMEOUT, Guard, InFlightFolder, InFlightRecord


def _run_child(folder: Path, body: str) -> int:
    """Run `body` in a fresh Python process with `guard` (a Guard on `folder`, budget 0.3 s) in
    scope; returns its exit status (negative: the signal that ended it)."""
    script = textwrap.dedent(
        f"""
        import time
        from sis_platform.runtime.guard import Guard
        guard = Guard({str(folder)!r}, 0.3)
        """
    ) + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", script], timeout=120).returncode


def test_marker_names_the_key_while_it_runs_and_is_empty_after(tmp_path: Path):
    folder = InFlightFolder.create(str(tmp_path), "job")
    guard = Guard(folder.path, 10.0)
    guard.start("ASC-1430")
    guard.item("m1", 0)
    assert folder.records() == [InFlightRecord("ASC-1430", RUNNING)]
    guard.done()
    assert folder.records() == []
    guard.close()
    folder.remove()
    assert folder.path is not None and not Path(folder.path).exists()


def test_item_over_its_budget_kills_the_process_and_leaves_the_item_as_a_timeout(
    tmp_path: Path,
):
    status = _run_child(
        tmp_path,
        """
        guard.start("ASC-1500")
        guard.item("m1", 0)
        guard.item("m2", 3)
        time.sleep(60)  # the hung item: only the watchdog's SIGKILL ends it
        """,
    )
    assert status == -signal.SIGKILL
    assert InFlightFolder(str(tmp_path)).records() == [
        InFlightRecord("ASC-1500", TIMEOUT, "m2", 3, 0.3)
    ]


def test_items_each_within_the_budget_never_fire_however_long_they_take_together(
    tmp_path: Path,
):
    status = _run_child(
        tmp_path,
        """
        for key in ("a", "b"):
            guard.start(key)
            for position in range(6):  # 6 x 0.1 s per key: twice the budget, per item a third
                guard.item("m", position)
                time.sleep(0.1)
            guard.done()
        time.sleep(0.6)  # disarmed: idle time is not an item's
        guard.close()
        """,
    )
    assert status == 0
    assert InFlightFolder(str(tmp_path)).records() == []


def test_a_worker_that_dies_mid_key_leaves_the_key_running(tmp_path: Path):
    status = _run_child(
        tmp_path,
        """
        import os, signal
        guard.start("ROM-1912")
        guard.item("m1", 0)
        os.kill(os.getpid(), signal.SIGKILL)  # a segfault, the OOM killer
        """,
    )
    assert status == -signal.SIGKILL
    assert InFlightFolder(str(tmp_path)).records() == [InFlightRecord("ROM-1912", RUNNING)]


def test_object_storage_has_no_marker_folder():
    folder = InFlightFolder.create("s3a://bucket/lake", "job")
    assert folder.path is None and folder.records() == []
