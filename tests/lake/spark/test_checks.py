"""The lake's checks (sis_platform/lake/spark/checks.py), each on tiny tables written for it:
passing on a healthy shape and failing, with the offender named, on a seeded fault. That they
appear and pass on a real run is in tests/assets/test_dead_letter_view.py (one pipeline run)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pyspark.sql import types as T

from sis_platform.lake.delta import Lake
from sis_platform.lake.spark import checks
from sis_platform.lake.spark.checks import StepScope
from sis_platform.lake.tables import (
    DEAD_LETTERS,
    EVENTS,
    MARKETS,
    MASTER_DOCUMENTS,
    MASTER_VERSIONS,
    MESSAGE_OUTCOMES,
    RAW_MESSAGES,
    SELECTIONS,
    Table,
)
from sis_platform.log.landing import batch_key

pytestmark = [pytest.mark.spark, pytest.mark.cost(50)]

T0 = datetime(2026, 11, 21, 14, 30, tzinfo=UTC)
_DEFAULTS: dict[type, Any] = {
    T.StringType: "",
    T.LongType: 0,
    T.IntegerType: 0,
    T.BinaryType: b"",
    T.TimestampType: T0,
    T.BooleanType: False,
}


def _write(spark, lake: Lake, table: Table, *rows: dict[str, Any]) -> None:
    """`rows` appended to `table`, every column not given at its type's zero value."""
    fields = table.schema().fields
    full = [
        tuple(row[f.name] if f.name in row else _DEFAULTS.get(type(f.dataType)) for f in fields)
        for row in rows
    ]
    lake.ensure(table)
    lake.append(table, spark.createDataFrame(full, table.schema()))


@pytest.fixture
def lake(spark, tmp_path) -> Lake:
    return Lake(spark, str(tmp_path / "lake"))


def test_one_row_per_master(spark, lake):
    _write(spark, lake, MASTER_DOCUMENTS, {"master_id": "M1"}, {"master_id": "M2"})
    assert checks.one_row_per_master(lake).passed
    _write(spark, lake, MASTER_DOCUMENTS, {"master_id": "M1"})
    finding = checks.one_row_per_master(lake)
    assert not finding.passed
    assert finding.metadata == {"masters": 2, "duplicated_masters": 1}
    assert finding.examples == ("M1",)


def _version(master: str, version: int, batch: int, msg: int, step: int) -> dict[str, Any]:
    return {
        "master_id": master,
        "version": version,
        "batch_seq": batch,
        "msg_seq": msg,
        "position": 0,
        "fold_step": step,
    }


def test_versions_gap_free(spark, lake):
    step2 = StepScope(2, 2, 2)
    _write(
        spark,
        lake,
        MASTER_VERSIONS,
        _version("M1", 1, 1, 0, 1),
        _version("M1", 2, 2, 0, 2),
        _version("M2", 1, 1, 1, 1),  # not touched by step 2: not read
        _version("M3", 5, 9, 0, 3),  # an uncommitted step's row: not counted
    )
    finding = checks.versions_gap_free(lake, step2)
    assert finding.passed and finding.metadata["masters_checked"] == 1

    _write(
        spark,
        lake,
        MASTER_VERSIONS,
        _version("M1", 4, 2, 1, 2),  # version 3 missing
        _version("M4", 2, 2, 2, 2),  # out of feed order with the next
        _version("M4", 1, 2, 3, 2),
    )
    finding = checks.versions_gap_free(lake, step2)
    assert not finding.passed
    assert finding.metadata == {"masters_checked": 2, "masters_with_gaps": 2}
    assert sorted(finding.examples) == ["M1", "M4"]


def _outcome(message: str, master: str | None, outcome: str, step: int, **more: Any):
    return {
        "message_id": message,
        "master_id": master,
        "outcome": outcome,
        "fold_step": step,
    } | more


def test_applied_at_most_once(spark, lake):
    _write(
        spark,
        lake,
        MESSAGE_OUTCOMES,
        _outcome("A", "M1", "applied", 1),
        _outcome("A", "M1", "duplicate", 2),  # a redelivery: not applied again
        _outcome("B", "M1", "applied", 2),
    )
    finding = checks.applied_at_most_once(lake, StepScope(2, 2, 2))
    assert finding.passed and finding.metadata == {"applied_items_checked": 1, "applied_twice": 0}

    _write(spark, lake, MESSAGE_OUTCOMES, _outcome("A", "M1", "applied", 3))
    finding = checks.applied_at_most_once(lake, StepScope(3, 3, 3))
    assert not finding.passed
    assert finding.metadata == {"applied_items_checked": 1, "applied_twice": 1}
    assert finding.examples == ("A -> M1",)


