"""The fold on Spark: items to master documents, per master id in feed order, parallel across ids.

One fold step takes the gap-free run of batches after the last committed step (the fold never
advances over a missing batch: docs/design.md invariant 3), drops messages already seen by message
id (invariant 2), dead-letters invalid messages, and folds each master's items with the domain's
`fold_master` in Spark's Python workers: masters are hash-partitioned, each partition is sorted
so a master's state and items are contiguous, and one `mapInArrow` call streams the partition.

Commit protocol. A step appends to master_versions, dead_letters and message_outcomes (every
row tagged with the step), merges the new states into master_documents, and finally appends its
row to fold_steps: that last append is the commit point, and it records the master_documents
version the step produced. Before each step, `recover` undoes whatever an interrupted step left
behind: it deletes appended rows of steps after the last committed one and restores
master_documents to the version the last committed step recorded. So a crash anywhere in a
step leaves no trace once the next step starts, and the refold produces the same rows.

Unknown failures (docs/design.md invariants 4 and 6). Each master is folded under the worker guard
(spark/guard.py): an in-flight marker and a per-item wall-clock budget. A master whose fold
raises yields one `failure` row, its id a column; the driver collects those rows before it
writes anything. A worker that dies leaves its master in its marker; one the watchdog killed
leaves the item too. Either way the failure is recorded in fold_failures against exactly those
masters (never against a name found in an error's text) and the step fails, to be retried: an
item over the budget is then dead-lettered `too-complex` without being folded again, and a
master that failed `quarantine_after` times is quarantined. On object storage there are no
markers: a dying worker is retried as a transient failure, and only failure rows attribute.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NoReturn, overload

from sis_platform.domain.limits import DEFAULT_LIMITS, Limits
from sis_platform.domain.reasons import Outcome, Reason
from sis_platform.faults import (
    InjectedFailure,
    crash_point,
    fail_as_injected,
    injected_fold_failure,
    kill_during_write,
    kill_in_worker,
)
from sis_platform.lake.delta import sql_string
from sis_platform.lake.tables import (
    BATCH_LOG,
    DEAD_LETTERS,
    FOLD_APPEND_TABLES,
    FOLD_FAILURES,
    FOLD_STEPS,
    MASTER_DOCUMENTS,
    MASTER_VERSIONS,
    MESSAGE_ITEMS,
    MESSAGE_OUTCOMES,
    RAW_MESSAGES,
)
from sis_platform.spark.arrow import record_batches
from sis_platform.spark.guard import RUNNING, TIMEOUT, Guard, InFlightFolder, budget_detail

if TYPE_CHECKING:
    from collections.abc import Mapping

    import pyarrow as pa
    from pyspark.sql import DataFrame, Row
    from pyspark.sql.types import StructType

    from sis_platform.domain.fold import MasterFoldResult, MasterState
    from sis_platform.domain.items import Item
    from sis_platform.lake.delta import Lake

log = logging.getLogger(__name__)

# The role of the fold's single writer (the Dagster pool "sis_fold": fold steps, model refreshes,
# dead-letter replays), claimed on the Lake before anything is read: see Lake.claim_writer.
FOLD_WRITER = "sis-fold-writer"

FOLD_TABLES = (MASTER_VERSIONS, MASTER_DOCUMENTS, DEAD_LETTERS, MESSAGE_OUTCOMES, FOLD_STEPS)

# The most message ids a step broadcasts to look up in message_outcomes: ~40 MB of ids, a few
# batches' worth (SIS_BATCH_MAX_MESSAGES, 50,000 by default), well inside a 1.5 GiB driver.
BROADCAST_STEP_IDS_MAX = 500_000


@dataclass(frozen=True)
class CommittedStep:
    fold_step: int  # 0 before the first step
    last_batch_seq: int  # the last batch folded; 0 before the first step
    master_documents_version: int
    table_versions: dict[str, int]  # Delta version of each fold table after the step


@dataclass(frozen=True)
class FoldStepResult:
    fold_step: int | None  # None when nothing could be folded
    first_batch_seq: int | None = None
    last_batch_seq: int | None = None
    messages: int = 0  # messages given an outcome by this step
    applied: int = 0
    duplicates: int = 0
    filtered: int = 0
    dead_lettered: int = 0
    masters_changed: int = 0
    waiting_for: int | None = None  # the missing batch number that blocks the fold, if any
    rewound_masters: int = 0  # masters rewound and refolded (their input changed)
    changed_batches: tuple[int, ...] = ()  # folded batches whose items changed since


def _fold_out_schema() -> StructType:
    from pyspark.sql import types as T

    return T.StructType(
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
        ]
    )


# The tables a step writes before committing; recovery restores each to its committed version.
STEP_TABLES = (*FOLD_APPEND_TABLES, MASTER_DOCUMENTS)


def fold_step_rows(lake: Lake) -> list[Row]:
    """Every committed step's row of fold_steps (one small row per step), read once per fold
    step for both the last committed step and what each batch was when folded."""
    lake.ensure(FOLD_STEPS)
    return (
        lake.read(FOLD_STEPS)
        .select(
            "fold_step",
            "first_batch_seq",
            "last_batch_seq",
            "master_documents_version",
            "table_versions",
            "items_digest",
        )
        .collect()
    )


def committed_step(lake: Lake, rows: list[Row] | None = None) -> CommittedStep:
    """The last committed step, from fold_steps (or from its `rows`, already read)."""
    import json

    if rows is None:
        rows = fold_step_rows(lake)
    last = max(rows, key=lambda r: int(r["fold_step"]), default=None)
    if last is None:
        # Before the first step every table is as `ensure` created it: version 0.
        return CommittedStep(0, 0, 0, {t.name: 0 for t in STEP_TABLES})
    return CommittedStep(
        int(last["fold_step"]),
        int(last["last_batch_seq"]),
        int(last["master_documents_version"]),
        {k: int(v) for k, v in json.loads(last["table_versions"]).items()},
    )


def recover(lake: Lake, rows: list[Row] | None = None) -> tuple[CommittedStep, dict[str, int]]:
    """Undo an interrupted step (see the module docstring). Returns the last committed step
    and the current version of each step table (to read them pinned). `rows`: fold_steps, if
    already read (the commit point, so recovery never changes it)."""
    lake.ensure(*FOLD_TABLES)
    committed = committed_step(lake, rows)
    current: dict[str, int] = {}
    for table in STEP_TABLES:
        version = lake.version(table)
        committed_version = committed.table_versions[table.name]
        if version != committed_version:
            # A step wrote here and died before its fold_steps row: its writes never happened.
            lake.restore(table, committed_version)
            version = lake.version(table)
        current[table.name] = version
    return committed, current


@dataclass(frozen=True)
class LoggedBatches:
    """The batch log as one fold step reads it (pinned: see `fold_step`)."""

    keys: dict[int, str]  # batch_seq -> batch_key
    digests: dict[int, str]  # batch_seq -> items_digest of its current message_items

    def gap_free_after(self, after: int) -> tuple[list[tuple[int, str]], int | None]:
        """The gap-free run of processed batches after batch `after`, and the first missing
        batch number beyond which later processed batches wait (None if nothing waits)."""
        run: list[tuple[int, str]] = []
        seq = after + 1
        while seq in self.keys:
            run.append((seq, self.keys[seq]))
            seq += 1
        waiting = seq if any(s > seq for s in self.keys) else None
        return run, waiting


@dataclass(frozen=True)
class FoldedBatch:
    digest: str  # items digest of the batch when it was last folded (or refolded)
    items_version: int | None  # message_items version that fold read (None: not recorded)


def folded_batches(rows: list[Row]) -> dict[int, FoldedBatch]:
    """What each batch's items were when last folded, from the rows of fold_steps."""
    import json

    folded: dict[int, FoldedBatch] = {}
    rows = sorted(rows, key=lambda r: int(r["fold_step"]))
    for row in rows:
        text = str(row["items_digest"])
        items_version = json.loads(row["table_versions"]).get(MESSAGE_ITEMS.name)
        if text.startswith("{"):
            digests = {int(k): v for k, v in json.loads(text).items()}
        else:  # steps written before rewinds existed: the digests of first..last, in order
            seqs = range(int(row["first_batch_seq"]), int(row["last_batch_seq"]) + 1)
            digests = dict(zip(seqs, text.split(","), strict=True))
        folded.update({s: FoldedBatch(d, items_version) for s, d in digests.items()})
    return folded


