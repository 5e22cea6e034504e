"""One fold step, start to commit: recover, plan, dedupe, fold, write, commit.

The step reads every table it writes at a version pinned after recovery: Delta invalidates
cached plans of a table it writes to, and a plan that re-read message_outcomes after this step's
own append would find every message of the step "already seen". The modules beside this one own
each part: ledger.py (recovery and the commit point), plan.py (which batches), rewind.py
(masters whose input changed), dedupe.py (exactly once), quarantine.py (unknown failures),
homes.py (the partitions the step's masters live in), worker.py (the fold in the Python workers)
and outputs.py (the rows written).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, NoReturn

from pyspark.sql import functions as F

from sis_platform.domain.dedup import DEFAULT_DEDUP_WINDOW, DedupWindow
from sis_platform.domain.limits import DEFAULT_LIMITS, Limits
from sis_platform.domain.priority import Priority
from sis_platform.domain.reasons import Outcome
from sis_platform.lake.spark.fold.dedupe import tag_duplicates
from sis_platform.lake.spark.fold.homes import Homes
from sis_platform.lake.spark.fold.ledger import (
    FOLD_WRITER,
    FoldStepResult,
    commit_step,
    recover,
)
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
from sis_platform.lake.spark.fold.plan import StepPlan, plan_step
from sis_platform.lake.spark.fold.quarantine import (
    died_in_flight,
    fail_step,
    failure_rows,
    hold_quarantined,
    known_failures,
)
from sis_platform.lake.spark.fold.rewind import Rewind
from sis_platform.lake.spark.fold.worker import (
    FOLD_OUT_SCHEMA,
    WorkerPlan,
    fold_input,
    fold_partition,
)
from sis_platform.lake.tables import (
    BATCH_LOG,
    FIRST_BLOCK,
    FOLD_FAILURES,
    MASTER_DOCUMENTS,
    MASTER_INDEX,
    MASTER_VERSIONS,
    MESSAGE_ITEMS,
    MESSAGE_OUTCOMES,
    RAW_MESSAGES,
)
from sis_platform.lake.upkeep import FOLD_UPKEEP_TABLES, run_upkeep
from sis_platform.runtime.faults import injected_fold_failure, kill_in_worker
from sis_platform.runtime.guard import InFlightFolder
from sis_platform.settings import DEFAULT_QUARANTINE_AFTER

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from pyspark.sql import DataFrame

    from sis_platform.lake.delta import Lake


@dataclass(frozen=True)
class StepInput:
    """The rows a step folds, tagged, and what it knows before folding them."""

    valid: DataFrame  # first copies of valid items of masters not quarantined
    facts: MessageFacts  # duplicates, invalid messages, quarantined masters' items
    state: DataFrame  # master_documents rows of the masters in `valid` (rewound: their point)
    timed_out: dict[tuple[str, int], str]  # items that overran the budget before
    homes: Homes  # the home block of each of the step's masters
    documents: DataFrame  # master_documents (committed) in the partitions of `homes`


def fold_step(
    lake: Lake,
    *,
    selector: str | None = None,
    run_id: str | None = None,
    max_batches: int | None = None,
    rewind: Mapping[str, int] | None = None,
    quarantine_after: int = DEFAULT_QUARANTINE_AFTER,
    limits: Limits = DEFAULT_LIMITS,
    priority: str | None = None,
    window: DedupWindow = DEFAULT_DEDUP_WINDOW,
) -> FoldStepResult:
    """Recover, then fold the next gap-free run of batches and commit it as one step.

    `priority` (SIS_PRIORITY): master_documents takes the masters of each priority class in a
    commit of their own, in order, before the step's other writes (outputs.write_outputs).

    Masters whose folded batches' items changed since are rewound and refolded in the same step
    (rewind.py); `rewind` asks for the same explicitly (master id -> batch to refold from):
    dead-letter replay after a fold fix, where the items themselves are the same.
    """
    lake.claim_writer(FOLD_WRITER)
    committed, versions_now = recover(lake)
    lake.ensure(MESSAGE_ITEMS, BATCH_LOG, FOLD_FAILURES)
    plan = plan_step(lake, committed, max_batches=max_batches)
    if not plan.run and not plan.changed and not rewind:
        return FoldStepResult(None, waiting_for=plan.waiting_for or committed.last_batch_seq + 1)
    now = datetime.now(UTC)
    log_items = lake.read(MESSAGE_ITEMS, version=plan.items_version).where(
        F.col("batch_seq") <= F.lit(plan.last)
    )
    documents = lake.read(MASTER_DOCUMENTS, version=versions_now[MASTER_DOCUMENTS.name])
    rewound = None
    if plan.changed or rewind:
        rewound = Rewind.plan(
            lake,
            log_items=log_items,
            versions=lake.read(MASTER_VERSIONS, version=versions_now[MASTER_VERSIONS.name]),
            changed=plan.changed,
            changed_keys=plan.changed_keys,
            folded=plan.folded,
            explicit=rewind,
        )
    outcomes_then = lake.read(MESSAGE_OUTCOMES, version=versions_now[MESSAGE_OUTCOMES.name])
    step_input = _step_input(
        lake,
        plan,
        log_items,
        outcomes_then,
        documents,
        rewound,
        quarantine_after,
        window,
        index_version=versions_now[MASTER_INDEX.name],
    )
    worker_plan = WorkerPlan(
        selector_text=selector,
        limits=limits,
        timed_out=step_input.timed_out,
        injected=injected_fold_failure(),
        priority_text=priority,
    )
    fail = partial(
        fail_step, lake, step=plan.step, run_id=run_id, quarantine_after=quarantine_after
    )
    folded = _fold(lake, step_input, plan.step, worker_plan, fail)

    step_col = F.lit(plan.step).cast("long")
    outcomes = outcome_rows(folded, step_input.facts, step_col)
    states = state_rows(folded, step_col)
    if rewound is not None:
        states = rewound.with_tombstones(states, step_input.documents, step_col)
    states = step_input.homes.placed(states)
    figures = tally(outcomes)
    if figures.failed:
        fail(failure_rows(failed_masters(outcomes).collect()))
    result = FoldStepResult(
        fold_step=plan.step,
        first_batch_seq=plan.first,
        last_batch_seq=plan.last,
        messages=figures.messages,
        applied=figures.count(Outcome.APPLIED),
        duplicates=figures.count(Outcome.DUPLICATE),
        filtered=figures.count(Outcome.FILTERED),
        dead_lettered=figures.count(Outcome.DEAD_LETTERED),
        masters_changed=states.count(),
        waiting_for=plan.waiting_for,
        rewound_masters=rewound.points.count() if rewound is not None else 0,
        changed_batches=tuple(plan.changed),
    )
    if rewound is not None:
        rewound.delete_replaced_rows(lake)
    raw = lake.read(RAW_MESSAGES).where(
        F.col("batch_key").isin(plan.keys + plan.changed_keys)
        | (F.col("batch_seq") <= F.lit(plan.last) if rewound is not None else F.lit(False))
    )
    outputs = StepOutputs(
        versions=version_rows(folded, step_col),
        dead_letters=dead_letter_rows(outcomes, raw, now),
        outcomes=outcomes,
        states=states,
        index=step_input.homes.index_rows(states, step_col),
        blocks=step_input.homes.blocks,
    )
    classes = len(Priority.compile(priority).selectors) if priority else 0
    write_outputs(lake, outputs, dead_lettered=result.dead_lettered, priority_classes=classes)
    # Before the commit point: the step's row records each table's version after its upkeep,
    # and a crash in it is undone by the next step's recovery with the step's writes.
    run_upkeep(
        lake,
        FOLD_UPKEEP_TABLES,
        role="fold",
        before=committed.fold_step,
        after=plan.step,
        settings=lake.upkeep,
    )
    commit_step(
        lake,
        result,
        first_batch_seq=plan.first if plan.first is not None else plan.last,
        digests=plan.digests(),
        items_version=plan.items_version,
        log_version=plan.log_version,
        run_id=run_id,
        committed_at=now,
        master_blocks=step_input.homes.blocks,
    )
    return result


def _step_input(
    lake: Lake,
    plan: StepPlan,
    log_items: DataFrame,
    outcomes_then: DataFrame,
    documents: DataFrame,
    rewound: Rewind | None,
    quarantine_after: int,
    window: DedupWindow,
    *,
    index_version: int,
) -> StepInput:
    """The step's rows (the new batches', and a rewind's), deduplicated and split: what is
    folded, from which states, and what ends without a fold."""
    new_items = log_items.where(F.col("batch_key").isin(plan.keys))
    if rewound is None:
        items = new_items
        message_level = F.lit(True)
        step_messages: int | None = plan.run_messages()
        first_batch = plan.first
    else:
        items = rewound.step_items(log_items, new_items)
        # Message-level rows (duplicate, invalid) are emitted for new and changed batches only;
        # those of unchanged batches stand.
        message_level = F.col("batch_key").isin(plan.keys + plan.changed_keys)
        step_messages = None
        first_batch = None  # a rewound master's items may start at any earlier batch
    tagged = tag_duplicates(
        items, outcomes_then, step_messages=step_messages, window=window, first_batch=first_batch
    )
    duplicates = (
        tagged.where(F.col("duplicate") & message_level)
        .select("message_id", "batch_seq", "msg_seq")
        .distinct()
    )
    invalid = tagged.where("duplicate IS NULL AND status = 'invalid'")
    valid = tagged.where("duplicate IS NULL AND status = 'item'")
    # Poison isolation for unknown failures: a quarantined master's items are held back as
    # dead letters, so the fold of every other master goes on.
    known = known_failures(lake, quarantine_after)
    valid, held = hold_quarantined(valid, known.quarantined)
    # The step's masters (thousands at most per batch), and a rewind's (a tombstone needs the
    # home of a master whose items are all gone).
    masters = valid.select("master_id", F.col("batch_seq").alias("first_seq"))
    if rewound is not None:
        masters = masters.unionByName(
            rewound.ids.select("master_id", F.lit(None).cast("long").alias("first_seq"))
        )
    homes = Homes.find(lake, masters, index_version=index_version)
    documents = homes.documents(documents)
    # Broadcast: the documents of the homes' other masters are read and dropped where they
    # lie, never shuffled.
    affected = F.broadcast(valid.select("master_id").distinct())
    state = documents.drop(FIRST_BLOCK).join(affected, "master_id", "left_semi")
    if rewound is not None:
        state = rewound.starting_states(state)
    return StepInput(
        valid, MessageFacts(duplicates, invalid, held), state, known.timed_out, homes, documents
    )


def _fold(
    lake: Lake,
    step_input: StepInput,
    step: int,
    worker_plan: WorkerPlan,
    fail: Callable[..., NoReturn],
) -> DataFrame:
    """The fold's output rows (worker.FOLD_OUT_SCHEMA), materialized. A worker that died on
    a master (its in-flight marker says which) fails the step against that master; any other
    failure is not attributable to a master: a transient one, retried as such."""
    folder = InFlightFolder.create(lake.base_path, f"fold-{step}")
    try:
        fold = kill_in_worker(
            partial(fold_partition, plan=worker_plan, inflight_dir=folder.path), "fold.mid_fold"
        )
        try:
            return (
                fold_input(step_input.valid, step_input.state)
                .mapInArrow(fold, FOLD_OUT_SCHEMA)
                .localCheckpoint()
            )
        except Exception as error:
            died = died_in_flight(folder, error)
            if not died:
                raise
            fail(died, cause=error)
    finally:
        folder.remove()


def fold_all(lake: Lake, *, selector: str | None = None) -> list[FoldStepResult]:
    """Fold steps until nothing more can be folded (tests and benchmarks)."""
    steps: list[FoldStepResult] = []
    while (r := fold_step(lake, selector=selector)).fold_step is not None:
        steps.append(r)
    return steps
