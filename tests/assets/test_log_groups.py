"""A batch landed in groups (parts, sis_platform.log.landing.GroupWriter) through the lake's message
log: raw_messages reads its parts, the blocking chain check and sis-verify-log pass it, and
damage to one of its parts is found like damage to a batch file."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sis_platform.cli.verify_log import EXIT_BROKEN, EXIT_INTACT, verify
from sis_platform.lake.spark.chain import verify_batch
from sis_platform.lake.tables import RAW_MESSAGES
from sis_platform.log.landing import ClosedBy, GroupWriter
from tests.harness import Harness, received

pytestmark = [pytest.mark.spark, pytest.mark.dagster, pytest.mark.cost(120)]

WHOLE, GROUPED = "0000000001", "0000000002"


@pytest.fixture(scope="module")
def logged(spark, tmp_path_factory) -> Iterator[tuple[Harness, Any]]:
    h = Harness(tmp_path_factory.mktemp("groups") / "data")
    assert h.zone.writer.land([received(b"<a/>"), received(b"<b/>")]).key == WHOLE
    writer = GroupWriter(h.zone.writer)
    writer.land([received(b"<c/>"), received(b"<d/>", delivery_count=2)])
    writer.land([received(b"<e/>")])
    writer.land([received(b"<f/>"), received(b"<g/>")])
    sealed = writer.seal(ClosedBy.MESSAGES)
    assert sealed is not None and sealed.key == GROUPED
    h.instance.add_dynamic_partitions("batches", [WHOLE, GROUPED])
    for key in (WHOLE, GROUPED):
        result = h.materialize(key, "raw_messages")
        (evaluation,) = result.get_asset_check_evaluations()
        assert evaluation.passed, evaluation.metadata["problems"]
    yield h, h.lake(spark)


def test_a_batch_in_parts_is_logged_whole_and_verified(logged):
    h, lake = logged
    rows = lake.read(RAW_MESSAGES).where(f"batch_key = '{GROUPED}'").orderBy("msg_seq").collect()
    assert [bytes(r["body"]) for r in rows] == [b"<c/>", b"<d/>", b"<e/>", b"<f/>", b"<g/>"]
    assert [r["msg_seq"] for r in rows] == list(range(5))
    assert [r["chain_link"] for r in rows] == h.zone.catalog.read(GROUPED).column(
        "chain_link"
    ).to_pylist()
    verdict = verify_batch(lake, h.zone, GROUPED)
    assert verdict.intact and verdict.messages == 5
    assert verify(lake, h.zone, None, None) == EXIT_INTACT


def test_a_part_rewritten_with_one_field_changed_is_found(logged):
    h, lake = logged
    path = h.zone.catalog.parts(GROUPED)[0]
    saved = path.read_bytes()
    table = pq.read_table(path)
    index = table.schema.get_field_index("delivery_count")
    changed = table.set_column(index, table.schema.field(index), pa.array([1, 3], pa.int32()))
    try:
        path.chmod(0o600)
        pq.write_table(changed, path)  # its metadata (the running anchor) kept as it was
        verdict = verify_batch(lake, h.zone, GROUPED)
        assert not verdict.intact
        first = verdict.first_problem
        assert first is not None and first.msg_seq == 1 and "landing file" in first.text
        assert verify(lake, h.zone, None, None) == EXIT_BROKEN
    finally:
        path.write_bytes(saved)
    assert verify_batch(lake, h.zone, GROUPED).intact


def test_a_part_removed_from_the_middle_is_found(logged):
    h, lake = logged
    path = h.zone.catalog.parts(GROUPED)[1]
    saved = path.read_bytes()
    try:
        path.unlink()
        verdict = verify_batch(lake, h.zone, GROUPED)
        assert not verdict.intact
        texts = [p.text for p in verdict.problems]
        assert any("a message was deleted, inserted or moved" in t for t in texts), texts
        assert any("4 message(s) where the anchor says 5" in t for t in texts), texts
    finally:
        path.write_bytes(saved)
        path.chmod(0o600)
    assert verify_batch(lake, h.zone, GROUPED).intact