def _changed_items(
    lake: Lake, now: DataFrame, changed: list[int], folded: dict[int, FoldedBatch]
) -> DataFrame:
    """(master_id, batch_seq) of every item that differs between what was folded and what the
    changed batches hold now: the masters to rewind, and from which batch. Where the folded
    version of message_items is gone (vacuumed, or not recorded), every master of the batch,
    then or now, counts as changed."""
    from functools import reduce

    from pyspark.errors import AnalysisException
    from pyspark.sql import functions as F

    columns = [
        "batch_seq",
        "msg_seq",
        "position",
        "master_id",
        "status",
        "category",
        "type",
        "payload",
        "reason",
    ]
    parts: list[DataFrame] = []
    by_version: dict[int | None, list[int]] = {}
    for seq in changed:
        by_version.setdefault(folded[seq].items_version, []).append(seq)
    for version, seqs in by_version.items():
        current = now.where(F.col("batch_seq").isin(seqs)).select(*columns)
        if version is not None:
            try:
                before = (
                    lake.read(MESSAGE_ITEMS, version=version)
                    .where(F.col("batch_seq").isin(seqs))
                    .select(*columns)
                )
                diff = before.exceptAll(current).unionByName(current.exceptAll(before))
                parts.append(diff.select("master_id", "batch_seq").localCheckpoint())
                continue
            except AnalysisException as error:
                log.warning(
                    f"message_items version {version} unavailable ({error}); "
                    f"rewinding every master of batches {seqs}"
                )
        outcomes = lake.read(MESSAGE_OUTCOMES).where(F.col("batch_seq").isin(seqs))
        parts.append(
            outcomes.select("master_id", "batch_seq").unionByName(
                current.select("master_id", "batch_seq")
            )
        )
    return reduce(lambda a, b: a.unionByName(b), parts).where(F.col("master_id").isNotNull())


# The fold's input, one row shape for both sides: a master's state row (row_kind 0, at most
# one) sorts before its items (row_kind 1) in feed order.
_STATE_ROW, _ITEM_ROW = 0, 1
_FOLD_INPUT_ORDER = ("master_id", "row_kind", "batch_seq", "msg_seq", "position")


def _fold_input(items: DataFrame, state: DataFrame) -> DataFrame:
    """Items and states hash-partitioned by master id and sorted within each partition, so
    every master's rows are contiguous: its state first, then its items in feed order. The
    fold then streams each partition once (`mapInArrow`), one Python call per partition and
    Arrow batches both ways, instead of a pandas call per master (a cogrouped
    `applyInPandas`): measured 2-3x the per-item cost of the fold itself."""
    from pyspark.sql import functions as F

    item_rows = items.select(
        "master_id",
        F.lit(_ITEM_ROW).alias("row_kind"),
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
        F.lit(_STATE_ROW).alias("row_kind"),
        "version",
        "document",
        "stale",
        "filtered",
    )
    return (
        item_rows.unionByName(state_rows, allowMissingColumns=True)
        .repartition("master_id")
        .sortWithinPartitions(*_FOLD_INPUT_ORDER)
    )


