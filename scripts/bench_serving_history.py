"""The serving store's size over simulated days, with and without history pruning.

    python scripts/bench_serving_history.py --days 60 --messages-per-day 36000

Builds two SQLite stores with the store's own writer (`ServingWriter.commit`), one group per
landing batch (720 batches a day, the feed's average of 0.42 msg/s spread over them), each
message a new version of one of the day's races, one in a hundred dead-lettered with a 2 KB
body. The store's commit clock is the simulated day (the script replaces
`sis_platform.serving.writer.utc_now`). After each day the second store records live == lake
as passed at the day's last batch and prunes (`ServingWriter.prune`, as sis-live's idle turns
do) until nothing more is prunable; the first never prunes. Prints, per day, each store's
file size and rows, the prune steps' durations (a message arriving during a step waits
for it), and at the end each store's size by table. The stores are left in a temporary folder
(printed) for a closer look; remove it afterwards.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sis_platform.domain.interpret import interpret
from sis_platform.log.position import LogPosition
from sis_platform.serving import (
    ChangeRow,
    DeadLetterRow,
    GroupCommit,
    MasterRow,
    OutcomeRow,
    ServingWriter,
    open_writer,
)
from sis_platform.serving import writer as writer_module
from sis_platform.settings import DEFAULT_SERVING_HISTORY_DAYS

DAY0 = datetime(2026, 3, 1, tzinfo=UTC)
BATCHES_PER_DAY = 720
RACES_PER_DAY = 400
DEAD_EVERY = 100
DEAD_BODY = b"<sportsdata>" + b"x" * 2048


def _document(master_id: str, version: int) -> bytes:
    selections = "".join(
        f'<selection id="{master_id}-s{n}" number="{n}" name="Horse {n}" status="runner">'
        f'<price num="{version + n}" den="4" at="2026-03-01T12:00:00Z"/></selection>'
        for n in range(1, 9)
    )
    return (
        f'<event id="{master_id}" sport="horse-racing" country="GB" course="Ascot" '
        f'name="Race {master_id}" start="2026-03-01T14:00:00Z" status="open">'
        f'<market id="{master_id}-win" type="win" status="open" places="1">{selections}</market>'
        "</event>"
    ).encode()


class Feed:
    """Messages of simulated days: versions of each day's races, in batch order."""

    def __init__(self, messages_per_day: int) -> None:
        self.per_batch = max(1, messages_per_day // BATCHES_PER_DAY)
        self.versions: dict[str, int] = {}
        self.sent = 0

    def batch(self, day: int, batch_seq: int) -> GroupCommit:
        masters: dict[str, MasterRow] = {}
        changes, letters, outcomes = [], [], []
        for msg_seq in range(self.per_batch):
            self.sent += 1
            message_id = f"m{self.sent}"
            if self.sent % DEAD_EVERY == 0:
                letters.append(
                    DeadLetterRow(
                        message_id, None, None, "invalid", "not XML", batch_seq, msg_seq, DEAD_BODY
                    )
                )
                outcomes.append(
                    OutcomeRow(message_id, batch_seq, msg_seq, -1, None, "dead-lettered", "invalid")
                )
                continue
            master_id = f"d{day}-r{self.sent % RACES_PER_DAY}"
            version = self.versions[master_id] = self.versions.get(master_id, 0) + 1
            document = _document(master_id, version)
            masters[master_id] = MasterRow(master_id, version, document, message_id, False, False)
            changes.append(
                ChangeRow(
                    master_id,
                    version,
                    message_id,
                    0,
                    batch_seq,
                    msg_seq,
                    None,
                    "upsert",
                    hashlib.sha256(document).hexdigest(),
                )
            )
            outcomes.append(
                OutcomeRow(message_id, batch_seq, msg_seq, 0, master_id, "applied", None)
            )
        model = {m: interpret(m, row.document or b"") for m, row in masters.items()}
        return GroupCommit(
            LogPosition(batch_seq, self.per_batch - 1),
            list(masters.values()),
            model,
            changes,
            letters,
            outcomes,
        )


def _size(store: ServingWriter, path: Path) -> int:
    store._backend.run(lambda conn: conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall())
    return path.stat().st_size


def _rows(store: ServingWriter, table: str) -> int:
    found = store._backend.run(
        lambda conn: conn.execute(f"SELECT count(*) FROM {table}").fetchone()
    )
    return int(found[0])


def _tables(store: ServingWriter) -> str:
    found = store._backend.run(
        lambda conn: conn.execute(
            "SELECT name, sum(pgsize) FROM dbstat GROUP BY name ORDER BY 2 DESC"
        ).fetchall()
    )
    return ", ".join(f"{name} {size / 2**20:.1f}" for name, size in found if size >= 2**16)


def _prune(store: ServingWriter, window: timedelta) -> list[float]:
    """Prune steps until none is left; each step's seconds."""
    steps = []
    while True:
        start = time.perf_counter()
        more = store.prune(window).more
        steps.append(time.perf_counter() - start)
        if not more:
            return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=60)
    parser.add_argument("--messages-per-day", type=int, default=36_000)
    parser.add_argument("--history-days", type=float, default=DEFAULT_SERVING_HISTORY_DAYS)
    parser.add_argument("--every", type=int, default=5, help="print every this many days")
    args = parser.parse_args()
    window = timedelta(days=args.history_days)
    folder = Path(tempfile.mkdtemp(prefix="serving-history-"))
    paths = {"kept": folder / "kept.db", "pruned": folder / "pruned.db"}
    stores = {name: open_writer(f"sqlite:///{path}") for name, path in paths.items()}
    feeds = {name: Feed(args.messages_per_day) for name in stores}
    steps: list[float] = []
    print(
        f"{args.messages_per_day} msg/day in {BATCHES_PER_DAY} groups, history "
        f"{args.history_days} days; stores in {folder}"
    )
    print(
        "day  kept_MB  kept_changes  pruned_MB  pruned_changes  pruned_dead  step_p50_ms "
        "step_max_ms"
    )
    for day in range(args.days):
        clock: Callable[[], datetime] = lambda day=day: DAY0 + timedelta(days=day)  # noqa: E731
        writer_module.utc_now = clock  # type: ignore[assignment]
        for n in range(BATCHES_PER_DAY):
            batch_seq = day * BATCHES_PER_DAY + n + 1
            for name, store in stores.items():
                store.commit(feeds[name].batch(day, batch_seq))
        pruned = stores["pruned"]
        pruned.record_checked((day + 1) * BATCHES_PER_DAY)
        day_steps = _prune(pruned, window)
        steps += day_steps
        if (day + 1) % args.every == 0 or day + 1 == args.days:
            kept = stores["kept"]
            print(
                f"{day + 1:>3}  {_size(kept, paths['kept']) / 2**20:7.1f}  "
                f"{_rows(kept, 'changes'):12d}  {_size(pruned, paths['pruned']) / 2**20:9.1f}  "
                f"{_rows(pruned, 'changes'):14d}  {_rows(pruned, 'dead_letters'):11d}  "
                f"{statistics.median(day_steps) * 1000:11.1f}  {max(day_steps) * 1000:11.1f}"
            )
    print(
        f"prune steps: {len(steps)}, p50 {statistics.median(steps) * 1000:.1f} ms, "
        f"max {max(steps) * 1000:.1f} ms"
    )
    for name, store in stores.items():
        print(f"{name}: MB by table and index, largest first: {_tables(store)}")
    for store in stores.values():
        store.close()


if __name__ == "__main__":
    main()
