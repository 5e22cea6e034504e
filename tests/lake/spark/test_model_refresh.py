"""refresh_model on real Spark and Delta: failures stay per master, and model tables of an older
schema are recreated and rebuilt. master_documents is written directly (a document the feed's
schema would refuse today can be in a lake folded before the schema bounded it), and the
fold's committed step is given."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest

from sis_platform.lake.delta import Lake, sql_in
from sis_platform.lake.spark import model
from sis_platform.lake.spark.fold import CommittedStep
from sis_platform.lake.tables import (
    EVENTS,
    MARKETS,
    MASTER_DOCUMENTS,
    MODEL_FAILURES,
    MODEL_STEPS,
    SELECTIONS,
)
from tests.domain.sportsdata_fixtures import ASCOT_1430, ASCOT_1500, ROMFORD_1912, event

pytestmark = [pytest.mark.spark, pytest.mark.cost(150)]

INT64_MAX = 2**63 - 1
BROKEN = "BROKEN-1"


def _market(num: int, den: int = 1) -> str:
    return (
        '<market id="WIN" type="win" status="open" places="3">'
        f'<selection id="1" number="1" name="One" status="runner"><price num="{num}" '
        f'den="{den}"/></selection></market>'
    )


def _fold(lake: Lake, monkeypatch: pytest.MonkeyPatch, step: int, *docs: tuple[str, str]) -> None:
    """`docs` (master id, document) as the masters fold step `step` changed, committed."""
    lake.ensure(MASTER_DOCUMENTS)
    lake.delete(MASTER_DOCUMENTS, sql_in("master_id", [m for m, _ in docs]))
    lake.append(
        MASTER_DOCUMENTS,
        lake.spark.createDataFrame(
            [
                MASTER_DOCUMENTS.row(
                    master_id=m,
                    version=step,
                    document=d,
                    stale=False,
                    filtered=False,
                    fold_step=step,
                    first_block=0,
                )
                for m, d in docs
            ],
            MASTER_DOCUMENTS.schema(),
        ),
    )
    version = lake.version(MASTER_DOCUMENTS)
    monkeypatch.setattr(
        model, "committed_step", lambda _lake: CommittedStep(step, step, version, {})
    )


def _by_master(lake: Lake, table) -> dict[str, list]:
    rows: dict[str, list] = {}
    for r in lake.read(table).collect():
        rows.setdefault(r["master_id"], []).append(r)
    return rows


def test_masters_that_cannot_be_interpreted_are_recorded_and_the_others_written(
    tmp_path, spark, monkeypatch
):
    lake = Lake(spark, str(tmp_path / "lake"))
    _fold(
        lake,
        monkeypatch,
        1,
        (ASCOT_1430, event(ASCOT_1430, markets=_market(2**31))),
        (ASCOT_1500, event(ASCOT_1500, markets=_market(INT64_MAX))),
        # Beyond 64 bits: the interpreter reads no number (the schema refuses it).
        (ROMFORD_1912, event(ROMFORD_1912, markets=_market(2**63))),
        (BROKEN, "<event"),  # the interpreter raises
    )
    first = model.refresh_model(lake)

    assert (first.fold_step, first.masters, first.events, first.selections) == (1, 4, 3, 3)
    assert (first.failed, first.failed_masters) == (1, (BROKEN,))
    selections = _by_master(lake, SELECTIONS)
    assert sorted(selections) == [ASCOT_1430, ASCOT_1500, ROMFORD_1912]
    assert [(r["price_num"], r["price_decimal"]) for r in selections[ASCOT_1430]] == [
        (2**31, Decimal(2**31 + 1))
    ]
    assert [(r["price_num"], r["price_decimal"]) for r in selections[ASCOT_1500]] == [
        (INT64_MAX, Decimal(2**63))
    ]
    assert [(r["price_num"], r["price_decimal"]) for r in selections[ROMFORD_1912]] == [
        (None, None)
    ]
    [failure] = lake.read(MODEL_FAILURES).collect()
    assert failure["master_id"] == BROKEN and failure["error"].startswith("XMLSyntaxError")
    assert (failure["model_step"], failure["fold_step"], failure["version"]) == (1, 1, 1)

    # The broken master folds again with a valid document: the next refresh builds it.
    _fold(lake, monkeypatch, 2, (BROKEN, event(BROKEN)))
    second = model.refresh_model(lake)
    assert (second.fold_step, second.masters, second.failed) == (2, 1, 0)
    assert sorted(_by_master(lake, EVENTS)) == [ASCOT_1430, ASCOT_1500, BROKEN, ROMFORD_1912]
    assert lake.read(MODEL_FAILURES).count() == 1  # the first refresh's, kept


def _older_schema(table):
    """The table's schema as a lake created with 32-bit numbers and a double price has it."""
    from pyspark.sql import types as T

    widened = {"places", "number", "price_num", "price_den"}
    return T.StructType(
        [
            T.StructField(
                f.name,
                T.IntegerType()
                if f.name in widened
                else T.DoubleType()
                if f.name == "price_decimal"
                else f.dataType,
                f.nullable,
            )
            for f in table.schema().fields
        ]
    )


