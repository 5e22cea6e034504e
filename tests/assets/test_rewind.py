"""Already-folded input that changes is refolded in feed order: a backfill after a fix, and a
dead-letter replay (docs/design.md invariant 3).

The fix here is a configuration one (the redelivery limit raised from 5 to 10), so that the
"fixed" platform is the same code: a message dead-lettered `redelivery-limit` before the fix is
valid after it, and must be applied at its place in the feed, before the updates that followed
it, exactly as one serial run with the fix would have.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pytest

from sis_platform.domain.limits import DEFAULT_LIMITS
from sis_platform.lake.tables import DEAD_LETTERS, EVENTS, MASTER_VERSIONS
from sis_platform.lake.trace import trace_message
from sis_platform.queues.base import new_message_id
from tests.domain.sportsdata_fixtures import (
    ASCOT_1430,
    ASCOT_1500,
    GO_SOFT,
    MISSING_NODE,
    PRICE_7_TO_9,
    ROMFORD_1912,
    event,
    master,
    update,
)
from tests.harness import LOG_ASSETS, Harness, received
from tests.reference import assert_lake_matches_reference, reference_for

pytestmark = [pytest.mark.spark, pytest.mark.dagster, pytest.mark.cost(310)]

FIXED = {"SIS_REDELIVERY_LIMIT": "10"}
FOLD_AND_MODEL = (
    "master_documents",
    "master_versions",
    "dead_letters",
    "message_outcomes",
    "events",
    "markets",
    "selections",
)


@dataclass(frozen=True)
class Folded:
    data_dir: Path
    keys: list[str]
    redelivered_id: str  # dead-lettered redelivery-limit before the fix


@pytest.fixture(scope="module")
def folded(tmp_path_factory: pytest.TempPathFactory, spark) -> Folded:
    """Three batches folded (in one step, to keep this short) under the redelivery limit 5."""
    h = Harness(tmp_path_factory.mktemp("rewind") / "data")
    redelivered_id = new_message_id()
    batches = [
        [received(master(event(ASCOT_1430), event(ASCOT_1500)))],
        [
            received(update(ASCOT_1430, PRICE_7_TO_9), redelivered_id, delivery_count=6),
            received(update(ASCOT_1500, MISSING_NODE)),  # fails: ASCOT_1500 goes stale
        ],
        [
            received(update(ASCOT_1430, GO_SOFT)),
            received(update(ASCOT_1500, GO_SOFT)),  # master-stale
            received(master(event(ROMFORD_1912))),
        ],
    ]
    keys = [h.zone.writer.land(b).key for b in batches]
    h.instance.add_dynamic_partitions("batches", keys)
    h.materialize(keys[0], *LOG_ASSETS)
    h.materialize(keys[1], *LOG_ASSETS)
    h.run(keys[2])
    return Folded(h.data_dir, keys, redelivered_id)


def _copy(folded: Folded, tmp_path: Path) -> Harness:
    # Each test changes the lake: it works on a copy (Delta tables are plain folders).
    shutil.copytree(folded.data_dir, tmp_path / "data")
    h = Harness(tmp_path / "data", overrides=FIXED)
    h.instance.add_dynamic_partitions("batches", folded.keys)
    return h


def test_folded_lake_before_the_fix_matches_the_reference(folded: Folded, spark):
    h = Harness(folded.data_dir)
    lake = h.lake(spark)
    assert_lake_matches_reference(lake, reference_for(h.logged_messages()))
    reasons = {r["reason"] for r in lake.read(DEAD_LETTERS).collect()}
    assert {"redelivery-limit", "unlocated-node", "master-stale"} <= reasons


def test_backfill_after_a_fix_rewinds_only_affected_masters_in_feed_order(
    folded: Folded, tmp_path, spark
):
    h = _copy(folded, tmp_path)
    # The backfill: batch 2's message_items again, with the fix deployed ...
    h.materialize(folded.keys[1], "message_items")
    # ... and the next fold (any partition's run) notices and refolds.
    result = h.materialize(folded.keys[2], *FOLD_AND_MODEL)
    meta = next(
        m
        for m in result.asset_materializations_for_node("fold_masters")
        if m.asset_key.path == ["master_documents"]
    ).metadata
    assert meta["rewound_masters"].value == 1  # ASCOT_1430; ASCOT_1500 and ROMFORD untouched
    assert meta["changed_batches"].value == [2]

    lake = h.lake(spark)
    assert_lake_matches_reference(lake, reference_for(h.logged_messages(), redelivery_limit=10))
    ascot = sorted(
        (r["version"], r["message_id"])
        for r in lake.read(MASTER_VERSIONS).collect()
        if r["master_id"] == ASCOT_1430
    )
    assert [m for _, m in ascot][1] == folded.redelivered_id  # version 2, before the going
    events = {r["master_id"]: r for r in lake.read(EVENTS).collect()}
    assert (events[ASCOT_1430]["version"], events[ASCOT_1430]["going"]) == (3, "soft")
    (copy,) = trace_message(lake, folded.redelivered_id).copies
    assert [(i.outcome.status, i.outcome.version.version) for i in copy.items] == [("applied", 2)]


def test_replay_job_applies_cured_dead_letters_in_feed_order_and_is_a_run(
    folded: Folded, tmp_path, spark
):
    h = _copy(folded, tmp_path)
    result = h.defs.resolve_job_def("replay_dead_letters").execute_in_process(instance=h.instance)
    assert result.success
    lake = h.lake(spark)
    # The cured message applies at its place; the uncured ones (a patch that cannot apply, an
    # update to the stale master) are dead-lettered again, once each.
    assert_lake_matches_reference(lake, reference_for(h.logged_messages(), redelivery_limit=10))
    reasons = sorted(r["reason"] for r in lake.read(DEAD_LETTERS).collect())
    assert reasons == ["master-stale", "unlocated-node"]
    runs = h.instance.get_run_records(dg.RunsFilter(job_name="replay_dead_letters"))
    assert [r.dagster_run.status for r in runs] == [dg.DagsterRunStatus.SUCCESS]
    replayed = h.instance.fetch_materializations(dg.AssetKey("message_items"), limit=10).records
    # The batches holding dead letters: 2 (the cured one, the failed patch), 3 (master-stale).
    assert sorted(r.partition_key for r in replayed) == folded.keys[1:]


def test_replay_with_nothing_fixed_changes_nothing(folded: Folded, tmp_path, spark):
    shutil.copytree(folded.data_dir, tmp_path / "data")
    h = Harness(tmp_path / "data")  # the same settings as the fold
    result = h.defs.resolve_job_def("replay_dead_letters").execute_in_process(
        instance=h.instance,
        run_config={
            "ops": {"replay": {"config": {"reasons": ["unlocated-node", "redelivery-limit"]}}}
        },
    )
    assert result.success
    assert_lake_matches_reference(h.lake(spark), reference_for(h.logged_messages()))


def test_concurrent_backfill_of_every_batch_converges_to_one_serial_run(
    folded: Folded, tmp_path, spark
):
    # Every batch's message_items re-materialized at once (threads sharing the Spark session,
    # as concurrent backfill runs share the lake): replaceWhere on distinct partitions, and
    # batch_log merges that conflict and are retried. Then one fold refolds what changed.
    from concurrent.futures import ThreadPoolExecutor

    from sis_platform.lake.spark.fold import fold_step
    from sis_platform.lake.spark.items import log_items

    h = _copy(folded, tmp_path)
    lake = h.lake(spark)
    with ThreadPoolExecutor(len(folded.keys)) as pool:
        list(
            pool.map(
                lambda key: log_items(
                    lake, key, limits=DEFAULT_LIMITS, redelivery_limit=10, run_id=None
                ),
                folded.keys,
            )
        )
    step = fold_step(lake)
    assert (step.changed_batches, step.rewound_masters) == ((2,), 1)
    assert_lake_matches_reference(lake, reference_for(h.logged_messages(), redelivery_limit=10))


def test_a_fix_that_invalidates_a_masters_last_update_takes_it_back_to_the_version_before(
    tmp_path, spark
):
    # The reverse fix: folded under the redelivery limit 10, the update (delivered 6 times)
    # was applied; under the limit 5 it is invalid. Its master has no item left after the
    # rewind point, so it goes back to the version before it (not to a tombstone).
    data = tmp_path / "data"
    h = Harness(data, overrides=FIXED)
    redelivered_id = new_message_id()
    batches = [
        [received(master(event(ASCOT_1430)))],
        [received(update(ASCOT_1430, PRICE_7_TO_9), redelivered_id, delivery_count=6)],
    ]
    keys = [h.zone.writer.land(b).key for b in batches]
    h.instance.add_dynamic_partitions("batches", keys)
    h.materialize(keys[0], *LOG_ASSETS)
    h.run(keys[1])
    assert {r["master_id"]: r["version"] for r in h.lake(spark).read(EVENTS).collect()} == {
        ASCOT_1430: 2
    }

    h = Harness(data)  # the limit back at 5
    h.instance.add_dynamic_partitions("batches", keys)
    h.materialize(keys[1], "message_items")
    h.materialize(keys[1], *FOLD_AND_MODEL)

    lake = h.lake(spark)
    assert_lake_matches_reference(lake, reference_for(h.logged_messages(), redelivery_limit=5))
    assert {r["master_id"]: r["version"] for r in lake.read(EVENTS).collect()} == {ASCOT_1430: 1}
    (copy,) = trace_message(lake, redelivered_id).copies
    assert copy.outcome is not None
    assert (copy.outcome.status, copy.outcome.reason) == ("dead-lettered", "redelivery-limit")
    assert copy.items == ()
