"""The platform under a real Dagster daemon: sensor ticks and queued runs in their own
processes, exactly as `scripts/run.sh` runs it, in both intake modes: the queue sensor
consuming, or the real `sis-live` process consuming beside the daemon (its serving store then
equals the reference and the lake).

The Dagster instance is the local one (deploy/dagster.yaml, SQLite) with the queue sensor, and
a service's (deploy/dagster-postgres.yaml: runs, event logs, schedule and sensor state on
PostgreSQL) with sis-live, whose serving store is then on PostgreSQL too (another database of
the same server). On PostgreSQL the webserver runs beside the daemon too, and answers with the
runs the daemon launched."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import dagster as dg
import psutil
import pytest

from sis_platform.assets.run_tags import run_batches
from sis_platform.queues.embedded import EmbeddedQueue
from sis_platform.serving import StoreNotReady
from sis_platform.simulator.generator import generate_feed
from tests.harness import Harness
from tests.modes import INTAKES, assert_live_path, harness
from tests.pg import PASSWORD_VARIABLE, USER, PgCluster, cluster
from tests.ports import free_port
from tests.reference import assert_lake_matches_reference, reference_for

pytestmark = [pytest.mark.spark, pytest.mark.dagster, pytest.mark.e2e, pytest.mark.cost(520)]

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
STOP_SECONDS = 60


class Process:
    """A child started in a process group of its own, its output in `log`."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], log: Path) -> None:
        self.name, self.log = name, log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                args,
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def check_alive(self, what: str) -> None:
        if self.proc.poll() is not None:
            raise AssertionError(
                f"{self.name} exited with {self.proc.returncode} before {what}: see {self.log}"
            )

    def stop(self) -> int:
        """SIGTERM to the group, SIGKILL after STOP_SECONDS; its exit code once no process of
        the group is left (a daemon's run workers included)."""
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            code = self.proc.wait()
        left = _group_members(self.proc.pid)
        if left:
            psutil.wait_procs(left, timeout=STOP_SECONDS)
            left = _group_members(self.proc.pid)
        assert not left, f"{self.name} left {[p.pid for p in left]} running"
        return code


def _group_members(pgid: int) -> list[psutil.Process]:
    """Processes of the group `pgid` still alive (zombies awaiting their reaper are gone)."""
    members = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                members.append(proc)
        except (ProcessLookupError, psutil.Error):
            continue
    return members


def _stop_all(processes: list[Process]) -> dict[str, int]:
    """Stop every process (the last started first), even when stopping one fails; their exit
    codes by name."""
    codes: dict[str, int] = {}
    failures: list[AssertionError] = []
    for process in reversed(processes):
        try:
            codes[process.name] = process.stop()
        except AssertionError as error:
            failures.append(error)
    if failures:
        raise failures[0]
    return codes


def _wait_for(
    condition: Callable[[], bool], timeout: float, what: str, processes: list[Process]
) -> None:
    # Bounded polling of an observable condition (run records in the instance); the daemon
    # offers no event to subscribe to from outside its process.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for process in processes:
            process.check_alive(what)
        if condition():
            return
        time.sleep(1.0)
    tails = "\n".join(
        f"{p.name} log:\n{p.log.read_text(errors='replace')[-3000:]}" for p in processes
    )
    raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{tails}")


def _store_caught_up(h: Harness) -> bool:
    if h.intake != "live":
        return True
    try:
        store = h.open_reader()
    except StoreNotReady:  # sis-live has not created it yet
        return False
    try:
        return store.position() == h.zone.catalog.last_position()
    finally:
        store.close()


# The Dagster instance each intake mode runs on: its file under deploy/.
INSTANCE_FILES = {"sensor": "dagster.yaml", "live": "dagster-postgres.yaml"}
assert set(INSTANCE_FILES) == set(INTAKES)
POSTGRES_INTAKES = {i for i, name in INSTANCE_FILES.items() if name == "dagster-postgres.yaml"}

RUNS_QUERY = """
query { runsOrError(filter: {pipelineName: "process_batch", statuses: [SUCCESS]}) {
  ... on Runs { results { runId tags { key value } } } } }
"""


@pytest.fixture
def dagster_pg(intake: str) -> Iterator[PgCluster | None]:
    """A PostgreSQL cluster on loopback for the instance on PostgreSQL, else None."""
    if intake not in POSTGRES_INTAKES:
        yield None
        return
    with cluster(port=free_port(), tls=True) as running:
        yield running


