"""The serving store's read API: what Opportunity Management and the platform's checks call.

`ServingReader` answers from committed state only, in any process, beside the one writer
(`writer.py`): the current masters, the change log and the versions at a batch, the dead
letters, the store's status and position, the lake's recorded progress and how far history is
pruned, and a wait for the next changes. It has no method that writes (tests/serving pin that),
and `open_reader(url)` opens it on a read-only connection: the database refuses a write through
it (sqlite.py, postgres.py), and it creates no store (a writer does). A read of pruned history
raises `ChangesPruned` or `DeadLettersPruned` rather than answering short (docs/serving.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Self

from sis_platform.log.position import LogPosition
from sis_platform.serving.backend import StoreBackend, as_utc
from sis_platform.serving.opening import open_backend
from sis_platform.serving.records import (
    Change,
    ChangesPruned,
    DeadLetter,
    DeadLettersPruned,
    LakeProgress,
    Retention,
    StoredMaster,
    StoreHalt,
    StoreStatus,
)
from sis_platform.serving.sqlite import DEFAULT_BUSY_TIMEOUT_SECONDS

# Rows one reader call returns at most.
MAX_LIMIT = 100_000

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


def open_reader(
    url: str | None = None, *, busy_timeout: float = DEFAULT_BUSY_TIMEOUT_SECONDS
) -> ServingReader:
    """A reader of the serving store at `url` (None: the configured SIS_SERVING_URL), on a
    connection the database keeps from writing. The store must exist: `StoreNotReady` (a
    ServingUnavailable) while it has no database, no tables or an older schema, which the
    writer (sis-live) creates and upgrades. ValueError (naming the URL, password-free) for a
    URL that names no store; ServingUnavailable if it cannot be reached. `busy_timeout`: how
    long SQLite waits for a lock before ServingUnavailable."""
    return ServingReader(open_backend(url, busy_timeout, read_only=True))


class ServingReader:
    """Reads the serving store `backend` connects to. Use as a context manager or close."""

    def __init__(self, backend: StoreBackend) -> None:
        self._backend = backend
        self.shown = backend.shown

    def master(self, master_id: str) -> StoredMaster | None:
        """The master's current version and document; None if unknown or never applied."""
        b = self._backend
        row = b.run(
            lambda c: b.fetch_one(
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
        found, held = self._read_held(query, (master_id, self._backend.timestamp_in(at)))
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
        stamp = self._backend.stamp
        return [
            DeadLetter(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], stamp(r[8])) for r in found
        ]

    def status(self) -> StoreStatus:
        b = self._backend

        def work(conn: Any) -> StoreStatus:
            with b.transaction(conn, write=False):
                position = b.fetch_one(
                    conn,
                    "SELECT batch_seq, msg_seq, messages, committed_at, heartbeat_at "
                    "FROM position WHERE id = 1",
                )
                masters = b.fetch_one(conn, "SELECT count(*) FROM masters")
                last_seq = self._last_seq(conn)
                halt = self._halt(conn)
            assert position is not None and masters is not None  # created with the schema
            return StoreStatus(
                LogPosition(int(position[0]), int(position[1])),
                last_seq,
                int(masters[0]),
                int(position[2]),
                b.timestamp_out(position[3]),
                b.timestamp_out(position[4]),
                halt,
            )

        return b.run(work)

    def versions_at(self, batch_seq: int) -> dict[str, tuple[int, str]]:
        """master id -> (version, document_sha256) of its last change at or before the end of
        batch `batch_seq`: the live side of the live == lake check. `ChangesPruned` for a batch
        before the pruned history's last batch."""
        found, held = self._read_held(_VERSIONS_AT, (batch_seq,))
        if batch_seq < held.changes_pruned_batch:
            raise self._changes_pruned(held, f"the versions at batch {batch_seq}")
        return {r[0]: (int(r[1]), r[2]) for r in found}

    def position(self) -> LogPosition:
        """The last log position committed (LogPosition(0, -1) before the first group)."""
        b = self._backend
        row = b.run(
            lambda c: b.fetch_one(c, "SELECT batch_seq, msg_seq FROM position WHERE id = 1")
        )
        assert row is not None  # created with the schema
        return LogPosition(int(row[0]), int(row[1]))

    def message_at(self, position: LogPosition) -> str | None:
        """The id of the message the store applied at `position` (None: no outcome there)."""
        b = self._backend
        row = b.run(
            lambda c: b.fetch_one(
                c,
                "SELECT message_id FROM message_outcomes WHERE batch_seq = ? AND msg_seq = ? "
                "LIMIT 1",
                (position.batch_seq, position.msg_seq),
            )
        )
        return None if row is None else str(row[0])

    def last_seq(self) -> int:
        """The change log's last seq (0 when empty)."""
        return self._backend.run(self._last_seq)

    def wait_for_changes(self, after_seq: int, timeout: float) -> int:
        """The change log's last seq, as soon as it exceeds `after_seq` (woken by the writer's
        commit, not by polling), or at `timeout` seconds whatever it is."""
        return self._backend.wait_for_changes(after_seq, timeout, self.last_seq)

    def retention(self) -> Retention:
        """The live == lake gate and how far each history table is pruned."""
        return self._backend.run(self._retention)

    def lake_progress(self) -> LakeProgress | None:
        """The lake's progress as last recorded (None: never recorded); one row by key."""
        b = self._backend
        row = b.run(
            lambda c: b.fetch_one(
                c,
                "SELECT fold_step, last_batch_seq, committed_at, dead_letters, recorded_at "
                "FROM lake_progress WHERE id = 1",
            )
        )
        if row is None:
            return None
        return LakeProgress(int(row[0]), int(row[1]), b.stamp(row[2]), int(row[3]), b.stamp(row[4]))

    def close(self) -> None:
        """Close the connections (idempotent)."""
        self._backend.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- reads the writer shares, inside its transactions --------------------------------------

    def _last_seq(self, conn: Any) -> int:
        row = self._backend.fetch_one(conn, "SELECT max(seq) FROM changes")
        return int(row[0]) if row and row[0] is not None else 0

    def _halt(self, conn: Any) -> StoreHalt | None:
        row = self._backend.fetch_one(
            conn, "SELECT reason, detail, raised_at FROM halt WHERE id = 1"
        )
        return None if row is None else StoreHalt(row[0], row[1], self._backend.stamp(row[2]))

    def _retention(self, conn: Any) -> Retention:
        b = self._backend
        row = b.fetch_one(
            conn,
            "SELECT checked_batch, changes_pruned_seq, changes_pruned_batch, changes_pruned_at, "
            "dead_letters_pruned_seq FROM retention WHERE id = 1",
        )
        assert row is not None  # created with the schema
        return Retention(
            int(row[0]), int(row[1]), int(row[2]), b.timestamp_out(row[3]), int(row[4])
        )

    def _read_held(
        self, query: str, params: Sequence[Any]
    ) -> tuple[list[tuple[Any, ...]], Retention]:
        """`query`'s rows and the retention row, read in one snapshot (a prune committing
        between the two reads cannot make a short answer look whole)."""
        b = self._backend

        def work(conn: Any) -> tuple[list[tuple[Any, ...]], Retention]:
            with b.transaction(conn, write=False):
                return b.fetch_all(conn, query, params), self._retention(conn)

        return b.run(work)

    def _changes_pruned(self, held: Retention, asked: str) -> ChangesPruned:
        return ChangesPruned(
            f"serving store {self.shown}: {asked} are pruned (history older than the window "
            f"and checked live == lake up to batch {held.changes_pruned_batch}); the change "
            f"log is complete after seq {held.changes_pruned_seq}, each master's last change "
            "kept before it: read the masters and resume after that seq",
            held.changes_pruned_seq,
        )

    def _change(self, r: Sequence[Any]) -> Change:
        b = self._backend
        return Change(r[0], r[1], r[2], r[3], b.timestamp_out(r[4]), b.stamp(r[5]), *r[6:])


def _limit(limit: int) -> int:
    if not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit {limit} must be 1 to {MAX_LIMIT}")
    return limit
