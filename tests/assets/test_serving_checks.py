"""live_matches_lake on a real lake (Spark, Delta) and a real SQLite serving store, both built
from the same log landed in groups: the lake by the runs the landed-batches sensor requests, the
store by sis-live's fold. The check runs in its own job, as live_matches_lake_sensor requests
it. The lake's runs record its progress in the store sis-live keeps (live intake), from which
sis-live exports the lake's lag and dead letters."""

from __future__ import annotations

import sqlite3
from datetime import UTC
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from sis_platform.definitions import build_definitions
from sis_platform.domain.limits import DEFAULT_LIMITS
from sis_platform.lake.tables import DEAD_LETTERS, FOLD_STEPS
from sis_platform.live.classify import Classify
from sis_platform.live.config import FoldOptions
from sis_platform.live.fold import Fold
from sis_platform.log.landing import START_POSITION, ClosedBy, GroupWriter
from sis_platform.sensors.landed_sensor import build_landed_batches_sensor
from sis_platform.sensors.live_check_sensor import build_live_check_sensor
from sis_platform.serving import open_reader, open_writer
from tests.domain.sportsdata_fixtures import (
    ASCOT_1430,
    ASCOT_1500,
    GO_SOFT,
    MISSING_NODE,
    PRICE_7_TO_9,
    event,
    master,
    update,
)
from tests.harness import Harness, received

pytestmark = [pytest.mark.spark, pytest.mark.dagster, pytest.mark.cost(210)]


@pytest.fixture(scope="module")
def folded_lake(tmp_path_factory: pytest.TempPathFactory, spark: Any) -> Harness:
    """Two batches landed in groups as sis-live lands them, registered by the landed-batches
    sensor and folded by the lake: two masters, one of them stale, a duplicate, an invalid
    message and an orphan update."""
    h = Harness(tmp_path_factory.mktemp("live_lake") / "data", {"SIS_INTAKE": "live"})
    writer = GroupWriter(h.zone.writer)
    groups = [
        [
            received(master(event(ASCOT_1430), event(ASCOT_1500))),
            received(update(f"{ASCOT_1430} {ASCOT_1500}", GO_SOFT), "dup-1"),
        ],
        [received(b"<sportsdata category='master' type='new' id='X'><event")],
        None,  # the batch is sealed here
        [
            received(update(ASCOT_1430, PRICE_7_TO_9)),
            received(update(f"{ASCOT_1430} {ASCOT_1500}", GO_SOFT), "dup-1", delivery_count=2),
        ],
        [received(update(ASCOT_1500, MISSING_NODE)), received(update("NOPE-1", GO_SOFT))],
        None,
    ]
    for group in groups:
        if group is None:
            writer.seal(ClosedBy.MESSAGES)
        else:
            writer.land(group)
    sensor = build_landed_batches_sensor(5)
    result = sensor(dg.build_sensor_context(instance=h.instance, resources=h.resources))
    assert isinstance(result, dg.SensorResult)
    for request in result.dynamic_partitions_requests or []:
        assert isinstance(request, dg.AddDynamicPartitionsRequest)
        h.instance.add_dynamic_partitions(request.partitions_def_name, request.partition_keys)
    # The two batches waited together: one run over their range.
    (request,) = result.run_requests or []
    assert request.partition_key_range == dg.PartitionKeyRange("0000000001", "0000000002")
    h.run(["0000000001", "0000000002"])
    return h


def _live_store(h: Harness, db: Path, *, fold: bool = True) -> str:
    """A serving store at `db` with the whole landed log folded by sis-live's fold."""
    url = f"sqlite:///{db}"
    store = open_writer(url)
    try:
        if fold:
            group = list(h.zone.catalog.landed_after(START_POSITION, DEFAULT_LIMITS))
            classified = Classify(store, FoldOptions())(group)
            store.commit(Fold(store, FoldOptions())(classified))
    finally:
        store.close()
    return url


def _check(h: Harness, url: str) -> dg.AssetCheckEvaluation:
    defs = build_definitions({**h.env, "SIS_INTAKE": "live", "SIS_SERVING_URL": url})
    result = defs.resolve_job_def("check_live_matches_lake").execute_in_process(instance=h.instance)
    assert result.success
    (evaluation,) = result.get_asset_check_evaluations()
    assert evaluation.check_name == "live_matches_lake"
    return evaluation


