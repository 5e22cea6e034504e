"""Table.row: rows written by column name land in the schema's order, and a missing or unknown
column is an error rather than a shifted row."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from sis_platform.lake.tables import MODEL_STEPS

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
