"""The platform under a real Dagster daemon: sensor ticks and queued runs in their own
processes, on a persistent SQLite instance, exactly as `scripts/run.sh` runs it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest

from sis_platform.queues.embedded import EmbeddedQueue
from sis_platform.simulator.generator import generate_feed
from tests.harness import Harness
from tests.reference import assert_lake_matches_reference, reference_for

pytestmark = [pytest.mark.spark, pytest.mark.dagster, pytest.mark.e2e, pytest.mark.cost(250)]

REPO = Path(__file__).resolve().parents[2]


def _wait_for(condition, timeout: float, what: str, proc: subprocess.Popen, log_path: Path) -> None:
    # Bounded polling of an observable condition (run records in the instance); the daemon
    # offers no event to subscribe to from outside its process.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(
                f"dagster-daemon exited with {proc.returncode} before {what}: see {log_path}"
            )
        if condition():
            return
        time.sleep(1.0)
    tail = log_path.read_text(errors="replace")[-4000:]
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; daemon log:\n{tail}")


def test_daemon_lands_batches_runs_them_and_masters_match_the_reference(
    tmp_path, spark, monkeypatch
):
    home = tmp_path / "dagster"
    home.mkdir()
    shutil.copy(REPO / "deploy" / "dagster.yaml", home / "dagster.yaml")
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "SIS_DATA_DIR": str(tmp_path / "data"),
        "SIS_SPARK_MASTER": "local[2]",
        "SIS_SPARK_SHUFFLE_PARTITIONS": "2",
        "SIS_BATCH_MAX_MESSAGES": "200",
    }
    h = Harness(tmp_path / "data", {"SIS_BATCH_MAX_MESSAGES": "200"})
    queue: EmbeddedQueue = h.resources["queue"].open()
    feed = list(generate_feed(seed=5, messages=400, duplicates=0.02))
    with queue.producer() as producer:
        for m in feed:
            producer.put(m.body, message_id=m.message_id)

    monkeypatch.setenv("DAGSTER_HOME", str(home))
    instance = dg.DagsterInstance.get()
    log = (tmp_path / "daemon.log").open("wb")
    proc = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "dagster-daemon"),
            "run",
            "-w",
            str(REPO / "workspace.yaml"),
        ],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:

        def all_batches_processed() -> bool:
            keys = h.zone.keys()
            if queue.depth() or not keys:
                return False
            done = instance.get_run_records(
                dg.RunsFilter(job_name="process_batch", statuses=[dg.DagsterRunStatus.SUCCESS])
            )
            failed = instance.get_run_records(
                dg.RunsFilter(job_name="process_batch", statuses=[dg.DagsterRunStatus.FAILURE])
            )
            assert not failed, f"run {failed[0].dagster_run.run_id} failed"
            return {r.dagster_run.tags.get("dagster/partition") for r in done} >= set(keys)

        _wait_for(
            all_batches_processed,
            600,
            "every landed batch to be processed",
            proc,
            tmp_path / "daemon.log",
        )
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()

    assert len(h.zone.keys()) >= 2
    assert_lake_matches_reference(h.lake(spark), reference_for(h.logged_messages()))
