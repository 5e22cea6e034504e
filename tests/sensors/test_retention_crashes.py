"""Dagster's retention SIGKILLed at its crash points (sis_platform/runtime/faults.py
RETENTION_POINTS), in a process of its own over a persistent instance: partition retirement
killed after the second key of its chunk, run retention between a run's event log and its run
record. What the kill leaves is consistent, and the next tick finishes the work exactly: no
eligible key or old run is left, nothing else is touched."""

from __future__ import annotations

import os
import subprocess
import sys

import dagster as dg
import pytest

from sis_platform.runtime.faults import ENV
from sis_platform.sensors.partition_retirement import RETIRED_POINT
from sis_platform.sensors.run_retention import EVENTS_DELETED_POINT, delete_old_runs
from tests.live.processes import REPO, SIGKILLED
from tests.sensors.test_partition_retirement import Site
from tests.sensors.test_run_retention import WINDOW, Runs, alpha

pytestmark = [pytest.mark.faults, pytest.mark.dagster]

# One tick of the partition retirement sensor (live intake) over the data folder argv[1] and the
# instance argv[2], without a cursor.
RETIRE = """
import sys
import dagster as dg
from sis_platform.resources import config
from sis_platform.sensors.partition_retirement import build_partition_retirement_sensor
instance = dg.DagsterInstance.local_temp(tempdir=sys.argv[2])
resources = config.resources({"SIS_DATA_DIR": sys.argv[1]})
build_partition_retirement_sensor(30, live=True)(
    dg.build_sensor_context(instance=instance, resources=resources)
)
"""
# One step of run retention over the instance argv[1] (30 days, chunk 10).
DELETE_RUNS = """
import sys
from datetime import timedelta
import dagster as dg
from sis_platform.sensors.run_retention import delete_old_runs
instance = dg.DagsterInstance.local_temp(tempdir=sys.argv[1])
delete_old_runs(instance, timedelta(days=30), 10)
"""


def _killed(code: str, *args: str, point: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), ENV: point}
    proc = subprocess.run([sys.executable, "-c", code, *args], env=env, cwd=REPO, timeout=240)
    assert proc.returncode == SIGKILLED


@pytest.mark.timeout(300)
def test_retirement_killed_mid_chunk_is_finished_by_the_next_tick(tmp_path):
    home = tmp_path / "dagster"
    home.mkdir()
    instance = dg.DagsterInstance.local_temp(tempdir=str(home))
    site = Site(tmp_path / "data", [50, 45, 40, 35, 1, 0], instance=instance)
    site.check(6)

    _killed(RETIRE, str(tmp_path / "data"), str(home), point=f"{RETIRED_POINT}@2")
    assert site.registered() == site.keys[2:]  # two keys deleted, the cursor not moved

    site.tick()  # the daemon's next tick: the cursor it last stored (none)
    assert site.registered() == site.keys[4:]
    assert site.cursor == "4"
    assert all(site.zone.catalog.landed_files(k) for k in site.keys)


@pytest.mark.timeout(300)
def test_run_retention_killed_between_events_and_run_is_finished_by_the_next_tick(tmp_path):
    runs = Runs(tmp_path)
    old = [runs.materialize(alpha, days) for days in (45, 44, 43)]
    newest = runs.materialize(alpha, 0)

    _killed(DELETE_RUNS, str(runs.home), point=f"{EVENTS_DELETED_POINT}@2")
    # The first run is gone whole; the second has lost its events but not its record, and is
    # still finished and old, so the next step finds it.
    assert runs.ids() == {*old[1:], newest}
    assert runs.events(old[1]) == 0 and runs.events(old[2]) > 0

    assert delete_old_runs(runs.instance, WINDOW, chunk=10) == old[1:]
    assert runs.ids() == {newest}
    assert runs.events(newest) > 0
