"""A part of the batch job, as tests and the fault driver run it (inprocess.job_subset): the
job's own checks on the chosen assets, never the lake's integrity checks, which only their own
job (check_lake) runs."""

from __future__ import annotations

from sis_platform.testing.inprocess import BATCH_JOB, InProcessPlatform, job_subset


def test_a_part_of_the_batch_job_runs_its_own_checks_and_not_the_lakes(tmp_path):
    defs = InProcessPlatform(tmp_path / "data").defs
    job = defs.resolve_job_def(BATCH_JOB)
    keys = {k for a in ("master_documents", "events") for k in defs.resolve_assets_def(a).keys}
    part = job_subset(job, keys)
    assert sorted(n.name for n in part.graph.node_defs) == ["fold_masters", "interpreted_model"]
    checks = {k.to_user_string() for k in part.asset_layer.asset_graph.asset_check_keys}
    assert checks == {
        "master_documents:lake_lag_within_bounds",
        "dead_letters:dead_letter_rate_below_threshold",
    }
    # What selecting the assets alone would have run: the lake's checks besides.
    alone = job.get_subset(asset_selection=keys)
    assert "lake_integrity" in {n.name for n in alone.graph.node_defs}
