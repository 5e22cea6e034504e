"""What a fold step writes (sis_platform/lake/spark/fold/outputs.py): one outcome row per item and
per duplicate or invalid message, quarantined items dead-lettered, the tally, dead letters with
their bodies, and the writes (no dead_letters commit when there is none)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pyspark.sql import functions as F

from sis_platform.domain.reasons import Outcome, Reason
from sis_platform.lake.spark.fold.outputs import (
    MessageFacts,
    StepOutputs,
    dead_letter_rows,
    failed_masters,
    outcome_rows,
    state_rows,
    tally,
    version_rows,
    write_outputs,
)
from sis_platform.lake.spark.fold.quarantine import FAILED
from sis_platform.lake.spark.fold.worker import (
    FAILURE,
    FOLD_OUT_SCHEMA,
    RESULT,
    STATE,
    VERSION,
    FoldRow,
)
from sis_platform.lake.tables import (
    DEAD_LETTERS,
    FIRST_BLOCK,
    MASTER_DOCUMENTS,
    MASTER_INDEX,
    MASTER_VERSIONS,
    MESSAGE_OUTCOMES,
)
from tests.lake.spark.fold.lakes import new_lake

pytestmark = [pytest.mark.spark, pytest.mark.cost(40)]

NOW = datetime(2026, 11, 21, 12, tzinfo=UTC)


def _step():
    return F.lit(7).cast("long")


MSG = "message_id string, batch_seq long, msg_seq int"
INVALID = f"{MSG}, reason string, detail string"
HELD = f"{MSG}, position int, master_id string, detail string"


def _folded(spark, *rows: FoldRow):
    return spark.createDataFrame([tuple(r) for r in rows], FOLD_OUT_SCHEMA)


def _facts(spark, duplicates=(), invalid=(), held=()) -> MessageFacts:
    return MessageFacts(
        spark.createDataFrame(list(duplicates), MSG),
        spark.createDataFrame(list(invalid), INVALID),
        spark.createDataFrame(list(held), HELD),
    )


APPLIED = FoldRow(RESULT, "M1", 1, "a", 0, outcome=str(Outcome.APPLIED), batch_seq=1, msg_seq=0)
VERSION_1 = FoldRow(VERSION, "M1", 1, "a", 0, "new", "<e/>", batch_seq=1, msg_seq=0)
STATE_1 = FoldRow(STATE, "M1", 1, document="<e/>", stale=False, filtered=False)


def test_every_message_of_the_step_has_an_outcome_and_the_tally_counts_them(spark):
    facts = _facts(
        spark,
        duplicates=[("a", 2, 0)],
        invalid=[("b", 2, 1, "invalid-xml", "bad")],
        held=[("c", 2, 2, 0, "M9", "fold failed 3 times: x")],
    )
    outcomes = outcome_rows(_folded(spark, VERSION_1, APPLIED, STATE_1), facts, _step())
    assert outcomes.columns == MESSAGE_OUTCOMES.schema().fieldNames()
    got = sorted(
        (r["message_id"], r["outcome"], r["reason"], r["fold_step"]) for r in outcomes.collect()
    )
    assert got == [
        ("a", str(Outcome.APPLIED), None, 7),
        ("a", str(Outcome.DUPLICATE), None, 7),
        ("b", str(Outcome.DEAD_LETTERED), "invalid-xml", 7),
        ("c", str(Outcome.DEAD_LETTERED), str(Reason.QUARANTINED), 7),
    ]
    figures = tally(outcomes)
    assert (figures.messages, figures.count(Outcome.DEAD_LETTERED), figures.failed) == (4, 2, 0)


def test_a_failure_row_is_a_failed_outcome_naming_its_master(spark):
    failure = FoldRow(FAILURE, "M2", reason="ValueError", detail="ValueError: x")
    outcomes = outcome_rows(_folded(spark, failure), _facts(spark), _step())
    assert tally(outcomes).failed == 1
    assert [tuple(r) for r in failed_masters(outcomes).collect()] == [("M2", "ValueError: x")]
    assert outcomes.where(F.col("outcome") == FAILED).count() == 1


def test_dead_letters_carry_their_message_body(spark):
    facts = _facts(spark, invalid=[("b", 2, 1, "invalid-xml", "bad")])
    outcomes = outcome_rows(_folded(spark, APPLIED), facts, _step())
    raw = spark.createDataFrame(
        [(1, 0, "0000000001", b"<a/>", 1), (2, 1, "0000000002", b"<b", 3)],
        "batch_seq long, msg_seq int, batch_key string, body binary, delivery_count int",
    )
    [letter] = dead_letter_rows(outcomes, raw, NOW).collect()
    assert (letter["message_id"], bytes(letter["body"]), letter["delivery_count"]) == (
        "b",
        b"<b",
        3,
    )


def test_write_outputs_appends_and_merges_and_skips_an_empty_dead_letters(spark, tmp_path):
    lake = new_lake(spark, tmp_path)
    lake.ensure(MASTER_VERSIONS, MASTER_DOCUMENTS, MASTER_INDEX, DEAD_LETTERS, MESSAGE_OUTCOMES)
    folded = _folded(spark, VERSION_1, APPLIED, STATE_1)
    outcomes = outcome_rows(folded, _facts(spark), _step())
    raw = spark.createDataFrame(
        [], "batch_seq long, msg_seq int, batch_key string, body binary, delivery_count int"
    )
    states = state_rows(folded, _step()).withColumn(FIRST_BLOCK, F.lit(3).cast("long"))
    out = StepOutputs(
        versions=version_rows(folded, _step()),
        dead_letters=dead_letter_rows(outcomes, raw, NOW),
        outcomes=outcomes,
        states=states,
        index=states.select("master_id", FIRST_BLOCK, "fold_step"),
        blocks=(3,),
    )
    write_outputs(lake, out, dead_lettered=0)
    assert lake.version(DEAD_LETTERS) == 0
    [document] = lake.read(MASTER_DOCUMENTS).collect()
    assert (document["master_id"], document["version"], document["fold_step"]) == ("M1", 1, 7)
    assert document[FIRST_BLOCK] == 3
    assert [tuple(r) for r in lake.read(MASTER_INDEX).collect()] == [("M1", 3, 7)]
    assert lake.read(MASTER_VERSIONS).count() == 1 and lake.read(MESSAGE_OUTCOMES).count() == 1