def _values(evaluation: dg.AssetCheckEvaluation) -> dict[str, Any]:
    return {k: v.value for k, v in evaluation.metadata.items()}


def _checked_batch(url: str) -> int:
    store = open_reader(url)
    try:
        return store.retention().checked_batch
    finally:
        store.close()


def test_live_matches_the_lake_folded_from_the_same_log(folded_lake, tmp_path):
    url = _live_store(folded_lake, tmp_path / "serving.db")
    evaluation = _check(folded_lake, url)
    metadata = _values(evaluation)
    assert evaluation.passed, evaluation.description
    assert metadata["lake_batch_seq"] == 2
    assert metadata["masters_compared"] == 2
    assert metadata["mismatches"] == 0
    assert _checked_batch(url) == 2  # the gate of the store's history pruning


def test_one_master_whose_document_differs_fails_the_check_and_is_named(folded_lake, tmp_path):
    db = tmp_path / "serving.db"
    url = _live_store(folded_lake, db)
    conn = sqlite3.connect(db)
    try:
        with conn:
            conn.execute(
                "UPDATE changes SET document_sha256 = ? WHERE master_id = ? AND version = "
                "(SELECT max(version) FROM changes WHERE master_id = ?)",
                ("0" * 64, ASCOT_1430, ASCOT_1430),
            )
    finally:
        conn.close()
    evaluation = _check(folded_lake, url)
    metadata = _values(evaluation)
    assert not evaluation.passed
    assert metadata["mismatches"] == 1
    assert metadata["mismatched_masters"] == [ASCOT_1430]
    sides = metadata["mismatched_versions"][ASCOT_1430]
    assert sides["store"][1] == "0" * 64
    assert sides["lake"][0] == sides["store"][0] and sides["lake"][1] != "0" * 64
    assert ASCOT_1430 in (evaluation.description or "")
    assert _checked_batch(url) == 0  # a failed check lets nothing be pruned


def test_a_store_behind_the_lake_fails_without_comparing(folded_lake, tmp_path):
    evaluation = _check(folded_lake, _live_store(folded_lake, tmp_path / "empty.db", fold=False))
    assert not evaluation.passed
    assert "has not applied batch 2" in (evaluation.description or "")
    assert "masters_compared" not in evaluation.metadata


def test_the_check_is_requested_once_per_fold_position(folded_lake):
    """The lake's runs above recorded fold position 2 in master_documents' materialization."""
    sensor = build_live_check_sensor()
    context = dg.build_sensor_context(instance=folded_lake.instance)
    result = sensor(context)
    assert isinstance(result, dg.SensorResult)
    (request,) = result.run_requests or []
    assert request.run_key == "live-matches-lake-2"
    again = sensor(dg.build_sensor_context(instance=folded_lake.instance, cursor=result.cursor))
    assert isinstance(again, dg.SensorResult) and not again.run_requests


def test_each_fold_run_records_the_lakes_progress_in_the_serving_store(folded_lake, spark):
    """From fold_steps: the last committed step, its last batch and commit time, and the dead
    letters of every step; a run that ended before recording it is made good by the next."""
    lake = folded_lake.lake(spark)
    steps = lake.read(FOLD_STEPS).collect()
    last = max(steps, key=lambda r: r["fold_step"])
    dead_letters = lake.read(DEAD_LETTERS).count()
    assert dead_letters == sum(r["dead_lettered"] for r in steps) > 0
    with folded_lake.open_writer() as store:
        recorded = store.lake_progress()
        assert recorded is not None
        assert recorded[:2] == (last["fold_step"], 2)
        assert recorded.committed_at == last["committed_at"].replace(tzinfo=UTC)
        assert recorded.dead_letters == dead_letters
        # As if the last run had died between its step's commit and this record.
        store._backend.run(lambda conn: conn.execute("DELETE FROM lake_progress"))
        assert store.lake_progress() is None
    again = folded_lake.materialize("0000000002", "master_documents")  # nothing new to fold
    assert not again.asset_materializations_for_node("fold_masters")
    with folded_lake.open_reader() as store:
        assert store.lake_progress() == recorded._replace(
            recorded_at=store.lake_progress().recorded_at  # type: ignore[union-attr]
        )
