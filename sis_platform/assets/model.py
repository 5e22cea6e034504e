"""The interpreted model Opportunity Management reads (events, markets, selections) and its own
records (model_steps, model_failures), as one unpartitioned multi-asset.

Like the fold it is global incremental state: each materialization refreshes the model to the
last committed fold step, rebuilding only the masters that changed since the last refresh
(lake/spark/model.py).

No `from __future__ import annotations` in asset and sensor modules: Dagster reads the
`context` annotation at definition time.
"""

from collections.abc import Iterator

import dagster as dg
from dagster_pyspark import LazyPySparkResource

from sis_platform.assets.masters import FOLD_POOL
from sis_platform.assets.policies import TRANSIENT_RETRY
from sis_platform.assets.table_specs import identifier, location, table_spec
from sis_platform.lake.spark.model import refresh_model
from sis_platform.lake.tables import (
    EVENTS,
    FOLD_STEPS,
    MARKETS,
    MASTER_DOCUMENTS,
    MODEL_FAILURES,
    MODEL_STEPS,
    SELECTIONS,
)
from sis_platform.resources.platform import DeltaLakeResource

WHEN = (
    " Refreshed after the fold in every batch run the queue sensor requests and in a "
    "dead-letter replay; materializing it from the UI refreshes it to the last fold step."
)
# What a refresh reads: the last committed fold step and the master documents as of it.
MODEL_INPUTS = (MASTER_DOCUMENTS.name, FOLD_STEPS.name)


@dg.multi_asset(
    specs=[
        table_spec(
            EVENTS,
            "One row per sports event: sport, country, course, name, start, status, going, "
            "current version and staleness." + WHEN,
            deps=MODEL_INPUTS,
            skippable=True,
        ),
        table_spec(
            MARKETS,
            "One row per market of each event: type, status, places." + WHEN,
            deps=MODEL_INPUTS,
            skippable=True,
        ),
        table_spec(
            SELECTIONS,
            "One row per selection (runner) of each market, with its current fractional and "
            "decimal price." + WHEN,
            deps=MODEL_INPUTS,
            skippable=True,
        ),
        table_spec(
            MODEL_STEPS,
            "One row per model refresh: the fold step it reached and how many masters it "
            "rebuilt." + WHEN,
            deps=MODEL_INPUTS,
            skippable=True,
        ),
        table_spec(
            MODEL_FAILURES,
            "Masters whose document could not be interpreted (the interpreter raised, or a "
            "value does not fit its column) at a refresh: such a master has no rows in events, "
            "markets and selections until it folds again." + WHEN,
            deps=MODEL_INPUTS,
            skippable=True,
        ),
    ],
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
    lk = lake.lake(spark.spark_session)
    r = refresh_model(lk)
    if r.fold_step is None:
        # The model already holds the fold's last step (it ran after a replay that folded
        # nothing new): no new materialization, its latest one still says what it holds.
        context.log.info("model already refreshed to the fold's last step: nothing to do")
        return
    if r.upgraded:
        context.log.warning(
            f"model table(s) {', '.join(r.upgraded)} recreated with this version's schema: the "
            "model was rebuilt from every master"
        )
    context.log.info(f"model refreshed to fold step {r.fold_step}: {r.masters} master(s)")
    if r.failed:
        # One master's failure does not fail the others (lake/spark/model.py): it is reported here
        # and kept in model_failures, and the master has no model rows until it folds again.
        context.log.warning(
            f"{r.failed} master(s) could not be interpreted and have no model rows (see "
            f"{lk.path(MODEL_FAILURES)}): {', '.join(r.failed_masters)}"
            + (" ..." if r.failed > len(r.failed_masters) else "")
        )
    common = {
        "fold_step": identifier(r.fold_step),
        "masters_refreshed": r.masters,
        "masters_failed": r.failed,
        "failures_table": dg.MetadataValue.path(lk.path(MODEL_FAILURES)),
    }
    counts = lk.row_counts(EVENTS, MARKETS, SELECTIONS)
    for table, rows in (
        (EVENTS, r.events),
        (MARKETS, r.markets),
        (SELECTIONS, r.selections),
        (MODEL_STEPS, None),
        (MODEL_FAILURES, None),
    ):
        refreshed = (
            {}
            if rows is None
            else {"rows_refreshed": rows, "dagster/row_count": counts[table.name]}
        )
        yield dg.MaterializeResult(
            asset_key=table.name, metadata={**common, **refreshed, **location(lk, table)}
        )
