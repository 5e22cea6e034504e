"""The fold in Spark's Python workers: each master's items, in feed order, through the domain's
`fold_master`, under the worker guard.

Masters are hash-partitioned, each partition sorted so a master's state and items are contiguous
(`fold_input`), and one `mapInArrow` call streams the partition (`fold_partition`). Out come rows
of `FOLD_OUT_SCHEMA`, one `FoldRow` each: a version, an item's result, the master's new state,
or (its fold raised) one failure and nothing else of the master.

The functions here run in the Python workers: the driver pickles `fold_partition` by reference
and each worker imports this module, so its compiled selectors and patch caches (module-level,
made on first use) live once per worker process, not once per master.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from sis_platform.domain.fold import (
    MasterFoldResult,
    MasterState,
    PatchCache,
)
from sis_platform.domain.items import Item
from sis_platform.domain.limits import Limits
from sis_platform.domain.poison import failure_detail
from sis_platform.domain.priority import Priority
from sis_platform.lake.spark.arrow import record_batches
from sis_platform.runtime.faults import InjectedFailure
from sis_platform.runtime.guard import Guard, fold_watched
from sis_platform.standards.selector import Selector

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

# Kinds of fold output row (FoldRow.kind).
VERSION, RESULT, STATE, FAILURE = "version", "result", "state", "failure"

FOLD_OUT_SCHEMA = T.StructType(
    [
        # version | result | state | failure (the master's fold raised: `reason` holds the
        # exception type, `detail` its text, truncated; no other row of the master)
        T.StructField("kind", T.StringType(), False),
        T.StructField("master_id", T.StringType(), False),
        T.StructField("version", T.IntegerType(), True),
        T.StructField("message_id", T.StringType(), True),
        T.StructField("position", T.IntegerType(), True),
        T.StructField("operation", T.StringType(), True),
        T.StructField("document", T.StringType(), True),
        T.StructField("outcome", T.StringType(), True),
        T.StructField("reason", T.StringType(), True),
        T.StructField("detail", T.StringType(), True),
        T.StructField("warning", T.StringType(), True),
        T.StructField("stale", T.BooleanType(), True),
        T.StructField("filtered", T.BooleanType(), True),
        T.StructField("batch_seq", T.LongType(), True),
        T.StructField("msg_seq", T.IntegerType(), True),
        # A state row's priority class (SIS_PRIORITY, domain/priority.py); None without one.
        T.StructField("priority_class", T.IntegerType(), True),
    ]
)


class FoldRow(NamedTuple):
    """One row of FOLD_OUT_SCHEMA (same fields, same order); a field a kind does not use is
    None."""

    kind: str
    master_id: str
    version: int | None = None
    message_id: str | None = None
    position: int | None = None
    operation: str | None = None
    document: str | None = None
    outcome: str | None = None
    reason: str | None = None
    detail: str | None = None
    warning: str | None = None
    stale: bool | None = None
    filtered: bool | None = None
    batch_seq: int | None = None
    msg_seq: int | None = None
    priority_class: int | None = None


assert FoldRow._fields == tuple(FOLD_OUT_SCHEMA.fieldNames())

# The fold's input, one row shape for both sides: a master's state row (row_kind 0, at most
# one) sorts before its items (row_kind 1) in feed order.
STATE_ROW, ITEM_ROW = 0, 1
FOLD_INPUT_ORDER = ("master_id", "row_kind", "batch_seq", "msg_seq", "position")


def fold_input(items: DataFrame, state: DataFrame) -> DataFrame:
    """Items and states hash-partitioned by master id and sorted within each partition, so
    every master's rows are contiguous: its state first, then its items in feed order. The
    fold then streams each partition once (`mapInArrow`), one Python call per partition and
    Arrow batches both ways, instead of a pandas call per master (a cogrouped
    `applyInPandas`): measured 2-3x the per-item cost of the fold itself."""
    item_rows = items.select(
        "master_id",
        F.lit(ITEM_ROW).alias("row_kind"),
        "message_id",
        "position",
        "category",
        "type",
        "payload",
        "batch_seq",
        "msg_seq",
    )
    state_rows = state.select(
        "master_id",
        F.lit(STATE_ROW).alias("row_kind"),
        "version",
        "document",
        "stale",
        "filtered",
    )
    return (
        item_rows.unionByName(state_rows, allowMissingColumns=True)
        .repartition("master_id")
        .sortWithinPartitions(*FOLD_INPUT_ORDER)
    )


@dataclass(frozen=True)
class WorkerPlan:
    """What the driver hands every fold worker with the fold function."""

    selector_text: str | None
    limits: Limits  # the fold's bounds, and the per-item budget of the guard
    # Items that overran the budget in an earlier attempt, by (message id, position): each is
    # dead-lettered `too-complex` with this detail and never folded again.
    timed_out: Mapping[tuple[str, int], str] = field(default_factory=dict)
    injected: InjectedFailure | None = None  # test hook (sis_platform.runtime.faults)
    priority_text: str | None = None  # SIS_PRIORITY: each state row says its master's class


def fold_partition(
    batches: Iterator[pa.RecordBatch], *, plan: WorkerPlan, inflight_dir: str | None = None
) -> Iterator[pa.RecordBatch]:
    """Fold one partition of `fold_input`: each master's run of rows (which may span Arrow
    batches) goes to `fold_one` as soon as the next master's rows begin. A master with a state
    and no items is a rewound one whose items after its rewind point are all gone: it is
    folded too, and so comes out at its version before the point (else it would be left a
    tombstone, as if it had never existed)."""
    schema = to_arrow_schema(FOLD_OUT_SCHEMA)
    guard = Guard(inflight_dir, plan.limits.item_budget_seconds)
    master_id: str | None = None
    state: dict[str, Any] | None = None
    items: list[dict[str, Any]] = []
    try:
        for batch in batches:
            out: list[FoldRow] = []
            for row in batch.to_pylist():
                if row["master_id"] != master_id:
                    if master_id is not None:
                        out.extend(fold_one(master_id, state, items, plan, guard))
                    master_id, state, items = row["master_id"], None, []
                if row["row_kind"] == STATE_ROW:
                    state = row
                else:
                    items.append(row)
            yield from record_batches(out, schema)
        if master_id is not None:  # the partition's last master
            yield from record_batches(fold_one(master_id, state, items, plan, guard), schema)
    finally:
        guard.close()


def _master_state(master_id: str, state: dict[str, Any] | None) -> MasterState | None:
    if state is None:
        return None
    document = state["document"]
    return MasterState(
        master_id=master_id,
        version=int(state["version"]),
        document=str(document).encode("utf-8") if document is not None else None,
        stale=bool(state["stale"]),
        filtered=bool(state["filtered"]),
    )


def fold_one(
    master_id: str,
    state: dict[str, Any] | None,
    items: list[dict[str, Any]],
    plan: WorkerPlan,
    guard: Guard,
) -> list[FoldRow]:
    """One master's fold: its state row (None: not seen before) and item rows, in feed order,
    to rows of FOLD_OUT_SCHEMA; if the fold raises, one `failure` row instead."""
    where: dict[tuple[str, int], tuple[int, int]] = {}  # item -> (batch_seq, msg_seq)
    batch: list[Item] = []
    for rec in items:
        message_id, position = str(rec["message_id"]), int(rec["position"])
        where[(message_id, position)] = (int(rec["batch_seq"]), int(rec["msg_seq"]))
        batch.append(
            Item(
                message_id=message_id,
                position=position,
                master_id=master_id,
                category=rec["category"],
                type=rec["type"],
                payload=rec["payload"],
            )
        )
    guard.start(master_id)
    try:
        result = fold_items(master_id, _master_state(master_id, state), batch, plan, guard)
    except Exception as error:
        # Content errors never get here (fold_master dead-letters them): this is a bug, and
        # it fails the step. The master is named by this row's column, never by the error's
        # text, which may quote content (an lxml error quotes the document).
        guard.done()
        detail = failure_detail(error)
        return [FoldRow(FAILURE, master_id, reason=type(error).__name__, detail=detail)]
    guard.done()
    priority_class = None
    if plan.priority_text:
        current = _master_state(master_id, state)
        document = current.document if current is not None else None
        priority_class = _priority(plan.priority_text).master_class(batch, document)
    return output_rows(master_id, result, where, priority_class)


def output_rows(
    master_id: str,
    result: MasterFoldResult,
    where: Mapping[tuple[str, int], tuple[int, int]],
    priority_class: int | None = None,
) -> list[FoldRow]:
    """A master's fold result as rows: its versions, its items' results (each placed in the
    feed by `where`: (message id, position) -> (batch_seq, msg_seq)) and its new state (with
    its `priority_class`)."""
    rows: list[FoldRow] = []
    for v in result.versions:
        b, m = where[(v.message_id, v.position)]
        rows.append(
            FoldRow(
                VERSION,
                master_id,
                version=v.version,
                message_id=v.message_id,
                position=v.position,
                operation=v.operation,
                document=v.document.decode("utf-8"),
                batch_seq=b,
                msg_seq=m,
            )
        )
    for r in result.results:
        b, m = where[(r.message_id, r.position)]
        rows.append(
            FoldRow(
                RESULT,
                master_id,
                version=r.version,
                message_id=r.message_id,
                position=r.position,
                outcome=str(r.outcome),
                reason=str(r.reason) if r.reason else None,
                detail=r.detail,
                warning=r.warning,
                batch_seq=b,
                msg_seq=m,
            )
        )
    st = result.state
    # Like the reference, an orphan update leaves no master behind.
    if st.exists or st.stale or st.filtered:
        document = st.document.decode("utf-8") if st.document is not None else None
        rows.append(
            FoldRow(
                STATE,
                master_id,
                version=st.version,
                document=document,
                stale=st.stale,
                filtered=st.filtered,
                priority_class=priority_class,
            )
        )
    return rows


def fold_items(
    master_id: str,
    current: MasterState | None,
    batch: list[Item],
    plan: WorkerPlan,
    guard: Guard,
) -> MasterFoldResult:
    """`fold_master` over the items, each under the guard's budget. An item that overran the
    budget in an earlier attempt is dead-lettered `too-complex` without being folded
    (`fold_skipping`, which sis-live shares)."""
    return fold_watched(
        master_id,
        current,
        batch,
        guard=guard,
        injected=plan.injected,
        timed_out=plan.timed_out,
        selector=_selector(plan.selector_text),
        patches=_patch_cache(plan.limits),
        limits=plan.limits,
    )


# Compiled once per Python worker, not once per master.
_SELECTORS: dict[str, Selector] = {}
_PRIORITIES: dict[str, Priority] = {}
# A PatchCache per Python worker and limits, made on first use: the cache compiles selectors
# under its limits (their length and steps), so the configured ones must reach it.
_PATCHES: dict[Limits, PatchCache] = {}


def _patch_cache(limits: Limits) -> PatchCache:
    patches = _PATCHES.get(limits)
    if patches is None:
        patches = _PATCHES[limits] = PatchCache(limits)
    return patches


def _priority(text: str) -> Priority:
    if text not in _PRIORITIES:
        _PRIORITIES[text] = Priority.compile(text)
    return _PRIORITIES[text]


def _selector(text: str | None) -> Selector | None:
    if not text:
        return None
    if text not in _SELECTORS:
        _SELECTORS[text] = Selector.compile(text)
    return _SELECTORS[text]
