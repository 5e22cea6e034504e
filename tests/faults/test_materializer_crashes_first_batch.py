"""Crash anywhere, materializer side, batch 1 alone (see test_materializer_crashes.py): killed
in every write of its message log and of fold step 1, and in the middle of the fold."""

from __future__ import annotations

import pytest

from tests.faults.sequences import B1, FIRST_BATCH_SEQUENCE, converge_after_kills

pytestmark = [pytest.mark.faults, pytest.mark.spark, pytest.mark.dagster, pytest.mark.cost(450)]


# 7 Spark driver starts: ~9 minutes on a loaded 2-core machine.
@pytest.mark.timeout(3600)
def test_first_batch_killed_at_every_write_and_fold_boundary_converges_to_the_reference(
    tmp_path, request
):
    converge_after_kills(
        tmp_path,
        request,
        messages=40,
        clean_runs=[],
        sequence=FIRST_BATCH_SEQUENCE,
        final=[f"{B1}:fold_masters"],
        steps=[1],
    )