def test_one_end_state_per_message(spark, lake):
    def logged(msg: int) -> dict[str, Any]:
        return {"batch_key": batch_key(1), "batch_seq": 1, "msg_seq": msg, "message_id": f"m{msg}"}

    def ended(msg: int, position: int | None, step: int = 1) -> dict[str, Any]:
        return _outcome(
            f"m{msg}", None, "applied", step, batch_seq=1, msg_seq=msg, position=position
        )

    _write(spark, lake, RAW_MESSAGES, *[logged(m) for m in range(5)])
    _write(spark, lake, MESSAGE_OUTCOMES, ended(0, None), ended(1, 0), ended(1, 1))
    _write(spark, lake, MESSAGE_OUTCOMES, ended(2, None), ended(2, 0))  # whole and per item
    _write(spark, lake, MESSAGE_OUTCOMES, ended(3, 0), ended(3, 0))  # an item twice
    _write(spark, lake, MESSAGE_OUTCOMES, ended(4, None, step=2))  # only an uncommitted step's
    finding = checks.one_end_state_per_message(lake, StepScope(1, 1, 1))
    assert not finding.passed
    assert finding.metadata == {"messages_checked": 5, "messages_without_one_end_state": 3}
    assert sorted(finding.examples) == [
        "m2 (batch 1 message 2): whole and per item",
        "m3 (batch 1 message 3): an end state twice",
        "m4 (batch 1 message 4): no end state",
    ]
    assert (
        checks.one_end_state_per_message(lake, StepScope(2, 1, 1)).metadata[
            "messages_without_one_end_state"
        ]
        == 2
    )


def test_model_references_hold(spark, lake):
    _write(spark, lake, EVENTS, {"master_id": "M1"})
    _write(spark, lake, MARKETS, {"master_id": "M1", "market_id": "K1"})
    _write(spark, lake, SELECTIONS, {"master_id": "M1", "market_id": "K1", "selection_id": "S1"})
    assert checks.model_references_hold(lake).passed

    _write(spark, lake, MARKETS, {"master_id": "M2", "market_id": "K2"})
    _write(spark, lake, SELECTIONS, {"master_id": "M1", "market_id": "K9", "selection_id": "S2"})
    finding = checks.model_references_hold(lake)
    assert not finding.passed
    assert finding.metadata == {"orphan_markets": 1, "orphan_selections": 1}
    assert sorted(finding.examples) == ["market/M2/K2", "selection/M1/K9/S2"]


def test_dead_letter_rate(spark, lake):
    def letter(message: str, batch: int, reason: str, step: int = 5, master: str | None = None):
        return {
            "message_id": message,
            "master_id": master,
            "reason": reason,
            "batch_seq": batch,
            "batch_key": batch_key(batch),
            "fold_step": step,
        }

    sizes = {1: 10, 2: 4, 9: 1}.get  # messages per batch, as the landing zone tells them
    _write(
        spark,
        lake,
        DEAD_LETTERS,
        letter("m1", 1, "schema-invalid"),
        letter("m2", 1, "orphan-update", master="M1"),  # two items of one message: counted once
        letter("m2", 1, "orphan-update", master="M2"),
        letter("m3", 2, "orphan-update", master="M3"),
        letter("m0", 1, "schema-invalid", step=4),  # an earlier step's: not this step's rate
    )
    finding = checks.dead_letter_rate(lake, 5, range(1, 3), 0.25, sizes)
    assert finding.passed and finding.examples == ()
    assert finding.metadata == {
        "batches_checked": 2,
        "messages": 14,
        "dead_lettered_messages": 3,
        "dead_letter_rate": round(3 / 14, 6),
        "worst_batch_rate": 0.25,  # batch 2: 1 of 4; batch 1: 2 of 10
        "batches_over_threshold": 0,
        "threshold": 0.25,
        "dead_letters_orphan_update": 2,
        "dead_letters_schema_invalid": 1,
    }

    finding = checks.dead_letter_rate(lake, 5, range(1, 3), 0.2, sizes)
    assert not finding.passed
    assert finding.metadata["batches_over_threshold"] == 1  # batch 1's 20% is not over
    assert finding.examples == ("batch 2: 1 of 4 messages (25.0%): orphan-update 1",)

    # A replay's step dead-letters messages of batches before its own: they are judged too.
    _write(spark, lake, DEAD_LETTERS, letter("m9", 9, "too-complex", step=6))
    finding = checks.dead_letter_rate(lake, 6, range(0), 0.5, sizes)
    assert not finding.passed
    assert (finding.metadata["batches_checked"], finding.metadata["worst_batch_rate"]) == (1, 1.0)
    assert finding.examples == ("batch 9: 1 of 1 messages (100.0%): too-complex 1",)
