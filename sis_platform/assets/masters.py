"""The fold: master documents, their versions, dead letters, outcomes, and the fold's own
records (fold_steps, fold_failures), as one unpartitioned multi-asset.

The fold is global incremental state, not a function of one batch: each materialization is a
fold step over every landed batch not yet folded, up to the first missing one, in feed order
(lake/spark/fold/). It runs in every batch run the queue sensor requests (after that batch's
message_items), in a dead-letter replay (with `replay` config), and whenever a user materializes
it. Every writer of the fold's tables runs in the `sis_fold` pool, one at a time. With live
intake each run records the fold's progress in the serving store (`record_lake_progress`), from
which sis-live exports the lake's lag and dead letters.

No `from __future__ import annotations` in asset and sensor modules: Dagster reads the
`context` annotation at definition time.
"""

from collections.abc import Iterator
from datetime import UTC, datetime
from functools import partial
from typing import Any

import dagster as dg
from dagster_pyspark import LazyPySparkResource
from pydantic import Field

from sis_platform.assets.dead_letter_view import dead_letter_metadata
from sis_platform.assets.feed_checks import (
    FEED_CHECK_SPECS,
    dead_letter_rate_result,
    lake_lag_result,
)
from sis_platform.assets.message_log import classified
from sis_platform.assets.policies import TRANSIENT_RETRY
from sis_platform.assets.table_specs import identifier, location, table_spec
from sis_platform.lake.delta import Lake
from sis_platform.lake.spark.checks import dead_letter_rate
from sis_platform.lake.spark.dead_letter_summary import dead_letter_summary
from sis_platform.lake.spark.fold import (
    FoldStepResult,
    committed_step,
    fold_progress,
    fold_step,
)
from sis_platform.lake.spark.items import ItemsSummary
from sis_platform.lake.spark.model import model_step
from sis_platform.lake.spark.replay import ReplayResult, replay_dead_letters
from sis_platform.lake.tables import (
    BATCH_LOG,
    DEAD_LETTERS,
    FOLD_FAILURES,
    FOLD_STEPS,
    MASTER_DOCUMENTS,
    MASTER_INDEX,
    MASTER_VERSIONS,
    MESSAGE_ITEMS,
    MESSAGE_OUTCOMES,
    RAW_MESSAGES,
    Table,
)
from sis_platform.log.landing.backlog import backlog_after, landed_messages
from sis_platform.resources.platform import (
    DeltaLakeResource,
    FeedChecksResource,
    FeedProcessingResource,
    LandingZoneResource,
)
from sis_platform.resources.serving import ServingStoreResource
from sis_platform.runtime.faults import LAKE_PROGRESS_POINTS, crash_point
from sis_platform.runtime.logs import concerning
from sis_platform.serving import LakeProgress, ServingUnavailable

FOLD_POOL = "sis_fold"
WHEN = (
    " Written by the fold, which runs in every batch run the queue sensor requests and in a "
    "dead-letter replay; materializing it from the UI folds whatever is landed and classified "
    "and not yet folded."
)
# What the fold reads: every batch's items and their summary, and the original bytes of the
# messages it dead-letters.
FOLD_INPUTS = (MESSAGE_ITEMS.name, BATCH_LOG.name, RAW_MESSAGES.name)

FOLD_SPECS = [
    table_spec(
        MASTER_DOCUMENTS,
        "The current master document of every sports event (one row per master id: its "
        "latest version, the `event` XML, and whether it is stale or filtered), partitioned "
        "by the master's home block (`first_block`, see master_index)." + WHEN,
        deps=FOLD_INPUTS,
        skippable=True,
    ),
    table_spec(
        MASTER_VERSIONS,
        "Every version of every master document, with the message and item position that "
        "produced it." + WHEN,
        deps=FOLD_INPUTS,
        skippable=True,
    ),
    table_spec(
        MASTER_INDEX,
        "Every master id the fold has given a state, with its home block (`first_block`: "
        "the block of 500 batches in which it was first folded), the partition of "
        "master_documents, events, markets and selections that holds it for good." + WHEN,
        deps=FOLD_INPUTS,
        skippable=True,
    ),
    table_spec(
        DEAD_LETTERS,
        "Messages and items that could not be applied: original bytes, message id, master id, "
        "reason code, error detail and time, for inspection and replay." + WHEN,
        deps=FOLD_INPUTS,
        skippable=True,
    ),
    table_spec(
        MESSAGE_OUTCOMES,
        "What became of every logged message and item: applied, duplicate, filtered or "
        "dead-lettered (the message log's accounting)." + WHEN,
        deps=FOLD_INPUTS,
        skippable=True,
    ),
    table_spec(
        FOLD_STEPS,
        "One row per committed fold step: the batches it folded, its counts, the Delta "
        "version of every table it wrote (what recovery restores after an interrupted step) "
        "and the run that made it." + WHEN,
        deps=FOLD_INPUTS,
        skippable=True,
    ),
    table_spec(
        FOLD_FAILURES,
        "Masters whose fold failed for an unknown reason (an error, a worker that died, an "
        "item over SIS_ITEM_BUDGET_SECONDS), one row per master and failed attempt. After "
        "SIS_QUARANTINE_AFTER failures the master is quarantined; a replay of its dead letters "
        "releases it." + WHEN,
        deps=FOLD_INPUTS,
        skippable=True,
    ),
]


