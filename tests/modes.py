"""The two intake modes the end-to-end and broker tests run in (SIS_INTAKE), and what live mode
adds to their checks: the serving store sis-live kept equals the reference over the landed log,
and the live_matches_lake check passes where the lake has folded, whose progress is recorded in
the store (the store on SQLite or PostgreSQL)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import psycopg

from sis_platform.domain.pipeline import ReferencePipeline
from sis_platform.serving.location import SqliteLocation, parse_location
from tests.harness import Harness
from tests.live.store_view import assert_rows_match_reference, assert_store_matches_reference
from tests.pg import PASSWORD_VARIABLE

INTAKES: Final = ("live", "sensor")


def harness(data_dir: Path, intake: str, overrides: Mapping[str, str] | None = None) -> Harness:
    """The in-process platform on `data_dir` in the `intake` mode."""
    return Harness(data_dir, {**(overrides or {}), "SIS_INTAKE": intake})


def serving_db(h: Harness) -> Path:
    """The path of the platform's SQLite serving store."""
    location = parse_location(h.serving_url)
    assert isinstance(location, SqliteLocation), h.serving_url
    return location.path


def assert_live_path(h: Harness, ref: ReferencePipeline, *, lake_folded: bool = True) -> None:
    """In live mode: the serving store equals `ref` (the reference over the landed log) and,
    when the lake has folded the log, live_matches_lake passes and the lake has recorded its
    progress there. Nothing in sensor mode, which keeps no serving store."""
    if h.intake != "live":
        return
    location = parse_location(h.serving_url)
    if isinstance(location, SqliteLocation):
        assert_store_matches_reference(location.path, ref)
    else:
        # PostgreSQL: the password as the platform reads it, from the environment.
        with psycopg.connect(location.url, password=os.environ[PASSWORD_VARIABLE]) as conn:
            assert_rows_match_reference(conn, ref)
    if lake_folded:
        evaluation = h.check_live_matches_lake()
        assert evaluation.passed, evaluation.description
        metadata = {k: v.value for k, v in evaluation.metadata.items()}
        assert metadata["mismatches"] == 0
        assert metadata["masters_compared"] > 0
        # The lake's fold recorded where it stands in the store, for sis-live's /metrics.
        with h.open_reader() as store:
            progress = store.lake_progress()
        assert progress is not None
        assert progress.last_batch_seq == metadata["lake_batch_seq"] > 0
