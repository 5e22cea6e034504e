"""A message over SIS_MAX_MESSAGE_BYTES is moved aside at intake, logged by size, digest and
location, dead-lettered `too-large`, and the batches after it fold: landed whole, it would run the
batch's raw_messages step out of the Spark driver's memory and leave that batch and every later one
unfolded. Real embedded queue, sensor, Spark and Delta; the bound is small here instead of the body
large."""

from __future__ import annotations

import dagster as dg
import pytest

from sis_platform.assets.run_tags import CHAIN_HEAD_TAG, MESSAGES_TAG
from sis_platform.lake.tables import DEAD_LETTERS, MASTER_DOCUMENTS, RAW_MESSAGES
from tests.domain.sportsdata_fixtures import (
    ASCOT_1430,
    GO_SOFT,
    PRICE_7_TO_9,
    event,
    master,
    update,
)
from tests.harness import Harness

pytestmark = [pytest.mark.spark, pytest.mark.dagster, pytest.mark.cost(120)]

BOUND = 2_000


def _run(h: Harness, request: dg.RunRequest) -> dg.ExecuteInProcessResult:
    """The requested run, with the tags the daemon would give it."""
    result = h.defs.resolve_job_def("process_batch").execute_in_process(
        partition_key=request.partition_key, instance=h.instance, tags=request.tags
    )
    assert result.success
    return result


def _tick(h: Harness, *bodies: bytes) -> tuple[list[str], dg.RunRequest]:
    with h.resources["queue"].open().producer() as producer:
        ids = [producer.put(body) for body in bodies]
    result = h.tick()
    assert isinstance(result, dg.SensorResult)
    (request,) = result.run_requests
    return ids, request


def test_a_message_over_the_bound_is_dead_lettered_too_large_and_later_batches_fold(
    tmp_path, spark
):
    h = Harness(tmp_path / "data", {"SIS_MAX_MESSAGE_BYTES": str(BOUND)})
    oversized = update(ASCOT_1430, GO_SOFT).replace(
        b"</sportsdata>", b" " * 5 * BOUND + b"</sportsdata>"
    )
    ids, request = _tick(h, master(event(ASCOT_1430)), oversized, update(ASCOT_1430, GO_SOFT))
    anchor = h.zone.catalog.anchors.read(request.partition_key)
    assert request.tags[CHAIN_HEAD_TAG] == anchor.head
    assert request.tags[MESSAGES_TAG] == "3"
    _run(h, request)

    lake = h.lake(spark)
    logged = lake.read(RAW_MESSAGES).where(f"message_id = '{ids[1]}'").first()
    assert (len(logged["body"]), logged["body_size"]) == (0, len(oversized))
    assert (h.zone.catalog.root / logged["body_location"]).read_bytes() == oversized
    (letter,) = lake.read(DEAD_LETTERS).collect()
    assert (letter["message_id"], letter["reason"]) == (ids[1], "too-large")
    assert logged["body_location"] in letter["detail"]
    assert f"over the limit of {BOUND} (SIS_MAX_MESSAGE_BYTES)" in letter["detail"]

    _, later = _tick(h, update(ASCOT_1430, PRICE_7_TO_9))
    result = _run(h, later)
    (evaluation,) = [
        e for e in result.get_asset_check_evaluations() if e.check_name == "hash_chain_intact"
    ]
    assert evaluation.passed and evaluation.metadata["run_anchor_compared"].value is True
    (document,) = lake.read(MASTER_DOCUMENTS).collect()
    assert (document["version"], document["stale"]) == (3, False)
