"""The lake's upkeep over many small batch runs: files, deletion vectors and log entries per
table, and run time, with compaction and VACUUM inside the fold's and the model's steps.

    python scripts/bench_upkeep.py --batches 60 --batch 10 --optimize-every 10 --vacuum-every 30

Lands `--batches` batches of `--batch` simulated messages (the queue sensor's intake), then runs
the `process_batch` job for each in turn in this process (one Spark driver), as the daemon's
runs would one after another. Prints each run's wall time, the mean of the first and of the last
tenth of the runs, and for each table the upkeep keeps compact: the data files its latest
version lists, and on the volume its data files, deletion-vector files and log entries (files a
later VACUUM removes are counted until it does; the retention keeps them at least a day). Set
`--optimize-every 0` for the same runs without upkeep. Uses a new data folder, removed at the
end unless `--keep`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from pyspark.sql import SparkSession

from sis_platform.cli.footprint import table_footprint
from sis_platform.lake.upkeep import UPKEEP_TABLES, table_files
from sis_platform.queues.embedded import EmbeddedQueue
from sis_platform.settings import python_workers_use_this_interpreter
from sis_platform.simulator.generator import generate_feed
from sis_platform.testing.inprocess import InProcessPlatform


def out(line: str = "") -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--batch", type=int, default=10, help="messages per batch")
    parser.add_argument("--optimize-every", type=int, default=10)
    parser.add_argument("--vacuum-every", type=int, default=30)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--keep", action="store_true", help="keep the data folder")
    args = parser.parse_args()
    python_workers_use_this_interpreter()
    data = Path(tempfile.mkdtemp(prefix="sis-bench-upkeep-"))
    env = {
        "SIS_INTAKE": "sensor",
        "SIS_SPARK_MASTER": os.environ.get("SIS_SPARK_MASTER", "local[2]"),
        "SIS_SPARK_SHUFFLE_PARTITIONS": "2",
        "SIS_GET_WAIT_SECONDS": "0.05",
        "SIS_BATCH_MAX_MESSAGES": str(args.batch),
        "SIS_LAKE_OPTIMIZE_EVERY": str(args.optimize_every),
        "SIS_LAKE_VACUUM_EVERY": str(args.vacuum_every),
    }
    try:
        with EmbeddedQueue(data / "queue").producer() as producer:
            feed = generate_feed(seed=args.seed, messages=args.batches * args.batch)
            producer.put_many([(m.body, m.message_id) for m in feed])
        platform = InProcessPlatform(data, env)
        platform.drain()
        out(
            f"data {data}; {len(platform.requested)} batches of {args.batch} messages; "
            f"optimize every {args.optimize_every}, vacuum every {args.vacuum_every}; "
            f"load {os.getloadavg()[0]:.2f}"
        )
        seconds: list[float] = []
        for key in platform.requested:
            t0 = time.perf_counter()
            platform.run(key)
            seconds.append(time.perf_counter() - t0)
            out(f"run {key}: {seconds[-1]:.1f} s")
        tenth = max(1, len(seconds) // 10)
        first, last = statistics.mean(seconds[:tenth]), statistics.mean(seconds[-tenth:])
        out(
            f"runs: {len(seconds)}; mean of the first {tenth}: {first:.1f} s, "
            f"of the last {tenth}: {last:.1f} s; load {os.getloadavg()[0]:.2f}"
        )
        lake = platform.lake(SparkSession.builder.getOrCreate())
        out(f"{'table':<18} {'listed':>6} {'files':>6} {'DVs':>5} {'log':>5}")
        for table in UPKEEP_TABLES:
            if not lake.exists(table):
                continue
            listed = table_files(lake, table).active_files
            disk = table_footprint(Path(lake.path(table)))
            out(
                f"{table.name:<18} {listed:>6} {disk.data_files.files:>6} "
                f"{disk.deletion_vectors.files:>5} {disk.log_entries.files:>5}"
            )
    finally:
        if not args.keep:
            shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
