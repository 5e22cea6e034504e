"""The code location loads as the webserver and the daemon load it (every job, asset, sensor and
op resolved together: e.g. no two definitions may share a name), in either intake mode."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import dagster as dg
import pytest

from sis_platform.definitions import build_definitions
from sis_platform.settings import load_settings

# Dagster's own retention: partitions (gated on live == lake, or on the fold) and runs.
RETENTION_SENSORS = {"batch_partition_retirement_sensor", "run_retention_sensor"}
LIVE_SENSORS = {
    "landed_batches_sensor",
    "serving_store_reporter",
    "live_matches_lake_sensor",
    *RETENTION_SENSORS,
}
SERVING_CHECKS = {"live_matches_lake", "live_store_fresh"}
LAKE_CHECKS = {
    "hash_chain_intact",
    "one_row_per_master",
    "versions_gap_free",
    "applied_at_most_once",
    "one_end_state_per_message",
    "model_references_hold",
    "lake_lag_within_bounds",
    "dead_letter_rate_below_threshold",
    "files_within_bound",
}


def _loaded(defs: dg.Definitions) -> dg.RepositoryDefinition:
    dg.Definitions.validate_loadable(defs)
    return defs.get_repository_def()


def _checks(repo: dg.RepositoryDefinition) -> set[str]:
    return {k.name for k in repo.asset_graph.asset_check_keys}


def _serving(tmp_path, intake: str) -> Any:
    """The serving store's resource as the definitions of `intake` hold it."""
    env = {"SIS_DATA_DIR": str(tmp_path), "SIS_INTAKE": intake}
    return (build_definitions(env).resources or {})["serving"]


def test_live_intake_is_the_default_the_lake_registers_what_sis_live_lands(tmp_path):
    repo = _loaded(build_definitions({"SIS_DATA_DIR": str(tmp_path)}))
    assert {s.name for s in repo.sensor_defs} == LIVE_SENSORS
    assert {j.name for j in repo.get_all_jobs()} >= {
        "process_batch",
        "replay_dead_letters",
        "check_live_matches_lake",
    }
    assert dg.AssetKey("serving_store") in repo.asset_graph.get_all_asset_keys()
    assert _checks(repo) == {*LAKE_CHECKS, *SERVING_CHECKS}
    # The fold records the lake's progress in the store sis-live keeps, for its /metrics.
    assert _serving(tmp_path, "live").records_lake_progress


def test_sensor_intake_consumes_with_the_queue_sensor_and_has_no_serving_store(tmp_path):
    repo = _loaded(build_definitions({"SIS_DATA_DIR": str(tmp_path), "SIS_INTAKE": "sensor"}))
    assert {s.name for s in repo.sensor_defs} == {"sportsdata_queue_sensor", *RETENTION_SENSORS}
    assert {j.name for j in repo.get_all_jobs()} >= {"process_batch", "replay_dead_letters"}
    assert "check_live_matches_lake" not in {j.name for j in repo.get_all_jobs()}
    assert dg.AssetKey("serving_store") not in repo.asset_graph.get_all_asset_keys()
    assert _checks(repo) == LAKE_CHECKS
    # No sis-live keeps or reads a store: the fold records nothing in one.
    assert not _serving(tmp_path, "sensor").records_lake_progress


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        (None, "sqlite"),
        ("postgresql://sis@db.example:5432/serving", "postgres"),
    ],
)
def test_the_serving_store_asset_shows_its_engine_and_the_resource_holds_no_password(
    tmp_path, url, kind
):
    env = {"SIS_DATA_DIR": str(tmp_path)} | ({"SIS_SERVING_URL": url} if url else {})
    defs = build_definitions(env)
    spec = defs.resolve_assets_def("serving_store").specs_by_key[dg.AssetKey("serving_store")]
    assert spec.kinds == {kind}
    assert spec.group_name == "live"
    assert [d.asset_key for d in spec.deps] == [dg.AssetKey("raw_messages")]
    serving = (defs.resources or {})["serving"]
    assert serving.url == (url or f"sqlite:///{tmp_path / 'serving' / 'serving.db'}")


def test_the_code_location_is_configured_by_its_settings_read_once(tmp_path):
    settings = load_settings(
        {
            "SIS_DATA_DIR": str(tmp_path),
            "SIS_SENSOR_INTERVAL_SECONDS": "7",
            "SIS_LIVE_REPORT_SECONDS": "2.5",
            "SIS_LIVE_MAX_LAG_SECONDS": "12",
        }
    )
    defs = build_definitions(settings)
    assert defs.resolve_sensor_def("landed_batches_sensor").minimum_interval_seconds == 7
    assert defs.resolve_sensor_def("serving_store_reporter").minimum_interval_seconds == 3
    resources = defs.resources or {}
    assert resources["landing"].root == str(tmp_path / "landing")
    assert resources["serving"].max_lag_seconds == 12

    queue_mode = build_definitions(
        load_settings(
            {
                "SIS_DATA_DIR": str(tmp_path),
                "SIS_INTAKE": "sensor",
                "SIS_SENSOR_INTERVAL_SECONDS": "7",
            }
        )
    )
    assert queue_mode.resolve_sensor_def("sportsdata_queue_sensor").minimum_interval_seconds == 7


def test_loading_the_definitions_prints_no_warning():
    # Every run worker loads them: a warning here is a line in every run's console output.
    loaded = subprocess.run(
        [sys.executable, "-W", "always", "-c", "import sis_platform.definitions"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "Warning" not in loaded.stderr, loaded.stderr
