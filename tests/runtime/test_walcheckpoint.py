"""WalCheckpointer: checkpoints a WAL database in its own thread when nudged."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from sis_platform.runtime.walcheckpoint import WalCheckpointer

WAIT_SECONDS = 60.0  # a safety bound only: each wait ends when the checkpoint is done


def _database_with_an_unchecked_log(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")  # only the checkpointer copies the log back
    conn.execute("CREATE TABLE t (body BLOB)")
    conn.executemany("INSERT INTO t VALUES (?)", [(bytes(10_000),) for _ in range(50)])
    return conn


def test_a_nudge_copies_the_log_into_the_database(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    conn = _database_with_an_unchecked_log(path)
    before = path.stat().st_size
    checkpointer = WalCheckpointer(path, interval=0.0)
    try:
        checkpointer.nudge()
        assert checkpointer.wait_for(1, WAIT_SECONDS)
        assert path.stat().st_size > before + 50 * 10_000
        # Everything in the log is in the database now: nothing is left to copy.
        busy, logged, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        assert (busy, logged) == (0, copied)
        assert conn.execute("SELECT count(*) FROM t").fetchone() == (50,)
    finally:
        checkpointer.close()
        conn.close()


def test_close_ends_the_thread_and_a_missing_database_is_no_error(tmp_path: Path) -> None:
    checkpointer = WalCheckpointer(tmp_path / "no" / "such.sqlite", interval=0.0)
    checkpointer.nudge()
    assert checkpointer.wait_for(1, WAIT_SECONDS)  # failed quietly, counted
    checkpointer.close()
    assert not any(t.name == "wal-checkpoint" and t.is_alive() for t in threading.enumerate())
