"""A SQLite serving store as a season of the feed leaves it, for sis-live's benchmark at an age.

    python scripts/age_serving_store.py sqlite:///PATH/serving.db --days 365

The store sis-live commits to keeps, after D days of the feed (docs/operations.md, "Serving
store history"): every master ever seen with its model rows (`masters`, `events`, `markets`,
`selections`: kept for good), each master's last change plus the last SIS_SERVING_HISTORY_DAYS
(30) days of the change log and dead letters, and the dedup window's outcomes (30 days at the
default SIS_DEDUP_WINDOW_BATCHES). This script builds that state in bulk, the way
scripts/bench_season.py builds the lake's:

1. The base (real): a day of the simulated feed (36,000 messages, 720 batches of 50, the
   feed's average), folded by sis-live's own stages (`Classify`, `Fold`) and committed by the
   store's own writer, batch by batch, into a scratch store beside the target.
2. D copies of the base's rows into the target, copy k with every master id and message id
   suffixed `~k` (each day of the feed brings new races and new messages) and its batch numbers
   moved below zero (before any batch the benchmark then lands): all of them in the kept-for-
   good tables, the last 30 copies' rows in the windowed ones, and each master's last change of
   every older copy. The target's log position is left where it was (the start), so sis-live
   starts on it as on a new store at that position, with a season's rows beside it.

What it leaves out: the pruned rows' free pages (pruning gives them back in bounded steps) and
the store's own statistics (none are kept on SQLite). Prints each table's rows and the file's
size. The target is created with the store's schema if it is new, and must hold no rows of its
own yet.
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from sis_platform.domain.limits import DEFAULT_LIMITS
from sis_platform.domain.pipeline import LoggedMessage
from sis_platform.live.classify import Classify
from sis_platform.live.config import FoldOptions
from sis_platform.live.fold import Fold
from sis_platform.log.landing import LandedMessage, LogPosition
from sis_platform.serving import open_writer
from sis_platform.serving.schema import (
    CHANGES,
    DEAD_LETTERS,
    EVENTS,
    MARKETS,
    MASTERS,
    MESSAGE_OUTCOMES,
    SELECTIONS,
    TableDef,
)
from sis_platform.settings import DEFAULT_SERVING_HISTORY_DAYS
from sis_platform.simulator.generator import INVALID_REASONS, generate_feed

BATCHES_PER_DAY = 720
MESSAGES_PER_BATCH = 50
# The dedup window's days at the default SIS_DEDUP_WINDOW_BATCHES (21,600 two-minute batches).
DEDUP_WINDOW_DAYS = 30
# Copy k's batches lie below zero, before any batch the benchmark lands afterwards.
BATCH_OFFSET = 1_000_000

# A few of each invalid kind, for dead letters in the window (as tests/live/feed.py's feed).
INVALID = {str(reason): 0.004 for reason in INVALID_REASONS}
# The tables kept for good, one copy per day; the windowed ones, one per day of the window.
KEPT = (MASTERS, EVENTS, MARKETS, SELECTIONS)


def base_day(seed: int, batches: int = BATCHES_PER_DAY) -> Iterator[list[LandedMessage]]:
    """A simulated day (or its first `batches`), batch by batch, as sis-live lands it."""
    feed = generate_feed(seed, batches * MESSAGES_PER_BATCH, invalid=INVALID, duplicates=0.01)
    batch: list[LandedMessage] = []
    for index, message in enumerate(feed):
        batch_seq = index // MESSAGES_PER_BATCH + 1
        logged = LoggedMessage(message.message_id, message.body, batch_seq=batch_seq)
        if len(message.body) > DEFAULT_LIMITS.max_message_bytes:
            # As intake lands a body over the bound: moved aside, logged empty with its size
            # and place, and dead-lettered `too-large` without it.
            location = f"overflow/{message.message_id}"
            logged = LoggedMessage(
                message.message_id, b"", 1, len(message.body), location, batch_seq=batch_seq
            )
        position = LogPosition(batch_seq, index % MESSAGES_PER_BATCH)
        batch.append(LandedMessage(position, logged, message.sent))
        if len(batch) == MESSAGES_PER_BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def build_base(db: Path, seed: int, batches: int = BATCHES_PER_DAY) -> None:
    """Fold the base day into a new store at `db` with sis-live's classify and fold stages."""
    with open_writer(f"sqlite:///{db}") as store:
        classify, fold = Classify(store, FoldOptions()), Fold(store, FoldOptions())
        for batch in base_day(seed, batches):
            store.commit(fold(classify(batch)))


