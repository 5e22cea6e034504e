"""`sis-run` as `scripts/run.sh` runs it (the real webserver, daemon, sis-live and simulator in a
fresh data folder): the UI answers, and SIGTERM leaves no process it started running."""

from __future__ import annotations

import urllib.request

import psutil
import pytest

from tests.e2e.sis_run import assert_sigterm_stops_everything, command, running_platform

pytestmark = [pytest.mark.dagster, pytest.mark.e2e, pytest.mark.cost(90)]


def test_sigterm_stops_every_process_run_sh_started(tmp_path):
    with running_platform(tmp_path, sim_messages=20) as platform:
        sup = platform.sup
        with urllib.request.urlopen(f"{platform.url}/server_info", timeout=30) as response:
            assert response.status == 200
        # The simulator starts before Dagster: a short feed may be done before the UI is up.
        sup.expect(r"^\[supervisor\] sis-feed: exited with 0 .*; done$", 300, seen=True)

        # A sensor evaluated (its result line; the "checking" line before it is quiet): the
        # daemon's code server (a grandchild) is up too.
        sup.expect(r"^\[daemon\] .*Sensor serving_store_reporter skipped", 300, seen=True)

        started = psutil.Process(sup.proc.pid).children(recursive=True)
        names = " ".join(command(p) for p in started)
        for program in ("dagster-webserver", "dagster-daemon", "sis-live"):
            assert program in names, names
        # Each Dagster process has its own code server (a grandchild).
        assert len(started) >= 5, names

        assert_sigterm_stops_everything(platform)
