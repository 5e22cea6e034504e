"""`sis-batch-runs restore FROM TO` / `retire FROM TO` on a real, persistent Dagster instance
(DAGSTER_HOME) over a real landing zone: a retired range is registered again for a backfill,
only batches the zone holds, the retirement sensor leaves the restored keys alone, and the range
is retired again by hand once its backfill has run."""

from __future__ import annotations

import dagster as dg
import pytest

from sis_platform.cli import batch_runs
from sis_platform.log.landing import batch_key
from tests.sensors.test_partition_retirement import Site, _backfill_job

pytestmark = [pytest.mark.dagster]


@pytest.fixture
def site(tmp_path, monkeypatch) -> Site:
    home = tmp_path / "dagster"
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("SIS_DATA_DIR", str(tmp_path / "data"))
    instance = dg.DagsterInstance.local_temp(tempdir=str(home))
    site = Site(tmp_path / "data", [50, 45, 40, 35, 1, 0], instance=instance)
    site.check(6)
    site.tick()
    assert site.registered() == site.keys[4:] and site.cursor == "4"
    return site


def test_restore_registers_a_retired_range_again_and_the_sensor_leaves_it(site, capsys):
    assert batch_runs.main(["restore", "2", "0000000009"]) == 0
    # Batches 2-4 are landed and retired: registered again; 5 and 6 were never retired; 7-9 are
    # not in the landing zone.
    assert sorted(site.registered()) == site.keys[1:]
    assert "registered 3 batch partition(s) of 0000000002..0000000009" in capsys.readouterr().out
    site.tick()
    assert sorted(site.registered()) == site.keys[1:]

    assert batch_runs.main(["retire", "2", "4"]) == 0
    assert site.registered() == site.keys[4:]
    assert "retired 3 batch partition(s)" in capsys.readouterr().out


def test_retire_is_refused_while_a_run_is_in_flight_for_the_range(site, capsys):
    assert batch_runs.main(["restore", "1", "4"]) == 0
    run = site.instance.create_run_for_job(
        _backfill_job,
        status=dg.DagsterRunStatus.STARTED,
        tags={"dagster/partition": batch_key(3)},
    )
    assert batch_runs.main(["retire", "1", "4"]) == 2
    assert "a run for batch 3 is queued or running" in capsys.readouterr().err
    assert sorted(site.registered()) == site.keys
    site.instance.report_run_failed(run)
    assert batch_runs.main(["retire", "1", "4"]) == 0
    assert site.registered() == site.keys[4:]


@pytest.mark.parametrize(
    "argv", [["restore", "5", "4"], ["restore", "1", "10001"], ["restore", "x", "2"]]
)
def test_a_bad_range_is_refused(site, argv):
    assert batch_runs.main(argv) == 2
    assert site.registered() == site.keys[4:]
