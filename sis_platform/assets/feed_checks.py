"""The checks that watch the feed, reported by the fold with every step it takes (assets/masters.py
declares them as its `check_specs`): how far the lake is behind the landing zone, and how much of
each batch the step dead-lettered.

They are the fold's own checks, not a part of `lake_integrity`: the fold already knows its
committed position and its step, so the lag costs a look at the landing zone (no Spark) and the
dead-letter rate one small Spark job over the step's dead letters (the batches' sizes from the
landing zone's anchors). Every batch run and replay evaluates them, and neither blocks anything
downstream (a late lake or a bad batch is something to look at, and the model should still show
what was folded). Thresholds: FeedChecksResource (SIS_LAKE_LAG_WARN_SECONDS,
SIS_LAKE_LAG_FAIL_SECONDS, SIS_DEAD_LETTER_RATE_WARN).
"""

from datetime import datetime
from typing import Any

import dagster as dg

from sis_platform.assets.table_specs import identifier
from sis_platform.lake.spark.checks import Finding
from sis_platform.lake.tables import DEAD_LETTERS, MASTER_DOCUMENTS
from sis_platform.log.landing.backlog import Backlog
from sis_platform.resources.platform import FeedChecksResource

LAKE_LAG = "lake_lag_within_bounds"
DEAD_LETTER_RATE = "dead_letter_rate_below_threshold"

FEED_CHECK_SPECS = [
    dg.AssetCheckSpec(
        LAKE_LAG,
        asset=MASTER_DOCUMENTS.name,
        description="The oldest landed message the fold has not folded yet (the first message of "
        "the first landed batch after the last folded one, or of the batch sis-live is filling) "
        "has waited less than SIS_LAKE_LAG_WARN_SECONDS; WARN beyond it, ERROR beyond "
        "SIS_LAKE_LAG_FAIL_SECONDS. Evaluated after every fold step.",
    ),
    dg.AssetCheckSpec(
        DEAD_LETTER_RATE,
        asset=DEAD_LETTERS.name,
        description="No batch the fold step folded had more than SIS_DEAD_LETTER_RATE_WARN of its "
        "messages dead-lettered (whole or for an item); WARN otherwise, with the dead-lettered "
        "messages by reason and the worst batches. Non-blocking: the model is refreshed anyway.",
    ),
]


def lake_lag_result(
    backlog: Backlog, now: datetime, thresholds: FeedChecksResource
) -> dg.AssetCheckResult:
    """WARN over the warning threshold, ERROR over the failing one."""
    lag = backlog.lag_seconds(now)
    if lag > thresholds.lake_lag_fail_seconds:
        passed, severity = False, dg.AssetCheckSeverity.ERROR
    elif lag > thresholds.lake_lag_warn_seconds:
        passed, severity = False, dg.AssetCheckSeverity.WARN
    else:
        passed, severity = True, dg.AssetCheckSeverity.WARN
    oldest = backlog.oldest_landed_at
    metadata: dict[str, Any] = {
        "lag_seconds": round(lag, 3),
        "messages_waiting": backlog.messages,
        "batches_waiting": backlog.batches,
        "folded_through_batch": identifier(backlog.folded_through),
        "oldest_waiting_landed_at": dg.MetadataValue.text(
            oldest.isoformat() if oldest is not None else "nothing waits"
        ),
        "open_batch_waiting": backlog.open_batch,
        "warn_seconds": thresholds.lake_lag_warn_seconds,
        "fail_seconds": thresholds.lake_lag_fail_seconds,
    }
    return dg.AssetCheckResult(
        asset_key=MASTER_DOCUMENTS.name,
        check_name=LAKE_LAG,
        passed=passed,
        severity=severity,
        metadata=metadata,
    )


def dead_letter_rate_result(finding: Finding | None, fold_step: int | None) -> dg.AssetCheckResult:
    """WARN when a batch is over the threshold; `finding` None: the step folded nothing."""
    if finding is None:
        finding = Finding(
            True,
            {"batches_checked": 0, "note": dg.MetadataValue.text("nothing folded in this step")},
        )
    metadata: dict[str, Any] = {**finding.metadata, "fold_step": identifier(fold_step)}
    if finding.examples:
        metadata["worst_batches"] = dg.MetadataValue.json(list(finding.examples))
    return dg.AssetCheckResult(
        asset_key=DEAD_LETTERS.name,
        check_name=DEAD_LETTER_RATE,
        passed=finding.passed,
        severity=dg.AssetCheckSeverity.WARN,
        metadata=metadata,
    )
