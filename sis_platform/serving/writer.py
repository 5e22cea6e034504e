"""The serving store's writing side: what sis-live's applier and the platform's assets write.

`ServingWriter` is a `ServingReader` that also writes. sis-live, the one writer, commits each
group in one transaction that also moves the stored log position; a position not after the
stored one is refused (`PositionConflict`). Around that it reads what its fold needs
(`masters_state`, `seen`, `ahead`), records a halt and its heartbeat, and prunes history up to
the live == lake gate. The platform's assets record that gate (`record_checked`) and the lake's
progress (`record_lake_progress`). `open_writer(url)` opens one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from sis_platform.domain.dedup import DEFAULT_DEDUP_WINDOW, DedupWindow
from sis_platform.log.position import LogPosition
from sis_platform.runtime.faults import crash_point
from sis_platform.serving import rows as R
from sis_platform.serving.backend import utc_now
from sis_platform.serving.opening import open_backend
from sis_platform.serving.reader import ServingReader
from sis_platform.serving.records import (
    GroupCommit,
    LakeProgress,
    MasterRow,
    PositionConflict,
    Pruned,
    Retention,
    StoreHalt,
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
)
from sis_platform.serving.sqlite import DEFAULT_BUSY_TIMEOUT_SECONDS

CRASH_POINT = "live.store_commit"
PRUNE_POINT = "serving.prune"
AFTER_PRUNE_POINT = "serving.after_prune"
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


def open_writer(
    url: str | None = None, *, busy_timeout: float = DEFAULT_BUSY_TIMEOUT_SECONDS
) -> ServingWriter:
    """A writer of the serving store at `url` (None: the configured SIS_SERVING_URL), its
    schema created if missing. ValueError (naming the URL, password-free) for a URL that names
    no store; ServingUnavailable if it cannot be reached. `busy_timeout`: how long a SQLite
    writer waits for the lock before ServingUnavailable."""
    return ServingWriter(open_backend(url, busy_timeout, read_only=False))


class ServingWriter(ServingReader):
    """Reads and writes the serving store `backend` connects to."""

    # -- what sis-live's fold reads ------------------------------------------------------------

    def masters_state(self, ids: Iterable[str]) -> dict[str, MasterRow]:
        """The stored state of those of `ids` the store has."""
        wanted = sorted(set(ids))
        if not wanted:
            return {}
        b = self._backend
        condition, param = b.ids("master_id", wanted)
        query = (
            "SELECT master_id, version, document, message_id, stale, filtered FROM masters "
            f"WHERE {condition}"
        )
        found = b.run(lambda c: b.fetch_all(c, query, (param,)))
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

    def latest_copies(self, message_ids: Iterable[str], since_batch: int = 0) -> dict[str, int]:
        """Those of `message_ids` that have an outcome in batch `since_batch` or later and at or
        before the store's position (were applied in an earlier group; an item committed ahead
        of the position does not count), each with the batch of its latest such outcome: the
        earlier copies the dedup window asks about (sis_platform/domain/dedup.py)."""
        wanted = sorted(set(message_ids))
        if not wanted:
            return {}
        b = self._backend
        condition, param = b.ids("o.message_id", wanted)
        query = (
            "SELECT o.message_id, max(o.batch_seq) FROM message_outcomes o, position p "
            f"WHERE p.id = 1 AND {condition} AND o.batch_seq >= ? AND (o.batch_seq < p.batch_seq "
            "OR (o.batch_seq = p.batch_seq AND o.msg_seq <= p.msg_seq)) GROUP BY o.message_id"
        )
        found = b.run(lambda c: b.fetch_all(c, query, (param, since_batch)))
        return {r[0]: int(r[1]) for r in found}

    def ahead(self) -> dict[str, LogPosition]:
        """The masters committed ahead of the position, each with the position its items are
        applied to (empty unless a stretch committed in parts was interrupted)."""
        b = self._backend
        found = b.run(lambda c: b.fetch_all(c, "SELECT master_id, batch_seq, msg_seq FROM ahead"))
        return {r[0]: LogPosition(int(r[1]), int(r[2])) for r in found}

    # -- sis-live's commit ---------------------------------------------------------------------

    def commit(self, group: GroupCommit) -> None:
        """Everything of `group` and its position in one transaction; `PositionConflict` if the
        position is not after the stored one, `ServingUnavailable` on an outage (then nothing
        of the group is stored). A part committed `ahead` records its masters as ahead instead
        of moving the position; the part that moves it clears them."""
        last_seq = self._backend.run(lambda conn: self._commit(conn, group))
        self._backend.after_commit(last_seq)

    def _commit(self, conn: Any, group: GroupCommit) -> int:
        b = self._backend
        with b.transaction(conn, write=True):
            stored = self._locked_position(conn)
            if group.position <= stored:
                raise PositionConflict(
                    f"serving store {self.shown}: group position {tuple(group.position)} is "
                    f"not after the stored {tuple(stored)} (a second writer?)"
                )
            now = b.timestamp_in(self._commit_time(conn))
            self._write_group(conn, group, now)
            last_seq = self._last_seq(conn)
            batch_seq, msg_seq = group.position
            if group.ahead:
                b.execute_many(
                    conn,
                    AHEAD.insert() + " ON CONFLICT (master_id) DO UPDATE SET "
                    "batch_seq = excluded.batch_seq, msg_seq = excluded.msg_seq",
                    [(master_id, batch_seq, msg_seq) for master_id in group.ahead],
                )
            else:
                conn.execute(
                    b.sql(
                        "UPDATE position SET batch_seq = ?, msg_seq = ?, committed_at = ?, "
                        "messages = messages + ? WHERE id = 1"
                    ),
                    (batch_seq, msg_seq, now, group.messages),
                )
                conn.execute(
                    b.sql(
                        "DELETE FROM ahead WHERE batch_seq < ? OR (batch_seq = ? AND msg_seq <= ?)"
                    ),
                    (batch_seq, batch_seq, msg_seq),
                )
            b.before_commit(conn, last_seq)
            crash_point(CRASH_POINT)
        return last_seq

    def _commit_time(self, conn: Any) -> datetime:
        """Now, or the previous commit's time if the clock was stepped back since: the change
        log's `committed_at` never goes backwards, so `change_as_of` never answers with a
        version readers were shown only later. Read inside the commit's transaction."""
        now = utc_now()
        row = self._backend.fetch_one(
            conn,
            "SELECT (SELECT committed_at FROM position WHERE id = 1), "
            "(SELECT committed_at FROM changes ORDER BY seq DESC LIMIT 1)",
        )
        previous = [self._backend.stamp(v) for v in row or () if v is not None]
        return max([now, *previous])

    def _locked_position(self, conn: Any) -> LogPosition:
        row = self._backend.fetch_one(conn, self._backend.position_for_update())
        assert row is not None  # created with the schema
        return LogPosition(int(row[0]), int(row[1]))

    def _write_group(self, conn: Any, group: GroupCommit, now: Any) -> None:
        b = self._backend
        b.execute_many(conn, _UPSERT_MASTER, R.master_rows(group.masters, now))
        if group.model:
            condition, param = b.ids("master_id", list(group.model))
            for table in MODEL_TABLES:
                conn.execute(b.sql(f"DELETE FROM {table.name} WHERE {condition}"), (param,))
            model = R.model_rows(group, b.converters)
            for table, rows in zip(
                MODEL_TABLES, (model.events, model.markets, model.selections), strict=True
            ):
                b.insert(conn, table, rows)
        b.insert(conn, CHANGES, R.change_rows(group.changes, now, b.converters))
        b.insert(conn, DEAD_LETTERS, R.dead_letter_rows(group.dead_letters, now))
        b.insert(conn, MESSAGE_OUTCOMES, R.outcome_rows(group.outcomes))

    # -- the writer's state --------------------------------------------------------------------

    def halt(self, reason: str, detail: str) -> None:
        """Record that the writer has halted, and why (`StoreStatus.halt`); a halt already
        recorded keeps the time it was first raised."""
        b = self._backend

        def work(conn: Any) -> None:
            with b.transaction(conn, write=True):
                conn.execute(
                    b.sql(
                        HALT.insert() + " ON CONFLICT (id) DO UPDATE SET reason = excluded.reason, "
                        "detail = excluded.detail"
                    ),
                    (1, reason, detail, b.timestamp_in(utc_now())),
                )

        b.run(work)

    def clear_halt(self) -> StoreHalt | None:
        """Forget a recorded halt (its cause was put right); the halt it was, if any."""
        b = self._backend

        def work(conn: Any) -> StoreHalt | None:
            with b.transaction(conn, write=True):
                halt = self._halt(conn)
                if halt is not None:
                    conn.execute("DELETE FROM halt WHERE id = 1")
                return halt

        return b.run(work)

    def heartbeat(self) -> None:
        """Record that the writer is alive (StoreStatus.heartbeat_at)."""
        b = self._backend

        def work(conn: Any) -> None:
            with b.transaction(conn, write=True):
                conn.execute(
                    b.sql("UPDATE position SET heartbeat_at = ? WHERE id = 1"),
                    (b.timestamp_in(utc_now()),),
                )

        b.run(work)

    # -- what the platform's assets record -----------------------------------------------------

    def record_checked(self, batch_seq: int) -> None:
        """Record that live == lake passed at batch `batch_seq` (the live_matches_lake check):
        history up to it may be pruned. The gate never moves back."""
        b = self._backend

        def work(conn: Any) -> None:
            with b.transaction(conn, write=True):
                conn.execute(
                    b.sql(
                        "UPDATE retention SET checked_batch = ? WHERE id = 1 AND checked_batch < ?"
                    ),
                    (batch_seq, batch_seq),
                )

        b.run(work)

    def record_lake_progress(self, progress: LakeProgress) -> None:
        """Record the lake's last committed fold step (one row, replaced): written by the fold's
        single writer, so the newest record is the lake's state, also after a rebuilt lake
        starts its steps again."""
        b = self._backend

        def work(conn: Any) -> None:
            with b.transaction(conn, write=True):
                conn.execute(b.sql(_UPSERT_LAKE_PROGRESS), self._lake_progress_row(progress))

        b.run(work)

    def _lake_progress_row(self, progress: LakeProgress) -> tuple[Any, ...]:
        b = self._backend
        return (
            1,
            progress.fold_step,
            progress.last_batch_seq,
            b.timestamp_in(progress.committed_at),
            progress.dead_letters,
            b.timestamp_in(utc_now()),
        )

    # -- history retention ---------------------------------------------------------------------

    def prune(
        self, window: timedelta, chunk: int = PRUNE_CHUNK, dedup: DedupWindow = DEFAULT_DEDUP_WINDOW
    ) -> Pruned:
        """One bounded step of removing history: the change log and the dead letters, oldest
        first, at most `chunk` rows of each, only rows of batches at or before the live == lake
        gate and committed more than `window` before the change log's newest commit (the log's
        own clock, which never goes back: the host's clock stepped back prunes nothing early,
        an idle feed prunes nothing). Each master's last change is kept. The message outcomes
        too, about `chunk` rows, of batches at or before the gate that the `dedup` window of no
        later message reaches (`_prune_outcomes`). One transaction, then (SQLite) a bounded step
        of reclaiming the space freed."""
        b = self._backend
        pruned = b.run(lambda conn: self._prune(conn, window, chunk, dedup))
        crash_point(AFTER_PRUNE_POINT)
        b.run(b.reclaim)
        return pruned

    def _prune(self, conn: Any, window: timedelta, chunk: int, dedup: DedupWindow) -> Pruned:
        b = self._backend
        with b.transaction(conn, write=True):
            held = self._retention(conn)
            newest = b.fetch_one(conn, "SELECT committed_at FROM changes ORDER BY seq DESC LIMIT 1")
            if held.checked_batch == 0 or newest is None:
                return Pruned(0, 0, False)
            limit = _HistoryLimit(held.checked_batch, b.stamp(newest[0]) - window)
            changes, more_changes = self._prune_changes(conn, held, limit, chunk)
            dead, more_dead = self._prune_dead_letters(conn, held, limit, chunk)
            outcomes, more_outcomes = self._prune_outcomes(conn, held, dedup, chunk)
            crash_point(PRUNE_POINT)
        return Pruned(changes, dead, more_changes or more_dead or more_outcomes, outcomes)

    def _prune_outcomes(
        self, conn: Any, held: Retention, dedup: DedupWindow, chunk: int
    ) -> tuple[int, bool]:
        """The oldest outcomes, about `chunk` rows (whole messages), of batches before the
        store's position's dedup window (every later message's window starts at or after it:
        `latest_copies` is never asked about them again) and at or before the live == lake
        gate; the count removed and whether more may be prunable. None with an unbounded
        window: duplicates are then looked up in the whole log."""
        if not dedup.bounded:
            return 0, False
        b = self._backend
        position = b.fetch_one(conn, "SELECT batch_seq FROM position WHERE id = 1")
        assert position is not None  # created with the schema
        below = min(dedup.oldest(int(position[0])), held.checked_batch + 1)
        last = b.fetch_one(
            conn,
            "SELECT batch_seq, msg_seq FROM message_outcomes WHERE batch_seq < ? "
            "ORDER BY batch_seq, msg_seq LIMIT 1 OFFSET ?",
            (below, chunk - 1),
        )
        if last is None:
            removed = conn.execute(
                b.sql("DELETE FROM message_outcomes WHERE batch_seq < ?"), (below,)
            ).rowcount
            return max(removed, 0), False
        removed = conn.execute(
            b.sql(
                "DELETE FROM message_outcomes WHERE batch_seq < ? "
                "OR (batch_seq = ? AND msg_seq <= ?)"
            ),
            (last[0], last[0], last[1]),
        ).rowcount
        return max(removed, 0), True

    def _prune_changes(
        self, conn: Any, held: Retention, limit: _HistoryLimit, chunk: int
    ) -> tuple[int, bool]:
        """Changes after the pruned seq, up to the first one the limit keeps, removed but for
        each master's last; the count removed and whether the whole chunk was prunable."""
        b = self._backend
        low = held.changes_pruned_seq
        prefix = self._prunable(conn, "changes", "committed_at", low, limit, chunk)
        if not prefix:
            return 0, False
        high = prefix[-1].seq
        # The chunk's masters: their changes up to `high` but the last (older kept ones too).
        removed = conn.execute(
            b.sql(
                "DELETE FROM changes WHERE seq <= ? AND master_id IN "
                "(SELECT master_id FROM changes WHERE seq > ? AND seq <= ?) AND seq NOT IN "
                "(SELECT max(seq) FROM changes WHERE seq > ? AND seq <= ? GROUP BY master_id)"
            ),
            (high, low, high, low, high),
        ).rowcount
        conn.execute(
            b.sql(
                "UPDATE retention SET changes_pruned_seq = ?, changes_pruned_batch = ?, "
                "changes_pruned_at = ? WHERE id = 1"
            ),
            (
                high,
                max(held.changes_pruned_batch, *(r.batch_seq for r in prefix)),
                b.timestamp_in(prefix[-1].at),
            ),
        )
        return max(removed, 0), len(prefix) == chunk

    def _prune_dead_letters(
        self, conn: Any, held: Retention, limit: _HistoryLimit, chunk: int
    ) -> tuple[int, bool]:
        """Dead letters after the pruned seq, up to the first one the limit keeps, removed."""
        b = self._backend
        low = held.dead_letters_pruned_seq
        prefix = self._prunable(conn, "dead_letters", "recorded_at", low, limit, chunk)
        if not prefix:
            return 0, False
        high = prefix[-1].seq
        removed = conn.execute(
            b.sql("DELETE FROM dead_letters WHERE seq > ? AND seq <= ?"), (low, high)
        ).rowcount
        conn.execute(
            b.sql("UPDATE retention SET dead_letters_pruned_seq = ? WHERE id = 1"), (high,)
        )
        return max(removed, 0), len(prefix) == chunk

    def _prunable(
        self, conn: Any, table: str, stamp: str, low: int, limit: _HistoryLimit, chunk: int
    ) -> list[_Row]:
        """The rows of `table` after seq `low` (at most `chunk`, in seq order) that `limit` lets
        go, up to the first it keeps; `stamp`: the table's commit time column."""
        b = self._backend
        rows = b.fetch_all(
            conn,
            f"SELECT seq, batch_seq, {stamp} FROM {table} WHERE seq > ? ORDER BY seq LIMIT ?",
            (low, chunk),
        )
        return limit.prefix([(r[0], r[1], b.stamp(r[2])) for r in rows])


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
