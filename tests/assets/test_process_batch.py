"""The per-batch job on real Spark and Delta, against the reference pipeline.

Batches are landed straight into the landing zone here (the queue has its own tests and the
end-to-end test goes through it); the runs go through Dagster's public execution API.
"""

from __future__ import annotations

import pytest

from sis_platform.lake.spark.model import model_step
from sis_platform.lake.tables import EVENTS, MASTER_DOCUMENTS, SELECTIONS
from sis_platform.queues.base import ReceivedMessage, new_message_id
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
from tests.harness import LOG_ASSETS, Harness, received
from tests.reference import assert_lake_matches_reference, reference_for

pytestmark = [pytest.mark.spark, pytest.mark.dagster, pytest.mark.cost(170)]


def _land(h: Harness, *batches: list[ReceivedMessage]) -> list[str]:
    keys = [h.zone.writer.land(batch).key for batch in batches]
    h.instance.add_dynamic_partitions("batches", keys)
    return keys


def every_outcome() -> list[list[ReceivedMessage]]:
    """Two batches with an outcome of every kind: applied, duplicate (a redelivery across
    batches), invalid message, failed patch (the master goes stale), update of a stale master,
    orphan update, redelivery limit. Also run over Spark Connect (tests/connect)."""
    dup_id = new_message_id()
    return [
        [
            received(master(event(ASCOT_1430), event(ASCOT_1500))),
            received(update(f"{ASCOT_1430} {ASCOT_1500}", GO_SOFT), dup_id),
            received(b"<sportsdata category='master' type='new' id='X'><event"),
        ],
        [
            received(update(ASCOT_1430, PRICE_7_TO_9)),
            received(update(f"{ASCOT_1430} {ASCOT_1500}", GO_SOFT), dup_id, delivery_count=2),
            received(update(ASCOT_1500, MISSING_NODE)),
            received(update(ASCOT_1500, PRICE_7_TO_9)),  # master is stale now
            received(update("NOPE-1", GO_SOFT)),  # orphan
            received(update(ASCOT_1430, PRICE_7_TO_9), delivery_count=6),  # over the limit
        ],
    ]


def test_batches_fold_into_masters_exactly_like_the_reference(tmp_path, spark):
    h = Harness(tmp_path / "data")
    keys = _land(h, *every_outcome())
    h.run_requested(keys)
    lake = h.lake(spark)
    ref = reference_for(h.logged_messages())
    assert_lake_matches_reference(lake, ref)

    docs = {r["master_id"]: r for r in lake.read(MASTER_DOCUMENTS).collect()}
    assert docs[ASCOT_1430]["version"] == 3 and not docs[ASCOT_1430]["stale"]
    assert docs[ASCOT_1500]["stale"]
    events = {r["master_id"]: r for r in lake.read(EVENTS).collect()}
    assert events[ASCOT_1430]["going"] == "soft"
    price = [
        r
        for r in lake.read(SELECTIONS).collect()
        if r["master_id"] == ASCOT_1430 and r["selection_id"] == "7"
    ]
    assert [(r["price_num"], r["price_den"], r["price_decimal"]) for r in price] == [(9, 1, 10.0)]


def test_fold_waits_for_a_missing_batch_catches_up_and_a_rerun_changes_nothing(tmp_path, spark):
    h = Harness(tmp_path / "data")
    first, second = _land(
        h,
        [received(master(event(ASCOT_1430)))],
        [received(update(ASCOT_1430, PRICE_7_TO_9))],
    )
    result = h.run(second)  # out of order: batch 1 not processed yet
    # Nothing folded: no materialization of the fold's tables or the model (their latest
    # materializations keep saying what they hold), and an observation says what it waits for.
    assert not result.asset_materializations_for_node("fold_masters")
    assert not result.asset_materializations_for_node("interpreted_model")
    (waiting,) = result.asset_observations_for_node("fold_masters")
    assert waiting.asset_key.path == ["master_documents"]
    assert waiting.metadata["waiting_for_batch"].value == 1
    lake = h.lake(spark)
    assert lake.read(MASTER_DOCUMENTS).count() == 0

    h.run(first)  # folds batch 1 and the waiting batch 2 in one step
    assert_lake_matches_reference(lake, reference_for(h.logged_messages()))
    assert lake.read(MASTER_DOCUMENTS).first()["version"] == 2

    # Rerunning a partition already logged and folded (its message log, the fold, the model)
    # changes nothing, and says so: the fold and the model record no new materialization.
    rerun = h.run(first)
    assert not rerun.asset_materializations_for_node("fold_masters")
    assert not rerun.asset_materializations_for_node("interpreted_model")
    assert_lake_matches_reference(lake, reference_for(h.logged_messages()))
    assert lake.read(MASTER_DOCUMENTS).first()["version"] == 2


def test_a_fold_step_the_model_missed_is_announced_again_so_the_model_catches_up(tmp_path, spark):
    h = Harness(tmp_path / "data")
    (key,) = _land(h, [received(master(event(ASCOT_1430)))])
    # A run that ended after the fold's step and before the model's refresh.
    h.materialize(key, *LOG_ASSETS, MASTER_DOCUMENTS.name)
    lake = h.lake(spark)
    assert model_step(lake) == 0

    result = h.run(key)
    (documents,) = [
        m
        for m in result.asset_materializations_for_node("fold_masters")
        if m.asset_key.path == ["master_documents"]
    ]
    # The step it announces is the one already committed; this run folded nothing new.
    assert documents.metadata["fold_step"].value == "1"
    assert documents.metadata["new_fold_step"].value is False
    assert documents.metadata["masters_changed"].value == 0
    model = {
        m.asset_key.path[-1]: m for m in result.asset_materializations_for_node("interpreted_model")
    }
    assert model["events"].metadata["fold_step"].value == "1"
    assert model_step(lake) == 1
    assert_lake_matches_reference(lake, reference_for(h.logged_messages()))
