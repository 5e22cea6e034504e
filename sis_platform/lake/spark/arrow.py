"""Arrow record batches for `mapInArrow` functions, built from rows against an exact schema, and
cut into chunks small enough for Arrow's 32-bit offsets.

A `binary` or `string` Arrow array addresses its values with 32-bit offsets: one array holds at
most 2 GiB. A producer that turns one input batch into one output batch fails on a batch whose
values add up to more (`pyarrow` cannot build the array; measured: an update naming 20,000 ids
gives 2.5 GB of items). `record_batches` bounds every batch it yields by bytes of
variable-width values and by rows, whatever the input batch held.

The other direction is Spark's: the batches it sends to a Python worker are cut at
spark.sql.execution.arrow.maxRecordsPerBatch (10,000) rows and maxBytesPerBatch (64 MiB by
default in Spark 4.2), and the driver's `toArrow` in lake/spark/items.py brings a digest and a few
short columns per item. So no array comes near 2 GiB and spark.sql.execution.arrow.
useLargeVarTypes (64-bit offsets for every string and binary column, both ways) stays off.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import pyarrow as pa

# Bytes of variable-width values (binary, string) in one batch yielded by `record_batches`,
# summed over its columns. A string is counted by its characters: UTF-8 takes at most 4 bytes
# per character, so one column of one batch holds at most 256 MiB, well inside 2 GiB.
MAX_BATCH_BYTES = 64 * 1024 * 1024
# Rows in one batch: Spark's own default for the batches it sends to Python
# (spark.sql.execution.arrow.maxRecordsPerBatch).
MAX_BATCH_ROWS = 10_000


def record_batch(rows: Sequence[Sequence[object]], schema: pa.Schema) -> pa.RecordBatch:
    """`rows` (tuples in the schema's column order) as one record batch of `schema`. Built
    column by column against the schema, so no type is inferred: a column that is null in
    every row still has its declared type. The caller bounds the rows' size (see
    `record_batches`)."""
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in schema]
    return pa.RecordBatch.from_arrays(
        [pa.array(c, type=f.type) for c, f in zip(columns, schema, strict=True)], schema=schema
    )


def _variable_width(schema: pa.Schema) -> list[int]:
    return [
        i
        for i, f in enumerate(schema)
        if pa.types.is_binary(f.type)
        or pa.types.is_string(f.type)
        or pa.types.is_large_binary(f.type)
        or pa.types.is_large_string(f.type)
    ]


def record_batches(
    rows: Iterable[Sequence[object]],
    schema: pa.Schema,
    *,
    max_bytes: int = MAX_BATCH_BYTES,
    max_rows: int = MAX_BATCH_ROWS,
) -> Iterator[pa.RecordBatch]:
    """`rows` (tuples in the schema's column order) as record batches of `schema`, in order,
    each holding at most `max_rows` rows and `max_bytes` bytes of binary and string values (a
    single row larger than that gets a batch of its own). No rows, no batch. `rows` may be a
    generator: it is consumed one chunk at a time."""
    if max_bytes <= 0 or max_rows <= 0:
        raise ValueError(f"max_bytes and max_rows must be positive: {max_bytes}, {max_rows}")
    variable = _variable_width(schema)
    chunk: list[Sequence[object]] = []
    size = 0
    for row in rows:
        row_size = 0
        for i in variable:
            value = row[i]
            if value is not None:
                row_size += len(value)  # type: ignore[arg-type]  # bytes or str by the schema
        if chunk and (size + row_size > max_bytes or len(chunk) >= max_rows):
            yield record_batch(chunk, schema)
            chunk, size = [], 0
        chunk.append(row)
        size += row_size
    if chunk:
        yield record_batch(chunk, schema)
