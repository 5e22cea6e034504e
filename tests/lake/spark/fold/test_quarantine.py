"""Unknown fold failures (sis_platform/lake/spark/fold/quarantine.py): recorded against exactly
their masters, counted into a quarantine, released by a replay; items over their budget remembered;
a quarantined master's items held back."""

from __future__ import annotations

import pytest

from sis_platform.lake.spark.fold.quarantine import (
    CRASH,
    ERROR,
    FoldFailure,
    KnownFailures,
    MasterFailure,
    died_in_flight,
    fail_step,
    hold_quarantined,
    known_failures,
    record_failures,
    release_quarantine,
)
from sis_platform.lake.tables import FOLD_FAILURES
from sis_platform.runtime.guard import TIMEOUT, Guard, InFlightFolder
from tests.lake.spark.fold.lakes import new_lake

pytestmark = [pytest.mark.spark, pytest.mark.cost(40)]


def test_a_master_is_quarantined_after_its_failures_until_released(spark, tmp_path):
    lake = new_lake(spark, tmp_path)
    lake.ensure(FOLD_FAILURES)
    assert known_failures(lake, 1).quarantined == {}
    record_failures(lake, [MasterFailure("M1", ERROR, "boom 1")], step=1, run_id=None)
    assert known_failures(lake, 2).quarantined == {}
    record_failures(lake, [MasterFailure("M1", CRASH, "boom 2")], step=1, run_id="r")
    assert known_failures(lake, 2).quarantined == {"M1": "fold failed 2 times: boom 2"}
    over = MasterFailure("M2", TIMEOUT, "took too long", "m9", 3)
    record_failures(lake, [over], step=2, run_id=None)
    known = known_failures(lake, 2)
    assert (list(known.quarantined), known.timed_out) == (["M1"], {("m9", 3): "took too long"})
    release_quarantine(lake, {"M1", "M2"})
    assert known_failures(lake, 1) == KnownFailures()


def test_fail_step_records_then_raises_naming_the_masters(spark, tmp_path):
    lake = new_lake(spark, tmp_path)
    lake.ensure(FOLD_FAILURES)
    failures = [MasterFailure("M2", ERROR, "x" * 5000), MasterFailure("M1", TIMEOUT, "t", "m", 0)]
    with pytest.raises(FoldFailure, match=r"fold step 4 failed on M1 \(timeout in m/0\), M2"):
        fail_step(lake, failures, step=4, run_id=None, quarantine_after=3)
    rows = {r["master_id"]: r for r in lake.read(FOLD_FAILURES).collect()}
    assert len(rows["M2"]["error"]) == 2000 and rows["M1"]["position"] == 0


def test_held_items_are_those_of_quarantined_masters_with_the_detail(spark):
    valid = spark.createDataFrame(
        [("M1", "m1", None), ("M2", "m2", None)],
        "master_id string, message_id string, detail string",
    )
    folded, held = hold_quarantined(valid, {"M1": "fold failed 3 times: x"})
    assert [r["master_id"] for r in folded.collect()] == ["M2"]
    assert [(r["master_id"], r["detail"]) for r in held.collect()] == [
        ("M1", "fold failed 3 times: x")
    ]
    same, none = hold_quarantined(valid, {})
    assert (same.count(), none.count()) == (2, 0)


def test_a_worker_that_died_leaves_its_master_in_its_marker(tmp_path):
    folder = InFlightFolder.create(str(tmp_path), "fold-1")
    guard = Guard(folder.path, 10.0)
    guard.start("M1")
    died = died_in_flight(folder, RuntimeError("worker lost"))
    assert died == [MasterFailure("M1", CRASH, "its Python worker died (RuntimeError)")]
    guard.done()
    assert died_in_flight(folder, RuntimeError("transient")) == []
    guard.close()
    folder.remove()