class ReplaySelection(dg.Config):
    """Which dead letters a replay takes (each filter unless empty)."""

    reasons: list[str] = Field(
        default_factory=list,
        description="Replay only dead letters with these reason codes (all when empty).",
    )
    batches: list[str] = Field(
        default_factory=list,
        description="Replay only dead letters of these batches (partition keys; all when empty).",
    )


class FoldConfig(dg.Config):
    replay: ReplaySelection | None = Field(
        default=None,
        description="Set by the replay_dead_letters job: classify the batches holding these "
        "dead letters again, then rewind the masters they touch and refold them. Unset: fold "
        "what is landed and not yet folded.",
    )


@dg.multi_asset(
    specs=FOLD_SPECS,
    check_specs=FEED_CHECK_SPECS,
    group_name="masters",
    pool=FOLD_POOL,
    retry_policy=TRANSIENT_RETRY,
)
def fold_masters(
    context: dg.AssetExecutionContext,
    config: FoldConfig,
    spark: LazyPySparkResource,
    lake: DeltaLakeResource,
    processing: FeedProcessingResource,
    landing: LandingZoneResource,
    feed_checks: FeedChecksResource,
    serving: ServingStoreResource,
) -> Iterator[dg.MaterializeResult | dg.AssetObservation | dg.AssetCheckResult]:
    processing.compiled_selector()  # a bad selector fails here, loudly, before any write
    processing.compiled_priority()
    lk = lake.lake(spark.spark_session)
    replayed: ReplayResult | None = None
    if config.replay is None:
        result = fold_step(
            lk,
            selector=processing.selector,
            run_id=context.run.run_id,
            quarantine_after=processing.quarantine_after,
            limits=processing.limits(),
            priority=processing.priority,
            window=processing.dedup_window(),
        )
    else:
        replayed = replay(context, config.replay, lk, processing, landing.root)
        result = replayed.step
    log_step(context, result)
    if serving.records_lake_progress:
        record_lake_progress(context, lk, serving)
    # Where the fold stands: the step just committed, or the last one before it.
    if result.fold_step is not None and result.last_batch_seq is not None:
        step, folded_through = result.fold_step, result.last_batch_seq
    else:
        last = committed_step(lk)
        step, folded_through = last.fold_step, last.last_batch_seq
    if result.fold_step is not None or replayed is not None or model_step(lk) < step:
        # A new step; or a step committed before whose model refresh never ran (its run
        # ended between the two): announced again, so the model downstream catches up.
        yield from step_results(lk, result, replayed, step, folded_through)
    else:
        # Nothing new (a backfill of batches already folded, a batch waiting for an earlier
        # one): the tables are as their latest materialization says, so none is recorded and
        # the model is skipped; an observation says where the fold stands.
        yield dg.AssetObservation(
            asset_key=MASTER_DOCUMENTS.name,
            metadata={
                "fold_step": identifier(step),
                "last_batch": identifier(folded_through),
                "waiting_for_batch": result.waiting_for,
            },
        )
    catalog = landing.catalog()
    yield lake_lag_result(backlog_after(catalog, folded_through), datetime.now(UTC), feed_checks)
    rate = None
    if result.fold_step is not None and folded_through:
        # The step's new batches; the batches it refolded are found by their dead letters.
        first = result.first_batch_seq
        batches = range(first, folded_through + 1) if first is not None else range(0)
        rate = dead_letter_rate(
            lk,
            result.fold_step,
            batches,
            feed_checks.dead_letter_rate_warn,
            batch_messages=partial(landed_messages, catalog),
        )
    yield dead_letter_rate_result(rate, result.fold_step)


