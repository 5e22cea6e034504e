"""The interpreted model's columns are one definition (sis_platform/domain/model.py): the
interpreter's rows, the lake's tables and the serving store's tables agree with it, column for
column, in name, order, kind and nullability."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from sis_platform.domain import interpret
from sis_platform.domain.model import MASTER_STATE_COLUMNS, MODEL_COLUMNS
from sis_platform.lake import tables
from sis_platform.serving import schema

ROWS = {
    "events": interpret.EventRow,
    "markets": interpret.MarketRow,
    "selections": interpret.SelectionRow,
}
SERVING = {"events": schema.EVENTS, "markets": schema.MARKETS, "selections": schema.SELECTIONS}
PYTHON_KINDS = {"text": "str", "int": "int", "long": "int", "decimal": "Decimal", "bool": "bool"}


@pytest.mark.parametrize("table", sorted(MODEL_COLUMNS))
def test_the_interpreter_fills_every_column_but_the_master_s_own(table: str) -> None:
    fields = dataclasses.fields(ROWS[table])
    hints = typing.get_type_hints(ROWS[table], vars(interpret))
    expected = [c for c in MODEL_COLUMNS[table] if c.name not in MASTER_STATE_COLUMNS]
    assert [f.name for f in fields] == [c.name for c in expected]
    for column in expected:
        hint = hints[column.name]
        names = {getattr(a, "__name__", str(a)) for a in typing.get_args(hint)} or {hint.__name__}
        assert PYTHON_KINDS[column.kind] in names, (column, hint)
        assert ("NoneType" in names) == column.nullable, (column, hint)


@pytest.mark.parametrize("table", sorted(MODEL_COLUMNS))
def test_the_serving_store_s_table_is_the_model_s(table: str) -> None:
    columns = SERVING[table].columns
    assert [(c.name, c.nullable) for c in columns] == [
        (c.name, c.nullable) for c in MODEL_COLUMNS[table]
    ]


@pytest.mark.parametrize("table", sorted(MODEL_COLUMNS))
def test_the_lake_s_table_is_the_model_s_with_its_fold_step_and_home_block(table: str) -> None:
    fields = tables.Table(table).schema().fields
    assert [(f.name, f.nullable) for f in fields] == [
        *((c.name, c.nullable) for c in MODEL_COLUMNS[table]),
        ("fold_step", False),
        (tables.FIRST_BLOCK, False),
    ]
    spark_kinds = {
        "text": "string",
        "int": "int",
        "long": "bigint",
        "decimal": "decimal(38,6)",
        "bool": "boolean",
    }
    assert [f.dataType.simpleString() for f in fields[: len(MODEL_COLUMNS[table])]] == [
        spark_kinds[c.kind] for c in MODEL_COLUMNS[table]
    ]
