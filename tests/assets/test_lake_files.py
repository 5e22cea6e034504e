"""The `files_within_bound` checks' results as Dagster shows them (the counts come from
sis_platform/lake/upkeep.py, tested on real tables in tests/lake/spark/test_upkeep.py)."""

from __future__ import annotations

import dagster as dg

from sis_platform.assets.lake_files import FILES_WITHIN_BOUND, SPECS, result
from sis_platform.lake.upkeep import UPKEEP_TABLES, FilesFinding, TableFiles


def test_one_check_per_upkept_table():
    assert [s.asset_key.path[-1] for s in SPECS] == [t.name for t in UPKEEP_TABLES]
    assert {s.name for s in SPECS} == {FILES_WITHIN_BOUND}


def test_a_table_over_its_bound_fails_with_its_counts():
    files = TableFiles(
        active_files=1001, active_bytes=5_000, deletion_vector_files=7, log_entries=40
    )
    checked = result("master_versions", FilesFinding(False, files, 1000))
    assert not checked.passed and checked.severity == dg.AssetCheckSeverity.WARN
    assert checked.asset_key == dg.AssetKey("master_versions")
    figures = {k: v.value for k, v in checked.metadata.items()}
    assert figures == {
        "max_files": 1000,
        "files": 1001,
        "bytes": 5_000,
        "deletion_vector_files": 7,
        "log_entries": 40,
    }
    assert result("events", FilesFinding(True, None, 1000)).passed