@dataclass(frozen=True)
class WorkerPlan:
    """What the driver hands every fold worker with the fold function."""

    selector_text: str | None
    limits: Limits  # the fold's bounds, and the per-item budget of the guard
    # Items that overran the budget in an earlier attempt, by (message id, position): each is
    # dead-lettered `too-complex` with this detail and never folded again.
    timed_out: Mapping[tuple[str, int], str] = field(default_factory=dict)
    injected: InjectedFailure | None = None  # test hook (sis_platform.faults)


def _fold_partition(
    batches: Iterator[pa.RecordBatch], *, plan: WorkerPlan, inflight_dir: str | None = None
) -> Iterator[pa.RecordBatch]:
    """Fold one partition of `_fold_input`: each master's run of rows (which may span Arrow
    batches) goes to `_fold_one` as soon as the next master's rows begin. A master with a state
    and no items is a rewound one whose items after its rewind point are all gone: it is
    folded too, and so comes out at its version before the point (else it would be left a
    tombstone, as if it had never existed)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    schema = to_arrow_schema(_fold_out_schema())
    guard = Guard(inflight_dir, plan.limits.item_budget_seconds)
    master_id: str | None = None
    state: dict[str, Any] | None = None
    items: list[dict[str, Any]] = []
    try:
        for batch in batches:
            out: list[tuple[object, ...]] = []
            for row in batch.to_pylist():
                if row["master_id"] != master_id:
                    if master_id is not None:
                        out.extend(_fold_one(master_id, state, items, plan, guard))
                    master_id, state, items = row["master_id"], None, []
                if row["row_kind"] == _STATE_ROW:
                    state = row
                else:
                    items.append(row)
            yield from record_batches(out, schema)
        if master_id is not None:  # the partition's last master
            yield from record_batches(_fold_one(master_id, state, items, plan, guard), schema)
    finally:
        guard.close()


def _fold_one(
    master_id: str | None,
    state: dict[str, Any] | None,
    items: list[dict[str, Any]],
    plan: WorkerPlan,
    guard: Guard,
) -> list[tuple[object, ...]]:
    """One master's fold: its state (None: not seen before) and items, in feed order, to rows
    of `_fold_out_schema`; if the fold raises, one `failure` row instead."""
    from sis_platform.domain.fold import MasterState
    from sis_platform.domain.items import Item

    assert master_id is not None
    current = None
    if state is not None:
        document = state["document"]
        current = MasterState(
            master_id=master_id,
            version=int(state["version"]),
            document=str(document).encode("utf-8") if document is not None else None,
            stale=bool(state["stale"]),
            filtered=bool(state["filtered"]),
        )
    where: dict[tuple[str, int], tuple[int, int]] = {}
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
        result = _fold_items(master_id, current, batch, plan, guard)
    except Exception as error:
        # Content errors never get here (fold_master dead-letters them): this is a bug, and
        # it fails the step. The master is named by this row's column, never by the error's
        # text, which may quote content (an lxml error quotes the document).
        guard.done()
        return [
            (
                "failure",
                master_id,
                None,
                None,
                None,
                None,
                None,
                None,
                type(error).__name__,
                f"{type(error).__name__}: {error}"[:FAILURE_DETAIL_CHARS],
                None,
                None,
                None,
                None,
                None,
            )
        ]
    guard.done()
    rows: list[tuple[object, ...]] = []
    for v in result.versions:
        b, m = where[(v.message_id, v.position)]
        rows.append(
            (
                "version",
                master_id,
                v.version,
                v.message_id,
                v.position,
                v.operation,
                v.document.decode("utf-8"),
                None,
                None,
                None,
                None,
                None,
                None,
                b,
                m,
            )
        )
    for r in result.results:
        b, m = where[(r.message_id, r.position)]
        rows.append(
            (
                "result",
                master_id,
                r.version,
                r.message_id,
                r.position,
                None,
                None,
                str(r.outcome),
                str(r.reason) if r.reason else None,
                r.detail,
                r.warning,
                None,
                None,
                b,
                m,
            )
        )
    st = result.state
    # Like the reference, an orphan update leaves no master behind.
    if st.exists or st.stale or st.filtered:
        rows.append(
            (
                "state",
                master_id,
                st.version,
                None,
                None,
                None,
                st.document.decode("utf-8") if st.document is not None else None,
                None,
                None,
                None,
                None,
                st.stale,
                st.filtered,
                None,
                None,
            )
        )
    return rows


# The most characters of an exception's text a failure keeps (the type is kept whole).
FAILURE_DETAIL_CHARS = 2000


def _fold_items(
    master_id: str,
    current: MasterState | None,
    batch: list[Item],
    plan: WorkerPlan,
    guard: Guard,
) -> MasterFoldResult:
    """`fold_master` over the items, each under the guard's budget. An item that overran the
    budget in an earlier attempt is dead-lettered `too-complex` without being folded; like any
    item not applied, it leaves an existing master stale (it missed an update)."""
    from dataclasses import replace

    from sis_platform.domain.fold import ItemResult, MasterFoldResult, MasterState, fold_master

    def fold(state: MasterState | None, part: list[Item]) -> MasterFoldResult:
        return fold_master(
            master_id,
            state,
            _Watched(part, guard, plan.injected),
            selector=_selector(plan.selector_text),
            patches=_patch_cache(plan.limits),
            limits=plan.limits,
        )

    if not plan.timed_out:
        return fold(current, batch)
    state = current or MasterState(master_id=master_id, version=0, document=None)
    versions, results = [], []
    pending: list[Item] = []
    for item in [*batch, None]:
        detail = None if item is None else plan.timed_out.get((item.message_id, item.position))
        if item is not None and detail is None:
            pending.append(item)
            continue
        if pending:
            part = fold(state, pending)
            versions += part.versions
            results += part.results
            state, pending = part.state, []
        if item is not None:
            results.append(
                ItemResult(
                    item.message_id,
                    item.position,
                    master_id,
                    Outcome.DEAD_LETTERED,
                    None,
                    Reason.TOO_COMPLEX,
                    detail,
                    None,
                )
            )
            state = replace(state, stale=state.stale or state.exists)
    return MasterFoldResult(state=state, versions=versions, results=results)


class _Watched(Sequence["Item"]):
    """A master's items as `fold_master` takes them: it iterates them once, in order, so taking
    an item is where that item's budget starts (and the previous item's ends). The injected
    test failure strikes there too, inside the fold of its item."""

    def __init__(self, items: list[Item], guard: Guard, injected: InjectedFailure | None) -> None:
        self._items = items
        self._guard = guard
        self._injected = injected

    def __iter__(self) -> Iterator[Item]:
        for item in self._items:
            self._guard.item(item.message_id, item.position)
            if self._injected is not None and self._injected.target in (
                item.master_id,
                item.message_id,
            ):
                fail_as_injected(self._injected.how, quoting=item.payload)
            yield item

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, index: int) -> Item: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Item]: ...
    def __getitem__(self, index: int | slice) -> Item | Sequence[Item]:
        return self._items[index]


class FoldFailure(RuntimeError):
    """The fold failed for an unknown reason (not a content error: those are dead letters).
    Retried by the asset's retry policy; the masters it names are quarantined once they have
    failed `quarantine_after` times, and an item that overran its budget is dead-lettered
    `too-complex` at the next attempt."""


# Kinds of fold failure (fold_failures.kind).
ERROR, CRASH = "error", "crash"  # and guard.TIMEOUT


@dataclass(frozen=True)
class MasterFailure:
    """One master a failed fold attempt was folding, as a structured fact: its failure row, or
    the in-flight marker its worker left."""

    master_id: str
    kind: str  # ERROR | CRASH | TIMEOUT
    error: str
    message_id: str | None = None  # TIMEOUT: the item that overran
    position: int | None = None


# The outcome a `failure` row of the fold takes among the step's outcomes (never written).
FAILED = "failed"


def _failure_rows(rows: list[Row]) -> list[MasterFailure]:
    """The fold's `failure` rows (collected before anything is written)."""
    return [MasterFailure(str(r["master_id"]), ERROR, str(r["detail"])) for r in rows]


