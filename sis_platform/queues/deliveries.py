"""Redelivery counts a queue source keeps itself, where the broker only says "redelivered".

ActiveMQ over STOMP flags a redelivered message with `redelivered:true` and gives no count
(queues/stomp/). A message that kills its consumer (the process dies with it in the unit of work)
comes back flagged to a new process, which has forgotten any count kept in memory: such a
message would never reach the backout threshold and would come back for ever. So the STOMP
source records here, keyed by the broker's message id, each time it hands a redelivered
message to its caller, before handing it over.

- Only redelivered messages are written (a first delivery costs nothing); one small SQLite
  transaction each, WAL with synchronous=NORMAL, which survives the process dying (the case
  this exists for); an operating-system crash may lose the latest counts, which only delays
  the threshold.
- A committed message is gone from the broker, so the source forgets its entry then.
- Bounded: at most `max_entries` entries, plus up to _PRUNE_EVERY between two prunings (the
  rest belong to messages another consumer took); the oldest go first, which only lowers a
  count to the broker's lower bound.
- `path=None` keeps the counts in memory, for this object's life (tests; a source that must
  not write files).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from sis_platform.queues.base import SourceUnavailable

# Far above the number of messages that can be in flight (a landing batch holds at most 50,000
# by default); an entry is a few dozen bytes.
DEFAULT_MAX_ENTRIES = 200_000
_BUSY_TIMEOUT_SECONDS = 30.0
# Entries beyond the bound are pruned once in this many new entries, not on every write.
_PRUNE_EVERY = 1024

_SCHEMA = """
CREATE TABLE IF NOT EXISTS redeliveries (
    position INTEGER PRIMARY KEY AUTOINCREMENT,
    key      TEXT    NOT NULL UNIQUE,
    count    INTEGER NOT NULL
)
"""


class RedeliveryCounts:
    """How many times each message was handed out redelivered, by broker message id."""

    def __init__(self, path: Path | None, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self.path = path
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None

    def __repr__(self) -> str:
        return f"RedeliveryCounts({str(self.path) if self.path else 'in memory'})"

    def record(self, key: str) -> int:
        """Count one more redelivery of `key`; returns its redeliveries so far, this one
        included (so its delivery count is one more)."""
        with self._connection() as conn:
            # One statement, one transaction: this runs before every redelivered message is
            # handed out, up to a whole backed-out batch of them.
            count, position = conn.execute(
                "INSERT INTO redeliveries (key, count) VALUES (?, 1)"
                " ON CONFLICT (key) DO UPDATE SET count = count + 1"
                " RETURNING count, position",
                (key,),
            ).fetchone()
            if position > self.max_entries and position % _PRUNE_EVERY == 0:
                conn.execute(
                    "DELETE FROM redeliveries WHERE position <= ?",
                    (position - self.max_entries,),
                )
        return int(count)

    def count(self, key: str) -> int:
        """The redeliveries recorded for `key` (0 if none)."""
        with self._connection() as conn:
            row = conn.execute("SELECT count FROM redeliveries WHERE key = ?", (key,)).fetchone()
        return int(row[0]) if row else 0

    def forget(self, keys: Iterable[str]) -> None:
        """Drop the entries of messages that are gone (committed)."""
        batch = [(key,) for key in keys]
        if not batch:
            return
        with self._connection() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.executemany("DELETE FROM redeliveries WHERE key = ?", batch)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def entries(self) -> int:
        with self._connection() as conn:
            (n,) = conn.execute("SELECT COUNT(*) FROM redeliveries").fetchone()
        return int(n)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    @contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        # A count that cannot be written is an outage of the source: handing the message out
        # uncounted could let a message that kills its consumer come back for ever.
        with self._lock:
            try:
                if self._conn is None:
                    self._conn = self._open()
                yield self._conn
            except (OSError, sqlite3.Error) as e:
                raise SourceUnavailable(f"redelivery counts {self}: {e}") from e

    def _open(self) -> sqlite3.Connection:
        if self.path is None:
            target = ":memory:"
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Created private (docs/design.md invariant 9); SQLite gives its -wal and -shm files the
            # database file's permissions.
            os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
            target = str(self.path)
        conn = sqlite3.connect(
            target,
            timeout=_BUSY_TIMEOUT_SECONDS,
            isolation_level=None,  # transactions are explicit
            check_same_thread=False,  # used from whichever thread runs the session
        )
        try:
            if self.path is not None:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute(_SCHEMA)
        except BaseException:
            conn.close()
            raise
        return conn
