"""A batch landed in groups (live mode's form) and then merged into one file
(sis_platform/log/landing/merge.py) through the lake's message log: raw_messages and message_items
materialize from the merged file, the blocking chain check passes, and the lake holds exactly
the rows it held from the parts."""

from __future__ import annotations

import pytest

from sis_platform.lake.spark.chain import verify_batch
from sis_platform.lake.tables import MESSAGE_ITEMS, RAW_MESSAGES
from sis_platform.log.landing import ClosedBy, GroupWriter
from sis_platform.log.landing.expiry import BatchExpired, advance_record, remove_expired
from sis_platform.log.landing.merge import merge_batch, remove_parts
from tests.harness import LOG_ASSETS, Harness, received

pytestmark = [pytest.mark.spark, pytest.mark.dagster, pytest.mark.cost(120)]

GROUPED = "0000000001"


def _rows(lake, table) -> list[dict[str, object]]:
    frame = lake.read(table).where(f"batch_key = '{GROUPED}'")
    return sorted((r.asDict() for r in frame.collect()), key=repr)


def test_a_merged_batch_materializes_the_rows_its_parts_did(spark, tmp_path):
    h = Harness(tmp_path / "data")
    writer = GroupWriter(h.zone.writer)
    writer.land([received(b"<c/>"), received(b"<d/>", delivery_count=2)])
    writer.land([received(b"<e/>")])
    writer.land([received(b"<f/>"), received(b"<g/>")])
    assert writer.seal(ClosedBy.SECONDS) is not None
    h.instance.add_dynamic_partitions("batches", [GROUPED])
    lake = h.lake(spark)

    def materialized() -> tuple[list[dict[str, object]], list[dict[str, object]]]:
        result = h.materialize(GROUPED, *LOG_ASSETS)
        assert result.success
        for evaluation in result.get_asset_check_evaluations():
            assert evaluation.passed, evaluation.metadata
        return _rows(lake, RAW_MESSAGES), _rows(lake, MESSAGE_ITEMS)

    from_parts = materialized()
    merged = merge_batch(h.zone.upkeep, GROUPED)
    assert merged is not None and merged.parts == 3
    assert h.zone.catalog.batch_files(GROUPED) == [h.zone.catalog.batch_path(GROUPED)]

    assert materialized() == from_parts
    assert len(from_parts[0]) == 5
    verdict = verify_batch(lake, h.zone, GROUPED)
    assert verdict.intact and verdict.messages == 5


def test_expired_batches_verify_from_the_lake_and_refuse_to_materialize_again(spark, tmp_path):
    h = Harness(tmp_path / "data")
    writer = GroupWriter(h.zone.writer)
    keys = []
    for n in range(3):
        writer.land([received(f"<c n='{n}'/>".encode())])
        writer.land([received(f"<d n='{n}'/>".encode())])
        sealed = writer.seal(ClosedBy.SECONDS)
        assert sealed is not None
        keys.append(sealed.key)
    for key in keys:
        assert merge_batch(h.zone.upkeep, key) is not None
        assert remove_parts(h.zone.upkeep, key)
    h.instance.add_dynamic_partitions("batches", keys)
    lake = h.lake(spark)
    for key in keys:
        assert h.materialize(key, *LOG_ASSETS).success

    assert advance_record(h.zone.upkeep, checked_batch=2, retain_seconds=0.0).through_seq == 2
    assert remove_expired(h.zone.upkeep)
    assert h.zone.catalog.keys() == [keys[2]]
    # The expired ones from their rows in the lake, each following the one before (as
    # sis-verify-log carries it), the last against the record; the kept one from the record.
    head = None
    for key in keys:
        verdict = verify_batch(lake, h.zone, key, expired_prev=head)
        assert verdict.intact and verdict.messages == 2, verdict.problems
        head = verdict.head
    broken = verify_batch(lake, h.zone, keys[1], expired_prev="00" * 32)
    assert not broken.intact  # a batch that does not follow the one before is named

    with pytest.raises(Exception) as failed:
        h.materialize(keys[0], *LOG_ASSETS)
    causes = []
    error: BaseException | None = failed.value
    while error is not None:
        causes.append(error)
        error = error.__cause__ or error.__context__
    assert any(isinstance(e, BatchExpired) for e in causes), causes
    # The lake's copy is untouched.
    assert lake.read(RAW_MESSAGES).where(f"batch_key = '{keys[0]}'").count() == 2
