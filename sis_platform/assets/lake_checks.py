"""The fold's and the model's asset checks, as Dagster sees them: their specs (attached to the
fold's and the model's multi-assets) and their results from the findings of spark/checks.py.

They run inside the step that writes the tables, on its Spark session, after its commit, and
only when selected (a run of part of the graph evaluates the checks of what it selected). The
one-row-per-master check is blocking: a fold step that left a master twice stops the model from
interpreting it in the same run.
"""

from collections.abc import Iterator
from typing import Any

import dagster as dg

from sis_platform.lake.delta import Lake
from sis_platform.lake.tables import (
    MARKETS,
    MASTER_DOCUMENTS,
    MASTER_VERSIONS,
    MESSAGE_OUTCOMES,
)
from sis_platform.spark import checks
from sis_platform.spark.checks import Finding, StepScope

ONE_ROW_PER_MASTER = "one_row_per_master"
VERSIONS_GAP_FREE = "versions_gap_free"
APPLIED_AT_MOST_ONCE = "applied_at_most_once"
ONE_END_STATE_PER_MESSAGE = "one_end_state_per_message"
MODEL_REFERENCES_HOLD = "model_references_hold"

FOLD_CHECK_SPECS = [
    dg.AssetCheckSpec(
        ONE_ROW_PER_MASTER,
        asset=MASTER_DOCUMENTS.name,
        blocking=True,
        description="master_documents holds exactly one row per master id. Blocking: the "
        "model does not interpret a fold step that breaks it.",
    ),
    dg.AssetCheckSpec(
        VERSIONS_GAP_FREE,
        asset=MASTER_VERSIONS.name,
        description="Every master the fold step changed has versions 1, 2, ... n in feed "
        "order: none missing, none twice, none out of order (committed steps).",
    ),
    dg.AssetCheckSpec(
        APPLIED_AT_MOST_ONCE,
        asset=MESSAGE_OUTCOMES.name,
        description="No item (message id, master id) the fold step applied was applied before: "
        "exactly once across redeliveries and refolds.",
    ),
    dg.AssetCheckSpec(
        ONE_END_STATE_PER_MESSAGE,
        asset=MESSAGE_OUTCOMES.name,
        description="Every logged message of the fold step's batches has exactly one end state "
        "(applied, duplicate, filtered or dead-lettered, for the whole message or per item).",
    ),
]
MODEL_CHECK_SPECS = [
    dg.AssetCheckSpec(
        MODEL_REFERENCES_HOLD,
        asset=MARKETS.name,
        description="Every market belongs to an event of the model and every selection to a "
        "market: what Opportunity Management joins always joins.",
    ),
]


def fold_check_results(
    context: dg.AssetExecutionContext, lake: Lake, scope: StepScope | None
) -> Iterator[dg.AssetCheckResult]:
    """The selected fold checks, over the step this run committed (`scope`; None: it folded
    nothing, and only the whole-table check has anything to look at)."""
    wanted = {key.name for key in context.selected_asset_check_keys}
    for spec in FOLD_CHECK_SPECS:
        if spec.name not in wanted:
            continue
        if spec.name == ONE_ROW_PER_MASTER:
            finding = checks.one_row_per_master(lake)
        elif scope is None:
            finding = Finding(True, {"note": dg.MetadataValue.text("no fold step in this run")})
        elif spec.name == VERSIONS_GAP_FREE:
            finding = checks.versions_gap_free(lake, scope)
        elif spec.name == APPLIED_AT_MOST_ONCE:
            finding = checks.applied_at_most_once(lake, scope)
        else:
            finding = checks.one_end_state_per_message(lake, scope)
        yield result(spec, finding, scope)


def model_check_results(
    context: dg.AssetExecutionContext, lake: Lake
) -> Iterator[dg.AssetCheckResult]:
    wanted = {key.name for key in context.selected_asset_check_keys}
    for spec in MODEL_CHECK_SPECS:
        if spec.name in wanted:
            yield result(spec, checks.model_references_hold(lake), None)


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
