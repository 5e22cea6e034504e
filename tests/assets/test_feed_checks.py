"""The checks that watch the feed (assets/feed_checks.py) without Spark: the backlog the lake lag
is measured on (log/landing/backlog.py), the lag check's verdict against its thresholds, and their
settings. The dead-letter rate's Spark part is in tests/lake/spark/test_checks.py; both checks in a
real batch run in tests/assets/test_dead_letter_view.py."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest

from sis_platform.assets.feed_checks import LAKE_LAG, lake_lag_result
from sis_platform.definitions import build_definitions
from sis_platform.log.landing import ClosedBy, GroupWriter, LandingZone
from sis_platform.log.landing.backlog import Backlog, backlog_after, landed_messages
from sis_platform.queues.base import ReceivedMessage, new_message_id
from sis_platform.resources import config
from sis_platform.resources.platform import FeedChecksResource
from sis_platform.settings import ConfigurationError, load_settings

T0 = datetime(2026, 11, 21, 14, 30, tzinfo=UTC)


def _messages(n: int) -> list[ReceivedMessage]:
    return [ReceivedMessage(new_message_id(), b"<m/>", T0, 1) for _ in range(n)]


def test_the_backlog_is_every_message_landed_after_the_folded_batch(tmp_path: Path) -> None:
    zone = LandingZone(tmp_path)
    assert backlog_after(zone.catalog, 0) == Backlog(0, 0, 0, None)
    zone.writer.land(_messages(2), now=T0)
    zone.writer.land(_messages(3), now=T0 + timedelta(seconds=60))
    zone.writer.land(_messages(4), now=T0 + timedelta(seconds=120))

    assert backlog_after(zone.catalog, 0) == Backlog(0, 3, 9, T0)
    assert backlog_after(zone.catalog, 1) == Backlog(1, 2, 7, T0 + timedelta(seconds=60))
    caught_up = backlog_after(zone.catalog, 3)
    assert caught_up == Backlog(3, 0, 0, None)
    assert caught_up.lag_seconds(T0 + timedelta(hours=1)) == 0.0
    assert backlog_after(zone.catalog, 1).lag_seconds(T0 + timedelta(seconds=100)) == 40.0
    # The dead-letter rate's denominators.
    assert [landed_messages(zone.catalog, seq) for seq in (1, 2, 3, 4)] == [2, 3, 4, None]


def test_the_batch_sis_live_is_filling_waits_too(tmp_path: Path) -> None:
    zone = LandingZone(tmp_path)
    writer = GroupWriter(zone.writer)
    writer.land(_messages(2), now=T0)
    writer.seal(ClosedBy.SECONDS)  # batch 1, sealed
    writer.land(_messages(3), now=T0 + timedelta(seconds=30))  # batch 2, open
    writer.land(_messages(1), now=T0 + timedelta(seconds=40))

    assert backlog_after(zone.catalog, 0) == Backlog(0, 1, 6, T0, open_batch=True)
    # Batch 1 folded: only the open batch waits, since its first part landed.
    assert backlog_after(zone.catalog, 1) == Backlog(
        1, 0, 4, T0 + timedelta(seconds=30), open_batch=True
    )


THRESHOLDS = FeedChecksResource(lake_lag_warn_seconds=300, lake_lag_fail_seconds=900)


@pytest.mark.parametrize(
    ("waited", "passed", "severity"),
    [
        (0, True, dg.AssetCheckSeverity.WARN),
        (300, True, dg.AssetCheckSeverity.WARN),
        (301, False, dg.AssetCheckSeverity.WARN),
        (900, False, dg.AssetCheckSeverity.WARN),
        (901, False, dg.AssetCheckSeverity.ERROR),
    ],
)
def test_the_lake_lag_warns_then_fails_past_its_thresholds(
    waited: int, passed: bool, severity: dg.AssetCheckSeverity
) -> None:
    backlog = Backlog(folded_through=7, batches=2, messages=40, oldest_landed_at=T0)
    result = lake_lag_result(backlog, T0 + timedelta(seconds=waited), THRESHOLDS)
    assert (result.check_name, result.passed, result.severity) == (LAKE_LAG, passed, severity)
    metadata = {k: getattr(v, "value", v) for k, v in result.metadata.items()}
    assert metadata["lag_seconds"] == waited  # plotted: a number
    assert (metadata["messages_waiting"], metadata["batches_waiting"]) == (40, 2)
    assert metadata["folded_through_batch"] == "7"  # an identifier: text, not plotted


def test_the_thresholds_come_from_the_settings(tmp_path: Path) -> None:
    env = {"SIS_DATA_DIR": str(tmp_path)}
    defaults = load_settings(env).checks
    assert (defaults.lake_lag_warn_seconds, defaults.lake_lag_fail_seconds) == (300, 900)
    assert defaults.dead_letter_rate_warn == 0.05
    assert (defaults.freshness_warn_seconds, defaults.freshness_fail_seconds) == (600, 1800)
    checks = config.resources(
        {
            **env,
            "SIS_LAKE_LAG_WARN_SECONDS": "60",
            "SIS_LAKE_LAG_FAIL_SECONDS": "120",
            "SIS_DEAD_LETTER_RATE_WARN": "0.5",
        }
    )["feed_checks"]
    assert (checks.lake_lag_warn_seconds, checks.lake_lag_fail_seconds) == (60, 120)
    assert checks.dead_letter_rate_warn == 0.5


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"SIS_LAKE_LAG_WARN_SECONDS": "0"}, "SIS_LAKE_LAG_WARN_SECONDS=0 must be positive"),
        ({"SIS_LAKE_LAG_FAIL_SECONDS": "100"}, "at most SIS_LAKE_LAG_FAIL_SECONDS=100"),
        ({"SIS_DEAD_LETTER_RATE_WARN": "5"}, "SIS_DEAD_LETTER_RATE_WARN=5 must be a share"),
        ({"SIS_FRESHNESS_WARN_SECONDS": "30"}, "SIS_FRESHNESS_WARN_SECONDS=30 must be at least"),
        ({"SIS_FRESHNESS_FAIL_SECONDS": "600"}, "under SIS_FRESHNESS_FAIL_SECONDS=600"),
    ],
)
def test_a_threshold_that_cannot_work_fails_at_start(
    tmp_path: Path, variables: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        load_settings({"SIS_DATA_DIR": str(tmp_path), **variables})


def test_the_masters_and_the_model_have_the_freshness_policy_of_the_settings(
    tmp_path: Path,
) -> None:
    defs = build_definitions(
        {
            "SIS_DATA_DIR": str(tmp_path),
            "SIS_FRESHNESS_WARN_SECONDS": "120",
            "SIS_FRESHNESS_FAIL_SECONDS": "600",
        }
    )
    graph = defs.get_repository_def().asset_graph
    policies = {
        key.to_user_string(): graph.get(key).freshness_policy for key in graph.get_all_asset_keys()
    }
    expected = dg.FreshnessPolicy.time_window(
        fail_window=timedelta(minutes=10), warn_window=timedelta(minutes=2)
    )
    fresh = {name for name, policy in policies.items() if policy is not None}
    assert fresh == {"master_documents", "events", "markets", "selections"}
    assert all(policies[name] == expected for name in fresh)


def test_each_job_evaluates_its_own_checks(tmp_path: Path) -> None:
    repository = build_definitions({"SIS_DATA_DIR": str(tmp_path)}).get_repository_def()

    def checks_of(job: str) -> set[str]:
        graph = repository.get_job(job).asset_layer.asset_graph
        return {key.name for key in graph.asset_check_keys}

    fold_checks = {"lake_lag_within_bounds", "dead_letter_rate_below_threshold"}
    assert checks_of("process_batch") == {"hash_chain_intact", *fold_checks}
    assert checks_of("replay_dead_letters") == fold_checks
    assert checks_of("check_lake") == {
        "one_row_per_master",
        "versions_gap_free",
        "applied_at_most_once",
        "one_end_state_per_message",
        "model_references_hold",
        "files_within_bound",
    }
