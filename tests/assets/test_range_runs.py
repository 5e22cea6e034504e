"""A run over a range of batches (what the landed-batches sensor requests for a backlog) on real
Spark and Delta: the same lake as a run per batch, one materialization per batch, and the
blocking chain check over the range, which stops the run at a tampered batch in its middle."""

from __future__ import annotations

from typing import Any

import dagster as dg
import pyarrow.parquet as pq
import pytest

from sis_platform.assets.message_log import CHAIN_CHECK, hash_chain_intact, raw_messages
from sis_platform.assets.run_tags import RANGE_END_TAG, RANGE_START_TAG
from sis_platform.lake.tables import BATCH_LOG, MESSAGE_ITEMS, RAW_MESSAGES
from sis_platform.queues.base import ReceivedMessage
from tests.assets.test_process_batch import every_outcome
from tests.domain.sportsdata_fixtures import ASCOT_1430, PRICE_7_TO_9, update
from tests.harness import Harness, received
from tests.reference import assert_lake_matches_reference, reference_for

pytestmark = [pytest.mark.spark, pytest.mark.dagster, pytest.mark.cost(130)]

CHECK_KEY = dg.AssetCheckKey(dg.AssetKey("raw_messages"), CHAIN_CHECK)


def _feed() -> list[list[ReceivedMessage]]:
    return [*every_outcome(), [received(update(ASCOT_1430, PRICE_7_TO_9))]]


def _land(h: Harness, batches: list[list[ReceivedMessage]]) -> list[str]:
    keys = [h.zone.writer.land(batch).key for batch in batches]
    h.instance.add_dynamic_partitions("batches", keys)
    return keys


def _rows(lake: Any, table: Any, *columns: str) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in lake.read(table).select(*columns).collect())


def test_a_range_run_leaves_the_lake_a_run_per_batch_leaves(tmp_path, spark):
    feed = _feed()
    ranged, single = Harness(tmp_path / "ranged"), Harness(tmp_path / "single")
    keys = _land(ranged, feed)
    assert _land(single, feed) == keys

    result = ranged.run(keys)
    single.run_requested(keys)

    # One materialization of each partitioned asset per batch of the range, and one check
    # evaluation, passed, over all of them.
    for node, asset in (("raw_messages", "raw_messages"), ("message_items", "message_items")):
        materialized = [
            m.partition
            for m in result.asset_materializations_for_node(node)
            if m.asset_key.to_user_string() == asset
        ]
        assert sorted(materialized) == keys
    (evaluation,) = [
        e for e in result.get_asset_check_evaluations() if e.asset_check_key == CHECK_KEY
    ]
    assert evaluation.passed, evaluation.metadata["problems"]
    assert evaluation.metadata["batches_checked"].value == len(keys)
    assert evaluation.metadata["messages_checked"].value == sum(len(b) for b in feed)

    lake, other = ranged.lake(spark), single.lake(spark)
    assert_lake_matches_reference(lake, reference_for(ranged.logged_messages()))
    summary = ("batch_key", "batch_seq", "messages", "items", "invalid", "items_digest")
    assert _rows(lake, BATCH_LOG, *summary) == _rows(other, BATCH_LOG, *summary)
    # The chain links differ: each harness landed the feed at its own time (received_at).
    logged = ("batch_key", "msg_seq", "message_id", "delivery_count", "body")
    assert _rows(lake, RAW_MESSAGES, *logged) == _rows(other, RAW_MESSAGES, *logged)
    items = ("batch_key", "msg_seq", "position", "status", "master_id", "payload", "reason")
    assert _rows(lake, MESSAGE_ITEMS, *items) == _rows(other, MESSAGE_ITEMS, *items)


def _check_range(h: Harness, keys: list[str]) -> dg.AssetCheckEvaluation:
    """The chain check alone over the range of `keys`, as the UI runs it for a range."""
    defs = dg.Definitions(
        assets=[raw_messages],
        asset_checks=[hash_chain_intact],
        jobs=[dg.define_asset_job("check", selection=dg.AssetSelection.checks(hash_chain_intact))],
        resources=h.resources,
    )
    result = defs.resolve_job_def("check").execute_in_process(
        tags={RANGE_START_TAG: keys[0], RANGE_END_TAG: keys[-1]},
        instance=h.instance,
        raise_on_error=False,
    )
    (evaluation,) = result.get_asset_check_evaluations()
    return evaluation


def test_the_chain_check_over_a_range_stops_the_run_at_a_tampered_batch(tmp_path, spark):
    h = Harness(tmp_path / "data")
    keys = _land(h, _feed())
    # The middle batch's landing file rewritten with one body changed, after it was anchored.
    (path,) = h.zone.catalog.landed_files(keys[1])
    table = pq.read_table(path)
    bodies = table.column("body").to_pylist()
    bodies[0] = bodies[0] + b" "
    table = table.set_column(table.schema.get_field_index("body"), "body", [bodies])
    pq.write_table(table, path)

    with pytest.raises(Exception, match="blocking asset check failed") as failed:
        h.run(keys)
    assert CHAIN_CHECK in str(failed.value)
    lake = h.lake(spark)
    # Blocking: nothing of the range was classified, so the fold read none of it.
    assert not lake.exists(MESSAGE_ITEMS) or lake.read(MESSAGE_ITEMS).count() == 0

    evaluation = _check_range(h, keys)
    assert not evaluation.passed
    problems = str(evaluation.metadata["problems"].value)
    assert keys[1] in problems
    assert keys[0] not in problems and keys[2] not in problems
