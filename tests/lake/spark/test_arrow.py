"""Record batches cut by bytes and rows (lake/spark/arrow.py), without a Spark session."""

from __future__ import annotations

import pyarrow as pa
import pytest

from sis_platform.lake.spark.arrow import record_batches

SCHEMA = pa.schema(
    [("n", pa.int64()), ("payload", pa.binary()), ("text", pa.string()), ("x", pa.int32())]
)


def _rows(count: int, payload_bytes: int) -> list[tuple[object, ...]]:
    return [(i, bytes(payload_bytes), f"t{i}", None) for i in range(count)]


def _numbers(batches: list[pa.RecordBatch]) -> list[int]:
    return [n for b in batches for n in b.column("n").to_pylist()]


def test_rows_within_both_bounds_come_out_as_one_batch():
    batches = list(record_batches(_rows(5, 10), SCHEMA))
    assert [b.num_rows for b in batches] == [5]
    assert batches[0].schema == SCHEMA


def test_batches_are_cut_at_the_byte_bound_in_row_order():
    # Each row holds 100 payload bytes and a 2-character text: 102 bytes.
    batches = list(record_batches(_rows(10, 100), SCHEMA, max_bytes=310))
    assert [b.num_rows for b in batches] == [3, 3, 3, 1]
    assert _numbers(batches) == list(range(10))
    for batch in batches:
        assert batch.column("payload").nbytes <= 310 + 8 * batch.num_rows  # values + offsets


def test_batches_are_cut_at_the_row_bound():
    batches = list(record_batches(_rows(7, 1), SCHEMA, max_rows=3))
    assert [b.num_rows for b in batches] == [3, 3, 1]
    assert _numbers(batches) == list(range(7))


def test_a_row_over_the_byte_bound_gets_a_batch_of_its_own():
    rows = [(0, b"a", None, 1), (1, bytes(1000), None, 2), (2, b"b", None, 3)]
    batches = list(record_batches(rows, SCHEMA, max_bytes=100))
    assert [b.num_rows for b in batches] == [1, 1, 1]
    assert batches[1].column("payload")[0].as_py() == bytes(1000)


def test_no_rows_give_no_batch():
    assert list(record_batches([], SCHEMA)) == []


def test_a_column_null_in_every_row_keeps_its_declared_type():
    [batch] = list(record_batches([(1, None, None, None)], SCHEMA))
    assert batch.schema == SCHEMA
    assert batch.column("x").to_pylist() == [None]


def test_a_generator_of_rows_is_consumed_one_chunk_at_a_time():
    consumed: list[int] = []

    def rows():
        for i in range(10):
            consumed.append(i)
            yield (i, b"x", None, None)

    batches = record_batches(rows(), SCHEMA, max_rows=4)
    first = next(batches)
    assert first.num_rows == 4
    assert len(consumed) == 5  # the fifth row is what closed the first chunk


@pytest.mark.parametrize("bounds", [{"max_bytes": 0}, {"max_rows": 0}])
def test_a_bound_that_is_not_positive_is_refused(bounds):
    with pytest.raises(ValueError, match="must be positive"):
        list(record_batches(_rows(1, 1), SCHEMA, **bounds))
