"""Crash anywhere, materializer side (invariants 1 and 2): the process running a `process_batch` run
is SIGKILLed in the middle of every Delta write, in the middle of the fold (from its Python worker),
and between the fold's writes and its commit; each time a fresh process re-executes the run from the
killed step, as Dagster's re-execution from failure does. After the last restart the masters equal
the reference fold and the message log accounts for every message, none applied twice.

Two sequences of processes, each killed at the next point, keep the JVM starts (the cost of
this suite) at one per point, and run on the suite's two workers at once (two files): batch 1
alone, its fold killed at step 1 (recovery restores the tables to their empty versions); and
batch 2 after a clean batch 1, its fold killed at step 2 (recovery restores step 1's committed
versions) and its model while refreshing over a committed model step. The rewinding fold's
kills are in test_rewind_crashes.py."""

from __future__ import annotations

import pytest

from sis_platform.runtime.faults import (
    BLOCK_POINTS,
    CONSUMER_POINTS,
    CRASH_POINTS,
    EXPIRE_POINTS,
    LAKE_PROGRESS_POINTS,
    LIVE_POINTS,
    MERGE_POINTS,
    PRIORITY_POINTS,
    PRUNE_POINTS,
    RETENTION_POINTS,
    REWIND_POINTS,
    UPKEEP_POINTS,
)
from tests.faults.sequences import (
    B1,
    B2,
    FIRST_BATCH_SEQUENCE,
    REWIND_SEQUENCE,
    SECOND_BATCH_SEQUENCE,
    converge_after_kills,
)

pytestmark = [pytest.mark.faults, pytest.mark.spark, pytest.mark.dagster, pytest.mark.cost(810)]


def test_sequences_cover_every_declared_crash_point():
    sequences = FIRST_BATCH_SEQUENCE + SECOND_BATCH_SEQUENCE
    covered = {point.partition("@")[0] for point, _ in sequences}
    # The consumer's points are killed in tests/faults/test_consumer_crashes.py, sis-live's in
    # tests/live/test_crashes.py and tests/live/test_priority.py, the rewind's in
    # test_rewind_crashes.py, the serving store's prune in tests/serving/test_retention.py, the
    # landing merge's in tests/log/test_merge_crashes.py, the landing expiry's in
    # tests/log/test_expiry.py, Dagster's retention's in tests/sensors/test_retention_crashes.py,
    # the fold's progress record's in tests/faults/test_lake_progress_crash.py, the lake's
    # upkeep's in test_upkeep_crashes.py, the message log's block compaction's in
    # test_block_compaction_crash.py.
    others = set(CONSUMER_POINTS) | set(REWIND_POINTS) | set(LIVE_POINTS) | set(PRIORITY_POINTS)
    others |= set(LAKE_PROGRESS_POINTS)
    others |= set(PRUNE_POINTS) | set(MERGE_POINTS) | set(EXPIRE_POINTS) | set(RETENTION_POINTS)
    others |= set(UPKEEP_POINTS) | set(BLOCK_POINTS)
    assert sorted(covered | others) == sorted(CRASH_POINTS)
    assert len(covered) == len(sequences)
    assert [point for point, _ in REWIND_SEQUENCE] == list(REWIND_POINTS)


# 8 Spark driver starts: ~10 minutes on a loaded 2-core machine.
@pytest.mark.timeout(3600)
def test_second_batch_killed_at_every_write_and_fold_boundary_converges_to_the_reference(
    tmp_path, request
):
    converge_after_kills(
        tmp_path,
        request,
        messages=80,
        clean_runs=[B1],
        sequence=SECOND_BATCH_SEQUENCE,
        final=[f"{B2}:interpreted_model"],
        steps=[1, 2],
        outcomes={"applied", "duplicate", "filtered", "dead-lettered"},
    )
