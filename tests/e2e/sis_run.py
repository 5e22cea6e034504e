"""`sis-run` started as `scripts/run.sh` starts it (the real webserver, daemon, sis-live and feed
simulator, in a fresh data folder and DAGSTER_HOME), for the tests that use the running platform
from outside: its stop (test_run_stop.py) and its UI in a browser (test_ui.py)."""

from __future__ import annotations

import os
import shutil
import signal
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil

from tests.ports import free_port
from tests.supervised import SupervisedProcess

REPO = Path(__file__).resolve().parents[2]
UI_SECONDS = 300  # a cold start: imports, the code location, the webserver's first answer
STOP_SECONDS = 30  # what the README promises for a stop


@dataclass(frozen=True)
class RunningPlatform:
    """A started `sis-run`: its supervisor, the UI's address and where its state lives."""

    sup: SupervisedProcess
    url: str
    data: Path
    home: Path
    env: Mapping[str, str]


def command(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())
    except psutil.Error as error:  # gone meanwhile
        return f"{proc.pid}: {error}"


@contextmanager
def running_platform(
    tmp_path: Path,
    *,
    sim_messages: int,
    sim_rate: str = "backlog",
    settings: Mapping[str, str] | None = None,
) -> Iterator[RunningPlatform]:
    """`sis-run` on a fresh data folder under `tmp_path`, with `deploy/dagster.yaml` as its
    instance (as run.sh copies it) and the default intake (sis-live consumes), the simulator
    publishing `sim_messages`; yielded once the UI is up. Whatever the test did, it is stopped
    (SIGTERM, then SIGKILL to what is left) on the way out."""
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
        **(settings or {}),
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
            str(sim_messages),
            "--sim-rate",
            sim_rate,
        ],
        env=env,
        cwd=REPO,
    )
    try:
        url = sup.expect(r"^\[supervisor\] Dagster UI: (http://\S+)", UI_SECONDS).group(1)
        assert url == f"http://127.0.0.1:{port}"
        yield RunningPlatform(sup=sup, url=url, data=data, home=home, env=env)
    finally:
        sup.kill()


def assert_sigterm_stops_everything(platform: RunningPlatform) -> None:
    """SIGTERM to the supervisor ends every process it started (run workers and their Spark
    drivers included) within STOP_SECONDS, and it exits 0 saying so, with no restart on the
    way."""
    sup = platform.sup
    started = psutil.Process(sup.proc.pid).children(recursive=True)
    sup.proc.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(started, timeout=STOP_SECONDS)
    assert alive == [], [command(p) for p in alive]
    assert sup.finish(STOP_SECONDS) == 0
    assert "[supervisor] stopped: every process it started is gone" in sup.lines
    restarts = [x for x in sup.lines if "; restart " in x]
    assert restarts == [], restarts
