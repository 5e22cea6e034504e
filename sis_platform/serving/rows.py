"""A group's records as the serving tables' rows (tuples in each table's column order).

Values stay Python values (datetime, Decimal, bool); the backend converts the few a driver does
not take as they are (`Converters`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from sis_platform.domain.interpret import Interpretation
from sis_platform.domain.model import EVENT_COLUMNS, MARKET_COLUMNS, SELECTION_COLUMNS, ModelColumn
from sis_platform.serving.records import (
    ChangeRow,
    DeadLetterRow,
    GroupCommit,
    MasterRow,
    OutcomeRow,
)

# selections.price_decimal's scale, as in the Delta model (DECIMAL(38, 6)).

Row = tuple[Any, ...]


@dataclass(frozen=True)
class Converters:
    """How a backend binds a timestamp and a decimal."""

    timestamp: Callable[[datetime | None], Any]
    decimal: Callable[[Decimal | None], Any]


@dataclass(frozen=True)
class ModelRows:
    events: list[Row]
    markets: list[Row]
    selections: list[Row]


def master_rows(masters: list[MasterRow], now: Any) -> list[Row]:
    """masters: master_id, version, document, message_id, updated_at, stale, filtered."""
    return [
        (m.master_id, m.version, m.document, m.message_id, now, m.stale, m.filtered)
        for m in masters
    ]


def model_rows(group: GroupCommit, convert: Converters) -> ModelRows:
    """The events, markets and selections rows of the masters the group re-interpreted; the
    event row takes its version and stale flag from the master's row in the group."""
    by_id = {m.master_id: m for m in group.masters}
    rows = ModelRows([], [], [])
    for master_id, model in group.model.items():
        if model is None:
            continue
        master = by_id.get(master_id)
        if master is None:
            raise ValueError(f"group commit: model rows for {master_id!r} without its master row")
        _add_model(rows, model, master, convert)
    return rows


def _add_model(
    rows: ModelRows, model: Interpretation, master: MasterRow, convert: Converters
) -> None:
    event = {**vars(model.event), "version": master.version, "stale": master.stale}
    rows.events.append(_model_row(EVENT_COLUMNS, event, convert))
    rows.markets.extend(_model_row(MARKET_COLUMNS, vars(m), convert) for m in model.markets)
    rows.selections.extend(
        _model_row(SELECTION_COLUMNS, vars(s), convert) for s in model.selections
    )


def _model_row(
    columns: tuple[ModelColumn, ...], values: dict[str, Any], convert: Converters
) -> Row:
    """One row of a model table in its columns' order (domain/model.py, as schema.py creates
    the table), a decimal converted for the backend."""
    return tuple(
        convert.decimal(values[c.name]) if c.kind == "decimal" else values[c.name] for c in columns
    )


def change_rows(changes: list[ChangeRow], now: Any, convert: Converters) -> list[Row]:
    """changes: master_id, version, message_id, position, operation, put_time, committed_at,
    batch_seq, msg_seq, document_sha256."""
    return [
        (
            c.master_id,
            c.version,
            c.message_id,
            c.position,
            c.operation,
            convert.timestamp(c.put_time),
            now,
            c.batch_seq,
            c.msg_seq,
            c.document_sha256,
        )
        for c in changes
    ]


def dead_letter_rows(letters: list[DeadLetterRow], now: Any) -> list[Row]:
    """dead_letters: message_id, master_id, position, reason, detail, batch_seq, msg_seq, body,
    recorded_at."""
    return [
        (d.message_id, d.master_id, d.position, d.reason, d.detail, d.batch_seq, d.msg_seq)
        + (d.body, now)
        for d in letters
    ]


def outcome_rows(outcomes: list[OutcomeRow]) -> list[Row]:
    """message_outcomes: batch_seq, msg_seq, position, message_id, master_id, outcome, reason."""
    return [
        (o.batch_seq, o.msg_seq, o.position, o.message_id, o.master_id, o.outcome, o.reason)
        for o in outcomes
    ]