def _webserver_runs(port: int) -> set[str]:
    """The ids of the successful process_batch runs, as the webserver's GraphQL API lists them."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        data=json.dumps({"query": RUNS_QUERY}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        runs = json.load(answer)["data"]["runsOrError"]["results"]
    return {run["runId"] for run in runs}


@pytest.mark.parametrize(
    "intake",
    [
        # On PostgreSQL: part of the production deployment's smoke test (scripts/smoke-cluster.sh).
        pytest.param(i, marks=[pytest.mark.cluster] if i in POSTGRES_INTAKES else [])
        for i in INTAKES
    ],
)
def test_daemon_lands_batches_runs_them_and_masters_match_the_reference(
    tmp_path, spark, monkeypatch, intake, dagster_pg: PgCluster | None
):
    home = tmp_path / "dagster"
    home.mkdir()
    shutil.copy(REPO / "deploy" / INSTANCE_FILES[intake], home / "dagster.yaml")
    instance_env: dict[str, str] = {}
    serving: dict[str, str] = {}
    if dagster_pg is not None:
        with dagster_pg.admin() as conn:
            conn.execute("CREATE DATABASE dagster")
        instance_env = {
            **dagster_pg.dagster_env("dagster"),
            PASSWORD_VARIABLE: dagster_pg.password,
        }
        database = dagster_pg.new_database()
        serving = {"SIS_SERVING_URL": f"postgresql://{USER}@127.0.0.1:{dagster_pg.port}/{database}"}
    settings = {
        "SIS_INTAKE": intake,
        "SIS_BATCH_MAX_MESSAGES": "200",
        # sis-live seals an open batch this old even with no new message, so the lake gets it.
        "SIS_LIVE_BATCH_SECONDS": "2",
        **serving,
    }
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "SIS_DATA_DIR": str(tmp_path / "data"),
        "SIS_SPARK_MASTER": "local[2]",
        "SIS_SPARK_SHUFFLE_PARTITIONS": "2",
        **settings,
        **instance_env,
    }
    h = harness(tmp_path / "data", intake, settings)
    queue: EmbeddedQueue = h.resources["queue"].open()
    feed = list(generate_feed(seed=5, messages=400, duplicates=0.02))
    with queue.producer() as producer:
        for m in feed:
            producer.put(m.body, message_id=m.message_id)

    monkeypatch.setenv("DAGSTER_HOME", str(home))
    for name, value in instance_env.items():
        monkeypatch.setenv(name, value)
    instance = dg.DagsterInstance.get()
    workspace = str(REPO / "workspace.yaml")
    processes = [
        Process(
            "dagster-daemon",
            [str(BIN / "dagster-daemon"), "run", "-w", workspace],
            env,
            tmp_path / "daemon.log",
        )
    ]
    if intake == "live":
        processes.append(Process("sis-live", [str(BIN / "sis-live")], env, tmp_path / "live.log"))
    web_port = free_port() if dagster_pg is not None else None
    if web_port is not None:
        processes.append(
            Process(
                "dagster-webserver",
                [str(BIN / "dagster-webserver"), "-h", "127.0.0.1", "-p", str(web_port)]
                + ["-w", workspace],
                env,
                tmp_path / "webserver.log",
            )
        )
    webserver_runs: set[str] = set()
    try:

        def all_batches_processed() -> bool:
            keys = h.zone.catalog.keys()
            if queue.depth() or not keys or not _store_caught_up(h):
                return False
            done = instance.get_run_records(
                dg.RunsFilter(job_name="process_batch", statuses=[dg.DagsterRunStatus.SUCCESS])
            )
            failed = instance.get_run_records(
                dg.RunsFilter(job_name="process_batch", statuses=[dg.DagsterRunStatus.FAILURE])
            )
            assert not failed, f"run {failed[0].dagster_run.run_id} failed"
            # A batch's run, or a range run over batches waiting together.
            ranges = [b for r in done if (b := run_batches(r.dagster_run.tags)) is not None]
            return all(any(b.covers(key) for b in ranges) for key in keys)

        _wait_for(all_batches_processed, 600, "every landed batch to be processed", processes)
        if web_port is not None:

            def webserver_answers() -> bool:
                try:
                    webserver_runs.update(_webserver_runs(web_port))
                except OSError:  # not listening yet
                    return False
                return True

            _wait_for(webserver_answers, 120, "the webserver to answer", processes)
    finally:
        codes = _stop_all(processes)
    if intake == "live":
        assert codes["sis-live"] == 0, (tmp_path / "live.log").read_text(errors="replace")[-3000:]

    assert len(h.zone.catalog.keys()) >= 2
    if dagster_pg is not None:
        # Every run is in PostgreSQL, and the webserver shows the runs the daemon launched.
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        launched = {
            r.dagster_run.run_id
            for r in instance.get_run_records(
                dg.RunsFilter(job_name="process_batch", statuses=[dg.DagsterRunStatus.SUCCESS])
            )
        }
        assert launched and webserver_runs == launched
        assert not (home / "history").exists()  # no SQLite run storage beside it
    ref = reference_for(h.logged_messages())
    assert_lake_matches_reference(h.lake(spark), ref)
    assert_live_path(h, ref)
