"""Checkpoints of an SQLite database in WAL mode, off the thread that commits.

SQLite checkpoints a WAL database by itself when a commit leaves the log at 1000 pages
(`wal_autocheckpoint`): that commit then copies the log into the database and fsyncs it, tens
to hundreds of milliseconds on a busy disk, inside whatever operation happened to commit (a put
on the embedded queue, a get, sis-live's store commit): the latency outliers of the live path.
`WalCheckpointer` runs PASSIVE checkpoints in a daemon thread of its own, on its own connection,
when nudged after a commit and at most every `interval` seconds, so the log is copied back
while it is small and seldom reaches the automatic threshold on the hot path. A PASSIVE
checkpoint neither waits for nor blocks writers and readers. The automatic checkpoint stays on:
it still bounds the log should this thread fall behind (a backlog at full speed) or stop.
Durability is SQLite's own: the checkpoint runs with synchronous=FULL, as the writers do.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path

log = logging.getLogger(__name__)

# At most one checkpoint a second: the log holds at most a second of commits beyond what the
# automatic checkpoint would, and a slow feed pays one fsync of the database a second, off its
# hot path.
DEFAULT_INTERVAL_SECONDS = 1.0
# Opening the checkpoint's connection may meet a writer setting the database up.
_BUSY_TIMEOUT_SECONDS = 5.0


class WalCheckpointer:
    """A daemon thread checkpointing the WAL database at `path` when nudged (see the module
    docstring). `close` ends it; nothing it does ever raises into the caller."""

    def __init__(
        self, path: Path, interval: float = DEFAULT_INTERVAL_SECONDS, name: str = "wal-checkpoint"
    ) -> None:
        self.path = Path(path)
        self.interval = interval
        self._due = threading.Event()
        self._stop = threading.Event()
        self._done = threading.Condition()
        self.checkpoints = 0  # checkpoints run so far (for tests and diagnostics)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def nudge(self) -> None:
        """Something was committed: checkpoint soon (at once, unless one ran within the
        interval)."""
        self._due.set()

    def wait_for(self, checkpoints: int, timeout: float) -> bool:
        """Wait until at least `checkpoints` have run (or `timeout` seconds pass)."""
        with self._done:
            return self._done.wait_for(lambda: self.checkpoints >= checkpoints, timeout)

    def close(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._due.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _run(self) -> None:
        conn: sqlite3.Connection | None = None
        try:
            while True:
                self._due.wait()
                if self._stop.is_set():
                    return
                self._due.clear()
                try:
                    if conn is None:
                        conn = sqlite3.connect(
                            self.path,
                            timeout=_BUSY_TIMEOUT_SECONDS,
                            isolation_level=None,
                            check_same_thread=False,
                        )
                        conn.execute("PRAGMA synchronous=FULL")
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error as error:
                    # The automatic checkpoint still runs; the next nudge tries again.
                    log.debug("checkpoint of %s failed: %s", self.path, error)
                    if conn is not None:
                        conn.close()
                        conn = None
                with self._done:
                    self.checkpoints += 1
                    self._done.notify_all()
                if self._stop.wait(self.interval):
                    return
        finally:
            if conn is not None:
                conn.close()
