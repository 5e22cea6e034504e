"""The Delta tables of the platform: names, Spark schemas and partitioning, in one place.

pyspark's type classes are imported with the module: the code location imports them anyway
(dagster_pyspark), and on their own they take about 0.1 s. Nothing on the intake path (the
queues, landing, lease and consumer modules) imports this module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyspark.sql import types as T
from pyspark.sql.types import StructType

from sis_platform.domain.model import MODEL_COLUMNS, PRICE_PLACES, ModelKind

# raw_messages and message_items are partitioned by block of this many consecutive batches
# (`batch_block`, generated from batch_seq), not by batch: a partition per batch is 720 a day
# at the feed's real shape, and every read and write of one batch filters Delta's list of all
# of them. A block's files are compacted into a few once the batches after it are being
# written (lake/upkeep.py, `compact_blocks`); a batch is found in them by its key's statistics.
BATCHES_PER_BLOCK = 500


def batch_block(batch_seq: int) -> int:
    """The block of batches (the partition of raw_messages and message_items) a batch is in."""
    return batch_seq // BATCHES_PER_BLOCK


@dataclass(frozen=True)
class GeneratedColumn:
    name: str
    sql_type: str
    expression: str


BATCH_BLOCK = GeneratedColumn("batch_block", "BIGINT", f"batch_seq DIV {BATCHES_PER_BLOCK}")

# The current state (master_documents, events, markets, selections) is partitioned by each
# master's home block: the block of batches in which the fold first gave it a state
# (`batch_block` of that item's batch), recorded once in master_index and never changed. A race
# is created, updated and finished within a block or two, so a step's masters lie in the newest
# few partitions, and what a step reads, replaces and compacts is a few blocks' races, however
# many the lake has kept: the partitions of finished races are no longer touched. The ids are
# opaque, so the home of a master comes from master_index (two narrow columns), not from its id.
FIRST_BLOCK = "first_block"


@dataclass(frozen=True)
class Table:
    name: str
    partition_by: tuple[str, ...] = ()
    # Rows replaced in place at every step (MERGE or replaceWhere by master id). Without
    # deletion vectors Delta rewrites every file holding a replaced row, untouched rows
    # included; each rewrite mixes old and new masters, so after a few steps every file holds a
    # changed master and each step rewrote the whole table (a cost growing with the lake).
    # With them a step marks the replaced rows and writes only the new ones. Readers need
    # Delta 2.3+ (or another reader with deletion vectors: delta-rs, Delta Kernel).
    replaced_in_place: bool = False
    # Delta's change data feed: each commit's changed rows are readable on their own
    # (Lake.changes), so a reader that keeps up reads what changed, not the whole table.
    change_feed: bool = False
    # Columns Delta computes from the others on every write (generated columns), after those of
    # `schema()`, which writers give: (name, SQL type, SQL expression).
    generated: tuple[GeneratedColumn, ...] = ()
    # The size of the files the upkeep's compaction writes and leaves alone once reached
    # (lake/upkeep.py); None: its default, COMPACT_BELOW_BYTES.
    compact_bytes: int | None = None

    def schema(self) -> StructType:
        return _SCHEMAS[self.name]()

    def properties(self) -> dict[str, str]:
        """Delta table properties it is created with."""
        properties = {}
        if self.replaced_in_place:
            properties["delta.enableDeletionVectors"] = "true"
        if self.change_feed:
            properties["delta.enableChangeDataFeed"] = "true"
        return properties

    def row(self, **values: Any) -> tuple[Any, ...]:
        """One row in the schema's column order, from its values by column name: a row built
        field by field by name, never by position. Every column must be given, and only those."""
        names = self.schema().fieldNames()
        if missing := [n for n in names if n not in values]:
            raise ValueError(f"{self.name} row: no value for {', '.join(missing)}")
        if extra := sorted(set(values) - set(names)):
            raise ValueError(f"{self.name} row: no column {', '.join(extra)}")
        return tuple(values[n] for n in names)


RAW_MESSAGES = Table("raw_messages", (BATCH_BLOCK.name,), generated=(BATCH_BLOCK,))
MESSAGE_ITEMS = Table("message_items", (BATCH_BLOCK.name,), generated=(BATCH_BLOCK,))
# The fold plans each step from what changed in batch_log since the last (fold/plan.py).
BATCH_LOG = Table("batch_log", change_feed=True)
MASTER_VERSIONS = Table("master_versions")
MASTER_DOCUMENTS = Table("master_documents", (FIRST_BLOCK,), replaced_in_place=True)
# Every master id the fold has given a state, with its home block (FIRST_BLOCK): appended when
# the fold first writes a master, never changed, so the step finds its masters' partitions.
MASTER_INDEX = Table("master_index")
DEAD_LETTERS = Table("dead_letters")
# Appended in batch order, and read by the fold's dedupe for the dedup window's batches only
# (fold/dedupe.py), which Delta finds by each file's batch_seq range. Compacted into files of
# at most 16 MiB (about a month of the feed's outcomes), so that the file still growing never
# spans more than that: at 128 MiB it would span most of a year, and each step would read it.
MESSAGE_OUTCOMES = Table("message_outcomes", compact_bytes=16 * 1024 * 1024)
FOLD_STEPS = Table("fold_steps")
FOLD_FAILURES = Table("fold_failures")
CLASSIFY_FAILURES = Table("classify_failures")
EVENTS = Table("events", (FIRST_BLOCK,), replaced_in_place=True)
MARKETS = Table("markets", (FIRST_BLOCK,), replaced_in_place=True)
SELECTIONS = Table("selections", (FIRST_BLOCK,), replaced_in_place=True)
MODEL_FAILURES = Table("model_failures")
MODEL_STEPS = Table("model_steps")

# Tables the fold appends to, each row tagged with the fold step that wrote it: an uncommitted
# step's rows are deleted before the next step (see sis_platform/lake/spark/fold/ledger.py).
FOLD_APPEND_TABLES = (MASTER_VERSIONS, DEAD_LETTERS, MESSAGE_OUTCOMES, MASTER_INDEX)


def _raw_messages() -> StructType:
    return T.StructType(
        [
            T.StructField("batch_key", T.StringType(), False),
            T.StructField("batch_seq", T.LongType(), False),
            T.StructField("msg_seq", T.IntegerType(), False),
            T.StructField("message_id", T.StringType(), False),
            T.StructField("put_time", T.TimestampType(), True),
            T.StructField("received_at", T.TimestampType(), False),
            T.StructField("delivery_count", T.IntegerType(), False),
            T.StructField("properties_json", T.StringType(), True),
            T.StructField("body", T.BinaryType(), False),
            T.StructField("body_sha256", T.StringType(), False),
            # The real body's size, and where it lies when intake moved it aside for being over
            # SIS_MAX_MESSAGE_BYTES (relative to the landing root; `body` is then empty).
            T.StructField("body_size", T.LongType(), False),
            T.StructField("body_location", T.StringType(), True),
            T.StructField("prev_link", T.StringType(), False),
            T.StructField("chain_link", T.StringType(), False),
        ]
    )


def _message_items() -> StructType:
    return T.StructType(
        [
            T.StructField("batch_key", T.StringType(), False),
            T.StructField("batch_seq", T.LongType(), False),
            T.StructField("msg_seq", T.IntegerType(), False),
            T.StructField("message_id", T.StringType(), False),
            T.StructField("delivery_count", T.IntegerType(), False),
            # "item" rows carry one master's share of a valid message; an "invalid" row stands
            # for a whole message that is dead-lettered before splitting (reason set).
            T.StructField("status", T.StringType(), False),
            T.StructField("position", T.IntegerType(), True),
            T.StructField("master_id", T.StringType(), True),
            T.StructField("category", T.StringType(), True),
            T.StructField("type", T.StringType(), True),
            T.StructField("payload", T.BinaryType(), True),
            T.StructField("reason", T.StringType(), True),
            T.StructField("detail", T.StringType(), True),
        ]
    )


def _batch_log() -> StructType:
    return T.StructType(
        [
            T.StructField("batch_key", T.StringType(), False),
            T.StructField("batch_seq", T.LongType(), False),
            T.StructField("messages", T.LongType(), False),
            T.StructField("items", T.LongType(), False),
            T.StructField("invalid", T.LongType(), False),
            T.StructField("items_digest", T.StringType(), False),
            T.StructField("processed_at", T.TimestampType(), False),
            T.StructField("run_id", T.StringType(), True),
        ]
    )


def _master_versions() -> StructType:
    return T.StructType(
        [
            T.StructField("master_id", T.StringType(), False),
            T.StructField("version", T.IntegerType(), False),
            T.StructField("message_id", T.StringType(), False),
            T.StructField("position", T.IntegerType(), False),
            T.StructField("operation", T.StringType(), False),
            T.StructField("document", T.StringType(), False),
            T.StructField("batch_seq", T.LongType(), False),
            T.StructField("msg_seq", T.IntegerType(), False),
            T.StructField("fold_step", T.LongType(), False),
        ]
    )


def _master_documents() -> StructType:
    return T.StructType(
        [
            T.StructField("master_id", T.StringType(), False),
            T.StructField("version", T.IntegerType(), False),
            T.StructField("document", T.StringType(), True),
            T.StructField("stale", T.BooleanType(), False),
            T.StructField("filtered", T.BooleanType(), False),
            T.StructField("fold_step", T.LongType(), False),
            T.StructField(FIRST_BLOCK, T.LongType(), False),
        ]
    )


def _master_index() -> StructType:
    return T.StructType(
        [
            T.StructField("master_id", T.StringType(), False),
            T.StructField(FIRST_BLOCK, T.LongType(), False),
            T.StructField("fold_step", T.LongType(), False),
        ]
    )


def _dead_letters() -> StructType:
    return T.StructType(
        [
            T.StructField("message_id", T.StringType(), False),
            T.StructField("master_id", T.StringType(), True),
            T.StructField("position", T.IntegerType(), True),
            T.StructField("reason", T.StringType(), False),
            T.StructField("detail", T.StringType(), True),
            T.StructField("body", T.BinaryType(), False),
            T.StructField("batch_key", T.StringType(), False),
            T.StructField("batch_seq", T.LongType(), False),
            T.StructField("msg_seq", T.IntegerType(), False),
            T.StructField("delivery_count", T.IntegerType(), False),
            T.StructField("fold_step", T.LongType(), False),
            T.StructField("dead_lettered_at", T.TimestampType(), False),
        ]
    )


def _message_outcomes() -> StructType:
    return T.StructType(
        [
            T.StructField("message_id", T.StringType(), False),
            T.StructField("batch_seq", T.LongType(), False),
            T.StructField("msg_seq", T.IntegerType(), False),
            T.StructField("position", T.IntegerType(), True),
            T.StructField("master_id", T.StringType(), True),
            T.StructField("outcome", T.StringType(), False),
            T.StructField("version", T.IntegerType(), True),
            T.StructField("reason", T.StringType(), True),
            T.StructField("detail", T.StringType(), True),
            T.StructField("warning", T.StringType(), True),
            T.StructField("fold_step", T.LongType(), False),
        ]
    )


def _fold_steps() -> StructType:
    return T.StructType(
        [
            T.StructField("fold_step", T.LongType(), False),
            T.StructField("first_batch_seq", T.LongType(), False),
            T.StructField("last_batch_seq", T.LongType(), False),
            T.StructField("items_digest", T.StringType(), False),
            T.StructField("master_documents_version", T.LongType(), False),
            # JSON {table: Delta version} of every table the step wrote, after its writes: what
            # recovery restores to when a later step was interrupted.
            T.StructField("table_versions", T.StringType(), False),
            T.StructField("messages", T.LongType(), False),
            T.StructField("applied", T.LongType(), False),
            T.StructField("duplicates", T.LongType(), False),
            T.StructField("filtered", T.LongType(), False),
            T.StructField("dead_lettered", T.LongType(), False),
            T.StructField("masters_changed", T.LongType(), False),
            # The home blocks of the masters the step wrote (FIRST_BLOCK): the partitions of
            # master_documents the model reads for them. Null: unknown, read every partition.
            T.StructField("master_blocks", T.ArrayType(T.LongType(), False), True),
            T.StructField("run_id", T.StringType(), True),
            T.StructField("committed_at", T.TimestampType(), False),
        ]
    )


def _fold_failures() -> StructType:
    # One row per master a failed fold attempt was folding (lake/spark/fold/quarantine.py), from a
    # structured fact: the master's failure row, or a worker's in-flight marker.
    return T.StructType(
        [
            T.StructField("master_id", T.StringType(), False),
            T.StructField("fold_step", T.LongType(), False),
            T.StructField("error", T.StringType(), False),
            T.StructField("failed_at", T.TimestampType(), False),
            T.StructField("run_id", T.StringType(), True),
            T.StructField("released", T.BooleanType(), False),
            # error (the fold raised), crash (its worker died), timeout (an item overran the
            # per-item budget: message_id/position name it).
            T.StructField("kind", T.StringType(), True),
            T.StructField("message_id", T.StringType(), True),
            T.StructField("position", T.IntegerType(), True),
        ]
    )


def _classify_failures() -> StructType:
    # One row per message a failed message_items attempt was classifying when its worker died
    # or overran the per-item budget (lake/spark/items.py). Counted per run: a later run (a replay,
    # a backfill after a fix) classifies the message afresh.
    return T.StructType(
        [
            T.StructField("batch_key", T.StringType(), False),
            T.StructField("message_id", T.StringType(), False),
            T.StructField("kind", T.StringType(), False),  # crash | timeout
            T.StructField("error", T.StringType(), False),
            T.StructField("failed_at", T.TimestampType(), False),
            T.StructField("run_id", T.StringType(), True),
        ]
    )


_SPARK_KINDS: dict[ModelKind, Callable[[], T.DataType]] = {
    "text": T.StringType,
    "int": T.IntegerType,
    "long": T.LongType,
    "decimal": lambda: T.DecimalType(38, PRICE_PLACES),
    "bool": T.BooleanType,
}


def _model(name: str) -> Callable[[], StructType]:
    """A model table (sis_platform/domain/model.py, one definition with the serving store's),
    with the fold step that wrote each row and its master's home block (its partition)."""

    def schema() -> StructType:
        columns = [
            T.StructField(c.name, _SPARK_KINDS[c.kind](), c.nullable) for c in MODEL_COLUMNS[name]
        ]
        return T.StructType(
            [
                *columns,
                T.StructField("fold_step", T.LongType(), False),
                T.StructField(FIRST_BLOCK, T.LongType(), False),
            ]
        )

    return schema


def _model_failures() -> StructType:
    # One row per master whose model rows a refresh could not build (lake/spark/model.py): the
    # interpreter raised, or a value does not fit its column. The master has no rows in
    # events, markets and selections as of that refresh (model_step).
    return T.StructType(
        [
            T.StructField("master_id", T.StringType(), False),
            T.StructField("version", T.IntegerType(), False),
            T.StructField("fold_step", T.LongType(), False),
            T.StructField("model_step", T.LongType(), False),
            T.StructField("error", T.StringType(), False),
            T.StructField("failed_at", T.TimestampType(), False),
        ]
    )


def _model_steps() -> StructType:
    return T.StructType(
        [
            T.StructField("fold_step", T.LongType(), False),
            T.StructField("masters", T.LongType(), False),
            T.StructField("committed_at", T.TimestampType(), False),
        ]
    )


_SCHEMAS = {
    "raw_messages": _raw_messages,
    "message_items": _message_items,
    "batch_log": _batch_log,
    "master_versions": _master_versions,
    "master_documents": _master_documents,
    "master_index": _master_index,
    "dead_letters": _dead_letters,
    "message_outcomes": _message_outcomes,
    "fold_steps": _fold_steps,
    "fold_failures": _fold_failures,
    "classify_failures": _classify_failures,
    "events": _model("events"),
    "markets": _model("markets"),
    "selections": _model("selections"),
    "model_failures": _model_failures,
    "model_steps": _model_steps,
}
