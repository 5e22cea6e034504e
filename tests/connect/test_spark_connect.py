"""The platform over Spark Connect: a real `sis-spark-connect` server (a local Spark driver with
Delta behind a gRPC port), and the runs as its clients.

Each scenario runs in a child process (tests/connect/scenarios.py): a Spark Connect session
switches PySpark into Connect mode for its whole process, which the suite's local driver must
not share.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from sis_platform.cli import spark_connect
from sis_platform.lake.driver.conf import SHORT_LIVED_SQL
from sis_platform.lake.tables import MODEL_STEPS
from sis_platform.settings import SPARK_CONNECT_TOKEN_VARIABLE
from tests.ports import free_port

pytestmark = [pytest.mark.spark, pytest.mark.connect, pytest.mark.cost(180)]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[str]:
    """A Spark Connect server on a free loopback port, requiring a token that this process's
    environment holds for the scenarios (its clients); its URL once it says it listens."""
    port = free_port()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(SPARK_CONNECT_TOKEN_VARIABLE, secrets.token_urlsafe(24))
        env = {
            **os.environ,
            "SIS_SPARK_SHUFFLE_PARTITIONS": "2",
            # Its scratch folder (lake/driver/scratch.py) goes with the test's files.
            "SIS_DATA_DIR": str(tmp_path_factory.mktemp("server")),
            # This server lives for one test module, not for a deployment's runs: it gets what
            # a run's driver gets (C1 only, no code generation; resources/spark.py): with C2 this
            # module took 320 s in CI, against 170 s before. The long-lived settings the CLI
            # gives a production server are checked in tests/resources/test_spark_config.py.
            "JAVA_TOOL_OPTIONS": "-XX:TieredStopAtLevel=1",
            "SIS_SPARK_CONF": " ".join(f"{k}={v}" for k, v in SHORT_LIVED_SQL.items()),
        }
        proc = spark_connect.start(port, env=env)
        try:
            # localhost: PySpark sends a token without TLS to that host only.
            yield f"sc://localhost:{port}"
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)


def _scenario(name: str, url: str, data: Path, env=None, **popen):  # type: ignore[no-untyped-def]
    args = [sys.executable, "-m", "tests.connect.scenarios", name, url, str(data)]
    if popen:
        return subprocess.Popen(args, cwd=ROOT, env=env, **popen)
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def _ok(done: subprocess.CompletedProcess) -> None:
    assert done.returncode == 0, f"{done.stdout[-4000:]}\n{done.stderr[-8000:]}"


def test_batches_fold_over_spark_connect_exactly_like_the_reference(server, tmp_path):
    _ok(_scenario("pipeline", server, tmp_path / "data"))


@pytest.mark.parametrize("token", [None, "not-the-servers-token"])
def test_a_client_without_the_servers_token_is_refused(server, tmp_path, token):
    env = {k: v for k, v in os.environ.items() if k != SPARK_CONNECT_TOKEN_VARIABLE}
    if token is not None:
        env[SPARK_CONNECT_TOKEN_VARIABLE] = token
    _ok(_scenario("unauthenticated", server, tmp_path / "data", env=env))


def test_the_server_does_not_start_without_a_token(monkeypatch, capsys):
    monkeypatch.delenv(SPARK_CONNECT_TOKEN_VARIABLE, raising=False)
    assert spark_connect.main(["--port", "1"]) == 2
    assert f"{SPARK_CONNECT_TOKEN_VARIABLE} is not set" in capsys.readouterr().err


def test_the_next_fold_writer_interrupts_a_killed_runs_write_before_it_commits(server, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    started = data / "started"
    os.mkfifo(started)
    orphan = _scenario(
        "orphan_writer", server, data, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        # The orphan's append is running on the server once its Python worker, inside the
        # append's task, writes its pid into the pipe.
        pid: list[str] = []
        reader = threading.Thread(target=lambda: pid.append(started.read_text()), daemon=True)
        reader.start()
        threading.Thread(target=_unblock_when_done, args=(orphan, started), daemon=True).start()
        reader.join(timeout=300)
        assert pid and pid[0], f"the orphan's append never started:\n{_output(orphan)}"
        worker = psutil.Process(int(pid[0]))
        version_before = _newest_commit(data)
    finally:
        orphan.kill()  # the run dies; over Spark Connect its append goes on without it
        orphan.wait()
    assert worker.is_running(), "the append ended with its client"

    _ok(_scenario("next_writer", server, data))

    worker.wait(timeout=120)  # the interrupted task's Python worker is stopped
    assert _newest_commit(data) == version_before, "the orphan's append committed"


def _unblock_when_done(proc: subprocess.Popen, fifo: Path) -> None:
    """If `proc` ends before its task opened the pipe, end the test's read of it (empty)."""
    proc.wait()
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:  # nobody reads it any more
        pass


def _output(proc: subprocess.Popen) -> str:
    proc.kill()
    return proc.communicate()[0].decode(errors="replace")[-8000:]


def _newest_commit(data: Path) -> int:
    log = data / "lake" / MODEL_STEPS.name / "_delta_log"
    return max(int(p.stem) for p in log.glob("*.json"))