def _copied(table: TableDef) -> str:
    """The select list of copy `copies.k` of `table`'s base rows."""
    out = []
    for name in table.names:
        if name in ("master_id", "message_id"):
            out.append(f"CASE WHEN {name} IS NULL THEN NULL ELSE {name} || '~' || copies.k END")
        elif name == "batch_seq":
            out.append(f"batch_seq - copies.k * {BATCH_OFFSET}")
        else:
            out.append(name)
    return ", ".join(out)


def _copy(conn: sqlite3.Connection, table: TableDef, upto: int, where: str = "") -> None:
    conn.execute(
        f"INSERT INTO main.{table.name} ({', '.join(table.names)}) "
        f"SELECT {_copied(table)} FROM base.{table.name} "
        f"CROSS JOIN copies WHERE copies.k <= {upto} {where} ORDER BY copies.k"
    )


def age(
    url: str,
    days: int,
    *,
    seed: int = 7,
    history_days: int = DEFAULT_SERVING_HISTORY_DAYS,
    batches: int = BATCHES_PER_DAY,
) -> dict:
    """Give the store at `url` (SQLite, new or with no rows) the rows of `days` days of the feed
    (module docstring); the figures. `batches`: the base day's batches (fewer: a smaller
    day, for a test)."""
    open_writer(url).close()  # the store's schema, if it is new
    target = Path(url.removeprefix("sqlite:///"))
    figures: dict = {"days": days}
    with tempfile.TemporaryDirectory(prefix="sis-aged-") as scratch:
        base = Path(scratch) / "base.db"
        started = time.perf_counter()
        build_base(base, seed, batches)
        figures["base_s"] = round(time.perf_counter() - started, 1)
        started = time.perf_counter()
        conn = sqlite3.connect(target, isolation_level=None)
        try:
            conn.execute("PRAGMA synchronous=OFF")
            conn.execute("PRAGMA cache_size=-1000000")
            conn.execute("ATTACH DATABASE ? AS base", (str(base),))
            conn.execute("CREATE TEMP TABLE copies (k INTEGER PRIMARY KEY)")
            conn.executemany("INSERT INTO copies VALUES (?)", [(k,) for k in range(1, days + 1)])
            conn.execute("BEGIN")
            for table in KEPT:
                _copy(conn, table, days)
            _copy(conn, DEAD_LETTERS, min(days, history_days))
            _copy(conn, MESSAGE_OUTCOMES, min(days, DEDUP_WINDOW_DAYS))
            # The change log: the window's copies whole, every older one's last change per
            # master (which pruning keeps whatever its age).
            _copy(conn, CHANGES, min(days, history_days))
            if days > history_days:
                last = "SELECT MAX(seq) FROM base.changes GROUP BY master_id"
                _copy(conn, CHANGES, days, f"AND copies.k > {history_days} AND seq IN ({last})")
            conn.execute("COMMIT")
            conn.execute("DETACH DATABASE base")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            for table in (*KEPT, CHANGES, DEAD_LETTERS, MESSAGE_OUTCOMES):
                (rows,) = conn.execute(f"SELECT COUNT(*) FROM {table.name}").fetchone()
                figures[f"{table.name}_rows"] = rows
        finally:
            conn.close()
        figures["copy_s"] = round(time.perf_counter() - started, 1)
    figures["file_mb"] = round(target.stat().st_size / 1e6, 1)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url", help="sqlite:///PATH: a new store, or one with no rows")
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    if not args.url.startswith("sqlite:///"):
        raise SystemExit("a SQLite store's URL (sqlite:///PATH)")
    for key, value in age(args.url, args.days, seed=args.seed).items():
        print(f"{key}: {value:,}" if isinstance(value, int) else f"{key}: {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
