"""The landing merge SIGKILLed at each of its crash points (sis_platform/runtime/faults.py
MERGE_POINTS:
before the claim, after it, in the middle of removing parts), in a process of its own over a
signed zone: right after the kill and after the merge is run again, every batch reads
identically (same rows, same order, same msg_seq), the log reads back the same messages once
each, and the chain check passes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sis_platform.log.landing import batch_key
from sis_platform.log.landing.merge import folder_keys, merge_zone
from sis_platform.runtime.faults import ENV, MERGE_POINTS
from tests.live.processes import REPO, SIGKILLED
from tests.log.grouped import chain_problems, land_in_groups, log_rows, read_back, sealed_zone

pytestmark = [pytest.mark.faults]

B1 = batch_key(1)
# The merge of the zone under data_dir (argv[1]) with parts removed at once, as `sis-live merge`
# does it with SIS_LANDING_MERGE_GRACE_SECONDS=0.
MERGE = """
import sys
from pathlib import Path
from sis_platform.log.landing.merge import merge_zone
from tests.log.grouped import sealed_zone
merge_zone(sealed_zone(Path(sys.argv[1])).upkeep, None, grace_seconds=0.0)
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("point", MERGE_POINTS)
def test_a_merge_killed_at_a_crash_point_loses_nothing_and_finishes_when_run_again(tmp_path, point):
    data = tmp_path / "data"
    zone = sealed_zone(data)
    land_in_groups(zone, batches=3, groups=4, leave_open=True)
    before, logged = log_rows(zone), read_back(zone)

    env = {**os.environ, "PYTHONPATH": str(REPO), ENV: point}
    proc = subprocess.run([sys.executable, "-c", MERGE, str(data)], env=env, timeout=240)
    assert proc.returncode == SIGKILLED

    merged = zone.catalog.batch_path(B1).is_file()
    assert merged == (point != "merge.before_claim")
    if point == "merge.mid_removal":
        assert 0 < len(zone.catalog.parts(B1)) < 4
    elif point == "merge.after_claim":
        assert len(zone.catalog.parts(B1)) == 4
    for state in ("killed", "merged again"):
        assert log_rows(zone) == before, state
        assert read_back(zone) == logged, state
        assert chain_problems(zone) == [], state
        # The lease holder's restart removes a partial merged file; then the merge runs again.
        zone.writer.clean_partials()
        merge_zone(zone.upkeep, None, grace_seconds=0.0)
    assert folder_keys(zone.upkeep) == [batch_key(4)]  # the open batch only
    assert list(zone.catalog.tmp_dir.iterdir()) == []
