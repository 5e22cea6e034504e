"""The fold (master documents, their versions, dead letters, outcomes) and the model.

No `from __future__ import annotations` in asset and sensor modules: Dagster reads the
`context` annotation at definition time.
"""

from collections.abc import Iterator

import dagster as dg
from dagster_pyspark import LazyPySparkResource

from sis_platform.assets.message_log import message_items
from sis_platform.assets.partitions import batches_partitions
from sis_platform.assets.policies import TRANSIENT_RETRY
from sis_platform.lake.tables import (
    DEAD_LETTERS,
    EVENTS,
    MARKETS,
    MASTER_DOCUMENTS,
    MASTER_VERSIONS,
    MESSAGE_OUTCOMES,
    MODEL_FAILURES,
    SELECTIONS,
)
from sis_platform.resources.platform import DeltaLakeResource, FeedProcessingResource

FOLD_POOL = "sis_fold"


@dg.multi_asset(
    specs=[
        dg.AssetSpec(
            "master_documents",
            deps=[message_items],
            description="The current master document of every sports event (one row per "
            "master id: its latest version, the `event` XML, and whether it is stale or "
            "filtered). A partition is the fold step run when that batch arrived: it folds "
            "every batch up to the first missing one, in feed order.",
            kinds={"spark", "delta"},
        ),
        dg.AssetSpec(
            "master_versions",
            deps=[message_items],
            description="Every version of every master document, with the message and item "
            "position that produced it.",
            kinds={"spark", "delta"},
        ),
        dg.AssetSpec(
            "dead_letters",
            deps=[message_items],
            description="Messages and items that could not be applied: original bytes, message "
            "id, master id, reason code, error detail and time, for inspection and replay.",
            kinds={"spark", "delta"},
        ),
        dg.AssetSpec(
            "message_outcomes",
            deps=[message_items],
            description="What became of every logged message and item: applied, duplicate, "
            "filtered or dead-lettered (the message log's accounting).",
            kinds={"spark", "delta"},
        ),
    ],
    partitions_def=batches_partitions,
    group_name="masters",
    pool=FOLD_POOL,
    retry_policy=TRANSIENT_RETRY,
)
def fold_masters(
    context: dg.AssetExecutionContext,
    spark: LazyPySparkResource,
    lake: DeltaLakeResource,
    processing: FeedProcessingResource,
) -> Iterator[dg.MaterializeResult]:
    from sis_platform.spark.fold import fold_step

    processing.compiled_selector()  # a bad selector fails here, loudly, before any write
    lk = lake.lake(spark.spark_session)
    result = fold_step(
        lk,
        selector=processing.selector,
        run_id=context.run.run_id,
        quarantine_after=processing.quarantine_after,
        limits=processing.limits(),
    )
    if result.fold_step is None:
        context.log.info(f"nothing to fold: waiting for batch {result.waiting_for}")
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
    common = {
        "fold_step": result.fold_step,
        "first_batch": result.first_batch_seq,
        "last_batch": result.last_batch_seq,
        "waiting_for_batch": result.waiting_for,
        "rewound_masters": result.rewound_masters,
        "changed_batches": dg.MetadataValue.json(list(result.changed_batches)),
    }
    yield dg.MaterializeResult(
        asset_key="master_documents",
        metadata={
            **common,
            "masters_changed": result.masters_changed,
            "table": dg.MetadataValue.path(lk.path(MASTER_DOCUMENTS)),
        },
    )
    yield dg.MaterializeResult(
        asset_key="master_versions",
        metadata={**common, "table": dg.MetadataValue.path(lk.path(MASTER_VERSIONS))},
    )
    yield dg.MaterializeResult(
        asset_key="dead_letters",
        metadata={
            **common,
            "dead_lettered": result.dead_lettered,
            "table": dg.MetadataValue.path(lk.path(DEAD_LETTERS)),
        },
    )
    yield dg.MaterializeResult(
        asset_key="message_outcomes",
        metadata={
            **common,
            "messages": result.messages,
            "applied": result.applied,
            "duplicates": result.duplicates,
            "filtered": result.filtered,
            "dead_lettered": result.dead_lettered,
            "table": dg.MetadataValue.path(lk.path(MESSAGE_OUTCOMES)),
        },
    )


@dg.multi_asset(
    specs=[
        dg.AssetSpec(
            "events",
            deps=["master_documents"],
            description="One row per sports event: sport, country, course, name, start, "
            "status, going, current version and staleness.",
            kinds={"spark", "delta"},
        ),
        dg.AssetSpec(
            "markets",
            deps=["master_documents"],
            description="One row per market of each event: type, status, places.",
            kinds={"spark", "delta"},
        ),
        dg.AssetSpec(
            "selections",
            deps=["master_documents"],
            description="One row per selection (runner) of each market, with its current "
            "fractional and decimal price.",
            kinds={"spark", "delta"},
        ),
    ],
    partitions_def=batches_partitions,
    group_name="model",
    pool=FOLD_POOL,
    retry_policy=TRANSIENT_RETRY,
)
def interpreted_model(
    context: dg.AssetExecutionContext, spark: LazyPySparkResource, lake: DeltaLakeResource
) -> Iterator[dg.MaterializeResult]:
    """The interpreted model that Opportunity Management reads. A master whose document cannot
    be interpreted is left out (no rows) and listed in the model_failures table; the count is
    the `masters_failed` metadata."""
    from sis_platform.spark.model import refresh_model

    lk = lake.lake(spark.spark_session)
    r = refresh_model(lk)
    if r.upgraded:
        context.log.warning(
            f"model table(s) {', '.join(r.upgraded)} recreated with this version's schema: the "
            "model was rebuilt from every master"
        )
    context.log.info(f"model refreshed to fold step {r.fold_step}: {r.masters} master(s)")
    if r.failed:
        # One master's failure does not fail the others (spark/model.py): it is reported here
        # and kept in model_failures, and the master has no model rows until it folds again.
        context.log.warning(
            f"{r.failed} master(s) could not be interpreted and have no model rows (see "
            f"{lk.path(MODEL_FAILURES)}): {', '.join(r.failed_masters)}"
            + (" ..." if r.failed > len(r.failed_masters) else "")
        )
    for name, table, rows in (
        ("events", EVENTS, r.events),
        ("markets", MARKETS, r.markets),
        ("selections", SELECTIONS, r.selections),
    ):
        yield dg.MaterializeResult(
            asset_key=name,
            metadata={
                "fold_step": r.fold_step,
                "masters_refreshed": r.masters,
                "masters_failed": r.failed,
                "rows_refreshed": rows,
                "table": dg.MetadataValue.path(lk.path(table)),
                "failures_table": dg.MetadataValue.path(lk.path(MODEL_FAILURES)),
            },
        )