def _died_in_flight(folder: InFlightFolder, error: BaseException) -> list[MasterFailure]:
    """The masters fold workers died on, from their markers: killed by the watchdog over an
    item (TIMEOUT) or dead of anything else mid-fold (CRASH). A timeout explains the job's
    failure: any other marker left then is a task Spark cancelled for it, not a crash. Empty on
    object storage, where there are no markers: such a failure is retried as a transient one."""
    records = folder.records()
    timeouts = [
        MasterFailure(r.key, TIMEOUT, budget_detail(r.budget_seconds), r.message_id, r.position)
        for r in records
        if r.state == TIMEOUT
    ]
    if timeouts:
        return timeouts
    return [
        MasterFailure(r.key, CRASH, f"its Python worker died ({type(error).__name__})")
        for r in records
        if r.state == RUNNING
    ]


@dataclass(frozen=True)
class KnownFailures:
    """What earlier failed attempts decided for this step's plan."""

    quarantined: dict[str, str] = field(default_factory=dict)  # master id -> detail
    timed_out: dict[tuple[str, int], str] = field(default_factory=dict)  # item -> detail


def known_failures(lake: Lake, after: int) -> KnownFailures:
    """Masters with at least `after` unreleased errors or crashes (quarantined, with their last
    error), and the unreleased items that overran the budget."""
    from pyspark.sql import functions as F

    if lake.version(FOLD_FAILURES) == 0:
        return KnownFailures()  # as created: no failure ever recorded (the usual case), no job
    table = lake.read(FOLD_FAILURES)
    if "kind" not in table.columns:  # a lake from before kinds: every row an error or crash
        table = table.select(
            "*",
            F.lit(None).cast("string").alias("kind"),
            F.lit(None).cast("string").alias("message_id"),
            F.lit(None).cast("int").alias("position"),
        )
    rows = (
        table.where(~F.col("released"))
        .select("master_id", "kind", "error", "failed_at", "message_id", "position")
        .orderBy("failed_at")
        .collect()
    )
    counts: dict[str, int] = {}
    last: dict[str, str] = {}
    timed_out: dict[tuple[str, int], str] = {}
    for r in rows:
        if r["kind"] == TIMEOUT:
            timed_out[(str(r["message_id"]), int(r["position"]))] = str(r["error"])
            continue
        master = str(r["master_id"])
        counts[master] = counts.get(master, 0) + 1
        last[master] = str(r["error"])
    quarantined = {m: f"fold failed {n} times: {last[m]}" for m, n in counts.items() if n >= after}
    return KnownFailures(quarantined, timed_out)


