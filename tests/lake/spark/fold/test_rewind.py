"""Rewind (sis_platform/lake/spark/fold/rewind.py): the point each rewound master goes back to, the
items refolded from there, the states it starts from, the tombstone of a master that no longer
exists, and which rows are replaced."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from sis_platform.lake.spark.fold.rewind import Rewind, after_point, rewind_points
from sis_platform.lake.spark.fold.worker import FOLD_OUT_SCHEMA
from sis_platform.lake.tables import DEAD_LETTERS, MASTER_VERSIONS, MESSAGE_OUTCOMES
from tests.lake.spark.fold.lakes import new_lake

pytestmark = [pytest.mark.spark, pytest.mark.cost(60)]

VERSIONS = (
    "master_id string, version int, document string, batch_seq long, msg_seq int, position int"
)
TOUCHED = "master_id string, batch_seq long"
ITEMS = (
    "batch_key string, batch_seq long, msg_seq int, message_id string, status string, "
    "position int, master_id string"
)


def _points(spark):
    versions = spark.createDataFrame(
        [
            ("M1", 1, "<v1/>", 1, 0, 0),
            ("M1", 2, "<v2/>", 2, 3, 1),
            ("M1", 3, "<v3/>", 3, 0, 0),
            ("M2", 1, "<w1/>", 3, 1, 0),
        ],
        VERSIONS,
    )
    touched = spark.createDataFrame([("M1", 3), ("M1", 4), ("M2", 3)], TOUCHED)
    return rewind_points(versions, touched)


def test_each_master_goes_back_to_its_last_version_before_the_first_changed_batch(spark):
    points = {r["master_id"]: tuple(r)[1:] for r in _points(spark).collect()}
    assert points == {"M1": (2, "<v2/>", 2, 3, 1), "M2": (None, None, -1, -1, -1)}


def test_the_items_after_the_point_are_refolded_with_the_new_batches_and_changed_rows(spark):
    rewind = Rewind(_points(spark), changed=[3], changed_keys=["0000000003"])
    log_items = spark.createDataFrame(
        [
            ("0000000002", 2, 3, "a", "item", 1, "M1"),  # the point itself: not refolded
            ("0000000002", 2, 3, "a", "item", 2, "M1"),
            ("0000000003", 3, 0, "b", "item", 0, "M1"),
            ("0000000003", 3, 1, "c", "item", 0, "M2"),
            ("0000000003", 3, 2, "d", "invalid", None, None),
            ("0000000004", 4, 0, "e", "item", 0, "M3"),
            ("0000000004", 4, 1, "f", "item", 0, "M1"),
        ],
        ITEMS,
    )
    new_items = log_items.where(F.col("batch_seq") == 4)
    rows = rewind.step_items(log_items, new_items).select("message_id", "position")
    assert sorted(tuple(r) for r in rows.collect()) == [
        ("a", 2),
        ("b", 0),
        ("c", 0),
        ("d", None),
        ("e", 0),
        ("f", 0),
    ]


def test_after_point_orders_by_batch_message_then_position(spark):
    rows = spark.createDataFrame(
        [(2, 3, 1), (2, 3, 2), (2, 4, 0), (3, 0, 0), (2, 2, 9), (2, 3, None)],
        "batch_seq long, msg_seq int, position int",
    ).alias("t")
    point = spark.createDataFrame([(2, 3, 1)], "p_batch long, p_msg int, p_pos int").alias("p")
    after = rows.crossJoin(point).where(after_point("t", "p")).select("t.*").collect()
    assert sorted(tuple(r) for r in after) == [(2, 3, 2), (2, 4, 0), (3, 0, 0)]


def test_states_start_at_the_point_and_a_master_gone_leaves_a_tombstone(spark):
    rewind = Rewind(_points(spark), changed=[3], changed_keys=["0000000003"])
    documents = spark.createDataFrame(
        [("M1", 3, "<v3/>", False, False, 3), ("M2", 1, "<w1/>", True, False, 3)],
        "master_id string, version int, document string, stale boolean, filtered boolean, "
        "fold_step long",
    )
    starting = {
        r["master_id"]: (r["version"], r["document"])
        for r in rewind.starting_states(documents).collect()
    }
    assert starting == {"M1": (2, "<v2/>")}  # M2 had no version before batch 3: no state
    step = F.lit(5).cast("long")
    states = spark.createDataFrame([], FOLD_OUT_SCHEMA).withColumn("fold_step", step)
    states = states.unionByName(
        spark.createDataFrame(
            [
                (
                    "state",
                    "M1",
                    4,
                    None,
                    None,
                    None,
                    "<v4/>",
                    None,
                    None,
                    None,
                    None,
                    False,
                    False,
                    None,
                    None,
                    None,
                )
            ],
            FOLD_OUT_SCHEMA,
        ).withColumn("fold_step", step)
    )
    out = {r["master_id"]: r for r in rewind.with_tombstones(states, documents, step).collect()}
    assert out["M1"]["version"] == 4
    tomb = out["M2"]
    assert (tomb["version"], tomb["document"], tomb["stale"], tomb["fold_step"]) == (
        0,
        None,
        False,
        5,
    )


def test_the_rows_replaced_are_those_after_each_point(spark, tmp_path):
    lake = new_lake(spark, tmp_path)
    lake.ensure(MASTER_VERSIONS, MESSAGE_OUTCOMES, DEAD_LETTERS)
    versions = [
        ("M1", 1, "m1", 0, "new", "<v1/>", 1, 0, 1),
        ("M1", 2, "m2", 1, "update", "<v2/>", 2, 3, 2),
        ("M1", 3, "m3", 0, "update", "<v3/>", 3, 0, 3),
    ]
    lake.append(MASTER_VERSIONS, spark.createDataFrame(versions, MASTER_VERSIONS.schema()))
    outcomes = [
        ("m3", 3, 0, 0, "M1", "applied", 3, None, None, None, 3),
        ("x", 3, 2, None, None, "dead-lettered", None, "invalid-xml", "bad", None, 3),
        ("y", 2, 0, None, None, "duplicate", None, None, None, None, 2),
    ]
    lake.append(MESSAGE_OUTCOMES, spark.createDataFrame(outcomes, MESSAGE_OUTCOMES.schema()))
    Rewind(_points(spark), changed=[3], changed_keys=["0000000003"]).delete_replaced_rows(lake)
    assert sorted(r["version"] for r in lake.read(MASTER_VERSIONS).collect()) == [1, 2]
    assert [r["message_id"] for r in lake.read(MESSAGE_OUTCOMES).collect()] == ["y"]
