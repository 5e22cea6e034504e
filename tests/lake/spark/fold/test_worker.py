"""The fold in the Python workers (sis_platform/lake/spark/fold/worker.py): Arrow rows in, FoldRows
out, the same as the domain's fold_master; a master whose fold raises is one failure row; an item
that overran its budget before is dead-lettered without being folded. Most cases call the worker
function directly (no Spark); one runs it through Spark's mapInArrow."""

from __future__ import annotations

from functools import partial

import pyarrow as pa
import pytest

from sis_platform.domain.fold import MasterState, fold_master
from sis_platform.domain.items import Item
from sis_platform.domain.limits import DEFAULT_LIMITS
from sis_platform.domain.reasons import Outcome, Reason
from sis_platform.lake.spark.fold.worker import (
    FAILURE,
    FOLD_OUT_SCHEMA,
    ITEM_ROW,
    RESULT,
    STATE,
    STATE_ROW,
    VERSION,
    FoldRow,
    WorkerPlan,
    fold_input,
    fold_partition,
    output_rows,
)
from sis_platform.runtime.faults import InjectedFailure
from tests.domain.sportsdata_fixtures import ASCOT_1430, ASCOT_1500, GO_SOFT, PRICE_7_TO_9
from tests.domain.test_fold import master_item, update_item

PLAN = WorkerPlan(selector_text=None, limits=DEFAULT_LIMITS)


def _item_row(item: Item, batch_seq: int, msg_seq: int) -> dict[str, object]:
    return {
        "master_id": item.master_id,
        "row_kind": ITEM_ROW,
        "message_id": item.message_id,
        "position": item.position,
        "category": item.category,
        "type": item.type,
        "payload": item.payload,
        "batch_seq": batch_seq,
        "msg_seq": msg_seq,
        "version": None,
        "document": None,
        "stale": None,
        "filtered": None,
    }


def _state_row(state: MasterState) -> dict[str, object]:
    document = state.document.decode() if state.document is not None else None
    return {
        **dict.fromkeys(["message_id", "position", "category", "type", "payload"]),
        **dict.fromkeys(["batch_seq", "msg_seq"]),
        "master_id": state.master_id,
        "row_kind": STATE_ROW,
        "version": state.version,
        "document": document,
        "stale": state.stale,
        "filtered": state.filtered,
    }


def _fold(*batches: list[dict[str, object]], plan: WorkerPlan = PLAN) -> list[FoldRow]:
    arrow = [pa.RecordBatch.from_pylist(rows) for rows in batches]
    out = fold_partition(iter(arrow), plan=plan)
    return [FoldRow(**row) for batch in out for row in batch.to_pylist()]


def test_rows_are_the_domain_fold_of_each_master_even_across_arrow_batches():
    created = master_item(ASCOT_1430)
    state = fold_master(ASCOT_1430, None, [created]).state
    soft, price = update_item(GO_SOFT), update_item(PRICE_7_TO_9)
    other = master_item(ASCOT_1500)
    rows = _fold(
        [_state_row(state), _item_row(soft, 2, 0)],
        [_item_row(price, 2, 1), _item_row(other, 2, 2)],
    )
    expected = fold_master(ASCOT_1430, state, [soft, price])
    where = {(soft.message_id, 0): (2, 0), (price.message_id, 0): (2, 1)}
    assert rows[:-3] == output_rows(ASCOT_1430, expected, where)
    assert [(r.kind, r.master_id, r.version) for r in rows[-3:]] == [
        (VERSION, ASCOT_1500, 1),
        (RESULT, ASCOT_1500, 1),
        (STATE, ASCOT_1500, 1),
    ]
    assert rows[-3].batch_seq == 2 and rows[-3].msg_seq == 2


def test_a_rewound_master_without_items_comes_out_at_its_state():
    state = fold_master(ASCOT_1430, None, [master_item(ASCOT_1430)]).state
    [row] = _fold([_state_row(state)])
    assert (row.kind, row.version, row.document) == (STATE, 1, state.document.decode())


def test_an_orphan_update_leaves_no_master_behind():
    [row] = _fold([_item_row(update_item(GO_SOFT), 1, 0)])
    assert (row.kind, row.outcome, row.reason) == (
        RESULT,
        str(Outcome.DEAD_LETTERED),
        str(Reason.ORPHAN_UPDATE),
    )


def test_a_master_whose_fold_raises_is_one_failure_row_naming_it():
    created = master_item(ASCOT_1430)
    plan = WorkerPlan(None, DEFAULT_LIMITS, injected=InjectedFailure(ASCOT_1430, "raise"))
    rows = _fold([_item_row(created, 1, 0), _item_row(master_item(ASCOT_1500), 1, 1)], plan=plan)
    failure = rows[0]
    assert (failure.kind, failure.master_id, failure.version, failure.document) == (
        FAILURE,
        ASCOT_1430,
        None,
        None,
    )
    assert failure.detail is not None and failure.detail.startswith(f"{failure.reason}: ")
    assert {r.master_id for r in rows[1:]} == {ASCOT_1500}


def test_an_item_over_its_budget_before_is_dead_lettered_and_leaves_the_master_stale():
    created, soft, price = master_item(ASCOT_1430), update_item(GO_SOFT), update_item(PRICE_7_TO_9)
    plan = WorkerPlan(None, DEFAULT_LIMITS, timed_out={(soft.message_id, 0): "over 10 s"})
    rows = _fold(
        [_item_row(created, 1, 0), _item_row(soft, 1, 1), _item_row(price, 1, 2)], plan=plan
    )
    results = [(r.message_id, r.outcome, r.reason, r.detail) for r in rows if r.kind == RESULT]
    assert results[1:] == [
        (soft.message_id, str(Outcome.DEAD_LETTERED), str(Reason.TOO_COMPLEX), "over 10 s"),
        (
            price.message_id,
            str(Outcome.DEAD_LETTERED),
            str(Reason.MASTER_STALE),
            f"master {ASCOT_1430!r} is stale since a failed update",
        ),
    ]
    [state] = [r for r in rows if r.kind == STATE]
    assert (state.version, state.stale) == (1, True)


@pytest.mark.spark
def test_fold_input_puts_each_master_state_first_then_its_items_in_feed_order(spark):
    created = master_item(ASCOT_1430)
    state = fold_master(ASCOT_1430, None, [created]).state
    soft, price = update_item(GO_SOFT), update_item(PRICE_7_TO_9)
    # Items given out of feed order: the fold must see price (batch 2) after soft (batch 1).
    items = spark.createDataFrame(
        [
            (ASCOT_1430, price.message_id, 0, "update", "update", price.payload, 2, 0),
            (ASCOT_1430, soft.message_id, 0, "update", "update", soft.payload, 1, 5),
        ],
        "master_id string, message_id string, position int, category string, type string, "
        "payload binary, batch_seq long, msg_seq int",
    )
    states = spark.createDataFrame(
        [(ASCOT_1430, 1, state.document.decode(), False, False, 1)],
        "master_id string, version int, document string, stale boolean, filtered boolean, "
        "fold_step long",
    )
    fold = partial(fold_partition, plan=PLAN)
    rows = [
        FoldRow(**r.asDict())
        for r in fold_input(items, states).mapInArrow(fold, FOLD_OUT_SCHEMA).collect()
    ]
    versions = [(r.version, r.message_id) for r in rows if r.kind == VERSION]
    assert versions == [(2, soft.message_id), (3, price.message_id)]
    expected = fold_master(ASCOT_1430, state, [soft, price]).state
    [out] = [r for r in rows if r.kind == STATE]
    assert out.document == expected.document.decode()
