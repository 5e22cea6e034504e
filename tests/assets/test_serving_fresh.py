"""live_store_fresh executed as a check (from the UI), against a real SQLite serving store and
a landing zone written by GroupWriter (no Spark): without the reporter's history it sees a
stall only."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from sis_platform.assets.serving import live_store_fresh, serving_store_spec
from sis_platform.log.landing import GroupWriter, LogPosition
from sis_platform.resources import config
from sis_platform.serving import GroupCommit, OutcomeRow, open_writer
from tests.harness import received

pytestmark = [pytest.mark.dagster]


def _execute(env: dict[str, str]) -> dg.AssetCheckEvaluation:
    job = dg.define_asset_job("fresh", selection=dg.AssetSelection.checks(live_store_fresh))
    defs = dg.Definitions(
        assets=[serving_store_spec("sqlite:///x")],
        asset_checks=[live_store_fresh],
        jobs=[job],
        resources=config.resources(env),
    )
    result = defs.resolve_job_def("fresh").execute_in_process()
    assert result.success
    (evaluation,) = result.get_asset_check_evaluations()
    return evaluation


def test_fails_as_an_error_while_landed_messages_wait_for_a_store_that_never_committed(
    tmp_path: Path,
):
    env = {"SIS_DATA_DIR": str(tmp_path)}
    resources = config.resources(env)
    writer = GroupWriter(resources["landing"].zone().writer)
    landed = writer.land([received(b"<m/>"), received(b"<m/>")])

    # sis-live has not even created its store.
    missing = _execute(env)
    assert not missing.passed
    assert missing.severity is dg.AssetCheckSeverity.ERROR
    assert "no serving store at" in (missing.description or "")
    assert not (tmp_path / "serving" / "serving.db").exists()  # the check made none

    open_writer(resources["serving"].url).close()
    stalled = _execute(env)
    assert not stalled.passed
    assert stalled.severity is dg.AssetCheckSeverity.ERROR
    assert "never committed" in (stalled.description or "")

    with open_writer(resources["serving"].url) as store:
        outcomes = [
            OutcomeRow(f"m{i}", 1, i, -1, None, "dead-lettered", "invalid-message")
            for i in range(2)
        ]
        store.commit(GroupCommit(landed.last_position, [], {}, [], [], outcomes))
    fresh = _execute(env)
    assert fresh.passed, fresh.description


def test_fails_as_an_error_when_the_store_is_beyond_the_landing(tmp_path: Path):
    # The landing put back to an earlier copy under the store: the store "has applied every
    # landed message" and more, which is no pass (sis-live halts: sis_platform/live/applier.py).
    env = {"SIS_DATA_DIR": str(tmp_path)}
    resources = config.resources(env)
    writer = GroupWriter(resources["landing"].zone().writer)
    writer.land([received(b"<m/>")])
    with open_writer(resources["serving"].url) as store:
        outcomes = [
            OutcomeRow(f"m{i}", 1, i, -1, None, "dead-lettered", "invalid-message")
            for i in range(3)
        ]
        store.commit(GroupCommit(LogPosition(1, 2), [], {}, [], [], outcomes))

    beyond = _execute(env)
    assert not beyond.passed
    assert beyond.severity is dg.AssetCheckSeverity.ERROR
    assert "beyond the landing" in (beyond.description or "")


def test_a_halt_recorded_in_the_store_fails_as_an_error_naming_it(tmp_path: Path):
    env = {"SIS_DATA_DIR": str(tmp_path)}
    resources = config.resources(env)
    GroupWriter(resources["landing"].zone().writer).land([received(b"<m/>")])
    with open_writer(resources["serving"].url) as store:
        store.halt("store-beyond-landing", "the serving store is at (1, 2), beyond (1, 0)")
    halted = _execute(env)
    assert not halted.passed
    assert halted.severity is dg.AssetCheckSeverity.ERROR
    assert "store-beyond-landing" in (halted.description or "")
