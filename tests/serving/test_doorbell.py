"""The doorbell: waiters woken by a ring from this or another process, without polling."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from pathlib import Path

from sis_platform.runtime.doorbell import SUFFIX, Doorbell, ring

JOIN_SECONDS = 60
NEVER = 600.0


def test_a_ring_wakes_every_waiter(tmp_path: Path) -> None:
    bell = Doorbell(tmp_path / "bell")
    with bell.waiter() as one, bell.waiter() as two:
        assert not one.wait(0)
        assert ring(bell.folder) == 2
        assert one.wait(NEVER) and two.wait(NEVER)
        # The rings were consumed.
        assert not one.wait(0) and not two.wait(0)


def test_rings_are_kept_until_cleared(tmp_path: Path) -> None:
    bell = Doorbell(tmp_path / "bell")
    with bell.waiter() as waiter:
        for _ in range(3):
            bell.ring()
        waiter.clear()
        assert not waiter.wait(0)
        bell.ring()
        assert waiter.wait(0)


def test_a_waiter_blocked_in_wait_is_woken_from_another_process(tmp_path: Path) -> None:
    bell = Doorbell(tmp_path / "bell")
    with bell.waiter() as waiter:
        woken: list[bool] = []
        thread = threading.Thread(target=lambda: woken.append(waiter.wait(NEVER)))
        thread.start()
        code = f"from sis_platform.runtime.doorbell import ring; print(ring({str(bell.folder)!r}))"
        out = subprocess.run(
            [sys.executable, "-c", code], check=True, capture_output=True, text=True
        ).stdout
        thread.join(JOIN_SECONDS)
        assert not thread.is_alive() and woken == [True] and out.strip() == "1"


def test_a_dead_waiters_socket_is_removed(tmp_path: Path) -> None:
    bell = Doorbell(tmp_path / "bell")
    # A socket file whose owner died without removing it: bound, then closed.
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dead.bind(str(bell.folder / f"123-dead{SUFFIX}"))
    dead.close()
    (bell.folder / "not-a-bell.txt").write_text("left alone")
    with bell.waiter() as waiter:
        assert ring(bell.folder) == 1
        assert waiter.wait(0)
        names = sorted(p.name for p in bell.folder.iterdir())
        assert names == sorted([waiter.name, "not-a-bell.txt"])
    # A closed waiter removes its own socket.
    assert [p.name for p in bell.folder.iterdir()] == ["not-a-bell.txt"]


def test_no_folder_no_waiters(tmp_path: Path) -> None:
    assert ring(tmp_path / "missing") == 0


def test_the_folder_is_private(tmp_path: Path) -> None:
    bell = Doorbell(tmp_path / "a" / "bell")
    assert bell.folder.stat().st_mode & 0o777 == 0o700


def test_a_folder_past_the_socket_path_limit(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 100) / "bell"
    bell = Doorbell(deep)
    with bell.waiter() as waiter:
        assert (deep / waiter.name).exists()
        assert ring(deep) == 1
        assert waiter.wait(NEVER)
