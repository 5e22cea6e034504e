"""A serving store's plumbing: its connection, transactions, SQL helpers and schema.

`StoreBackend` holds one DB-API connection (sqlite3 or psycopg) behind a lock; a dialect
(`sqlite.py`, `postgres.py`) supplies the connection, its transactions, how a list of ids is
bound, how an error is told apart as an outage, how waiting readers are woken and what happens
around a commit. SQL is written with `?` placeholders and rewritten once per statement for a
`%s` driver. Opening a store for writing creates its schema if missing and upgrades an older
one; a read-only backend (a reader's: the database refuses its writes) creates nothing and
refuses a store it cannot read yet with `StoreNotReady` (`prepare`). What is read and written
through it: `reader.py` and `writer.py`.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, TypeVar

from sis_platform.serving import rows as R
from sis_platform.serving.records import ServingUnavailable, StoreNotReady
from sis_platform.serving.schema import (
    SCHEMA_VERSION,
    UPGRADES,
    TableDef,
    create_statements,
)

T = TypeVar("T")


def utc_now() -> datetime:
    return datetime.now(UTC)


def as_utc(value: datetime | None) -> datetime | None:
    """`value` in UTC; a naive datetime is taken as UTC already (Parquet's UTC timestamps read
    back without a zone), never as the host's local time."""
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class StoreBackend(ABC):
    """The connection to a serving store at `shown` (its URL, password-free); `read_only`: a
    connection the database itself keeps from writing (a reader's)."""

    dialect: str = ""
    placeholder: str = "?"

    def __init__(self, shown: str, *, read_only: bool) -> None:
        self.shown = shown
        self.read_only = read_only
        self._lock = threading.RLock()
        self._sql_cache: dict[str, str] = {}
        self.converters = R.Converters(self.timestamp_in, self.decimal_in)

    # -- what a dialect supplies ---------------------------------------------------------------

    @abstractmethod
    def connection(self) -> Any:
        """The open connection, (re)connecting if there is none."""

    @abstractmethod
    def drop_connection(self) -> None:
        """Forget a connection an outage broke; the next call reconnects."""

    @abstractmethod
    def is_outage(self, exc: BaseException) -> bool:
        """Whether `exc` means the store is unreachable or unwritable for now."""

    @abstractmethod
    def schema_version(self, conn: Any) -> int | None:
        """The stored schema version; None if the store has no tables yet."""

    @abstractmethod
    def transaction(self, conn: Any, *, write: bool) -> AbstractContextManager[Any]:
        """A transaction on `conn`, committed on exit or rolled back on an exception."""

    @abstractmethod
    def ids(self, column: str, ids: Sequence[str]) -> tuple[str, Any]:
        """A condition `column IN ids` and its one parameter."""

    @abstractmethod
    def wait_for_changes(self, after_seq: int, timeout: float, last_seq: Callable[[], int]) -> int:
        """`last_seq()` as soon as it exceeds `after_seq` (woken by the writer's commit, not by
        polling), or at `timeout` seconds whatever it is."""

    @abstractmethod
    def before_commit(self, conn: Any, last_seq: int) -> None:
        """Inside a group's commit transaction, after its writes (PostgreSQL notifies here)."""

    @abstractmethod
    def after_commit(self, last_seq: int) -> None:
        """After a group's commit (SQLite rings its doorbell here)."""

    @abstractmethod
    def lock_schema(self, conn: Any) -> None:
        """Inside a schema change's transaction: keep other processes' changes out."""

    @abstractmethod
    def reclaim(self, conn: Any) -> None:
        """After a prune, outside its transaction: reclaim a bounded part of the space it
        freed."""

    def position_for_update(self) -> str:
        """The query that reads the position inside a commit, locking it where the dialect
        needs a lock for that."""
        return "SELECT batch_seq, msg_seq FROM position WHERE id = 1"

    def timestamp_in(self, value: datetime | None) -> Any:
        return as_utc(value)

    def timestamp_out(self, value: Any) -> datetime | None:
        return value.astimezone(UTC) if value is not None else None

    def decimal_in(self, value: Decimal | None) -> Any:
        return value

    @abstractmethod
    def close(self) -> None:
        """Close the connections (idempotent)."""

    # -- running SQL ---------------------------------------------------------------------------

    def sql(self, text: str) -> str:
        if self.placeholder == "?":
            return text
        if (converted := self._sql_cache.get(text)) is None:
            converted = self._sql_cache[text] = text.replace("?", self.placeholder)
        return converted

    def run(self, work: Callable[[Any], T]) -> T:
        """`work(connection)` under the lock; an outage becomes `ServingUnavailable`."""
        with self._lock:
            try:
                return work(self.connection())
            except ServingUnavailable:
                raise
            except Exception as exc:
                if not self.is_outage(exc):
                    raise
                self.drop_connection()
                raise ServingUnavailable(f"serving store {self.shown}: {exc}") from exc

    def fetch_all(self, conn: Any, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return list(conn.execute(self.sql(sql), params).fetchall())

    def fetch_one(self, conn: Any, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        row = conn.execute(self.sql(sql), params).fetchone()
        return tuple(row) if row is not None else None

    def execute_many(self, conn: Any, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """One executemany per table (psycopg pipelines it; sqlite3 reuses the statement)."""
        if rows:
            conn.cursor().executemany(self.sql(sql), rows)

    def insert(self, conn: Any, table: TableDef, rows: Sequence[Sequence[Any]]) -> None:
        """Append `rows` (in `table.names` order) to `table`."""
        self.execute_many(conn, table.insert(), rows)

    def stamp(self, value: Any) -> datetime:
        """A NOT NULL timestamp column's value, in UTC."""
        stamp = self.timestamp_out(value)
        assert stamp is not None  # a NOT NULL column
        return stamp

    # -- the schema ----------------------------------------------------------------------------

    def create_schema(self, conn: Any) -> None:
        """Every table, if missing, and the position row at the log's start."""
        for statement in create_statements(self.dialect):
            conn.execute(statement)
        conn.execute(
            self.sql(
                "INSERT INTO position (id, schema_version, batch_seq, msg_seq, messages) "
                "VALUES (1, ?, 0, -1, 0) ON CONFLICT (id) DO NOTHING"
            ),
            (SCHEMA_VERSION,),
        )
        conn.execute(
            "INSERT INTO retention (id, checked_batch, changes_pruned_seq, changes_pruned_batch, "
            "dead_letters_pruned_seq) VALUES (1, 0, 0, 0, 0) ON CONFLICT (id) DO NOTHING"
        )

    def prepare(self, conn: Any) -> None:
        """On opening: a writer creates the schema if missing and upgrades an older one; a
        reader, which can do neither, refuses such a store (`StoreNotReady`). Either refuses a
        version this code cannot read."""
        version = self.schema_version(conn)
        if self.read_only:
            self.check_readable(version)
            return
        if version is None:
            with self.transaction(conn, write=True):
                self.lock_schema(conn)
                self.create_schema(conn)
            version = self.schema_version(conn)
            assert version is not None  # created with the schema
        self.settle_schema(conn, version)

    def check_readable(self, version: int | None) -> None:
        """Refuse a store a reader cannot read as it is: none yet or older (`StoreNotReady`:
        the writer creates and upgrades it), or newer than this code."""
        if version is None:
            raise self.not_created()
        if version in UPGRADES:
            raise StoreNotReady(
                f"serving store {self.shown} has schema version {version}; this code reads "
                f"version {SCHEMA_VERSION}: sis-live upgrades it when it opens the store "
                "(open_writer), a reader cannot"
            )
        self.refuse_other_version(version)

    def not_created(self) -> StoreNotReady:
        return StoreNotReady(
            f"no serving store at {self.shown}: sis-live creates it when it first opens the "
            "store (open_writer); a reader cannot"
        )

    def settle_schema(self, conn: Any, version: int) -> None:
        """Bring a store of an older version this code can upgrade up to date (its missing
        tables created; the position row is kept), or refuse one of another version."""
        if version in UPGRADES:
            with self.transaction(conn, write=True):
                self.lock_schema(conn)
                self.create_schema(conn)
                conn.execute(
                    self.sql("UPDATE position SET schema_version = ? WHERE id = 1"),
                    (SCHEMA_VERSION,),
                )
            return
        self.refuse_other_version(version)

    def refuse_other_version(self, version: int) -> None:
        """Refuse a store of a version this code neither reads nor upgrades (a newer one)."""
        if version != SCHEMA_VERSION:
            raise RuntimeError(
                f"serving store {self.shown} has schema version {version}; this code reads "
                f"version {SCHEMA_VERSION}"
            )
