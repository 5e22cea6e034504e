"""Backlog benchmark: the queue preloaded by the simulator, the platform run until every master
is current. Prints wall time, messages/s and the peak memory of the whole process tree.

    python scripts/bench_backlog.py --messages 12000 [--mode inprocess|daemon] [--batch 5000]

inprocess: sensor ticks and the requested runs executed in this process through Dagster's
public APIs (one Spark session for all runs), as the tests do.
daemon: a real `dagster-daemon` launching each run in its own process (its own Spark driver),
as `scripts/run.sh` does.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


class PeakMemory(threading.Thread):
    """Samples the RSS of this process and all its descendants every 0.2 s."""

    def __init__(self, root: psutil.Process) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.peak = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.2):
            total = 0
            for p in [self.root, *self.root.children(recursive=True)]:
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    pass
            self.peak = max(self.peak, total)


def preload(data: Path, messages: int, seed: int) -> int:
    from sis_platform.queues.embedded import EmbeddedQueue
    from sis_platform.simulator.generator import generate_feed

    queue = EmbeddedQueue(data / "queue")
    n = 0
    with queue.producer() as producer:
        for m in generate_feed(seed=seed, messages=messages):
            producer.put(m.body, message_id=m.message_id)
            n += 1
    return n


def run_inprocess(data: Path, env: dict[str, str]) -> tuple[int, int]:
    import dagster as dg

    from tests.harness import Harness

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    h = Harness(data, env)
    runs = 0
    while True:
        result = h.tick()
        if isinstance(result, dg.SkipReason):
            break
        for request in result.run_requests or []:
            h.run(request.partition_key)
            runs += 1
    return len(h.zone.keys()), runs


def run_daemon(data: Path, env: dict[str, str]) -> tuple[int, int]:
    import dagster as dg

    from sis_platform.landing import LandingZone
    from sis_platform.queues.embedded import EmbeddedQueue

    home = data / "dagster"
    home.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "deploy" / "dagster.yaml", home / "dagster.yaml")
    full_env = {**os.environ, **env, "DAGSTER_HOME": str(home)}
    os.environ["DAGSTER_HOME"] = str(home)
    instance = dg.DagsterInstance.get()
    daemon = subprocess.Popen(
        [str(Path(sys.executable).parent / "dagster-daemon"), "run", "-w",
         str(REPO / "workspace.yaml")],
        cwd=REPO, env=full_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    zone, queue = LandingZone(data / "landing"), EmbeddedQueue(data / "queue")
    try:
        while True:
            time.sleep(1.0)
            done = instance.get_run_records(
                dg.RunsFilter(job_name="process_batch",
                              statuses=[dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE])
            )
            keys = zone.keys()
            finished = {r.dagster_run.tags.get("dagster/partition") for r in done}
            if keys and not queue.depth() and finished >= set(keys):
                return len(keys), len(done)
    finally:
        os.killpg(daemon.pid, signal.SIGTERM)
        daemon.wait(timeout=60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=12_000)
    parser.add_argument("--mode", choices=["inprocess", "daemon"], default="inprocess")
    parser.add_argument("--batch", type=int, default=5_000, help="SIS_BATCH_MAX_MESSAGES")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the data folder")
    args = parser.parse_args()

    data = Path(tempfile.mkdtemp(prefix="sis-bench-"))
    env = {
        "SIS_DATA_DIR": str(data),
        "SIS_BATCH_MAX_MESSAGES": str(args.batch),
        "SIS_BATCH_MAX_SECONDS": "15",
        "SIS_GET_WAIT_SECONDS": "0.2",
    }
    t0 = time.monotonic()
    n = preload(data, args.messages, args.seed)
    preload_s = time.monotonic() - t0
    sampler = PeakMemory(psutil.Process())
    sampler.start()
    t0 = time.monotonic()
    if args.mode == "inprocess":
        batches, runs = run_inprocess(data, env)
    else:
        batches, runs = run_daemon(data, env)
    wall = time.monotonic() - t0
    sampler.stop.set()
    sampler.join()
    print(f"machine: {os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB")
    print(f"preload: {n} messages in {preload_s:.1f} s")
    print("| mode | messages | batches | runs | wall s | messages/s | peak RSS MiB |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {args.mode} | {n} | {batches} | {runs} | {wall:.1f} | {n / wall:.0f} | "
          f"{sampler.peak / 2**20:.0f} |")
    if not args.keep:
        shutil.rmtree(data, ignore_errors=True)
    else:
        print(f"data kept in {data}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
