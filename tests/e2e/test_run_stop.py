"""`sis-run` as `scripts/run.sh` runs it (the real webserver, daemon, sis-live and simulator in a
fresh data folder): the UI answers, and SIGTERM leaves no process it started running."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
import urllib.request
from pathlib import Path

import psutil
import pytest

from tests.supervised import SupervisedProcess

pytestmark = [pytest.mark.dagster, pytest.mark.e2e, pytest.mark.cost(90)]

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())
    except psutil.Error as error:  # gone meanwhile
        return f"{proc.pid}: {error}"


def test_sigterm_stops_every_process_run_sh_started(tmp_path):
    data = tmp_path / "data"
    home = data / "dagster"
    home.mkdir(parents=True)
    shutil.copy(REPO / "deploy" / "dagster.yaml", home / "dagster.yaml")
    port = free_port()
    env = {
        **os.environ,
        "SIS_DATA_DIR": str(data),
        "DAGSTER_HOME": str(home),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    env.pop("SIS_INTAKE", None)  # the default: sis-live consumes
    sup = SupervisedProcess(
        [
            sys.executable,
            "-m",
            "sis_platform.cli.run",
            "--workspace",
            str(REPO / "workspace.yaml"),
            "--port",
            str(port),
            "--sim-messages",
            "20",
            "--sim-rate",
            "backlog",
        ],
        env=env,
        cwd=REPO,
    )
    try:
        url = sup.expect(r"^\[supervisor\] Dagster UI: (http://\S+)", 300).group(1)
        assert url == f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(f"{url}/server_info", timeout=30) as response:
            assert response.status == 200
        # The simulator starts before Dagster: a short feed may be done before the UI is up.
        sup.expect(r"^\[supervisor\] sis-feed: exited with 0 .*; done$", 300, seen=True)

        # A sensor evaluated: the daemon's code server (a grandchild) is up too.
        sup.expect(r"^\[daemon\] .*Checking for new runs for sensor", 300, seen=True)

        started = psutil.Process(sup.proc.pid).children(recursive=True)
        names = " ".join(command(p) for p in started)
        for program in ("dagster-webserver", "dagster-daemon", "sis-live"):
            assert program in names, names
        # Each Dagster process has its own code server (a grandchild).
        assert len(started) >= 5, names

        sup.proc.send_signal(signal.SIGTERM)
        gone, alive = psutil.wait_procs(started, timeout=30)
        assert alive == [], [command(p) for p in alive]
        assert sup.finish(30) == 0
        assert "[supervisor] stopped: every process it started is gone" in sup.lines
        restarts = [x for x in sup.lines if "; restart " in x]
        assert restarts == [], restarts
    finally:
        sup.kill()
