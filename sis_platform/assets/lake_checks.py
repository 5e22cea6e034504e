"""The lake's integrity checks as Dagster sees them: one multi-check (`lake_integrity`) over the
fold's and the model's tables, evaluated by its own job (`check_lake`, assets/jobs.py), from the
findings of lake/spark/checks.py.

The step-scoped checks look at the last committed fold step (the masters, message ids and
batches it covered); the others at the whole of their (small) tables. They are a job of their
own, not a part of every batch run: each check is a Spark query or two over Delta tables with
deletion vectors, about a second each on two cores (the model's references about four), which
would lengthen every feed run by several seconds. Launch `check_lake` from the UI, or turn on
its schedule (`check_lake_schedule`, stopped by default); each evaluation shows on the assets'
Checks tab with its counts and first offenders.
"""

from collections.abc import Iterator
from typing import Any

import dagster as dg
from dagster_pyspark import LazyPySparkResource

from sis_platform.lake.delta import Lake
from sis_platform.lake.spark import checks
from sis_platform.lake.spark.checks import Finding, StepScope
from sis_platform.lake.tables import (
    FOLD_STEPS,
    MARKETS,
    MASTER_DOCUMENTS,
    MASTER_VERSIONS,
    MESSAGE_OUTCOMES,
)
from sis_platform.resources.platform import DeltaLakeResource

ONE_ROW_PER_MASTER = "one_row_per_master"
VERSIONS_GAP_FREE = "versions_gap_free"
APPLIED_AT_MOST_ONCE = "applied_at_most_once"
ONE_END_STATE_PER_MESSAGE = "one_end_state_per_message"
MODEL_REFERENCES_HOLD = "model_references_hold"

LAST_STEP = " (the last committed fold step)"
SPECS = [
    dg.AssetCheckSpec(
        ONE_ROW_PER_MASTER,
        asset=MASTER_DOCUMENTS.name,
        description="master_documents holds exactly one row per master id.",
    ),
    dg.AssetCheckSpec(
        VERSIONS_GAP_FREE,
        asset=MASTER_VERSIONS.name,
        description="Every master the fold step changed has versions 1, 2, ... n in feed "
        "order: none missing, none twice, none out of order" + LAST_STEP + ".",
    ),
    dg.AssetCheckSpec(
        APPLIED_AT_MOST_ONCE,
        asset=MESSAGE_OUTCOMES.name,
        description="No item (message id, master id) the fold step applied was applied before: "
        "exactly once across redeliveries and refolds" + LAST_STEP + ".",
    ),
    dg.AssetCheckSpec(
        ONE_END_STATE_PER_MESSAGE,
        asset=MESSAGE_OUTCOMES.name,
        description="Every logged message of the fold step's batches has exactly one end state "
        "(applied, duplicate, filtered or dead-lettered, for the whole message or per item)"
        + LAST_STEP
        + ".",
    ),
    dg.AssetCheckSpec(
        MODEL_REFERENCES_HOLD,
        asset=MARKETS.name,
        description="Every market belongs to an event of the model and every selection to a "
        "market: what Opportunity Management joins always joins.",
    ),
]


@dg.multi_asset_check(
    specs=SPECS,
    can_subset=True,
    name="lake_integrity",
    description="The lake's integrity checks (lake/spark/checks.py), run by the check_lake job.",
)
def lake_integrity(
    context: dg.AssetCheckExecutionContext, spark: LazyPySparkResource, lake: DeltaLakeResource
) -> Iterator[dg.AssetCheckResult]:
    lk = lake.lake(spark.spark_session)
    scope = last_step(lk)
    wanted = {key.name for key in context.selected_asset_check_keys}
    for spec in SPECS:
        if spec.name in wanted:
            yield result(spec, evaluate(spec.name, lk, scope), scope)


def evaluate(name: str, lake: Lake, scope: StepScope | None) -> Finding:
    if name == ONE_ROW_PER_MASTER:
        return checks.one_row_per_master(lake)
    if name == MODEL_REFERENCES_HOLD:
        return checks.model_references_hold(lake)
    if scope is None:
        return Finding(True, {"note": dg.MetadataValue.text("no fold step committed yet")})
    if name == VERSIONS_GAP_FREE:
        return checks.versions_gap_free(lake, scope)
    if name == APPLIED_AT_MOST_ONCE:
        return checks.applied_at_most_once(lake, scope)
    return checks.one_end_state_per_message(lake, scope)


def last_step(lake: Lake) -> StepScope | None:
    """The last committed fold step and the batches it covered (None: none yet)."""
    if not lake.exists(FOLD_STEPS):
        return None
    row = (
        lake.read(FOLD_STEPS)
        .select("fold_step", "first_batch_seq", "last_batch_seq")
        .orderBy("fold_step", ascending=False)
        .first()
    )
    if row is None:
        return None
    return StepScope(int(row["fold_step"]), int(row["first_batch_seq"]), int(row["last_batch_seq"]))


def result(
    spec: dg.AssetCheckSpec, finding: Finding, scope: StepScope | None
) -> dg.AssetCheckResult:
    metadata: dict[str, Any] = dict(finding.metadata)
    if scope is not None:
        metadata["fold_step"] = dg.MetadataValue.text(str(scope.fold_step))
    if finding.examples:
        metadata["first_offenders"] = dg.MetadataValue.json(list(finding.examples))
    return dg.AssetCheckResult(
        asset_key=spec.asset_key,
        check_name=spec.name,
        passed=finding.passed,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata=metadata,
    )
