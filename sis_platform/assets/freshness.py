"""The freshness policy of the tables Opportunity Management reads: master_documents and the model
(events, markets, selections). A fold step that folds a new batch materializes them (a run that
finds nothing new records an observation only: assets/masters.py), so a table not materialized
within the window means no batch has been folded for that long: the feed is quiet, or its runs
stopped or fail, or the fold waits for a missing batch (the lake lag check, assets/feed_checks.py,
tells these apart). Dagster's freshness daemon shows it WARN after SIS_FRESHNESS_WARN_SECONDS and
FAIL after SIS_FRESHNESS_FAIL_SECONDS."""

from collections.abc import Sequence
from datetime import timedelta

import dagster as dg

from sis_platform.lake.tables import EVENTS, MARKETS, MASTER_DOCUMENTS, SELECTIONS

FRESH_TABLES = frozenset(t.name for t in (MASTER_DOCUMENTS, EVENTS, MARKETS, SELECTIONS))


def freshness_policy(warn_seconds: float, fail_seconds: float) -> dg.FreshnessPolicy:
    return dg.FreshnessPolicy.time_window(
        fail_window=timedelta(seconds=fail_seconds), warn_window=timedelta(seconds=warn_seconds)
    )


def with_freshness(
    assets: Sequence[dg.AssetsDefinition], policy: dg.FreshnessPolicy
) -> list[dg.AssetsDefinition]:
    """`assets` with `policy` on each of their FRESH_TABLES (their other tables unchanged)."""

    def apply(spec: dg.AssetSpec) -> dg.AssetSpec:
        if spec.key.to_user_string() in FRESH_TABLES:
            return dg.apply_freshness_policy(spec, policy)
        return spec

    return [asset.map_asset_specs(apply) for asset in assets]
