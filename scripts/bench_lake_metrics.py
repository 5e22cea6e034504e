"""What exporting the lake's metrics costs sis-live (sis_platform/live/lakelag.py): the read of
the lake's record in the serving store, the landing zone's look for the oldest unfolded message,
a turn of the watch when nothing moved, and rendering /metrics with the lake's series.

    python scripts/bench_lake_metrics.py [--batches 1000] [--repeat 2000]

The zone holds `--batches` sealed batches of 3 messages each (landed as sis-live lands them);
the store is SQLite under a temporary folder. Figures are medians (and p99 where it matters)
in microseconds, on this process's one core.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from prometheus_client.exposition import generate_latest

from sis_platform.live.lakelag import LakeWatch
from sis_platform.live.metrics import LiveMetrics, LiveState
from sis_platform.log.landing import ClosedBy, GroupWriter, LandingZone
from sis_platform.log.landing.backlog import oldest_waiting
from sis_platform.queues.base import ReceivedMessage, new_message_id
from sis_platform.serving import LakeProgress, open_writer


def timed(work: Callable[[], object], repeat: int) -> list[float]:
    """Microseconds of each of `repeat` calls of `work`."""
    spent = []
    for _ in range(repeat):
        started = time.perf_counter()
        work()
        spent.append((time.perf_counter() - started) * 1e6)
    return spent


def p99(values: list[float]) -> float:
    return sorted(values)[int(len(values) * 0.99) - 1]


def land(zone: LandingZone, batches: int) -> None:
    writer = GroupWriter(zone.writer)
    writer.recover()
    now = datetime.now(UTC)
    for _ in range(batches):
        writer.land([ReceivedMessage(new_message_id(), b"<sportsdata/>", now, 1) for _ in range(3)])
        writer.seal(ClosedBy.MESSAGES)


def state(watch: LakeWatch) -> LiveState:
    return LiveState(
        holding=True,
        landed=(1, 2),
        applied=(1, 2),
        behind_seconds=0.0,
        source_connected=True,
        store_available=True,
        halted=False,
        heartbeat_age_seconds=0.1,
        alive=True,
        ready=True,
        lake=watch.current,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        zone = LandingZone(root / "landing")
        started = time.perf_counter()
        land(zone, args.batches)
        landing_s = time.perf_counter() - started
        store = open_writer(f"sqlite:///{root / 'serving' / 'serving.db'}")
        store.record_lake_progress(LakeProgress(10, 1, datetime.now(UTC), 4))
        reads = timed(store.lake_progress, args.repeat)
        looks = timed(lambda: oldest_waiting(zone.catalog, 1, None), max(20, args.repeat // 40))
        last = zone.catalog.last_position()
        watch = LakeWatch(zone.catalog, 0.0, time.monotonic)
        watch.turn(store.lake_progress, last, None)  # the first look: the zone read once
        turns = timed(lambda: watch.turn(store.lake_progress, last, None), args.repeat)
        with_lake, without = LiveMetrics(process=False), LiveMetrics(process=False)
        with_lake.watch(lambda: state(watch))
        without.watch(lambda: LiveState(**{**state(watch).__dict__, "lake": None}))
        rendered = timed(lambda: generate_latest(with_lake.registry), args.repeat)
        bare = timed(lambda: generate_latest(without.registry), args.repeat)
        store.close()
    load = os.getloadavg()[0]
    print(f"zone: {args.batches} sealed batches landed in {landing_s:.1f} s; load {load:.2f}")
    print(
        f"store.lake_progress() (SQLite, one row by key): median "
        f"{statistics.median(reads):.1f} us, p99 {p99(reads):.1f} us"
    )
    print(
        f"oldest_waiting() over {args.batches} batches (listing + one file's column): median "
        f"{statistics.median(looks):.0f} us, p99 {p99(looks):.0f} us"
    )
    print(
        f"LakeWatch.turn, the lake standing still (store read, no zone read): median "
        f"{statistics.median(turns):.1f} us"
    )
    print(
        f"rendering /metrics: with the lake's series {statistics.median(rendered):.0f} us, "
        f"without {statistics.median(bare):.0f} us"
    )


if __name__ == "__main__":
    main()
