"""One writer per fold table (Delta concurrency): everything that writes the fold's tables
runs in the `sis_fold` pool, and the shipped instance limits pools to one step."""

from __future__ import annotations

from pathlib import Path

import yaml

from sis_platform.assets.masters import FOLD_POOL, fold_masters
from sis_platform.assets.model import interpreted_model
from sis_platform.definitions import build_definitions

ROOT = Path(__file__).resolve().parents[1]


def test_every_fold_writer_is_in_the_fold_pool(tmp_path):
    replay = build_definitions({"SIS_DATA_DIR": str(tmp_path)}).resolve_job_def(
        "replay_dead_letters"
    )
    writers = [fold_masters.op, interpreted_model.op, *replay.graph.node_defs]
    assert {(w.name, w.pool) for w in writers} == {(w.name, FOLD_POOL) for w in writers}


def test_shipped_instance_runs_one_step_of_a_pool_at_a_time():
    instance = yaml.safe_load((ROOT / "deploy" / "dagster.yaml").read_text())
    assert instance["concurrency"]["pools"]["default_limit"] == 1
