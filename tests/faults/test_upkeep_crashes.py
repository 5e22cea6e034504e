"""Crash in the lake's upkeep (invariants 1, 2 and 10): with compaction and VACUUM due at every
step (SIS_LAKE_OPTIMIZE_EVERY=1, SIS_LAKE_VACUUM_EVERY=1), the process running batch 2's
`process_batch` run is SIGKILLed between the fold's compactions of two tables, after them, after
its VACUUM (each before the step's fold_steps row), and after the model's compaction and its
VACUUM (before its model_steps row); each time a fresh process re-executes the run from the
killed step. After the last restart the masters equal the reference fold, the message log
accounts for every message with none applied twice, the model holds every live master, and the
fold's tables are compacted, with every interrupted step's writes and upkeep undone by recovery
and done again."""

from __future__ import annotations

import pytest

from sis_platform.lake.tables import FOLD_STEPS, MASTER_DOCUMENTS, MASTER_VERSIONS
from sis_platform.lake.upkeep import table_files
from sis_platform.runtime.faults import UPKEEP_POINTS
from tests.faults.driver import platform_env
from tests.faults.sequences import B1, B2, converge_after_kills

pytestmark = [pytest.mark.faults, pytest.mark.spark, pytest.mark.dagster, pytest.mark.cost(770)]

UPKEEP_SEQUENCE = [
    ("fold.mid_optimize", [B2]),
    ("fold.after_optimize", [f"{B2}:fold_masters"]),
    ("fold.after_vacuum", [f"{B2}:fold_masters"]),
    ("model.after_optimize", [f"{B2}:fold_masters"]),
    ("model.after_vacuum", [f"{B2}:interpreted_model"]),
]


def test_the_sequence_covers_every_upkeep_point():
    assert [point for point, _ in UPKEEP_SEQUENCE] == list(UPKEEP_POINTS)


# 6 Spark driver starts and the upkeep of 13 tables at both steps: 11 minutes at load 4-6 on a
# 2-core machine; the bound leaves room for a machine several times as loaded.
@pytest.mark.timeout(3600)
def test_killed_in_every_upkeep_step_converges_to_the_reference(tmp_path, request, monkeypatch):
    monkeypatch.setenv("SIS_LAKE_OPTIMIZE_EVERY", "1")
    monkeypatch.setenv("SIS_LAKE_VACUUM_EVERY", "1")
    converge_after_kills(
        tmp_path,
        request,
        messages=80,
        clean_runs=[B1],
        sequence=UPKEEP_SEQUENCE,
        final=[f"{B2}:interpreted_model"],
        steps=[1, 2],
        outcomes={"applied", "duplicate", "filtered", "dead-lettered"},
        timeout=2400,
    )
    from sis_platform.resources import config

    lake = config.resources(platform_env(tmp_path / "data"))["lake"].lake(
        request.getfixturevalue("spark")
    )
    history = lake.spark.sql(f"DESCRIBE HISTORY {lake.sql_table(MASTER_VERSIONS)}")
    operations = [r["operation"] for r in history.orderBy("version").collect()]
    # Each kill in the fold's upkeep left a compaction (or a vacuum) that the next run's
    # recovery restored away before folding step 2 again.
    assert operations.count("RESTORE") == 3
    assert operations.count("OPTIMIZE") >= 2 and operations[-1] == "VACUUM END"
    for table in (MASTER_VERSIONS, MASTER_DOCUMENTS):
        assert table_files(lake, table).active_files == 1, table.name
    assert table_files(lake, FOLD_STEPS).active_files <= 2
