"""The freshness policy of the tables Opportunity Management reads: master_documents and the model
(events, markets, selections). Every batch run materializes them, so a table that has not been
materialized within the window means the feed's runs have stopped (the daemon, a run that keeps
failing, a queue that stopped landing); Dagster's freshness daemon shows it WARN after
SIS_FRESHNESS_WARN_SECONDS and FAIL after SIS_FRESHNESS_FAIL_SECONDS. A fold that runs but
cannot advance (a missing batch) keeps them fresh: the lake lag check (assets/feed_checks.py)
catches that."""

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