def record_failures(
    lake: Lake, failures: list[MasterFailure], *, step: int, run_id: str | None
) -> None:
    now = datetime.now(UTC)
    _add_kind_columns(lake)
    rows = [
        (
            f.master_id,
            step,
            f.error[:FAILURE_DETAIL_CHARS],
            now,
            run_id,
            False,
            f.kind,
            f.message_id,
            f.position,
        )
        for f in sorted(set(failures), key=lambda f: (f.master_id, f.kind, f.error))
    ]
    lake.append(FOLD_FAILURES, lake.spark.createDataFrame(rows, FOLD_FAILURES.schema()))


def _add_kind_columns(lake: Lake) -> None:
    """Give a lake's fold_failures from before failure kinds their columns (nullable, so its
    rows read as null), in place: the table is never restored, so the change stays."""
    present = set(lake.read(FOLD_FAILURES).columns)
    missing = [f for f in FOLD_FAILURES.schema().fields if f.name not in present]
    if missing:
        columns = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in missing)
        lake.spark.sql(f"ALTER TABLE {lake.sql_table(FOLD_FAILURES)} ADD COLUMNS ({columns})")


def release_quarantine(lake: Lake, masters: set[str]) -> None:
    """Let the masters be folded again (dead-letter replay, after a fix): their failures of
    every kind, items over the budget included, no longer count."""
    if masters:
        ids = ", ".join(sql_string(m) for m in sorted(masters))
        lake.update(FOLD_FAILURES, f"master_id IN ({ids}) AND NOT released", {"released": "true"})


_SELECTORS: dict[str, object] = {}
# A PatchCache per Python worker and limits, made on first use: the cache compiles selectors
# under its limits (their length and steps), so the configured ones must reach it.
_PATCHES: dict[Limits, object] = {}


def _patch_cache(limits: Limits):  # type: ignore[no-untyped-def]
    patches = _PATCHES.get(limits)
    if patches is None:
        from sis_platform.domain.fold import PatchCache

        patches = _PATCHES[limits] = PatchCache(limits)
    return patches


def _selector(text: str | None):  # type: ignore[no-untyped-def]
    # Compiled once per Python worker, not once per master.
    if not text:
        return None
    if text not in _SELECTORS:
        from sis_platform.domain.selector import Selector

        _SELECTORS[text] = Selector.compile(text)
    return _SELECTORS[text]


def _after_point(t: str, p: str) -> str:
    """SQL: row `t` comes after the rewind point `p` in feed order (batch, message, position).
    A master without a point (p_batch = -1) is refolded from its first item."""
    return (
        f"({t}.batch_seq > {p}.p_batch OR ({t}.batch_seq = {p}.p_batch AND "
        f"({t}.msg_seq > {p}.p_msg OR ({t}.msg_seq = {p}.p_msg AND "
        f"coalesce({t}.position, -1) > {p}.p_pos))))"
    )


def _fail_step(
    lake: Lake,
    failures: list[MasterFailure],
    *,
    step: int,
    run_id: str | None,
    quarantine_after: int,
    cause: BaseException | None = None,
) -> NoReturn:
    """Record the failures against exactly their masters, then fail the step (retried)."""
    record_failures(lake, failures, step=step, run_id=run_id)
    named = ", ".join(
        f"{f.master_id} ({f.kind}{f' in {f.message_id}/{f.position}' if f.message_id else ''})"
        for f in sorted(set(failures), key=lambda f: f.master_id)
    )
    raise FoldFailure(
        f"fold step {step} failed on {named}; an item over its budget is dead-lettered "
        f"too-complex at the next attempt, a master is quarantined after {quarantine_after} "
        "failures"
    ) from cause


