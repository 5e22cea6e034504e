"""Run retention on a real, persistent Dagster instance (SQLite under tmp_path) with real runs and
materializations: only finished runs older than the window (counted back from the newest run)
go, oldest first, a chunk at a time, with their event logs; a run in flight and the run of each
asset's latest materialization stay. Runs are aged by rewriting their creation time in the run
storage, the one thing a test cannot wait a month for."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest

from sis_platform.sensors.run_retention import (
    RUN_RETENTION_SENSOR_NAME,
    build_run_retention_sensor,
    delete_old_runs,
)

pytestmark = [pytest.mark.dagster]

WINDOW = timedelta(days=30)


@dg.asset
def alpha() -> int:
    return 1


@dg.asset
def beta() -> int:
    return 2


@dg.op
def _noop() -> None:
    pass


@dg.job
def _other_job() -> None:
    _noop()


class Runs:
    """A persistent instance and the runs made on it, each dated by `age`."""

    def __init__(self, tmp_path: Path) -> None:
        self.home = tmp_path / "dagster"
        self.home.mkdir()
        self.instance = dg.DagsterInstance.local_temp(tempdir=str(self.home))

    def materialize(self, asset: dg.AssetsDefinition, days_ago: float) -> str:
        result = dg.materialize([asset], instance=self.instance)
        self.age(result.run_id, days_ago)
        return result.run_id

    def in_flight(self, days_ago: float) -> str:
        run = self.instance.create_run_for_job(_other_job, status=dg.DagsterRunStatus.STARTED)
        self.age(run.run_id, days_ago)
        return run.run_id

    def age(self, run_id: str, days_ago: float) -> None:
        at = datetime.now(UTC) - timedelta(days=days_ago)
        with sqlite3.connect(self.home / "history" / "runs.db") as db:
            db.execute(
                "UPDATE runs SET create_timestamp = ? WHERE run_id = ?",
                (at.replace(tzinfo=None).isoformat(sep=" "), run_id),
            )

    def ids(self) -> set[str]:
        return {r.dagster_run.run_id for r in self.instance.get_run_records()}

    def step_output_files(self, run_id: str) -> list[Path]:
        """The run's captured step output on the default instance's local compute logs."""
        return [p for p in (self.home / "storage" / run_id).rglob("*") if p.is_file()]

    def events(self, run_id: str) -> int:
        return len(self.instance.all_logs(run_id))


def test_deletes_old_finished_runs_oldest_first_a_chunk_at_a_time(tmp_path):
    runs = Runs(tmp_path)
    old = [runs.materialize(alpha, days) for days in (45, 44, 43)]
    beta_latest = runs.materialize(beta, 42)  # beta's latest materialization: kept
    started = runs.in_flight(41)  # still running: kept
    alpha_latest = runs.materialize(alpha, 0)  # the newest run
    assert all(runs.events(r) for r in old)

    assert delete_old_runs(runs.instance, WINDOW, chunk=2) == old[:2]
    assert delete_old_runs(runs.instance, WINDOW, chunk=2) == old[2:]
    assert delete_old_runs(runs.instance, WINDOW, chunk=2) == []
    assert runs.ids() == {beta_latest, started, alpha_latest}
    assert all(runs.events(r) == 0 for r in old)
    assert all(runs.step_output_files(r) == [] for r in old)
    assert runs.step_output_files(alpha_latest)
    assert runs.events(beta_latest) and runs.events(alpha_latest)
    latest = runs.instance.get_latest_materialization_event(dg.AssetKey("beta"))
    assert latest is not None and latest.run_id == beta_latest


def test_the_window_counts_back_from_the_newest_run_not_the_clock(tmp_path):
    # An instance idle for 100 days: its runs are old by the clock, within the window of each
    # other, and none is deleted.
    runs = Runs(tmp_path)
    made = {runs.materialize(alpha, days) for days in (110, 105, 100)}
    assert delete_old_runs(runs.instance, WINDOW, chunk=10) == []
    assert runs.ids() == made


def test_the_sensor_skips_loudly_when_nothing_is_old(tmp_path):
    runs = Runs(tmp_path)
    runs.materialize(alpha, 0)
    sensor = build_run_retention_sensor(30)
    assert sensor.name == RUN_RETENTION_SENSOR_NAME
    result = sensor(dg.build_sensor_context(instance=runs.instance))
    assert isinstance(result, dg.SensorResult) and result.skip_reason is not None
    assert "no finished run created more than 30 day(s)" in (result.skip_reason.skip_message or "")
    first = runs.materialize(alpha, 40)
    runs.materialize(alpha, 0)
    result = sensor(dg.build_sensor_context(instance=runs.instance))
    assert isinstance(result, dg.SensorResult) and result.skip_reason is None
    assert first not in runs.ids()
