"""The serving store's PostgreSQL backend, through psycopg 3 (the `postgres` extra).

The connection runs in autocommit mode with explicit transactions; a group's commit locks the
position row (`FOR UPDATE`), so a second writer waits and is then refused. The commit sends
`NOTIFY sis_serving_changes` (delivered when it commits); `wait_for_changes` LISTENs on a
connection of its own. The password comes from SIS_SERVING_PASSWORD, read at each connect,
never from the URL. A lost or refused connection, an administrator shutdown or a full disk
raises `ServingUnavailable`; the next call connects again.

A reader's connections (its queries' and its LISTEN's) are read-only sessions (`SET SESSION
CHARACTERISTICS AS TRANSACTION READ ONLY` at connect): every transaction on them is read-only,
so PostgreSQL refuses a write with its own error (SQLSTATE 25006). That guards against a bug,
not against a process that changes the session back: Opportunity Management's role should hold
SELECT only (docs/serving.md).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg

from sis_platform.serving.backend import StoreBackend
from sis_platform.serving.location import PASSWORD_VARIABLE, PostgresLocation
from sis_platform.serving.records import ServingUnavailable
from sis_platform.serving.schema import TableDef
from sis_platform.settings import secret

CHANNEL = "sis_serving_changes"
# Serialises schema creation between processes opening a new database at once.
_SCHEMA_LOCK_KEY = 0x5153_5356  # "SISV"
CONNECT_TIMEOUT_SECONDS = 10
# A peer that vanishes without closing (host down, network cut) is noticed within about
# idle + interval * count seconds instead of TCP's hours (libpq ignores these on a socket).
_KEEPALIVES: dict[str, Any] = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
}


class PostgresBackend(StoreBackend):
    dialect = "postgresql"
    placeholder = "%s"

    def __init__(self, location: PostgresLocation, *, read_only: bool = False) -> None:
        super().__init__(location.shown, read_only=read_only)
        self.location = location
        self._conn: psycopg.Connection[Any] | None = None
        self._listener: psycopg.Connection[Any] | None = None
        self._listen_lock = threading.Lock()
        self.run(self.prepare)

    def _connect(self) -> psycopg.Connection[Any]:
        password = secret(PASSWORD_VARIABLE)
        extra: dict[str, Any] = {"password": password} if password else {}
        conn = psycopg.connect(
            self.location.url,
            autocommit=True,
            connect_timeout=CONNECT_TIMEOUT_SECONDS,
            application_name="sis-serving",
            **_KEEPALIVES,
            **extra,
        )
        if self.read_only:
            # A statement rather than `options=-c default_transaction_read_only=on`, which
            # would replace any `options` the URL gives.
            try:
                conn.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
            except BaseException:
                conn.close()
                raise
        return conn

    # -- the backend's part --------------------------------------------------------------------

    def schema_version(self, conn: psycopg.Connection[Any]) -> int | None:
        row = conn.execute("SELECT to_regclass('position')").fetchone()
        if row is None or row[0] is None:
            return None
        found = conn.execute("SELECT schema_version FROM position WHERE id = 1").fetchone()
        return None if found is None else int(found[0])

    def connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self.drop_connection()
            self._conn = self._connect()
        return self._conn

    def drop_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def is_outage(self, exc: BaseException) -> bool:
        # Connection refused or lost, administrator shutdown, disk full, lock or statement
        # timeouts: psycopg's OperationalError (SQLSTATE classes 08, 53, 57, 58 and the like).
        return isinstance(exc, psycopg.OperationalError)

    @contextmanager
    def transaction(self, conn: psycopg.Connection[Any], *, write: bool) -> Iterator[None]:
        with conn.transaction():
            if not write:
                # One snapshot for every statement of a read (status: position and last seq).
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            yield

    def lock_schema(self, conn: Any) -> None:
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK_KEY,))

    def position_for_update(self) -> str:
        return "SELECT batch_seq, msg_seq FROM position WHERE id = 1 FOR UPDATE"

    def ids(self, column: str, ids: Sequence[str]) -> tuple[str, Any]:
        return f"{column} = ANY(?)", list(ids)

    def insert(self, conn: Any, table: TableDef, rows: Sequence[Sequence[Any]]) -> None:
        # COPY streams the rows in one statement: several times faster than a pipelined
        # executemany once a group has thousands of model rows.
        if not rows:
            return
        with conn.cursor().copy(f"COPY {table.name} ({', '.join(table.names)}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)

    def reclaim(self, conn: Any) -> None:
        """Nothing: autovacuum (on by default) marks the pruned rows' space free for the rows
        committed after them, so the tables stop growing once a window's worth is held. The
        files do not shrink; VACUUM FULL would, under a lock no live path can wait for."""

    def before_commit(self, conn: Any, last_seq: int) -> None:
        conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, str(last_seq)))

    def after_commit(self, last_seq: int) -> None:
        """Nothing: the NOTIFY sent inside the transaction is delivered by its COMMIT."""

    # -- waiting -------------------------------------------------------------------------------

    def wait_for_changes(self, after_seq: int, timeout: float, last_seq: Callable[[], int]) -> int:
        deadline = time.monotonic() + timeout
        with self._listen_lock:
            listener = self._listening()
            while True:
                # LISTEN is in effect before this look: a commit after it notifies the wait.
                last = last_seq()
                left = deadline - time.monotonic()
                if last > after_seq or left <= 0:
                    return last
                try:
                    for _ in listener.notifies(timeout=left, stop_after=1):
                        break
                except psycopg.OperationalError as exc:
                    self._drop_listener()
                    raise ServingUnavailable(f"serving store {self.shown}: {exc}") from exc

    def _listening(self) -> psycopg.Connection[Any]:
        if self._listener is not None and not (self._listener.closed or self._listener.broken):
            return self._listener
        self._drop_listener()
        try:
            self._listener = self._connect()
            self._listener.execute(f"LISTEN {CHANNEL}")
        except psycopg.OperationalError as exc:
            self._drop_listener()
            raise ServingUnavailable(f"serving store {self.shown}: {exc}") from exc
        return self._listener

    def _drop_listener(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    def close(self) -> None:
        with self._listen_lock:
            self._drop_listener()
        with self._lock:
            self.drop_connection()
