"""The serving store's SQLite backend: one file in WAL mode, one writer and readers in any process.

WAL lets readers read while sis-live writes. Commits run with synchronous=NORMAL: a commit is
atomic and survives sis-live dying (it is in the WAL file when it returns), but is durable
against the machine losing power only once the checkpoint thread (below, at most a second
later) has synced the WAL; a power cut before that rolls the store back to an earlier committed
position, its results with it. Nothing is lost by that: the landing log is the durable record
(fsync'd before the queue commit) and sis-live folds it again from the store's position, to the
same rows under the same change `seq` (the fold is deterministic and writes in log order). It
saves an fsync on every group of the live path (about a millisecond of put -> visible; see
docs/serving.md, "What a reader can rely on"). The folder is created 0700 and the database 0600
(SQLite gives its -wal and -shm files the database's mode). A writer that meets the lock past
the busy timeout, a full disk or an I/O error raises `ServingUnavailable`.

A reader's connection is read-only (`mode=ro`): SQLite refuses any write through it
(SQLITE_READONLY), and opening a reader creates neither the database nor its folder (a wait
binds its socket in the doorbell the writer made). The connection needs the WAL's
`-shm` and `-wal` files beside the database: SQLite opens them read-write (the index is shared
memory every connection updates) and creates them, with the database's mode, when the last
writer has closed and removed them; so a reader needs write access to the folder, which the
owner of the 0700 folder has. What the reader leaves there on closing is the writer's to
checkpoint and remove.

Waiting readers are woken by a doorbell (`sis_platform.runtime.doorbell`) beside the database
(`<file>.doorbell/`): the writer rings it after each commit, and nudges a checkpoint thread
(`sis_platform.runtime.walcheckpoint`), so the log is copied into the database off the commit path.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from sis_platform.runtime.doorbell import Doorbell, ring
from sis_platform.runtime.private import make_private_folder
from sis_platform.runtime.walcheckpoint import WalCheckpointer
from sis_platform.serving.backend import StoreBackend, as_utc

log = logging.getLogger(__name__)

DEFAULT_BUSY_TIMEOUT_SECONDS = 5.0
# Free pages one prune step gives back at most (4 MiB at the default 4 KiB page): more than a
# step of PRUNE_CHUNK rows frees, so the file follows the pruning down.
RECLAIM_PAGES = 1024
# The primary result codes that mean "not now" rather than a bug (extended codes carry them in
# their low byte).
_OUTAGE_CODES = frozenset(
    {
        sqlite3.SQLITE_BUSY,
        sqlite3.SQLITE_LOCKED,
        sqlite3.SQLITE_FULL,
        sqlite3.SQLITE_IOERR,
        sqlite3.SQLITE_CANTOPEN,
        sqlite3.SQLITE_PROTOCOL,
    }
)


def doorbell_folder(path: Path) -> Path:
    """The doorbell of the store at `path`."""
    return path.with_name(path.name + ".doorbell")


class SqliteBackend(StoreBackend):
    dialect = "sqlite"

    def __init__(
        self,
        path: Path,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT_SECONDS,
        shown: str = "",
        *,
        read_only: bool = False,
    ) -> None:
        super().__init__(shown or f"sqlite:///{path}", read_only=read_only)
        self.path = path.absolute()
        self.busy_timeout = busy_timeout
        self.doorbell = doorbell_folder(self.path)
        self._conn: sqlite3.Connection | None = None
        # Started at the first commit (a reader never commits): checkpoints off the commit path.
        self._checkpointer: WalCheckpointer | None = None
        if read_only:
            # SQLite's own error for a missing file is "unable to open database file".
            if not self.path.is_file():
                raise self.not_created()
        else:
            make_private_folder(self.path.parent)
            _private_file(self.path)
            Doorbell(self.doorbell)
        self.run(self.prepare)

    # -- the backend's part --------------------------------------------------------------------

    def schema_version(self, conn: sqlite3.Connection) -> int | None:
        if not conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'position'").fetchone():
            return None
        row = conn.execute("SELECT schema_version FROM position WHERE id = 1").fetchone()
        return None if row is None else int(row[0])

    def connection(self) -> sqlite3.Connection:
        if self._conn is None:
            if self.read_only:
                self._conn = self._connect(f"{self.path.as_uri()}?mode=ro", uri=True)
                return self._conn
            conn = self._connect(str(self.path), uri=False)
            try:
                if conn.execute("PRAGMA page_count").fetchone()[0] == 0:
                    # A new store, before WAL mode writes its header: freed pages are given
                    # back by `reclaim`. An existing one keeps its mode (docs/operations.md:
                    # converting one offline); setting it would wait for the write lock.
                    conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
                conn.execute("PRAGMA journal_mode = WAL")
                # Atomic and crash-safe, durable at checkpoints (see the module docstring).
                conn.execute("PRAGMA synchronous = NORMAL")
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def _connect(self, database: str, *, uri: bool) -> sqlite3.Connection:
        return sqlite3.connect(
            database,
            timeout=self.busy_timeout,
            isolation_level=None,  # transactions are explicit (BEGIN IMMEDIATE to write)
            check_same_thread=False,  # calls are serialised by the store's lock
            uri=uri,
        )

    def drop_connection(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except sqlite3.Error:
                pass
            self._conn = None

    def is_outage(self, exc: BaseException) -> bool:
        if not isinstance(exc, sqlite3.OperationalError | sqlite3.DatabaseError):
            return False
        code = getattr(exc, "sqlite_errorcode", None)
        return code is not None and code & 0xFF in _OUTAGE_CODES

    @contextmanager
    def transaction(self, conn: sqlite3.Connection, *, write: bool) -> Iterator[None]:
        # IMMEDIATE takes the write lock at once: a second writer waits (busy timeout) before
        # reading the position rather than failing at its first write.
        conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        try:
            yield
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        try:
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def lock_schema(self, conn: sqlite3.Connection) -> None:
        """Nothing more: the write transaction (IMMEDIATE) holds the database's write lock."""

    def ids(self, column: str, ids: Sequence[str]) -> tuple[str, Any]:
        # One parameter whatever the count (SQLite bounds the number of parameters).
        return f"{column} IN (SELECT value FROM json_each(?))", json.dumps(list(ids))

    def timestamp_in(self, value: datetime | None) -> Any:
        stamp = as_utc(value)
        return stamp.isoformat() if stamp is not None else None

    def timestamp_out(self, value: Any) -> datetime | None:
        return datetime.fromisoformat(value) if value is not None else None

    def decimal_in(self, value: Decimal | None) -> Any:
        return str(value) if value is not None else None

    def reclaim(self, conn: sqlite3.Connection) -> None:
        """Give back at most RECLAIM_PAGES free pages to the file system (a no-op on a store
        created without incremental auto-vacuum). executescript steps the pragma to its end."""
        conn.executescript(f"PRAGMA incremental_vacuum({RECLAIM_PAGES})")

    def before_commit(self, conn: Any, last_seq: int) -> None:
        """Nothing: the doorbell rings once the commit is done."""

    def after_commit(self, last_seq: int) -> None:
        if self._checkpointer is None:
            self._checkpointer = WalCheckpointer(self.path, name="serving-store-checkpoint")
        self._checkpointer.nudge()
        try:
            ring(self.doorbell)
        except OSError as exc:
            # Committed already; a waiting reader still wakes at its timeout.
            log.warning("serving store %s: doorbell not rung: %s", self.shown, exc)

    def wait_for_changes(self, after_seq: int, timeout: float, last_seq: Callable[[], int]) -> int:
        deadline = time.monotonic() + timeout
        # Bound before the first look, so a commit after that look rings it.
        with Doorbell(self.doorbell).waiter() as waiter:
            while True:
                waiter.clear()
                last = last_seq()
                left = deadline - time.monotonic()
                if last > after_seq or left <= 0:
                    return last
                waiter.wait(left)

    def close(self) -> None:
        with self._lock:
            self.drop_connection()
            checkpointer, self._checkpointer = self._checkpointer, None
        if checkpointer is not None:
            checkpointer.close()


def _private_file(path: Path) -> None:
    """The database file created 0600 before SQLite opens it (SQLite would use the umask)."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return
    os.close(fd)
