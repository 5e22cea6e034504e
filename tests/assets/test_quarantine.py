"""Poison isolation for unknown failures (issue 4, "Poison vs transient"): a master whose fold
fails for an unknown reason (a bug raising, or a Python worker dying) is retried by the retry
policy, quarantined after SIS_QUARANTINE_AFTER failures so the other masters go on, and folded
in feed order once a replay says the fix is in.

The failure is injected with SIS_INJECT_FOLD_FAILURE (read by the fold on the driver and passed
to the workers), the one test hook of the fold.
"""

from __future__ import annotations

import pytest

from sis_platform.lake.tables import DEAD_LETTERS, FOLD_FAILURES, MASTER_DOCUMENTS
from tests.domain.sportsdata_fixtures import ASCOT_1430, ASCOT_1500, GO_SOFT, event, master, update
from tests.harness import LOG_ASSETS, Harness, received
from tests.reference import assert_lake_matches_reference, reference_for

pytestmark = [pytest.mark.spark, pytest.mark.dagster, pytest.mark.cost(570)]



@pytest.mark.parametrize("how", ["raise", "crash"])
def test_failing_master_is_quarantined_then_replayed_in_order_after_the_fix(
    how: str, tmp_path, spark, monkeypatch: pytest.MonkeyPatch
):
    h = Harness(tmp_path / "data", overrides={"SIS_QUARANTINE_AFTER": "3"})
    keys = [
        h.zone.land(b).key
        for b in (
            [received(master(event(ASCOT_1430))), received(master(event(ASCOT_1500)))],
            [received(update(f"{ASCOT_1430} {ASCOT_1500}", GO_SOFT))],
        )
    ]
    h.instance.add_dynamic_partitions("batches", keys)
    monkeypatch.setenv("SIS_INJECT_FOLD_FAILURE", f"{ASCOT_1500}:{how}")

    h.materialize(keys[0], *LOG_ASSETS)
    # One run: the fold of batches 1-2 fails three times on ASCOT_1500 (retried by the retry
    # policy), then quarantines it and folds ASCOT_1430.
    result = h.defs.resolve_job_def("process_batch").execute_in_process(
        partition_key=keys[1], instance=h.instance, raise_on_error=False
    )
    assert result.success
    retries = [
        e for e in h.instance.all_logs(result.run_id)
        if e.dagster_event is not None and e.dagster_event.event_type_value == "STEP_UP_FOR_RETRY"
    ]
    assert [e.step_key for e in retries] == ["fold_masters"] * 3
    lake = h.lake(spark)
    failures = lake.read(FOLD_FAILURES).collect()
    assert [(r["master_id"], r["released"]) for r in failures] == [(ASCOT_1500, False)] * 3
    docs = {r["master_id"]: r for r in lake.read(MASTER_DOCUMENTS).collect()}
    assert set(docs) == {ASCOT_1430} and docs[ASCOT_1430]["version"] == 2
    held = sorted(
        (r["master_id"], r["reason"]) for r in lake.read(DEAD_LETTERS).collect()
    )
    assert held == [(ASCOT_1500, "quarantined")] * 2  # its master, then its update

    monkeypatch.delenv("SIS_INJECT_FOLD_FAILURE")  # the fix
    replay = h.defs.resolve_job_def("replay_dead_letters").execute_in_process(
        instance=h.instance,
        run_config={"ops": {"replay": {"config": {"reasons": ["quarantined"]}}}},
    )
    assert replay.success
    assert_lake_matches_reference(lake, reference_for(h.logged_messages()))
    assert all(r["released"] for r in lake.read(FOLD_FAILURES).collect())