def test_model_tables_of_an_older_schema_are_recreated_and_the_model_rebuilt(
    tmp_path, spark, monkeypatch
):
    lake = Lake(spark, str(tmp_path / "lake"))
    _fold(lake, monkeypatch, 1, (ASCOT_1430, event(ASCOT_1430, markets=_market(5, 2))))
    for table in (EVENTS, MARKETS, SELECTIONS):
        columns = ", ".join(
            f"`{f.name}` {f.dataType.simpleString()}" for f in _older_schema(table).fields
        )
        spark.sql(
            f"CREATE TABLE {lake.sql_table(table)} ({columns}) USING delta "
            "TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')"
        )
    spark.sql(  # a row of a master the rebuild does not know
        f"INSERT INTO {lake.sql_table(SELECTIONS)} (master_id, market_id, selection_id, "
        "price_num, price_den, price_decimal, fold_step) VALUES ('GONE', 'WIN', '1', 7, 1, 8.0, 1)"
    )
    lake.ensure(MODEL_STEPS)  # the model had reached the fold's step
    lake.append(
        MODEL_STEPS,
        spark.createDataFrame([(1, 1, datetime(2026, 11, 21, tzinfo=UTC))], MODEL_STEPS.schema()),
    )

    result = model.refresh_model(lake)

    assert result.upgraded == ("markets", "selections")  # events has no number column
    assert (result.fold_step, result.masters, result.selections) == (1, 1, 1)
    assert {f.name: f.dataType for f in lake.read(SELECTIONS).schema.fields} == {
        f.name: f.dataType for f in SELECTIONS.schema().fields
    }
    selections = _by_master(lake, SELECTIONS)
    assert sorted(selections) == [ASCOT_1430]
    assert [(r["price_num"], r["price_decimal"]) for r in selections[ASCOT_1430]] == [
        (5, Decimal("3.5"))
    ]
    properties = spark.sql(f"DESCRIBE DETAIL {lake.sql_table(SELECTIONS)}").first()["properties"]
    assert properties.get("delta.enableDeletionVectors") == "true"
    assert model.refresh_model(lake).upgraded == ()  # once


WHOLE_STAGE = "spark.sql.codegen.wholeStage"


def test_the_model_replaces_rows_with_whole_stage_code_generation_and_gives_it_back(
    tmp_path, spark, monkeypatch
):
    """A run's driver runs without whole-stage code generation, under which Delta reads a file
    that carries deletion vectors row by row; the model's writes, which scan each table's
    rows for the step's masters, run with it, and the session gets its setting back."""
    lake = Lake(spark, str(tmp_path / "lake"))
    seen: dict[str, str | None] = {}
    replace_where = lake.replace_where

    def noting(table, df, condition):  # type: ignore[no-untyped-def]
        seen[table.name] = spark.conf.get(WHOLE_STAGE, None)
        return replace_where(table, df, condition)

    monkeypatch.setattr(lake, "replace_where", noting)
    assert spark.conf.get(WHOLE_STAGE) == "false"  # the suite's session is a run's driver
    for step in (1, 2):  # the first refresh replaces whole tables, the second by master id
        _fold(lake, monkeypatch, step, (ASCOT_1430, event(ASCOT_1430, markets=_market(step))))
        model.refresh_model(lake)
        assert seen == {"events": "true", "markets": "true", "selections": "true"}
        assert spark.conf.get(WHOLE_STAGE) == "false"
        seen.clear()
