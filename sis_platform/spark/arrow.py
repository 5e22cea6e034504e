"""Arrow record batches for `mapInArrow` functions, built from rows against an exact schema."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa


def record_batch(rows: list[tuple[object, ...]], schema: pa.Schema) -> pa.RecordBatch:
    """`rows` (tuples in the schema's column order) as one record batch of `schema`. Built
    column by column against the schema, so no type is inferred: a column that is null in
    every row still has its declared type."""
    import pyarrow as pa

    columns = list(zip(*rows, strict=True)) if rows else [() for _ in schema]
    return pa.RecordBatch.from_arrays(
        [pa.array(c, type=f.type) for c, f in zip(columns, schema, strict=True)], schema=schema
    )
