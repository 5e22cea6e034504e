"""The `files_within_bound` checks' results as Dagster shows them (the counts come from
sis_platform/lake/upkeep.py, tested on real tables in tests/lake/spark/test_upkeep.py)."""

from __future__ import annotations

import dagster as dg

from sis_platform.assets.lake_files import FILES_WITHIN_BOUND, SPECS, blocks_result, result
from sis_platform.lake.upkeep import (
    BLOCK_TABLES,
    UPKEEP_TABLES,
    BlockFiles,
    BlocksFinding,
    FilesFinding,
    TableFiles,
)


def test_one_check_per_upkept_table_and_per_message_log_table():
    tables = [t.name for t in UPKEEP_TABLES + BLOCK_TABLES]
    assert [s.asset_key.path[-1] for s in SPECS] == tables
    assert {"raw_messages", "message_items"} <= set(tables)
    assert {s.name for s in SPECS} == {FILES_WITHIN_BOUND}


def test_a_table_over_its_bound_fails_with_its_counts():
    files = TableFiles(
        active_files=1001, active_bytes=5_000, deletion_vector_files=7, log_entries=40
    )
    checked = result("master_versions", FilesFinding(False, files, 1000, 1001))
    assert not checked.passed and checked.severity == dg.AssetCheckSeverity.WARN
    assert checked.asset_key == dg.AssetKey("master_versions")
    figures = {k: v.value for k, v in checked.metadata.items()}
    assert figures == {
        "max_files": 1000,
        "files_counted": 1001,
        "files": 1001,
        "bytes": 5_000,
        "deletion_vector_files": 7,
        "log_entries": 40,
    }
    assert result("events", FilesFinding(True, None, 1000)).passed


def test_a_message_log_table_with_an_uncompacted_settled_block_fails_naming_it():
    files = TableFiles(
        active_files=520, active_bytes=9_000, deletion_vector_files=0, log_entries=12
    )
    over = BlockFiles(block=3, files=500, bytes=8_000, bound=2, newest_seq=1_999)
    checked = blocks_result("raw_messages", BlocksFinding(False, files, 5, 4, (over,)))
    assert not checked.passed and checked.severity == dg.AssetCheckSeverity.WARN
    assert checked.asset_key == dg.AssetKey("raw_messages")
    figures = {k: v.value for k, v in checked.metadata.items()}
    assert figures == {
        "blocks": 5,
        "settled_blocks": 4,
        "blocks_over_bound": 1,
        "files": 520,
        "bytes": 9_000,
        "deletion_vector_files": 0,
        "log_entries": 12,
        "over_bound": "block 3: 500 files, 8000 bytes, bound 2",
    }
    assert blocks_result("message_items", BlocksFinding(True, None, 0, 0, ())).passed
