"""events / markets / selections: the interpreted model, refreshed for masters that changed.

The model follows the fold's committed steps: each refresh rebuilds the rows of every master the
fold touched since the model's last step, replacing them in one Delta commit per table
(replaceWhere on the master ids, within their home blocks' partitions: the blocks the fold's
steps recorded), then records the step in model_steps. Re-running a refresh
after a crash rebuilds the same rows, so it is idempotent.

One master never fails the refresh for the others: a master whose rows cannot be built (the
interpreter raised, or a value does not fit its column's type) gets no rows in the three tables
and a row in model_failures, naming the error; the next refresh that sees the master changed
builds it again.

Upgrading: the model tables are derived from master_documents, so a model table whose column
types differ from its schema in lake/tables.py (a lake created with 32-bit numbers and a double
price) is recreated empty with the new schema, and model_steps emptied first, so the same
refresh rebuilds every master's rows (see `_upgrade_schemas`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from typing import TYPE_CHECKING, NamedTuple

import pyarrow as pa
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from sis_platform.domain.interpret import interpret
from sis_platform.domain.model import MODEL_COLUMNS
from sis_platform.lake.delta import sql_in
from sis_platform.lake.driver.conf import DELETION_VECTOR_SCAN_SQL
from sis_platform.lake.spark.arrow import record_batches
from sis_platform.lake.spark.fold import FOLD_WRITER, committed_step, written_blocks
from sis_platform.lake.spark.fold.homes import blocks_condition
from sis_platform.lake.tables import (
    EVENTS,
    FIRST_BLOCK,
    MARKETS,
    MASTER_DOCUMENTS,
    MODEL_FAILURES,
    MODEL_STEPS,
    SELECTIONS,
    Table,
)
from sis_platform.lake.upkeep import MODEL_UPKEEP_TABLES, run_upkeep

if TYPE_CHECKING:
    from sis_platform.lake.delta import Lake

log = logging.getLogger(__name__)

# The keys of a row of each model table in the combined rows: its columns, its kind, its step.
_ROW_KEYS = {
    name: {c.name for c in columns} | {"kind", "fold_step", FIRST_BLOCK}
    for name, columns in MODEL_COLUMNS.items()
}
# Characters of an error kept in model_failures.
ERROR_CHARS = 2_000
# Failed master ids a refresh names in its result (the table has them all).
FAILED_MASTERS_SHOWN = 20


@dataclass(frozen=True)
class ModelRefresh:
    fold_step: int | None
    masters: int = 0
    events: int = 0
    markets: int = 0
    selections: int = 0
    # Masters whose rows could not be built (model_failures), and the first few of their ids.
    failed: int = 0
    failed_masters: tuple[str, ...] = ()
    # Model tables recreated with a new schema before this refresh (a full rebuild).
    upgraded: tuple[str, ...] = ()


MODEL_TABLES = {"events": EVENTS, "markets": MARKETS, "selections": SELECTIONS}
# Every table one refresh writes from the rows `_rows` builds, by the row's `kind`.
_OUTPUT_TABLES: dict[str, Table] = {**MODEL_TABLES, "model_failures": MODEL_FAILURES}


# model_failures columns the driver sets (the same for every row of a refresh).
_REFRESH_COLUMNS = ("model_step", "failed_at")


def _combined_schema() -> T.StructType:
    """One row shape for the refresh's output tables: `kind` names the table, the other columns
    are the union of the tables' columns (same name, same type), nullable, but for
    `_REFRESH_COLUMNS`."""
    fields: dict[str, T.StructField] = {}
    for table in _OUTPUT_TABLES.values():
        for f in table.schema().fields:
            if f.name not in _REFRESH_COLUMNS:
                fields.setdefault(f.name, T.StructField(f.name, f.dataType, True))
    return T.StructType([T.StructField("kind", T.StringType(), False), *fields.values()])


@lru_cache(maxsize=4096)  # a feed quotes a few hundred distinct odds; a Decimal is immutable
class _IntegerColumn(NamedTuple):
    """An integer column of the combined schema and the values it can hold."""

    position: int  # in the schema
    name: str
    lowest: int
    highest: int


def _integer_bounds(schema: pa.Schema) -> list[_IntegerColumn]:
    """Every integer column of `schema`, with its range."""
    bounds = []
    for i, f in enumerate(schema):
        if pa.types.is_signed_integer(f.type):
            top = 2 ** (f.type.bit_width - 1)
            bounds.append(_IntegerColumn(i, f.name, -top, top - 1))
    return bounds


def _out_of_range(rows: Sequence[Sequence[object]], bounds: list[_IntegerColumn]) -> str | None:
    """Why one of `rows` cannot be held by its integer columns, or None when all fit (a
    document folded before the schema bounded its integers can hold any number)."""
    for row in rows:
        for column in bounds:
            value = row[column.position]
            if isinstance(value, int) and not column.lowest <= value <= column.highest:
                return (
                    f"{column.name} {value} is outside the column's range "
                    f"[{column.lowest}, {column.highest}]"
                )
    return None


def _master_rows(rec: dict[str, object], names: Sequence[str]) -> list[tuple[object, ...]]:
    """The rows of one master (one `master_documents` row) for the three model tables, as
    tuples in `names` order."""
    master_id = str(rec["master_id"])
    model = interpret(master_id, str(rec["document"]).encode("utf-8"))
    tags = {"fold_step": rec["fold_step"], FIRST_BLOCK: rec[FIRST_BLOCK]}
    # The rows' fields are scalars: their __dict__ is what `asdict` would deep-copy.
    rows: list[dict[str, object]] = [
        {
            "kind": "events",
            **vars(model.event),
            "version": rec["version"],
            "stale": rec["stale"],
            **tags,
        }
    ]
    rows.extend({"kind": "markets", **vars(m), **tags} for m in model.markets)
    rows.extend({"kind": "selections", **vars(s), **tags} for s in model.selections)
    for row in rows:
        # Every row carries exactly its table's columns (domain/model.py): a column the
        # interpreter stopped filling fails this master loudly instead of landing as null.
        if row.keys() != _ROW_KEYS[str(row["kind"])]:
            raise ValueError(
                f"{row['kind']} row of {master_id!r} has columns {sorted(row)}, expected"
                f" {sorted(_ROW_KEYS[str(row['kind'])])}"
            )
    return [tuple(map(r.get, names)) for r in rows]


def _rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """master_documents rows (master_id, document, version, stale, fold_step, first_block) to
    rows of `_combined_schema`: each master's events, markets and selections rows, or one
    model_failures row (its error) when they cannot be built."""
    # Arrow batches built against the exact schema: no pandas type inference, which fails on
    # columns that are null in every row of a batch (e.g. a batch of events only).
    schema = to_arrow_schema(_combined_schema())
    names = schema.names
    bounds = _integer_bounds(schema)
    for batch in batches:
        out: list[tuple[object, ...]] = []
        for rec in batch.to_pylist():
            # Each document is parsed once for all three tables.
            try:
                rows = _master_rows(rec, names)
                why = _out_of_range(rows, bounds)
                if why is not None:
                    raise ValueError(why)
            except MemoryError:
                raise  # the worker's state, not this master's document: the step fails
            except Exception as error:
                # The interpreter and the checks are pure functions of this master's document
                # (no I/O): whatever they raise is about the document or a bug in reading it,
                # never an outage, so it is recorded as this master's failure (model_failures,
                # counted in the asset's metadata) and the other masters are written.
                failure = {
                    "kind": "model_failures",
                    "master_id": rec["master_id"],
                    "version": rec["version"],
                    "fold_step": rec["fold_step"],
                    "error": f"{type(error).__name__}: {error}"[:ERROR_CHARS],
                }
                rows = [tuple(map(failure.get, names))]
            out.extend(rows)
        yield from record_batches(out, schema)


def _same_types(actual: T.StructType, expected: T.StructType) -> bool:
    return [(f.name, f.dataType) for f in actual.fields] == [
        (f.name, f.dataType) for f in expected.fields
    ]


def _upgrade_schemas(lake: Lake) -> tuple[str, ...]:
    """Recreate, empty and with the current schema, every existing output table whose columns
    differ from it, after emptying model_steps, so this refresh rebuilds the model from every
    master. model_steps is emptied first: a crash before the tables are recreated leaves them
    to the next refresh, which finds them different still and rebuilds all the same. Returns
    the names of the recreated tables."""
    stale = [
        table
        for table in _OUTPUT_TABLES.values()
        if lake.exists(table) and not _same_types(lake.read(table).schema, table.schema())
    ]
    if not stale:
        return ()
    log.warning(
        "model table(s) %s have another schema than this version's: recreating them and "
        "rebuilding the model from every master",
        ", ".join(t.name for t in stale),
    )
    if lake.exists(MODEL_STEPS):
        lake.delete(MODEL_STEPS, "true")
    for table in stale:
        _recreate(lake, table)
    return tuple(t.name for t in stale)


def _recreate(lake: Lake, table: Table) -> None:
    """`table` emptied, with its current schema, in one commit (an overwrite that replaces the
    schema; the table's history and properties stay)."""
    writer = (
        lake.spark.createDataFrame([], table.schema())
        .write.format("delta")
        .mode("overwrite")
        .option("overwriteSchema", "true")
        .partitionBy(*table.partition_by)
    )
    lake.retrying_conflicts(f"{table.name} schema upgrade", lambda: writer.save(lake.path(table)))


def model_step(lake: Lake) -> int:
    """The fold step the model has been refreshed to (0 before its first refresh)."""
    if not lake.exists(MODEL_STEPS):
        return 0
    done = lake.read(MODEL_STEPS).agg(F.max("fold_step").alias("s")).first()
    return int(done["s"]) if done and done["s"] is not None else 0


def refresh_model(lake: Lake) -> ModelRefresh:
    lake.claim_writer(FOLD_WRITER)
    upgraded = _upgrade_schemas(lake)
    lake.ensure(*_OUTPUT_TABLES.values(), MODEL_STEPS)
    done = model_step(lake)
    target = committed_step(lake)
    if target.fold_step <= done:
        return ModelRefresh(None, upgraded=upgraded)
    # The partitions of the masters the steps since `done` wrote (all of them from step 0,
    # or when a step did not record its blocks).
    blocks = written_blocks(lake, done, target.fold_step) if done else None
    documents = lake.read(MASTER_DOCUMENTS, version=target.master_documents_version)
    if blocks is not None:
        documents = documents.where(blocks_condition(blocks))
    changed = documents.where(F.col("fold_step") > done).persist()
    ids = [r["master_id"] for r in changed.select("master_id").collect()]
    live = changed.where("document IS NOT NULL AND NOT filtered")
    counts: dict[str, int] = {}
    failed_masters: tuple[str, ...] = ()
    now = datetime.now(UTC)
    if ids:
        # From step 0 every master has changed: the whole tables are replaced (no list of
        # every id in the condition).
        condition = "true" if done == 0 else sql_in("master_id", ids)
        if blocks is not None:  # never from step 0
            condition = f"{blocks_condition(blocks)} AND {condition}"
        # Built once (one pass of the interpreter over the changed masters), counted and
        # written from the same materialized rows.
        rows = (
            live.select("master_id", "document", "version", "stale", "fold_step", FIRST_BLOCK)
            .mapInArrow(_rows, schema=_combined_schema())
            .localCheckpoint()
        )
        counts = {
            str(r["kind"]): int(r["n"])
            for r in rows.groupBy("kind").agg(F.count("*").alias("n")).collect()
        }
        failures = rows.where(F.col("kind") == "model_failures")
        if counts.get("model_failures"):
            failed_masters = tuple(
                str(r["master_id"])
                for r in failures.select("master_id")
                .orderBy("master_id")
                .limit(FAILED_MASTERS_SHOWN)
                .collect()
            )
        writes = [
            (table, rows.where(F.col("kind") == which), condition)
            for which, table in MODEL_TABLES.items()
        ]
        if failed_masters:
            # Replaced by refresh (model_step), so a re-run after a crash does not record them
            # twice. A refresh without failures writes nothing here (no commit per batch).
            writes.append(
                (
                    MODEL_FAILURES,
                    failures.withColumn(
                        "model_step", F.lit(target.fold_step).cast("long")
                    ).withColumn("failed_at", F.lit(now)),
                    f"model_step = {int(target.fold_step)}",
                )
            )
        # Independent commits, written concurrently (Spark runs jobs from several threads),
        # so each commit's driver-side work overlaps the others' tasks. Each scans its table's
        # files, deletion vectors and all, for the step's masters (DELETION_VECTOR_SCAN_SQL).
        with (
            lake.sql_settings(DELETION_VECTOR_SCAN_SQL),
            ThreadPoolExecutor(len(writes), thread_name_prefix="model-write") as pool,
        ):
            futures = [pool.submit(lake.replace_where, *write) for write in writes]
            for future in futures:
                future.result()  # the first failure is raised; the others still finish
    changed.unpersist()
    # Before the commit point (model_steps' row): a refresh that dies in it is redone whole.
    run_upkeep(
        lake,
        MODEL_UPKEEP_TABLES,
        role="model",
        before=done,
        after=target.fold_step,
        settings=lake.upkeep,
    )
    lake.append(
        MODEL_STEPS,
        lake.spark.createDataFrame(
            [MODEL_STEPS.row(fold_step=target.fold_step, masters=len(ids), committed_at=now)],
            MODEL_STEPS.schema(),
        ),
    )
    return ModelRefresh(
        target.fold_step,
        len(ids),
        counts.get("events", 0),
        counts.get("markets", 0),
        counts.get("selections", 0),
        counts.get("model_failures", 0),
        failed_masters,
        upgraded,
    )
