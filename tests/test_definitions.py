"""The code location loads as the webserver and the daemon load it (every job, asset, sensor and
op resolved together: e.g. no two definitions may share a name)."""

from __future__ import annotations

import dagster as dg

from sis_platform.definitions import build_definitions


def test_code_location_loads_as_the_daemon_loads_it(tmp_path):
    defs = build_definitions({"SIS_DATA_DIR": str(tmp_path)})
    dg.Definitions.validate_loadable(defs)
    assert {j.name for j in defs.get_repository_def().get_all_jobs()} >= {
        "process_batch",
        "replay_dead_letters",
    }
