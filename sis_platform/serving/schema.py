"""The serving store's tables: one definition, written out for SQLite or PostgreSQL.

Columns are declared once with a portable kind; each dialect maps the kinds to its types. The
model tables (events, markets, selections) have the Delta model's columns
(sis_platform/lake/tables.py) without `fold_step`, which is the lake's bookkeeping. Timestamps
are UTC: TIMESTAMPTZ in PostgreSQL, ISO 8601 text in SQLite. `price_decimal` is exact:
NUMERIC(38, 6) in PostgreSQL, the decimal's text in SQLite (whose REAL keeps ~15 digits).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sis_platform.domain.model import MODEL_COLUMNS, ModelKind

# Bumped when a table changes; a store of another version is refused rather than misread,
# except an older one `UPGRADES` brings up to date (tables are only ever added).
SCHEMA_VERSION = 5
# Version 2 added `ahead`, version 3 `halt`, version 4 `retention`, version 5 `lake_progress`.
UPGRADES = (1, 2, 3, 4)

Kind = Literal["text", "bytes", "int", "bool", "timestamp", "decimal"]

TYPES: dict[str, dict[Kind, str]] = {
    "sqlite": {
        "text": "TEXT",
        "bytes": "BLOB",
        "int": "INTEGER",
        "bool": "INTEGER",
        "timestamp": "TEXT",
        "decimal": "TEXT",
    },
    "postgresql": {
        "text": "TEXT",
        "bytes": "BYTEA",
        "int": "BIGINT",
        "bool": "BOOLEAN",
        "timestamp": "TIMESTAMPTZ",
        "decimal": "NUMERIC(38, 6)",
    },
}
# An ordered, never reused sequence number as the primary key.
SEQ_COLUMN = {
    "sqlite": "seq INTEGER PRIMARY KEY AUTOINCREMENT",
    "postgresql": "seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
}


@dataclass(frozen=True)
class Column:
    name: str
    kind: Kind
    nullable: bool = True


@dataclass(frozen=True)
class TableDef:
    name: str
    columns: tuple[Column, ...]
    primary_key: tuple[str, ...] = ()
    seq: bool = False  # a leading `seq` column, the table's order
    indexes: tuple[tuple[str, ...], ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        """The columns a row is inserted with (`seq` is assigned by the database)."""
        return tuple(c.name for c in self.columns)

    def create(self, dialect: str) -> list[str]:
        """CREATE statements for this table and its indexes, if missing."""
        types = TYPES[dialect]
        lines = [SEQ_COLUMN[dialect]] if self.seq else []
        lines += [
            f"{c.name} {types[c.kind]}{'' if c.nullable else ' NOT NULL'}" for c in self.columns
        ]
        if self.primary_key:
            lines.append(f"PRIMARY KEY ({', '.join(self.primary_key)})")
        statements = [f"CREATE TABLE IF NOT EXISTS {self.name} (\n  " + ",\n  ".join(lines) + ")"]
        statements += [
            f"CREATE INDEX IF NOT EXISTS {self.name}_{'_'.join(cols)} "
            f"ON {self.name} ({', '.join(cols)})"
            for cols in self.indexes
        ]
        return statements

    def insert(self) -> str:
        """An INSERT of every column but `seq`, with `?` placeholders."""
        return (
            f"INSERT INTO {self.name} ({', '.join(self.names)}) "
            f"VALUES ({', '.join('?' for _ in self.columns)})"
        )


_MODEL_KINDS: dict[ModelKind, Kind] = {
    "text": "text",
    "int": "int",
    "long": "int",
    "decimal": "decimal",
    "bool": "bool",
}


def _model(name: str) -> tuple[Column, ...]:
    return tuple(Column(c.name, _MODEL_KINDS[c.kind], c.nullable) for c in MODEL_COLUMNS[name])


def _c(name: str, kind: Kind, nullable: bool = True) -> Column:
    return Column(name, kind, nullable)


MASTERS = TableDef(
    "masters",
    (
        _c("master_id", "text", False),
        _c("version", "int", False),
        _c("document", "bytes"),
        _c("message_id", "text"),
        _c("updated_at", "timestamp", False),
        _c("stale", "bool", False),
        _c("filtered", "bool", False),
    ),
    primary_key=("master_id",),
)
# The model's tables, column for column as the lake holds them (sis_platform/domain/model.py).
EVENTS = TableDef("events", _model("events"), primary_key=("master_id",))
# Market and selection ids are not declared unique within a master (the Delta model does not
# assume it either): a document repeating one must not stop the writer.
MARKETS = TableDef("markets", _model("markets"), indexes=(("master_id", "market_id"),))
SELECTIONS = TableDef(
    "selections", _model("selections"), indexes=(("master_id", "market_id", "selection_id"),)
)
DEAD_LETTERS = TableDef(
    "dead_letters",
    (
        _c("message_id", "text", False),
        _c("master_id", "text"),
        _c("position", "int"),
        _c("reason", "text", False),
        _c("detail", "text", False),
        _c("batch_seq", "int", False),
        _c("msg_seq", "int", False),
        _c("body", "bytes", False),
        _c("recorded_at", "timestamp", False),
    ),
    seq=True,
    indexes=(("message_id",), ("master_id",)),
)
MESSAGE_OUTCOMES = TableDef(
    "message_outcomes",
    (
        _c("batch_seq", "int", False),
        _c("msg_seq", "int", False),
        _c("position", "int", False),
        _c("message_id", "text", False),
        _c("master_id", "text"),
        _c("outcome", "text", False),
        _c("reason", "text"),
    ),
    indexes=(("message_id",), ("batch_seq", "msg_seq")),
)
CHANGES = TableDef(
    "changes",
    (
        _c("master_id", "text", False),
        _c("version", "int", False),
        _c("message_id", "text", False),
        _c("position", "int", False),
        _c("operation", "text", False),
        _c("put_time", "timestamp"),
        _c("committed_at", "timestamp", False),
        _c("batch_seq", "int", False),
        _c("msg_seq", "int", False),
        _c("document_sha256", "text", False),
    ),
    seq=True,
    indexes=(("master_id", "batch_seq"),),
)
# One row (id 1): the last log position applied, and the writer's progress.
POSITION = TableDef(
    "position",
    (
        _c("id", "int", False),
        _c("schema_version", "int", False),
        _c("batch_seq", "int", False),
        _c("msg_seq", "int", False),
        _c("messages", "int", False),
        _c("committed_at", "timestamp"),
        _c("heartbeat_at", "timestamp"),
    ),
    primary_key=("id",),
)

# The masters committed ahead of the position (SIS_PRIORITY, sis_platform/live/fold.py): each
# one's items up to (batch_seq, msg_seq) are applied although the position is before it. Empty
# but between the parts of one stretch's commit; the stretch's last part clears it.
AHEAD = TableDef(
    "ahead",
    (_c("master_id", "text", False), _c("batch_seq", "int", False), _c("msg_seq", "int", False)),
    primary_key=("master_id",),
)

# At most one row (id 1): why the writer stopped applying (and getting from the queue), until
# the cause is put right: e.g. the store is beyond the landing zone's last message, a landing
# rolled back under it (sis_platform/live/applier.py). Read by `ServingReader.status()`.
HALT = TableDef(
    "halt",
    (
        _c("id", "int", False),
        _c("reason", "text", False),
        _c("detail", "text", False),
        _c("raised_at", "timestamp", False),
    ),
    primary_key=("id",),
)

# One row (id 1): how far the history tables are pruned (ServingWriter.prune) and the gate no
# prune passes. `checked_batch`: the last batch at which live_matches_lake passed (written by
# that check; 0: none yet). The change log is complete after `changes_pruned_seq` (below it only
# each master's last change is kept), and `versions_at` answers for batches from
# `changes_pruned_batch`, `change_as_of` for instants from `changes_pruned_at`; the dead letters
# are complete after `dead_letters_pruned_seq`.
RETENTION = TableDef(
    "retention",
    (
        _c("id", "int", False),
        _c("checked_batch", "int", False),
        _c("changes_pruned_seq", "int", False),
        _c("changes_pruned_batch", "int", False),
        _c("changes_pruned_at", "timestamp"),
        _c("dead_letters_pruned_seq", "int", False),
    ),
    primary_key=("id",),
)

# At most one row (id 1): the lake's last committed fold step as the lake last recorded it
# (ServingWriter.record_lake_progress, from fold_steps: written by the fold asset after each
# run, live intake only), so sis-live exports the lake's progress without Spark or Delta.
# `dead_letters`: the dead letters every committed step wrote, summed (a counter: it restarts
# only when the lake is rebuilt). Absent until the lake first records.
LAKE_PROGRESS = TableDef(
    "lake_progress",
    (
        _c("id", "int", False),
        _c("fold_step", "int", False),
        _c("last_batch_seq", "int", False),
        _c("committed_at", "timestamp", False),
        _c("dead_letters", "int", False),
        _c("recorded_at", "timestamp", False),
    ),
    primary_key=("id",),
)

TABLES = (
    MASTERS,
    EVENTS,
    MARKETS,
    SELECTIONS,
    DEAD_LETTERS,
    MESSAGE_OUTCOMES,
    CHANGES,
    POSITION,
    AHEAD,
    HALT,
    RETENTION,
    LAKE_PROGRESS,
)
MODEL_TABLES = (EVENTS, MARKETS, SELECTIONS)


def create_statements(dialect: str) -> list[str]:
    """Every CREATE statement of the store, in order, each a no-op when already there."""
    return [statement for table in TABLES for statement in table.create(dialect)]