def replay(
    context: dg.AssetExecutionContext,
    selection: ReplaySelection,
    lake: Lake,
    processing: FeedProcessingResource,
    landing_root: str,
) -> ReplayResult:
    """Replay the selected dead letters. Each batch classified again is recorded as a
    materialization of its message_items and batch_log partitions (docs/operations.md,
    "Dead-letter replay")."""

    def relogged(key: str, summary: ItemsSummary) -> None:
        for name, metadata in classified(lake, summary).items():
            context.log_event(
                dg.AssetMaterialization(
                    name,
                    partition=key,
                    description="classified again by a dead-letter replay",
                    metadata=metadata,
                )
            )

    result = replay_dead_letters(
        lake,
        reasons=selection.reasons,
        batch_keys=selection.batches,
        limits=processing.limits(),
        redelivery_limit=processing.redelivery_limit,
        selector=processing.selector,
        quarantine_after=processing.quarantine_after,
        window=processing.dedup_window(),
        run_id=context.run.run_id,
        landing_root=landing_root,
        on_relogged=relogged,
    )
    context.log.info(
        f"replayed {result.dead_letters} dead letter(s) from {len(result.batches)} batch(es); "
        f"{result.step.rewound_masters} master(s) rewound and refolded"
    )
    return result


def record_lake_progress(
    context: dg.AssetExecutionContext, lake: Lake, serving: ServingStoreResource
) -> None:
    """Record the fold's progress in the serving store, where sis-live exports it (its
    /metrics: docs/operations.md, "Monitoring"). Every run records it, a run that folded nothing
    too: the record is read from fold_steps, so a run that ended between its step's commit and
    this record is made good by the next run. The store unavailable does not fail the fold (the
    lake's tables are committed); the next run records it."""
    progress = fold_progress(lake)
    if progress is None:
        return  # nothing folded yet: no record, and sis-live exports no lake metrics
    record = LakeProgress(
        progress.fold_step, progress.last_batch_seq, progress.committed_at, progress.dead_letters
    )
    crash_point(LAKE_PROGRESS_POINTS[0])
    try:
        with serving.open_writer() as store:
            store.record_lake_progress(record)
    except ServingUnavailable as error:
        context.log.warning(f"the lake's progress is not recorded in the serving store: {error}")


def log_step(context: dg.AssetExecutionContext, result: FoldStepResult) -> None:
    if result.fold_step is None:
        context.log.info(
            f"nothing to fold: waiting for batch {result.waiting_for}",
            extra=concerning(batch=result.waiting_for),
        )
    if result.rewound_masters:
        context.log.warning(
            f"rewound and refolded {result.rewound_masters} master(s): the items of folded "
            f"batch(es) {list(result.changed_batches)} changed since they were folded"
        )
    if result.fold_step is not None:
        context.log.info(
            f"fold step {result.fold_step}: batches {result.first_batch_seq}..."
            f"{result.last_batch_seq}, {result.applied} applied, {result.duplicates} duplicate, "
            f"{result.filtered} filtered, {result.dead_lettered} dead-lettered"
        )


def step_results(
    lake: Lake,
    result: FoldStepResult,
    replayed: ReplayResult | None,
    step: int,
    folded_through: int,
) -> Iterator[dg.MaterializeResult]:
    """One materialization per fold table, each with the step's common metadata (`step` and
    `folded_through`: the last committed fold step and its last batch, this one's if it folded;
    `new_fold_step` says which, and the counts are this run's)."""
    common: dict[str, Any] = {
        "fold_step": identifier(step),
        "new_fold_step": result.fold_step is not None,
        "first_batch": identifier(result.first_batch_seq),
        "last_batch": identifier(folded_through),
        "waiting_for_batch": result.waiting_for,
        "rewound_masters": result.rewound_masters,
        "changed_batches": dg.MetadataValue.json(list(result.changed_batches)),
    }
    if replayed is not None:
        common |= {
            "replayed_dead_letters": replayed.dead_letters,
            "replayed_batches": dg.MetadataValue.json(list(replayed.batches)),
        }
    counts = {
        "messages": result.messages,
        "applied": result.applied,
        "duplicates": result.duplicates,
        "filtered": result.filtered,
        "dead_lettered": result.dead_lettered,
    }
    own: dict[Table, dict[str, Any]] = {
        MASTER_DOCUMENTS: {
            "masters_changed": result.masters_changed,
            "dagster/row_count": lake.read(MASTER_DOCUMENTS).count(),
        },
        MASTER_VERSIONS: {},
        MASTER_INDEX: {},
        DEAD_LETTERS: {
            "dead_lettered": result.dead_lettered,
            **dead_letter_metadata(dead_letter_summary(lake, step)),
        },
        MESSAGE_OUTCOMES: counts,
        FOLD_STEPS: {**counts, "masters_changed": result.masters_changed},
        FOLD_FAILURES: {},
    }
    for table, metadata in own.items():
        yield dg.MaterializeResult(
            asset_key=table.name, metadata={**common, **metadata, **location(lake, table)}
        )