def fold_step(
    lake: Lake,
    *,
    selector: str | None = None,
    run_id: str | None = None,
    max_batches: int | None = None,
    rewind: Mapping[str, int] | None = None,
    quarantine_after: int = 3,
    limits: Limits = DEFAULT_LIMITS,
) -> FoldStepResult:
    """Recover, then fold the next gap-free run of batches and commit it as one step.

    Rewind (docs/design.md invariant 3): when a batch already folded has different items now (its
    message_items were re-materialized after a fix, so its digest in batch_log differs from the
    one folded), the masters it touches, before or after, are rewound: each goes back to its
    last version before the first changed batch, taken from master_versions (right after an
    applied version a master is neither stale nor filtered, so the version is its whole
    state), its later rows are deleted, and its items from that point on are refolded, in the
    same step as any new batches. `rewind` asks for the same explicitly (master id -> batch to
    refold from): dead-letter replay after a fold fix, where the items themselves are the same.
    """
    import json
    from functools import partial

    from pyspark.sql import Window
    from pyspark.sql import functions as F

    lake.claim_writer(FOLD_WRITER)
    steps = fold_step_rows(lake)
    committed, versions_now = recover(lake, steps)
    lake.ensure(MESSAGE_ITEMS, BATCH_LOG, FOLD_FAILURES)
    # message_items is written before batch_log (assets/message_log.py), so reading batch_log's
    # version first, then message_items', never pairs a digest with items older than it. The
    # worst case, newer items under an older digest, is seen as changed by the next step.
    log_version = lake.version(BATCH_LOG)
    items_version = lake.version(MESSAGE_ITEMS)
    log_rows = (
        lake.read(BATCH_LOG, version=log_version)
        .select("batch_seq", "batch_key", "items_digest", "messages")
        .collect()
    )
    logged = LoggedBatches(
        {int(r["batch_seq"]): str(r["batch_key"]) for r in log_rows},
        {int(r["batch_seq"]): str(r["items_digest"]) for r in log_rows},
    )
    run, waiting = logged.gap_free_after(committed.last_batch_seq)
    if max_batches is not None:
        run = run[:max_batches]
    folded_before = folded_batches(steps)
    changed = sorted(
        seq
        for seq, digest in logged.digests.items()
        if seq in folded_before
        and seq <= committed.last_batch_seq
        and folded_before[seq].digest != digest
    )
    if not run and not changed and not rewind:
        return FoldStepResult(None, waiting_for=waiting or committed.last_batch_seq + 1)
    first = run[0][0] if run else None
    last = run[-1][0] if run else committed.last_batch_seq
    step = max(last, committed.fold_step + 1)
    keys = [k for _, k in run]
    changed_keys = [logged.keys[s] for s in changed]
    spark = lake.spark
    now = datetime.now(UTC)

    # Every table the step writes is read at a pinned version: Delta invalidates cached plans
    # of a table it writes to, and a plan that re-read message_outcomes after this step's own
    # append would find every message of the step "already seen".
    outcomes_version = versions_now[MESSAGE_OUTCOMES.name]
    documents_version = versions_now[MASTER_DOCUMENTS.name]
    log_items = lake.read(MESSAGE_ITEMS, version=items_version).where(
        F.col("batch_seq") <= F.lit(last)
    )
    new_items = log_items.where(F.col("batch_key").isin(keys))
    outcomes_then = lake.read(MESSAGE_OUTCOMES, version=outcomes_version)

    # Masters to rewind, each with the batch to refold from.
    rewinding = bool(changed or rewind)
    if rewinding:
        touched = (
            _changed_items(lake, log_items, changed, folded_before)
            if changed
            else spark.createDataFrame([], "master_id string, batch_seq long")
        )
        if rewind:
            touched = touched.unionByName(
                spark.createDataFrame(
                    [(m, int(b)) for m, b in rewind.items()], "master_id string, batch_seq long"
                )
            )
        from_batch = touched.groupBy("master_id").agg(F.min("batch_seq").alias("from_batch"))
        last_before = Window.partitionBy("master_id").orderBy(
            F.col("batch_seq").desc(), F.col("msg_seq").desc(), F.col("position").desc()
        )
        points = (
            lake.read(MASTER_VERSIONS, version=versions_now[MASTER_VERSIONS.name])
            .join(from_batch, "master_id")
            .where(F.col("batch_seq") < F.col("from_batch"))
            .withColumn("n", F.row_number().over(last_before))
            .where("n = 1")
            .select(
                "master_id",
                "version",
                "document",
                F.col("batch_seq").alias("p_batch"),
                F.col("msg_seq").alias("p_msg"),
                F.col("position").alias("p_pos"),
            )
        )
        rewound = (
            from_batch.join(points, "master_id", "left")
            .select(
                "master_id",
                "version",
                "document",
                F.coalesce("p_batch", F.lit(-1).cast("long")).alias("p_batch"),
                F.coalesce("p_msg", F.lit(-1)).alias("p_msg"),
                F.coalesce("p_pos", F.lit(-1)).alias("p_pos"),
            )
            .localCheckpoint()
        )
        rewound_ids = rewound.select("master_id")
        refold = (
            log_items.where(F.col("status") == "item")
            .alias("t")
            .join(rewound.alias("p"), "master_id")
            .where(_after_point("t", "p"))
            .select("t.*")
        )
        step_items = new_items.join(rewound_ids, "master_id", "left_anti").unionByName(refold)
        # Which copy of a message counts is a fact of the whole log (first in landing order),
        # decided afresh for every message the step emits rows for.
        emitting = step_items.unionByName(log_items.where(F.col("batch_key").isin(changed_keys)))
        messages = emitting.select("message_id", "batch_seq", "msg_seq").distinct()
        copies = (
            log_items.select("message_id", "batch_seq", "msg_seq")
            .distinct()
            .join(messages.select("message_id").distinct(), "message_id", "left_semi")
        )
        ranked = copies.withColumn(
            "copy",
            F.row_number().over(Window.partitionBy("message_id").orderBy("batch_seq", "msg_seq")),
        )
        dup_keys = (
            ranked.where("copy > 1")
            .select("batch_seq", "msg_seq")
            .withColumn("duplicate", F.lit(True))
        )
        # Message-level rows (duplicate, invalid) are emitted for new and changed batches only;
        # those of unchanged batches stand.
        message_level = F.col("batch_key").isin(keys + changed_keys)
        items = step_items.unionByName(
            log_items.where(F.col("batch_key").isin(changed_keys) & (F.col("status") != "item"))
        )
    else:
        items = new_items
        message_level = F.lit(True)
        # Exactly once (SPORTSDATA.md): the first copy of a message id in landing order counts;
        # later copies, in this step or after an earlier step, are duplicates.
        messages = items.select("message_id", "batch_seq", "msg_seq").distinct()
        first_copy = Window.partitionBy("message_id").orderBy("batch_seq", "msg_seq")
        # Only the step's own ids are looked up in the history: broadcast, they filter the
        # outcomes' message_id column where it lies. A distinct of every id ever logged was a
        # shuffle of the whole history per step, the term that made a fold step's time grow
        # with the lake (BENCHMARKS.md, 1.2 M). A step catching up on many batches (after a
        # missing one arrived) may hold too many ids to broadcast: Spark plans that join.
        step_ids = messages.select("message_id").distinct()
        in_step = {seq for seq, _ in run}
        step_messages = sum(int(r["messages"]) for r in log_rows if r["batch_seq"] in in_step)
        if step_messages <= BROADCAST_STEP_IDS_MAX:
            step_ids = F.broadcast(step_ids)
        seen = outcomes_then.select("message_id").join(step_ids, "message_id", "left_semi")
        ranked = messages.withColumn("copy", F.row_number().over(first_copy))
        dup_keys = (
            ranked.where("copy > 1")
            .select("batch_seq", "msg_seq")
            .unionByName(
                ranked.where("copy = 1")
                .join(seen, "message_id", "left_semi")
                .select("batch_seq", "msg_seq")
            )
            .withColumn("duplicate", F.lit(True))
        )
    # Materialized once (localCheckpoint): every output below derives from it.
    tagged = items.join(dup_keys, ["batch_seq", "msg_seq"], "left").localCheckpoint()

    dup_msgs = (
        tagged.where(F.col("duplicate") & message_level)
        .select("message_id", "batch_seq", "msg_seq")
        .distinct()
    )
    invalid = tagged.where("duplicate IS NULL AND status = 'invalid'")
    valid = tagged.where("duplicate IS NULL AND status = 'item'")
    # Poison isolation for unknown failures: a quarantined master's items are held back as
    # dead letters, so the fold of every other master goes on.
    known = known_failures(lake, quarantine_after)
    quarantined = known.quarantined
    held = valid.where(F.lit(False))
    if quarantined:
        reasons = F.create_map(*[F.lit(x) for kv in quarantined.items() for x in kv])
        held = valid.where(F.col("master_id").isin(list(quarantined))).withColumn(
            "detail", reasons[F.col("master_id")]
        )
        valid = valid.where(~F.col("master_id").isin(list(quarantined)))

    # The step's masters (thousands at most per batch), broadcast: the documents of the others
    # are read and dropped where they lie, never shuffled.
    affected = F.broadcast(valid.select("master_id").distinct())
    state = lake.read(MASTER_DOCUMENTS, version=documents_version).join(
        affected, "master_id", "left_semi"
    )
    if rewinding:
        # A rewound master starts again from its version before the change (or from nothing).
        state = state.join(rewound_ids, "master_id", "left_anti").unionByName(
            rewound.where("version IS NOT NULL").select(
                "master_id",
                "version",
                "document",
                F.lit(False).alias("stale"),
                F.lit(False).alias("filtered"),
                F.lit(0).cast("long").alias("fold_step"),
            )
        )
    plan = WorkerPlan(
        selector_text=selector,
        limits=limits,
        timed_out=known.timed_out,
        injected=injected_fold_failure(),
    )
    folder = InFlightFolder.create(lake.base_path, f"fold-{step}")
    try:
        fold = kill_in_worker(
            partial(_fold_partition, plan=plan, inflight_dir=folder.path), "fold.mid_fold"
        )
        try:
            folded = (
                _fold_input(valid, state).mapInArrow(fold, _fold_out_schema()).localCheckpoint()
            )
        except Exception as error:
            died = _died_in_flight(folder, error)
            if not died:
                raise  # not attributable to a master: a transient failure, retried as such
            _fail_step(
                lake, died, step=step, run_id=run_id, quarantine_after=quarantine_after, cause=error
            )
    finally:
        folder.remove()
    step_col = F.lit(step).cast("long")
    raw = lake.read(RAW_MESSAGES).where(
        F.col("batch_key").isin(keys + changed_keys)
        | (F.col("batch_seq") <= F.lit(last) if rewinding else F.lit(False))
    )
    raw_cols = raw.select("batch_seq", "msg_seq", "batch_key", "body", "delivery_count")

    # Outcomes: one row per item, one per duplicate or invalid message (position null).
    # A master whose fold raised has one `failure` row and no other: it rides with the outcomes
    # (outcome FAILED), so the tally below, before anything is written, finds it without a job
    # of its own.
    results = folded.where("kind IN ('result', 'failure')").withColumn(
        "outcome", F.when(F.col("kind") == "failure", F.lit(FAILED)).otherwise(F.col("outcome"))
    )
    outcomes = (
        results.select(
            "message_id",
            "batch_seq",
            "msg_seq",
            "position",
            "master_id",
            "outcome",
            "version",
            "reason",
            "detail",
            "warning",
        )
        .unionByName(
            dup_msgs.select(
                "message_id",
                "batch_seq",
                "msg_seq",
                F.lit(None).cast("int").alias("position"),
                F.lit(None).cast("string").alias("master_id"),
                F.lit(str(Outcome.DUPLICATE)).alias("outcome"),
                F.lit(None).cast("int").alias("version"),
                F.lit(None).cast("string").alias("reason"),
                F.lit(None).cast("string").alias("detail"),
                F.lit(None).cast("string").alias("warning"),
            )
        )
        .unionByName(
            invalid.select(
                "message_id",
                "batch_seq",
                "msg_seq",
                F.lit(None).cast("int").alias("position"),
                F.lit(None).cast("string").alias("master_id"),
                F.lit(str(Outcome.DEAD_LETTERED)).alias("outcome"),
                F.lit(None).cast("int").alias("version"),
                "reason",
                "detail",
                F.lit(None).cast("string").alias("warning"),
            )
        )
        .unionByName(
            held.select(
                "message_id",
                "batch_seq",
                "msg_seq",
                "position",
                "master_id",
                F.lit(str(Outcome.DEAD_LETTERED)).alias("outcome"),
                F.lit(None).cast("int").alias("version"),
                F.lit(str(Reason.QUARANTINED)).alias("reason"),
                "detail",
                F.lit(None).cast("string").alias("warning"),
            )
        )
        .withColumn("fold_step", step_col)
    ).localCheckpoint()
    dead = (
        outcomes.where(F.col("outcome") == str(Outcome.DEAD_LETTERED))
        .join(raw_cols, ["batch_seq", "msg_seq"])
        .withColumn("dead_lettered_at", F.lit(now))
    )
    versions = folded.where("kind = 'version'").withColumn("fold_step", step_col)
    states = folded.where("kind = 'state'").withColumn("fold_step", step_col)
    if rewinding:
        # A rewound master that no longer exists at all keeps a tombstone (no document, not
        # stale, not filtered) so the model drops its rows; readers treat it as absent.
        existing = lake.read(MASTER_DOCUMENTS, version=documents_version).select("master_id")
        states = states.unionByName(
            rewound_ids.join(existing, "master_id", "left_semi")
            .join(states.select("master_id"), "master_id", "left_anti")
            .select(
                F.lit("state").alias("kind"),
                "master_id",
                F.lit(0).alias("version"),
                *[
                    F.lit(None).cast(f.dataType).alias(f.name)
                    for f in _fold_out_schema().fields[3:11]
                ],
                F.lit(False).alias("stale"),
                F.lit(False).alias("filtered"),
                F.lit(None).cast("long").alias("batch_seq"),
                F.lit(None).cast("int").alias("msg_seq"),
                step_col.alias("fold_step"),
            )
        ).localCheckpoint()

    # Every figure of the step in one job over the materialized outcomes: each message of the
    # step has at least one outcome row.
    tally = outcomes.agg(
        F.count_distinct("batch_seq", "msg_seq").alias("messages"),
        *[F.count_if(F.col("outcome") == str(o)).alias(str(o)) for o in Outcome],
        F.count_if(F.col("outcome") == FAILED).alias(FAILED),
    ).first()
    assert tally is not None
    if int(tally[FAILED]):
        # The masters named by their failure rows' master_id column, never by an error's text.
        raised = outcomes.where(F.col("outcome") == FAILED).select("master_id", "detail")
        _fail_step(
            lake,
            _failure_rows(raised.collect()),
            step=step,
            run_id=run_id,
            quarantine_after=quarantine_after,
        )
    counts = {str(o): int(tally[str(o)]) for o in Outcome}
    n_rewound = rewound.count() if rewinding else 0
    result = FoldStepResult(
        fold_step=step,
        first_batch_seq=first,
        last_batch_seq=last,
        messages=int(tally["messages"]),
        applied=counts.get(str(Outcome.APPLIED), 0),
        duplicates=counts.get(str(Outcome.DUPLICATE), 0),
        filtered=counts.get(str(Outcome.FILTERED), 0),
        dead_lettered=counts.get(str(Outcome.DEAD_LETTERED), 0),
        masters_changed=states.count(),
        waiting_for=waiting,
        rewound_masters=n_rewound,
        changed_batches=tuple(changed),
    )
    if rewinding:
        # The rewound masters' rows from their point on, and the message-level rows of changed
        # batches, are replaced by this step's (all before the commit: `recover` undoes them).
        source = kill_during_write(rewound, "write.rewind")  # test hook: dies mid-delete
        after_point = f"t.master_id = s.master_id AND {_after_point('t', 's')}"
        for table in (MASTER_VERSIONS, MESSAGE_OUTCOMES, DEAD_LETTERS):
            lake.delete_matching(table, source, after_point)
        if changed:
            seqs = ", ".join(str(int(s)) for s in changed)
            for table in (MESSAGE_OUTCOMES, DEAD_LETTERS):
                lake.delete(table, f"master_id IS NULL AND batch_seq IN ({seqs})")
        crash_point("fold.after_rewind")
    for table, rows in (
        (MASTER_VERSIONS, versions),
        (DEAD_LETTERS, dead),
        (MESSAGE_OUTCOMES, outcomes),
    ):
        if table is DEAD_LETTERS and not result.dead_lettered:
            # One dead letter per dead-lettered outcome: none to write, so no commit (a Delta
            # commit, ~1 s, in most steps). The table stays at the version `recover` expects.
            continue
        lake.append(table, rows, txn_app_id=f"sis-fold:{table.name}")
        if table is MASTER_VERSIONS:
            crash_point("fold.after_versions")
    lake.merge_rows(
        MASTER_DOCUMENTS,
        states.select(*[f.name for f in MASTER_DOCUMENTS.schema().fields]),
        keys=("master_id",),
    )
    crash_point("fold.after_documents")

    written = {t.name: lake.version(t) for t in STEP_TABLES}
    # Not restored by recovery: the message_items version this step read, so a later change
    # of these batches can be diffed item by item (see _changed_items).
    written[MESSAGE_ITEMS.name] = items_version
    step_digests = {str(s): logged.digests[s] for s in [*changed, *(s for s, _ in run)]}
    commit = spark.createDataFrame(
        [
            (
                step,
                first if first is not None else last,
                last,
                json.dumps(step_digests, sort_keys=True),
                written[MASTER_DOCUMENTS.name],
                json.dumps(written, sort_keys=True),
                result.messages,
                result.applied,
                result.duplicates,
                result.filtered,
                result.dead_lettered,
                result.masters_changed,
                run_id,
                now,
            )
        ],
        FOLD_STEPS.schema(),
    )
    lake.append(FOLD_STEPS, commit, txn_app_id=f"sis-fold:{FOLD_STEPS.name}")
    return result


def fold_all(lake: Lake, *, selector: str | None = None) -> list[FoldStepResult]:
    """Fold steps until nothing more can be folded (tests and benchmarks)."""
    steps: list[FoldStepResult] = []
    while (r := fold_step(lake, selector=selector)).fold_step is not None:
        steps.append(r)
    return steps
