"""The model's row builder (the Python side of one mapInArrow), without a Spark session."""

from __future__ import annotations

from dataclasses import asdict, replace
from decimal import Decimal

import pyarrow as pa
import pytest

from sis_platform.domain.interpret import decimal_price, interpret
from sis_platform.lake.spark import model as model_module
from sis_platform.lake.spark.model import _rows
from tests.domain.sportsdata_fixtures import ASCOT_1430, ASCOT_1500, ROMFORD_1912, event


def _input(*docs: tuple[str, str]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [
            {
                "master_id": m,
                "document": d,
                "version": 2,
                "stale": False,
                "fold_step": 7,
                "first_block": 3,
            }
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
            expected += {
                "events": [model.event],
                "markets": model.markets,
                "selections": model.selections,
            }[kind]
        assert len(got) == len(expected) > 0
        for g, e in zip(got, expected, strict=True):
            assert {k: g[k] for k in asdict(e)} == asdict(e)
            assert (g["fold_step"], g["first_block"]) == (7, 3)


def test_a_batch_of_events_without_markets_keeps_the_schema():
    # Every market and selection column is null in every row: the schema must still hold.
    [out] = list(_rows(iter([_input((ASCOT_1430, event(ASCOT_1430, markets="")))])))
    assert [r["kind"] for r in out.to_pylist()] == ["events"]
    assert out.schema.field("price_decimal").type == pa.decimal128(38, 6)
    assert out.schema.field("places").type == pa.int64()


def test_an_empty_input_batch_gives_no_rows():
    assert sum(b.num_rows for b in _rows(iter([_input()]))) == 0


INT64_MAX = 2**63 - 1


def _market(*prices: tuple[int, int], places: int = 3, number: int = 1) -> str:
    selections = "".join(
        f'<selection id="{i}" number="{number}" name="S{i}" status="runner">'
        f'<price num="{num}" den="{den}"/></selection>'
        for i, (num, den) in enumerate(prices)
    )
    return f'<market id="WIN" type="win" status="open" places="{places}">{selections}</market>'


def _selections(out: list[pa.RecordBatch]) -> list[dict[str, object]]:
    return [r for b in out for r in b.to_pylist() if r["kind"] == "selections"]


def test_numbers_up_to_the_64_bit_bound_are_held_exactly():
    markets = _market(
        (2**31, 1), (INT64_MAX, 1), (INT64_MAX, INT64_MAX), places=2**40, number=INT64_MAX
    )
    out = list(_rows(iter([_input((ASCOT_1430, event(ASCOT_1430, markets=markets)))])))
    rows = _selections(out)
    assert [(r["price_num"], r["price_den"], r["price_decimal"]) for r in rows] == [
        (2**31, 1, Decimal(2**31 + 1)),
        (INT64_MAX, 1, Decimal(2**63)),  # a double would hold 2^63 + 0 and 2^63 - 1 alike
        (INT64_MAX, INT64_MAX, Decimal(2)),
    ]
    assert {r["number"] for r in rows} == {INT64_MAX}
    [market] = [r for b in out for r in b.to_pylist() if r["kind"] == "markets"]
    assert market["places"] == 2**40


def test_a_master_whose_interpretation_raises_is_a_failure_and_the_others_get_rows(
    monkeypatch,
):
    def interpret_failing_for_ascot_1500(master_id: str, document: bytes):
        if master_id == ASCOT_1500:
            raise RuntimeError("a bug in the interpreter")
        return interpret(master_id, document)

    # lake/spark/model.py calls the interpreter by the name it imported.
    monkeypatch.setattr(model_module, "interpret", interpret_failing_for_ascot_1500)
    docs = [
        (ASCOT_1430, event(ASCOT_1430)),
        (ASCOT_1500, event(ASCOT_1500)),
        (ROMFORD_1912, event(ROMFORD_1912)),
    ]
    rows = [r for b in _rows(iter([_input(*docs)])) for r in b.to_pylist()]
    [failure] = [r for r in rows if r["kind"] == "model_failures"]
    assert (failure["master_id"], failure["version"], failure["fold_step"]) == (ASCOT_1500, 2, 7)
    assert failure["error"] == "RuntimeError: a bug in the interpreter"
    assert {r["master_id"] for r in rows if r["kind"] == "events"} == {ASCOT_1430, ROMFORD_1912}
    assert all(r["master_id"] != ASCOT_1500 for r in rows if r["kind"] != "model_failures")


def test_a_number_beyond_its_column_fails_its_master_only(monkeypatch):
    # The interpreter reads no number outside 64 bits; a row holding one anyway (a bug) must
    # not fail the batch's Arrow conversion for the other masters.
    def interpret_with_a_huge_price(master_id: str, document: bytes):
        model = interpret(master_id, document)
        if master_id != ASCOT_1500:
            return model
        return replace(model, selections=[replace(model.selections[0], price_num=2**63)])

    monkeypatch.setattr(model_module, "interpret", interpret_with_a_huge_price)
    docs = [(ASCOT_1430, event(ASCOT_1430)), (ASCOT_1500, event(ASCOT_1500))]
    rows = [r for b in _rows(iter([_input(*docs)])) for r in b.to_pylist()]
    [failure] = [r for r in rows if r["kind"] == "model_failures"]
    assert failure["master_id"] == ASCOT_1500
    assert failure["error"].startswith(f"ValueError: price_num {2**63} is outside")
    assert {r["master_id"] for r in rows if r["kind"] != "model_failures"} == {ASCOT_1430}


def test_a_document_that_is_not_xml_fails_its_master_only():
    rows = [
        r
        for b in _rows(iter([_input((ASCOT_1430, "<event"), (ASCOT_1500, event(ASCOT_1500)))]))
        for r in b.to_pylist()
    ]
    [failure] = [r for r in rows if r["kind"] == "model_failures"]
    assert failure["master_id"] == ASCOT_1430
    assert failure["error"].startswith("XMLSyntaxError")


@pytest.mark.parametrize(
    ("num", "den", "price"),
    [
        (5, 2, "3.500000"),
        (1, 3, "1.333333"),
        (2, 3, "1.666667"),
        (1, 2_000_000, "1.000000"),  # 0.0000005: half to even, down
        (3, 2_000_000, "1.000002"),  # 0.0000015: half to even, up
        (INT64_MAX, 1, "9223372036854775808.000000"),
        (INT64_MAX - 1, 1, "9223372036854775807.000000"),
    ],
)
def test_decimal_price_is_num_over_den_plus_one_exact_to_six_places(num, den, price):
    assert decimal_price(num, den) == Decimal(price)
    assert decimal_price(num, den).as_tuple().exponent == -6


def test_decimal_price_without_a_price_is_none():
    assert decimal_price(None, 2) is None
    assert decimal_price(5, None) is None
    assert decimal_price(5, 0) is None
