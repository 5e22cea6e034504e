"""The fold on Spark: items to master documents, per master id in feed order, parallel across ids.

One fold step takes the gap-free run of batches after the last committed step (the fold never
advances over a missing batch: DESIGN.md invariant 3), drops messages already seen by message
id (invariant 2), dead-letters invalid messages, and folds each master's items with the domain's
`fold_master` inside `cogroup(...).applyInPandas`, one Python call per master, next to the data.

Commit protocol. A step appends to master_versions, dead_letters and message_outcomes (every
row tagged with the step), merges the new states into master_documents, and finally appends its
row to fold_steps: that last append is the commit point, and it records the master_documents
version the step produced. Before each step, `recover` undoes whatever an interrupted step left
behind: it deletes appended rows of steps after the last committed one and restores
master_documents to the version the last committed step recorded. So a crash anywhere in a
step leaves no trace once the next step starts, and the refold produces the same rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from sis_platform.domain.reasons import Outcome
from sis_platform.faults import crash_point, kill_during_write, kill_in_worker
from sis_platform.lake.tables import (
    BATCH_LOG,
    DEAD_LETTERS,
    FOLD_APPEND_TABLES,
    FOLD_STEPS,
    MASTER_DOCUMENTS,
    MASTER_VERSIONS,
    MESSAGE_ITEMS,
    MESSAGE_OUTCOMES,
    RAW_MESSAGES,
)

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql.types import StructType

    from sis_platform.lake.delta import Lake

FOLD_TABLES = (MASTER_VERSIONS, MASTER_DOCUMENTS, DEAD_LETTERS, MESSAGE_OUTCOMES, FOLD_STEPS)


@dataclass(frozen=True)
class CommittedStep:
    fold_step: int  # = the last batch number folded; 0 before the first step
    master_documents_version: int
    table_versions: dict[str, int]  # Delta version of each fold table after the step


@dataclass(frozen=True)
class FoldStepResult:
    fold_step: int | None  # None when nothing could be folded
    first_batch_seq: int | None = None
    last_batch_seq: int | None = None
    messages: int = 0
    applied: int = 0
    duplicates: int = 0
    filtered: int = 0
    dead_lettered: int = 0
    masters_changed: int = 0
    waiting_for: int | None = None  # the missing batch number that blocks the fold, if any


def _fold_out_schema() -> StructType:
    from pyspark.sql import types as T

    return T.StructType(
        [
            T.StructField("kind", T.StringType(), False),  # version | result | state
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


def committed_step(lake: Lake) -> CommittedStep:
    import json

    from pyspark.sql import functions as F

    row = (
        lake.read(FOLD_STEPS)
        .orderBy(F.col("fold_step").desc())
        .select("fold_step", "master_documents_version", "table_versions")
        .first()
    )
    if row is None:
        # Before the first step every table is as `ensure` created it: version 0.
        return CommittedStep(0, 0, {t.name: 0 for t in STEP_TABLES})
    return CommittedStep(
        int(row["fold_step"]), int(row["master_documents_version"]),
        {k: int(v) for k, v in json.loads(row["table_versions"]).items()},
    )


def recover(lake: Lake) -> tuple[CommittedStep, dict[str, int]]:
    """Undo an interrupted step (see the module docstring). Returns the last committed step
    and the current version of each step table (to read them pinned)."""
    lake.ensure(*FOLD_TABLES)
    committed = committed_step(lake)
    current: dict[str, int] = {}
    for table in STEP_TABLES:
        version = lake.version(table)
        committed_version = committed.table_versions[table.name]
        if version != committed_version:
            # A step wrote here and died before its fold_steps row: its writes never happened.
            lake.table(table).restoreToVersion(committed_version)
            version = lake.version(table)
        current[table.name] = version
    return committed, current


def foldable_batches(lake: Lake, after: int) -> tuple[list[tuple[int, str]], int | None]:
    """The gap-free run of processed batches after batch `after`, and the first missing batch
    number beyond which later processed batches wait (None if nothing waits)."""
    rows = lake.read(BATCH_LOG).select("batch_seq", "batch_key").collect()
    by_seq = {int(r["batch_seq"]): str(r["batch_key"]) for r in rows}
    run: list[tuple[int, str]] = []
    seq = after + 1
    while seq in by_seq:
        run.append((seq, by_seq[seq]))
        seq += 1
    waiting = seq if any(s > seq for s in by_seq) else None
    return run, waiting


def _fold_groups(
    items: pd.DataFrame, state: pd.DataFrame, *, selector_text: str | None
) -> pd.DataFrame:
    import pandas as pd

    from sis_platform.domain.fold import MasterState, fold_master
    from sis_platform.domain.items import Item

    columns = [f.name for f in _fold_out_schema().fields]
    if items.empty:
        return pd.DataFrame(columns=columns)
    items = items.sort_values(["batch_seq", "msg_seq", "position"], kind="stable")
    master_id = str(items["master_id"].iloc[0])
    current = None
    if not state.empty:
        s = state.iloc[0]
        current = MasterState(
            master_id=master_id,
            version=int(s["version"]),
            document=s["document"].encode("utf-8") if s["document"] is not None else None,
            stale=bool(s["stale"]),
            filtered=bool(s["filtered"]),
        )
    where: dict[tuple[str, int], tuple[int, int]] = {}
    batch: list[Item] = []
    for rec in items.itertuples(index=False):
        where[(rec.message_id, int(rec.position))] = (int(rec.batch_seq), int(rec.msg_seq))
        batch.append(
            Item(
                message_id=rec.message_id,
                position=int(rec.position),
                master_id=master_id,
                category=rec.category,
                type=rec.type,
                payload=bytes(rec.payload),
            )
        )
    result = fold_master(
        master_id, current, batch, selector=_selector(selector_text), patches=_patch_cache()
    )
    rows: list[tuple[object, ...]] = []
    for v in result.versions:
        b, m = where[(v.message_id, v.position)]
        rows.append(
            ("version", master_id, v.version, v.message_id, v.position, v.operation,
             v.document.decode("utf-8"), None, None, None, None, None, None, b, m)
        )
    for r in result.results:
        b, m = where[(r.message_id, r.position)]
        rows.append(
            ("result", master_id, r.version, r.message_id, r.position, None, None,
             str(r.outcome), str(r.reason) if r.reason else None, r.detail, r.warning, None,
             None, b, m)
        )
    st = result.state
    # Like the reference, an orphan update leaves no master behind.
    if st.exists or st.stale or st.filtered:
        rows.append(
            ("state", master_id, st.version, None, None, None,
             st.document.decode("utf-8") if st.document is not None else None, None, None,
             None, None, st.stale, st.filtered, None, None)
        )
    return pd.DataFrame.from_records(rows, columns=columns)


_SELECTORS: dict[str, object] = {}
_PATCHES = None  # a PatchCache per Python worker, made on first use


def _patch_cache():  # type: ignore[no-untyped-def]
    global _PATCHES
    if _PATCHES is None:
        from sis_platform.domain.fold import PatchCache

        _PATCHES = PatchCache()
    return _PATCHES


def _selector(text: str | None):  # type: ignore[no-untyped-def]
    # Compiled once per Python worker, not once per master.
    if not text:
        return None
    if text not in _SELECTORS:
        from sis_platform.domain.selector import Selector

        _SELECTORS[text] = Selector.compile(text)
    return _SELECTORS[text]


def fold_step(
    lake: Lake,
    *,
    selector: str | None = None,
    run_id: str | None = None,
    max_batches: int | None = None,
) -> FoldStepResult:
    """Recover, then fold the next gap-free run of batches and commit it as one step."""
    import json
    from functools import partial

    from pyspark.sql import Window
    from pyspark.sql import functions as F

    committed, versions_now = recover(lake)
    run, waiting = foldable_batches(lake, committed.fold_step)
    if max_batches is not None:
        run = run[:max_batches]
    if not run:
        return FoldStepResult(None, waiting_for=waiting or committed.fold_step + 1)
    first, last = run[0][0], run[-1][0]
    step = last
    keys = [k for _, k in run]
    spark = lake.spark
    now = datetime.now(UTC)

    # Every table the step writes is read at a pinned version: Delta invalidates cached plans
    # of a table it writes to, and a plan that re-read message_outcomes after this step's own
    # append would find every message of the step "already seen".
    outcomes_version = versions_now[MESSAGE_OUTCOMES.name]
    documents_version = versions_now[MASTER_DOCUMENTS.name]
    items = lake.read(MESSAGE_ITEMS).where(F.col("batch_key").isin(keys))
    digest_rows = lake.read(BATCH_LOG).where(F.col("batch_key").isin(keys)).orderBy("batch_seq")
    items_digest = ",".join(r["items_digest"] for r in digest_rows.collect())

    # Exactly once (SPORTSDATA.md): the first copy of a message id in landing order counts;
    # later copies, in this step or after an earlier step, are duplicates.
    messages = items.select("message_id", "batch_seq", "msg_seq").distinct()
    first_copy = Window.partitionBy("message_id").orderBy("batch_seq", "msg_seq")
    seen = lake.read(MESSAGE_OUTCOMES, version=outcomes_version).select("message_id").distinct()
    ranked = messages.withColumn("copy", F.row_number().over(first_copy))
    dup_keys = ranked.where("copy > 1").select("batch_seq", "msg_seq").unionByName(
        ranked.where("copy = 1")
        .join(seen, "message_id", "left_semi")
        .select("batch_seq", "msg_seq")
    ).withColumn("duplicate", F.lit(True))
    # Materialized once (localCheckpoint): every output below derives from it.
    tagged = items.join(dup_keys, ["batch_seq", "msg_seq"], "left").localCheckpoint()

    dup_msgs = tagged.where("duplicate").select("message_id", "batch_seq", "msg_seq").distinct()
    invalid = tagged.where("duplicate IS NULL AND status = 'invalid'")
    valid = tagged.where("duplicate IS NULL AND status = 'item'")

    affected = valid.select("master_id").distinct()
    state = lake.read(MASTER_DOCUMENTS, version=documents_version).join(
        affected, "master_id", "left_semi"
    )
    fold_groups = kill_in_worker(partial(_fold_groups, selector_text=selector), "fold.mid_fold")
    folded = (
        valid.select(
            "master_id", "message_id", "position", "category", "type", "payload", "batch_seq",
            "msg_seq",
        )
        .groupBy("master_id")
        .cogroup(state.groupBy("master_id"))
        .applyInPandas(fold_groups, _fold_out_schema())
        .localCheckpoint()
    )

    step_col = F.lit(step).cast("long")
    raw = lake.read(RAW_MESSAGES).where(F.col("batch_key").isin(keys))
    raw_cols = raw.select("batch_seq", "msg_seq", "batch_key", "body", "delivery_count")

    # Outcomes: one row per item, one per duplicate or invalid message (position null).
    results = folded.where("kind = 'result'")
    outcomes = (
        results.select(
            "message_id", "batch_seq", "msg_seq", "position", "master_id", "outcome", "version",
            "reason", "detail", "warning",
        )
        .unionByName(
            dup_msgs.select(
                "message_id", "batch_seq", "msg_seq",
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
                "message_id", "batch_seq", "msg_seq",
                F.lit(None).cast("int").alias("position"),
                F.lit(None).cast("string").alias("master_id"),
                F.lit(str(Outcome.DEAD_LETTERED)).alias("outcome"),
                F.lit(None).cast("int").alias("version"),
                "reason", "detail",
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

    counts = {
        str(r["outcome"]): int(r["n"])
        for r in outcomes.groupBy("outcome").agg(F.count("*").alias("n")).collect()
    }
    result = FoldStepResult(
        fold_step=step,
        first_batch_seq=first,
        last_batch_seq=last,
        messages=messages.count(),
        applied=counts.get(str(Outcome.APPLIED), 0),
        duplicates=counts.get(str(Outcome.DUPLICATE), 0),
        filtered=counts.get(str(Outcome.FILTERED), 0),
        dead_lettered=counts.get(str(Outcome.DEAD_LETTERED), 0),
        masters_changed=states.count(),
        waiting_for=waiting,
    )
    lake.append(MASTER_VERSIONS, versions)
    crash_point("fold.after_versions")
    lake.append(DEAD_LETTERS, dead)
    lake.append(MESSAGE_OUTCOMES, outcomes)
    states = kill_during_write(states, "write.master_documents")
    (
        lake.table(MASTER_DOCUMENTS)
        .alias("t")
        .merge(states.select(*[f.name for f in MASTER_DOCUMENTS.schema().fields]).alias("s"),
               "t.master_id = s.master_id")
        .whenMatchedUpdateAll()
        .whenNotMatchedInsertAll()
        .execute()
    )
    crash_point("fold.after_documents")

    written = {t.name: lake.version(t) for t in STEP_TABLES}
    commit = spark.createDataFrame(
        [
            (
                step, first, last, items_digest, written[MASTER_DOCUMENTS.name],
                json.dumps(written, sort_keys=True), result.messages,
                result.applied, result.duplicates, result.filtered, result.dead_lettered,
                result.masters_changed, run_id, now,
            )
        ],
        FOLD_STEPS.schema(),
    )
    lake.append(FOLD_STEPS, commit)
    return result


def fold_all(lake: Lake, *, selector: str | None = None) -> list[FoldStepResult]:
    """Fold steps until nothing more can be folded (tests and benchmarks)."""
    steps: list[FoldStepResult] = []
    while (r := fold_step(lake, selector=selector)).fold_step is not None:
        steps.append(r)
    return steps

