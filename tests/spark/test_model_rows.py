"""The model's row builder (the Python side of one mapInArrow), without a Spark session."""

from __future__ import annotations

from dataclasses import asdict

import pyarrow as pa

from sis_platform.domain.interpret import interpret
from sis_platform.spark.model import _rows
from tests.domain.sportsdata_fixtures import ASCOT_1430, ASCOT_1500, event


def _input(*docs: tuple[str, str]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [
            {"master_id": m, "document": d, "version": 2, "stale": False, "fold_step": 7}
            for m, d in docs
        ]
    )


def test_one_pass_gives_the_rows_of_all_three_tables():
    docs = [(ASCOT_1430, event(ASCOT_1430)), (ASCOT_1500, event(ASCOT_1500))]
    [out] = list(_rows(iter([_input(*docs)])))
    rows = out.to_pylist()
    for kind in ("events", "markets", "selections"):
        got = [r for r in rows if r["kind"] == kind]
        expected = []
        for master_id, document in docs:
            model = interpret(master_id, document.encode())
            expected += {"events": [model.event], "markets": model.markets,
                         "selections": model.selections}[kind]
        assert len(got) == len(expected) > 0
        for g, e in zip(got, expected, strict=True):
            assert {k: g[k] for k in asdict(e)} == asdict(e)
            assert g["fold_step"] == 7


def test_a_batch_of_events_without_markets_keeps_the_schema():
    # Every market and selection column is null in every row: the schema must still hold.
    [out] = list(_rows(iter([_input((ASCOT_1430, event(ASCOT_1430, markets="")))])))
    assert [r["kind"] for r in out.to_pylist()] == ["events"]
    assert out.schema.field("price_decimal").type == pa.float64()
    assert out.schema.field("places").type == pa.int32()


def test_an_empty_input_batch_gives_an_empty_batch():
    [out] = list(_rows(iter([_input()])))
    assert out.num_rows == 0
