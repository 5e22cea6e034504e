"""The fold's progress record (assets/masters.py `record_lake_progress`, live intake) killed
between the fold step's commit to the lake and the record in the serving store: a fresh process
re-executing the run from the fold records it, from fold_steps, with the dead letters of the
step the killed process committed; nothing is folded twice."""

from __future__ import annotations

from pathlib import Path

import pytest

from sis_platform.log.landing import ClosedBy, GroupWriter
from sis_platform.resources import config
from sis_platform.runtime.faults import LAKE_PROGRESS_POINTS
from sis_platform.serving import open_reader, open_writer
from tests.domain.sportsdata_fixtures import ASCOT_1430, GO_SOFT, event, master, update
from tests.faults.driver import instance, platform_env
from tests.faults.processes import SIGKILLED, drive
from tests.harness import received

pytestmark = [pytest.mark.faults, pytest.mark.spark, pytest.mark.dagster, pytest.mark.cost(140)]

B1 = "0000000001"
LIVE = {"SIS_INTAKE": "live"}


# 2 Spark driver starts.
@pytest.mark.timeout(1800)
def test_a_fold_killed_before_recording_its_progress_has_it_recorded_by_the_next_run(tmp_path):
    env = {**platform_env(tmp_path / "data"), **LIVE}
    settings = config.settings_of(env)
    # The zone as the platform opens it: its log signed with the platform's key.
    writer = GroupWriter(config.resources(settings)["landing"].zone().writer)
    writer.recover()
    # A master, an update of it, and an orphan update (a dead letter), as sis-live lands them.
    writer.land([received(master(event(ASCOT_1430))), received(update(ASCOT_1430, GO_SOFT))])
    writer.land([received(update("NOPE-1", GO_SOFT))])
    writer.seal(ClosedBy.MESSAGES)
    instance(tmp_path / "dagster").add_dynamic_partitions("batches", [B1])
    # sis-live's store, which live intake runs beside (its readers below cannot create it).
    open_writer(settings.serving.url).close()

    (point,) = LAKE_PROGRESS_POINTS
    assert drive(tmp_path, "run", B1, crash_at=point, extra_env=LIVE) == SIGKILLED
    # The step committed (fold_steps' first append after its creation), its record not written.
    assert (Path(settings.lake_path) / "fold_steps" / "_delta_log" / f"{1:020d}.json").is_file()
    with open_reader(settings.serving.url) as store:
        assert store.lake_progress() is None

    assert drive(tmp_path, "run", f"{B1}:fold_masters", crash_at=None, extra_env=LIVE) == 0
    with open_reader(settings.serving.url) as store:
        recorded = store.lake_progress()
    # Step 1, the killed process's: the re-execution had nothing new to fold.
    assert recorded is not None
    assert (recorded.fold_step, recorded.last_batch_seq, recorded.dead_letters) == (1, 1, 1)
