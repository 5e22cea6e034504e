"""Table.row: rows written by column name land in the schema's order, and a missing or unknown
column is an error rather than a shifted row."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pyspark.sql.pandas.types import to_arrow_schema

from sis_platform.lake.tables import MODEL_STEPS, RAW_MESSAGES
from sis_platform.log.landing.rows import LANDING_SCHEMA

NOW = datetime(2026, 11, 21, 12, tzinfo=UTC)


def test_a_row_is_ordered_by_the_schema_whatever_the_keyword_order() -> None:
    row = MODEL_STEPS.row(committed_at=NOW, masters=3, fold_step=7)
    assert row == (7, 3, NOW)
    assert MODEL_STEPS.schema().fieldNames() == ["fold_step", "masters", "committed_at"]


def test_a_missing_column_is_named() -> None:
    with pytest.raises(ValueError, match="model_steps row: no value for masters"):
        MODEL_STEPS.row(fold_step=7, committed_at=NOW)


def test_an_unknown_column_is_named() -> None:
    with pytest.raises(ValueError, match="model_steps row: no column master"):
        MODEL_STEPS.row(fold_step=7, masters=3, committed_at=NOW, master="m1")


def test_raw_messages_has_the_landing_files_columns_and_types() -> None:
    """raw_messages reads the landing files with its own schema (assets/message_log.py): a
    column added to one and not the other would be read as nulls."""
    table = [(f.name, f.type) for f in to_arrow_schema(RAW_MESSAGES.schema(), timezone="UTC")]
    assert table == [(f.name, f.type) for f in LANDING_SCHEMA]
