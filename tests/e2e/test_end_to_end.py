"""End to end: simulated feed -> embedded queue -> intake -> runs -> Delta, compared exactly
with the reference pipeline over the same message log, in both intake modes: the queue sensor
landing batches, or sis-live landing groups into batches (and keeping the serving store, which
must equal the same reference and the lake) with the landed-batches sensor registering them."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from sis_platform.lake.tables import EVENTS, MASTER_DOCUMENTS, MESSAGE_OUTCOMES, SELECTIONS
from sis_platform.simulator.generator import generate_feed
from tests.harness import Harness
from tests.modes import INTAKES, assert_live_path, harness
from tests.reference import assert_lake_matches_reference, reference_for

pytestmark = [pytest.mark.spark, pytest.mark.dagster, pytest.mark.e2e, pytest.mark.cost(200)]

INVALID = {
    "not-well-formed": 0.004,
    "schema-invalid": 0.004,
    "invalid-envelope": 0.003,
    "ids-mismatch": 0.003,
    "too-large": 0.001,
    "unlocated-node": 0.003,
    "orphan-update": 0.003,
}


def _publish(h: Harness, messages: int, seed: int) -> list:
    feed = list(generate_feed(seed=seed, messages=messages, invalid=INVALID, duplicates=0.02))
    with h.resources["queue"].open().producer() as producer:
        for m in feed:
            producer.put(m.body, message_id=m.message_id)
    return feed


@pytest.mark.parametrize("intake", INTAKES)
def test_simulated_feed_through_the_platform_equals_the_reference_fold(tmp_path, spark, intake):
    h = harness(tmp_path / "data", intake, {"SIS_BATCH_MAX_MESSAGES": "700"})
    feed = _publish(h, 1400, seed=7)
    kinds = Counter(m.kind.split(":")[0] for m in feed)
    assert kinds["duplicate"] > 0 and kinds["invalid"] > 0
    assert any(
        len(m.body.split(b' id="', 1)[1].split(b'"', 1)[0].split()) > 1
        for m in feed
        if m.kind == "update"
    )  # multi-id updates are in the feed

    assert h.drain() == 2
    assert h.requested == h.zone.catalog.keys()
    h.run_requested()

    lake = h.lake(spark)
    logged = h.logged_messages()
    assert len(logged) == len(feed)
    ref = reference_for(logged)
    assert_lake_matches_reference(lake, ref)
    assert_live_path(h, ref)

    outcomes = Counter(r["outcome"] for r in lake.read(MESSAGE_OUTCOMES).collect())
    assert outcomes["duplicate"] == kinds["duplicate"]
    assert outcomes["dead-lettered"] > 0 and outcomes["applied"] > 1250
    live = lake.read(MASTER_DOCUMENTS).where("document IS NOT NULL AND NOT filtered").count()
    assert lake.read(EVENTS).count() == live
    assert lake.read(SELECTIONS).where("price_num IS NOT NULL").count() > 0


def test_partitions_materialized_in_any_order_converge_to_the_reference(tmp_path, spark):
    # One intake mode, the default: the order the lake folds its partitions in does not depend
    # on which process registered them (the test above runs both modes).
    h = harness(tmp_path / "data", "live", {"SIS_BATCH_MAX_MESSAGES": "150"})
    _publish(h, 450, seed=11)
    h.drain()
    order = list(h.requested)
    random.Random(3).shuffle(order)
    h.run_requested(order)
    h.run(order[0])  # and a re-run of an already folded batch changes nothing
    ref = reference_for(h.logged_messages())
    assert_lake_matches_reference(h.lake(spark), ref)
    assert_live_path(h, ref)
