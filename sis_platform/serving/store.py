"""The serving store: what readers ask and what sis-live commits, in SQL both backends share.

`ServingStore` holds one DB-API connection (sqlite3 or psycopg) behind a lock; a backend
(`sqlite.py`, `postgres.py`) supplies the connection, its transactions, how a list of ids is
bound, how an error is told apart as an outage, and how waiting readers are woken. SQL is
written with `?` placeholders and rewritten once per statement for a `%s` driver.

One writer (sis-live) commits each group in one transaction that also moves the stored log
position; a position not after the stored one is refused (`PositionConflict`). Any number of
readers, in any process, read committed state only.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from types import TracebackType
from typing import Any, NamedTuple, TypeVar

from sis_platform.log.position import LogPosition
from sis_platform.runtime.faults import crash_point
from sis_platform.serving import rows as R
from sis_platform.serving.records import (
    Change,
    ChangesPruned,
    DeadLetter,
    DeadLettersPruned,
    GroupCommit,
    LakeProgress,
    MasterRow,
    PositionConflict,
    Pruned,
    Retention,
    ServingUnavailable,
    StoredMaster,
    StoreHalt,
    StoreStatus,
)
from sis_platform.serving.schema import (
    AHEAD,
    CHANGES,
    DEAD_LETTERS,
    HALT,
    LAKE_PROGRESS,
    MASTERS,
    MESSAGE_OUTCOMES,
    MODEL_TABLES,
    SCHEMA_VERSION,
    UPGRADES,
    TableDef,
    create_statements,
)

T = TypeVar("T")

CRASH_POINT = "live.store_commit"
PRUNE_POINT = "serving.prune"
AFTER_PRUNE_POINT = "serving.after_prune"
# Rows one reader call returns at most.
MAX_LIMIT = 100_000
# Rows of each history table one prune step looks at (and removes) at most: a step takes a few
# milliseconds, so a message arriving meanwhile waits no longer than that.
PRUNE_CHUNK = 1000

_UPSERT_MASTER = (
    MASTERS.insert() + " ON CONFLICT (master_id) DO UPDATE SET version = excluded.version, "
    "document = excluded.document, message_id = excluded.message_id, "
    "updated_at = excluded.updated_at, stale = excluded.stale, filtered = excluded.filtered"
)
_UPSERT_LAKE_PROGRESS = (
    LAKE_PROGRESS.insert() + " ON CONFLICT (id) DO UPDATE SET fold_step = excluded.fold_step, "
    "last_batch_seq = excluded.last_batch_seq, committed_at = excluded.committed_at, "
    "dead_letters = excluded.dead_letters, recorded_at = excluded.recorded_at"
)
_CHANGE_COLUMNS = (
    "seq, master_id, version, message_id, put_time, committed_at, batch_seq, msg_seq, "
    "document_sha256"
)
_DEAD_LETTER_COLUMNS = (
    "seq, message_id, master_id, position, reason, detail, batch_seq, msg_seq, recorded_at"
)
# Each master's last change at or before a batch's end (index changes(master_id, batch_seq)).
_VERSIONS_AT = (
    "SELECT c.master_id, c.version, c.document_sha256 FROM changes c JOIN "
    "(SELECT max(seq) AS seq FROM changes WHERE batch_seq <= ? GROUP BY master_id) l "
    "ON c.seq = l.seq"
)


def utc_now() -> datetime:
    return datetime.now(UTC)


def as_utc(value: datetime | None) -> datetime | None:
    """`value` in UTC; a naive datetime is taken as UTC already (Parquet's UTC timestamps read
    back without a zone), never as the host's local time."""
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class ServingStore(ABC):
    """A serving store at `shown` (its URL, password-free). Use as a context manager or close."""

    dialect: str = ""
    placeholder: str = "?"

    def __init__(self, shown: str) -> None:
        self.shown = shown
        self._lock = threading.RLock()
        self._sql_cache: dict[str, str] = {}
        self.converters = R.Converters(self._timestamp_in, self._decimal_in)

    # -- what a backend supplies ---------------------------------------------------------------

    @abstractmethod
    def _connection(self) -> Any:
        """The open connection, (re)connecting if there is none."""

    @abstractmethod
    def _drop_connection(self) -> None:
        """Forget a connection an outage broke; the next call reconnects."""

    @abstractmethod
    def _is_outage(self, exc: BaseException) -> bool:
        """Whether `exc` means the store is unreachable or unwritable for now."""

    @abstractmethod
    def _transaction(self, conn: Any, *, write: bool) -> AbstractContextManager[Any]:
        """A transaction on `conn`, committed on exit or rolled back on an exception."""

    @abstractmethod
    def _ids(self, column: str, ids: Sequence[str]) -> tuple[str, Any]:
        """A condition `column IN ids` and its one parameter."""

    @abstractmethod
    def wait_for_changes(self, after_seq: int, timeout: float) -> int:
        """The change log's last seq, as soon as it exceeds `after_seq` (woken by the writer's
        commit, not by polling), or at `timeout` seconds whatever it is."""

    @abstractmethod
    def _before_commit(self, conn: Any, last_seq: int) -> None:
        """Inside the commit's transaction, after its writes (PostgreSQL notifies here)."""

    @abstractmethod
    def _after_commit(self, last_seq: int) -> None:
        """After the commit (SQLite rings its doorbell here)."""

    def _timestamp_in(self, value: datetime | None) -> Any:
        return as_utc(value)

    def _timestamp_out(self, value: Any) -> datetime | None:
        return value.astimezone(UTC) if value is not None else None

    def _decimal_in(self, value: Decimal | None) -> Any:
        return value

    @abstractmethod
    def close(self) -> None:
        """Close the connections (idempotent)."""

    # -- plumbing ------------------------------------------------------------------------------

    def _sql(self, text: str) -> str:
        if self.placeholder == "?":
            return text
        if (converted := self._sql_cache.get(text)) is None:
            converted = self._sql_cache[text] = text.replace("?", self.placeholder)
        return converted

    def _run(self, work: Callable[[Any], T]) -> T:
        """`work(connection)` under the lock; an outage becomes `ServingUnavailable`."""
        with self._lock:
            try:
                return work(self._connection())
            except ServingUnavailable:
                raise
            except Exception as exc:
                if not self._is_outage(exc):
                    raise
                self._drop_connection()
                raise ServingUnavailable(f"serving store {self.shown}: {exc}") from exc

    def _all(self, conn: Any, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return list(conn.execute(self._sql(sql), params).fetchall())

    def _one(self, conn: Any, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        row = conn.execute(self._sql(sql), params).fetchone()
        return tuple(row) if row is not None else None

    def _many(self, conn: Any, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """One executemany per table (psycopg pipelines it; sqlite3 reuses the statement)."""
        if rows:
            conn.cursor().executemany(self._sql(sql), rows)

    def _insert(self, conn: Any, table: TableDef, rows: Sequence[Sequence[Any]]) -> None:
        """Append `rows` (in `table.names` order) to `table`."""
        self._many(conn, table.insert(), rows)

    def _create_schema(self, conn: Any) -> None:
        """Every table, if missing, and the position row at the log's start."""
        for statement in create_statements(self.dialect):
            conn.execute(statement)
        conn.execute(
            self._sql(
                "INSERT INTO position (id, schema_version, batch_seq, msg_seq, messages) "
                "VALUES (1, ?, 0, -1, 0) ON CONFLICT (id) DO NOTHING"
            ),
            (SCHEMA_VERSION,),
        )
        conn.execute(
            "INSERT INTO retention (id, checked_batch, changes_pruned_seq, changes_pruned_batch, "
            "dead_letters_pruned_seq) VALUES (1, 0, 0, 0, 0) ON CONFLICT (id) DO NOTHING"
        )

    @abstractmethod
    def _lock_schema(self, conn: Any) -> None:
        """Inside a schema change's transaction: keep other processes' changes out."""

    def _settle_schema(self, conn: Any, version: int) -> None:
        """Bring a store of an older version this code can upgrade up to date (its missing
        tables created; the position row is kept), or refuse one of another version."""
        if version in UPGRADES:
            with self._transaction(conn, write=True):
                self._lock_schema(conn)
                self._create_schema(conn)
                conn.execute(
                    self._sql("UPDATE position SET schema_version = ? WHERE id = 1"),
                    (SCHEMA_VERSION,),
                )
            return
        if version != SCHEMA_VERSION:
            raise RuntimeError(
                f"serving store {self.shown} has schema version {version}; this code reads "
                f"version {SCHEMA_VERSION}"
            )

    # -- readers -------------------------------------------------------------------------------

    def master(self, master_id: str) -> StoredMaster | None:
        """The master's current version and document; None if unknown or never applied."""
        row = self._run(
            lambda c: self._one(
                c, "SELECT version, document FROM masters WHERE master_id = ?", (master_id,)
            )
        )
        if row is None or row[1] is None:
            return None
        return StoredMaster(int(row[0]), bytes(row[1]))

    def changes(self, after_seq: int = 0, limit: int = 1000) -> list[Change]:
        """Change log rows after `after_seq`, in order, at most `limit`; `ChangesPruned` if
        rows after `after_seq` may have been pruned (never a silently short answer)."""
        query = f"SELECT {_CHANGE_COLUMNS} FROM changes WHERE seq > ? ORDER BY seq LIMIT ?"
        found, held = self._read_held(query, (after_seq, _limit(limit)))
        if after_seq < held.changes_pruned_seq:
            raise self._changes_pruned(held, f"changes after seq {after_seq}")
        return [self._change(r) for r in found]

    def change_as_of(self, master_id: str, at: datetime) -> Change | None:
        """The master's last change committed at or before `at`: the version readers of this
        store were shown then (None: none yet). Reads the master's changes only (index).
        `ChangesPruned` if `at` is before the pruned history's last commit."""
        query = (
            f"SELECT {_CHANGE_COLUMNS} FROM changes WHERE master_id = ? AND committed_at <= ? "
            "ORDER BY seq DESC LIMIT 1"
        )
        found, held = self._read_held(query, (master_id, self._timestamp_in(at)))
        pruned_at, asked = held.changes_pruned_at, as_utc(at)
        if pruned_at is not None and asked is not None and asked < pruned_at:
            raise self._changes_pruned(held, f"the change of {master_id!r} as of {at}")
        return self._change(found[0]) if found else None

    def dead_letters(self, after_seq: int = 0, limit: int = 1000) -> list[DeadLetter]:
        """Dead letters recorded after `after_seq`, in order, at most `limit` (bodies left out:
        read `dead_letters.body` by seq when needed); `DeadLettersPruned` if rows after
        `after_seq` may have been pruned."""
        query = (
            f"SELECT {_DEAD_LETTER_COLUMNS} FROM dead_letters WHERE seq > ? ORDER BY seq LIMIT ?"
        )
        found, held = self._read_held(query, (after_seq, _limit(limit)))
        if after_seq < held.dead_letters_pruned_seq:
            raise DeadLettersPruned(
                f"serving store {self.shown}: dead letters after seq {after_seq} are pruned up "
                f"to seq {held.dead_letters_pruned_seq} (older than the history window; the "
                "lake's dead_letters keeps them): resume after that seq",
                held.dead_letters_pruned_seq,
            )
        return [
            DeadLetter(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], self._stamp(r[8]))
            for r in found
        ]

    def status(self) -> StoreStatus:
        def work(conn: Any) -> StoreStatus:
            with self._transaction(conn, write=False):
                position = self._one(
                    conn,
                    "SELECT batch_seq, msg_seq, messages, committed_at, heartbeat_at "
                    "FROM position WHERE id = 1",
                )
                masters = self._one(conn, "SELECT count(*) FROM masters")
                last_seq = self._last_seq(conn)
                halt = self._halt(conn)
            assert position is not None and masters is not None  # created with the schema
            return StoreStatus(
                LogPosition(int(position[0]), int(position[1])),
                last_seq,
                int(masters[0]),
                int(position[2]),
                self._timestamp_out(position[3]),
                self._timestamp_out(position[4]),
                halt,
            )

        return self._run(work)

    def _halt(self, conn: Any) -> StoreHalt | None:
        row = self._one(conn, "SELECT reason, detail, raised_at FROM halt WHERE id = 1")
        return None if row is None else StoreHalt(row[0], row[1], self._stamp(row[2]))

    def versions_at(self, batch_seq: int) -> dict[str, tuple[int, str]]:
        """master id -> (version, document_sha256) of its last change at or before the end of
        batch `batch_seq`: the live side of the live == lake check. `ChangesPruned` for a batch
        before the pruned history's last batch."""
        found, held = self._read_held(_VERSIONS_AT, (batch_seq,))
        if batch_seq < held.changes_pruned_batch:
            raise self._changes_pruned(held, f"the versions at batch {batch_seq}")
        return {r[0]: (int(r[1]), r[2]) for r in found}

    # -- history retention -----------------------------------------------------------------------

    def retention(self) -> Retention:
        """The live == lake gate and how far each history table is pruned."""
        return self._run(self._retention)

    def _retention(self, conn: Any) -> Retention:
        row = self._one(
            conn,
            "SELECT checked_batch, changes_pruned_seq, changes_pruned_batch, changes_pruned_at, "
            "dead_letters_pruned_seq FROM retention WHERE id = 1",
        )
        assert row is not None  # created with the schema
        return Retention(
            int(row[0]), int(row[1]), int(row[2]), self._timestamp_out(row[3]), int(row[4])
        )

    def _read_held(
        self, query: str, params: Sequence[Any]
    ) -> tuple[list[tuple[Any, ...]], Retention]:
        """`query`'s rows and the retention row, read in one snapshot (a prune committing
        between the two reads cannot make a short answer look whole)."""

        def work(conn: Any) -> tuple[list[tuple[Any, ...]], Retention]:
            with self._transaction(conn, write=False):
                return self._all(conn, query, params), self._retention(conn)

        return self._run(work)

    def _changes_pruned(self, held: Retention, asked: str) -> ChangesPruned:
        return ChangesPruned(
            f"serving store {self.shown}: {asked} are pruned (history older than the window "
            f"and checked live == lake up to batch {held.changes_pruned_batch}); the change "
            f"log is complete after seq {held.changes_pruned_seq}, each master's last change "
            "kept before it: read the masters and resume after that seq",
            held.changes_pruned_seq,
        )

    def record_checked(self, batch_seq: int) -> None:
        """Record that live == lake passed at batch `batch_seq` (the live_matches_lake check):
        history up to it may be pruned. The gate never moves back."""

        def work(conn: Any) -> None:
            with self._transaction(conn, write=True):
                conn.execute(
                    self._sql(
                        "UPDATE retention SET checked_batch = ? WHERE id = 1 AND checked_batch < ?"
                    ),
                    (batch_seq, batch_seq),
                )

        self._run(work)

    # -- the lake's progress --------------------------------------------------------------------

    def record_lake_progress(self, progress: LakeProgress) -> None:
        """Record the lake's last committed fold step (one row, replaced): written by the fold's
        single writer, so the newest record is the lake's state, also after a rebuilt lake
        starts its steps again."""

        def work(conn: Any) -> None:
            with self._transaction(conn, write=True):
                conn.execute(self._sql(_UPSERT_LAKE_PROGRESS), self._lake_progress_row(progress))

        self._run(work)

    def _lake_progress_row(self, progress: LakeProgress) -> tuple[Any, ...]:
        return (
            1,
            progress.fold_step,
            progress.last_batch_seq,
            self._timestamp_in(progress.committed_at),
            progress.dead_letters,
            self._timestamp_in(utc_now()),
        )

    def lake_progress(self) -> LakeProgress | None:
        """The lake's progress as last recorded (None: never recorded); one row by key."""
        row = self._run(
            lambda c: self._one(
                c,
                "SELECT fold_step, last_batch_seq, committed_at, dead_letters, recorded_at "
                "FROM lake_progress WHERE id = 1",
            )
        )
        if row is None:
            return None
        return LakeProgress(
            int(row[0]), int(row[1]), self._stamp(row[2]), int(row[3]), self._stamp(row[4])
        )

    def prune(self, window: timedelta, chunk: int = PRUNE_CHUNK) -> Pruned:
        """One bounded step of removing history: the change log and the dead letters, oldest
        first, at most `chunk` rows of each, only rows of batches at or before the live == lake
        gate and committed more than `window` before the change log's newest commit (the log's
        own clock, which never goes back: the host's clock stepped back prunes nothing early,
        an idle feed prunes nothing). Each master's last change is kept. One transaction, then
        (SQLite) a bounded step of reclaiming the space freed."""
        pruned = self._run(lambda conn: self._prune(conn, window, chunk))
        crash_point(AFTER_PRUNE_POINT)
        self._run(self._reclaim)
        return pruned

    def _prune(self, conn: Any, window: timedelta, chunk: int) -> Pruned:
        with self._transaction(conn, write=True):
            held = self._retention(conn)
            newest = self._one(conn, "SELECT committed_at FROM changes ORDER BY seq DESC LIMIT 1")
            if held.checked_batch == 0 or newest is None:
                return Pruned(0, 0, False)
            limit = _HistoryLimit(held.checked_batch, self._stamp(newest[0]) - window)
            changes, more_changes = self._prune_changes(conn, held, limit, chunk)
            dead, more_dead = self._prune_dead_letters(conn, held, limit, chunk)
            crash_point(PRUNE_POINT)
        return Pruned(changes, dead, more_changes or more_dead)

    def _prune_changes(
        self, conn: Any, held: Retention, limit: _HistoryLimit, chunk: int
    ) -> tuple[int, bool]:
        """Changes after the pruned seq, up to the first one the limit keeps, removed but for
        each master's last; the count removed and whether the whole chunk was prunable."""
        low = held.changes_pruned_seq
        prefix = self._prunable(conn, "changes", "committed_at", low, limit, chunk)
        if not prefix:
            return 0, False
        high = prefix[-1].seq
        # The chunk's masters: their changes up to `high` but the last (older kept ones too).
        removed = conn.execute(
            self._sql(
                "DELETE FROM changes WHERE seq <= ? AND master_id IN "
                "(SELECT master_id FROM changes WHERE seq > ? AND seq <= ?) AND seq NOT IN "
                "(SELECT max(seq) FROM changes WHERE seq > ? AND seq <= ? GROUP BY master_id)"
            ),
            (high, low, high, low, high),
        ).rowcount
        conn.execute(
            self._sql(
                "UPDATE retention SET changes_pruned_seq = ?, changes_pruned_batch = ?, "
                "changes_pruned_at = ? WHERE id = 1"
            ),
            (
                high,
                max(held.changes_pruned_batch, *(r.batch_seq for r in prefix)),
                self._timestamp_in(prefix[-1].at),
            ),
        )
        return max(removed, 0), len(prefix) == chunk

    def _prune_dead_letters(
        self, conn: Any, held: Retention, limit: _HistoryLimit, chunk: int
    ) -> tuple[int, bool]:
        """Dead letters after the pruned seq, up to the first one the limit keeps, removed."""
        low = held.dead_letters_pruned_seq
        prefix = self._prunable(conn, "dead_letters", "recorded_at", low, limit, chunk)
        if not prefix:
            return 0, False
        high = prefix[-1].seq
        removed = conn.execute(
            self._sql("DELETE FROM dead_letters WHERE seq > ? AND seq <= ?"), (low, high)
        ).rowcount
        conn.execute(
            self._sql("UPDATE retention SET dead_letters_pruned_seq = ? WHERE id = 1"), (high,)
        )
        return max(removed, 0), len(prefix) == chunk

    def _prunable(
        self, conn: Any, table: str, stamp: str, low: int, limit: _HistoryLimit, chunk: int
    ) -> list[_Row]:
        """The rows of `table` after seq `low` (at most `chunk`, in seq order) that `limit` lets
        go, up to the first it keeps; `stamp`: the table's commit time column."""
        rows = self._all(
            conn,
            f"SELECT seq, batch_seq, {stamp} FROM {table} WHERE seq > ? ORDER BY seq LIMIT ?",
            (low, chunk),
        )
        return limit.prefix([(r[0], r[1], self._stamp(r[2])) for r in rows])

    @abstractmethod
    def _reclaim(self, conn: Any) -> None:
        """After a prune, outside its transaction: reclaim a bounded part of the space it
        freed."""

    def last_seq(self) -> int:
        """The change log's last seq (0 when empty)."""
        return self._run(self._last_seq)

    def _last_seq(self, conn: Any) -> int:
        row = self._one(conn, "SELECT max(seq) FROM changes")
        return int(row[0]) if row and row[0] is not None else 0

    def _change(self, r: Sequence[Any]) -> Change:
        return Change(r[0], r[1], r[2], r[3], self._timestamp_out(r[4]), self._stamp(r[5]), *r[6:])

    def _stamp(self, value: Any) -> datetime:
        stamp = self._timestamp_out(value)
        assert stamp is not None  # a NOT NULL column
        return stamp

    # -- the writer (sis-live) -----------------------------------------------------------------

    def position(self) -> LogPosition:
        """The last log position committed (LogPosition(0, -1) before the first group)."""
        row = self._run(
            lambda c: self._one(c, "SELECT batch_seq, msg_seq FROM position WHERE id = 1")
        )
        assert row is not None  # created with the schema
        return LogPosition(int(row[0]), int(row[1]))

    def message_at(self, position: LogPosition) -> str | None:
        """The id of the message the store applied at `position` (None: no outcome there)."""
        row = self._run(
            lambda c: self._one(
                c,
                "SELECT message_id FROM message_outcomes WHERE batch_seq = ? AND msg_seq = ? "
                "LIMIT 1",
                (position.batch_seq, position.msg_seq),
            )
        )
        return None if row is None else str(row[0])

    def masters_state(self, ids: Iterable[str]) -> dict[str, MasterRow]:
        """The stored state of those of `ids` the store has."""
        wanted = sorted(set(ids))
        if not wanted:
            return {}
        condition, param = self._ids("master_id", wanted)
        query = (
            "SELECT master_id, version, document, message_id, stale, filtered FROM masters "
            f"WHERE {condition}"
        )
        found = self._run(lambda c: self._all(c, query, (param,)))
        return {
            r[0]: MasterRow(
                r[0],
                int(r[1]),
                bytes(r[2]) if r[2] is not None else None,
                r[3],
                bool(r[4]),
                bool(r[5]),
            )
            for r in found
        }

    def seen(self, message_ids: Iterable[str]) -> set[str]:
        """Those of `message_ids` that have an outcome at or before the store's position (were
        applied in an earlier group; an item committed ahead of the position does not count)."""
        wanted = sorted(set(message_ids))
        if not wanted:
            return set()
        condition, param = self._ids("o.message_id", wanted)
        query = (
            "SELECT DISTINCT o.message_id FROM message_outcomes o, position p WHERE p.id = 1 "
            f"AND {condition} AND (o.batch_seq < p.batch_seq OR "
            "(o.batch_seq = p.batch_seq AND o.msg_seq <= p.msg_seq))"
        )
        return {r[0] for r in self._run(lambda c: self._all(c, query, (param,)))}

    def ahead(self) -> dict[str, LogPosition]:
        """The masters committed ahead of the position, each with the position its items are
        applied to (empty unless a stretch committed in parts was interrupted)."""
        found = self._run(lambda c: self._all(c, "SELECT master_id, batch_seq, msg_seq FROM ahead"))
        return {r[0]: LogPosition(int(r[1]), int(r[2])) for r in found}

    def commit(self, group: GroupCommit) -> None:
        """Everything of `group` and its position in one transaction; `PositionConflict` if the
        position is not after the stored one, `ServingUnavailable` on an outage (then nothing
        of the group is stored). A part committed `ahead` records its masters as ahead instead
        of moving the position; the part that moves it clears them."""
        last_seq = self._run(lambda conn: self._commit(conn, group))
        self._after_commit(last_seq)

    def _commit(self, conn: Any, group: GroupCommit) -> int:
        with self._transaction(conn, write=True):
            stored = self._locked_position(conn)
            if group.position <= stored:
                raise PositionConflict(
                    f"serving store {self.shown}: group position {tuple(group.position)} is "
                    f"not after the stored {tuple(stored)} (a second writer?)"
                )
            now = self._timestamp_in(self._commit_time(conn))
            self._write_group(conn, group, now)
            last_seq = self._last_seq(conn)
            batch_seq, msg_seq = group.position
            if group.ahead:
                self._many(
                    conn,
                    AHEAD.insert() + " ON CONFLICT (master_id) DO UPDATE SET "
                    "batch_seq = excluded.batch_seq, msg_seq = excluded.msg_seq",
                    [(master_id, batch_seq, msg_seq) for master_id in group.ahead],
                )
            else:
                conn.execute(
                    self._sql(
                        "UPDATE position SET batch_seq = ?, msg_seq = ?, committed_at = ?, "
                        "messages = messages + ? WHERE id = 1"
                    ),
                    (batch_seq, msg_seq, now, group.messages),
                )
                conn.execute(
                    self._sql(
                        "DELETE FROM ahead WHERE batch_seq < ? OR (batch_seq = ? AND msg_seq <= ?)"
                    ),
                    (batch_seq, batch_seq, msg_seq),
                )
            self._before_commit(conn, last_seq)
            crash_point(CRASH_POINT)
        return last_seq

    def _commit_time(self, conn: Any) -> datetime:
        """Now, or the previous commit's time if the clock was stepped back since: the change
        log's `committed_at` never goes backwards, so `change_as_of` never answers with a
        version readers were shown only later. Read inside the commit's transaction."""
        now = utc_now()
        row = self._one(
            conn,
            "SELECT (SELECT committed_at FROM position WHERE id = 1), "
            "(SELECT committed_at FROM changes ORDER BY seq DESC LIMIT 1)",
        )
        previous = [self._stamp(v) for v in row or () if v is not None]
        return max([now, *previous])

    def _locked_position(self, conn: Any) -> LogPosition:
        row = self._one(conn, self._position_for_update())
        assert row is not None  # created with the schema
        return LogPosition(int(row[0]), int(row[1]))

    def _position_for_update(self) -> str:
        return "SELECT batch_seq, msg_seq FROM position WHERE id = 1"

    def _write_group(self, conn: Any, group: GroupCommit, now: Any) -> None:
        self._many(conn, _UPSERT_MASTER, R.master_rows(group.masters, now))
        if group.model:
            condition, param = self._ids("master_id", list(group.model))
            for table in MODEL_TABLES:
                conn.execute(self._sql(f"DELETE FROM {table.name} WHERE {condition}"), (param,))
            model = R.model_rows(group, self.converters)
            for table, rows in zip(
                MODEL_TABLES, (model.events, model.markets, model.selections), strict=True
            ):
                self._insert(conn, table, rows)
        self._insert(conn, CHANGES, R.change_rows(group.changes, now, self.converters))
        self._insert(conn, DEAD_LETTERS, R.dead_letter_rows(group.dead_letters, now))
        self._insert(conn, MESSAGE_OUTCOMES, R.outcome_rows(group.outcomes))

    def halt(self, reason: str, detail: str) -> None:
        """Record that the writer has halted, and why (`StoreStatus.halt`); a halt already
        recorded keeps the time it was first raised."""

        def work(conn: Any) -> None:
            with self._transaction(conn, write=True):
                conn.execute(
                    self._sql(
                        HALT.insert() + " ON CONFLICT (id) DO UPDATE SET reason = excluded.reason, "
                        "detail = excluded.detail"
                    ),
                    (1, reason, detail, self._timestamp_in(utc_now())),
                )

        self._run(work)

    def clear_halt(self) -> StoreHalt | None:
        """Forget a recorded halt (its cause was put right); the halt it was, if any."""

        def work(conn: Any) -> StoreHalt | None:
            with self._transaction(conn, write=True):
                halt = self._halt(conn)
                if halt is not None:
                    conn.execute("DELETE FROM halt WHERE id = 1")
                return halt

        return self._run(work)

    def heartbeat(self) -> None:
        """Record that the writer is alive (StoreStatus.heartbeat_at)."""

        def work(conn: Any) -> None:
            with self._transaction(conn, write=True):
                conn.execute(
                    self._sql("UPDATE position SET heartbeat_at = ? WHERE id = 1"),
                    (self._timestamp_in(utc_now()),),
                )

        self._run(work)

    def __enter__(self) -> ServingStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class _Row(NamedTuple):
    seq: int
    batch_seq: int
    at: datetime


class _HistoryLimit(NamedTuple):
    """What a prune may remove: rows of batches at or before `checked_batch` (live == lake
    passed there) committed before `before`."""

    checked_batch: int
    before: datetime

    def prefix(self, rows: Sequence[tuple[int, int, datetime]]) -> list[_Row]:
        """The leading rows (in seq order) it may remove: up to the first it keeps."""
        taken: list[_Row] = []
        for seq, batch_seq, at in rows:
            if batch_seq > self.checked_batch or at >= self.before:
                break
            taken.append(_Row(int(seq), int(batch_seq), at))
        return taken


def _limit(limit: int) -> int:
    if not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit {limit} must be 1 to {MAX_LIMIT}")
    return limit
