"""The code location loads as the webserver and the daemon load it (every job, asset, sensor and
op resolved together: e.g. no two definitions may share a name)."""

from __future__ import annotations

import dagster as dg

from sis_platform.definitions import build_definitions
from sis_platform.settings import load_settings


def test_code_location_loads_as_the_daemon_loads_it(tmp_path):
    defs = build_definitions({"SIS_DATA_DIR": str(tmp_path)})
    dg.Definitions.validate_loadable(defs)
    assert {j.name for j in defs.get_repository_def().get_all_jobs()} >= {
        "process_batch",
        "replay_dead_letters",
    }


def test_the_code_location_is_configured_by_its_settings_read_once(tmp_path):
    settings = load_settings({"SIS_DATA_DIR": str(tmp_path), "SIS_SENSOR_INTERVAL_SECONDS": "7"})
    defs = build_definitions(settings)
    sensor = defs.resolve_sensor_def("sportsdata_queue_sensor")
    assert sensor.minimum_interval_seconds == 7
    assert defs.resources["landing"].root == str(tmp_path / "landing")
