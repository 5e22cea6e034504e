"""The materializer kill sequences and the catch-up check they share (test_materializer_*.py).

Each entry: (where the process dies, the runs it executes: KEY or KEY:first step of a
re-execution). A point may carry `@n`: the n-th time the process reaches it."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import pytest

from sis_platform.lake.tables import (
    EVENTS,
    FOLD_STEPS,
    MASTER_DOCUMENTS,
    MESSAGE_OUTCOMES,
    MODEL_STEPS,
)
from sis_platform.simulator.generator import generate_feed
from sis_platform.standards.selector import Selector
from tests.faults.accounting import assert_log_accounts_for_every_message, logged_messages
from tests.faults.driver import platform_env, run, tick_until_empty
from tests.faults.processes import SIGKILLED, drive
from tests.reference import assert_lake_matches_reference, reference_for

B1, B2 = "0000000001", "0000000002"
# Batch 1 alone: its message log, then fold step 1 from empty tables.
FIRST_BATCH_SEQUENCE = [
    ("write.raw_messages", [B1]),
    ("write.message_items", [f"{B1}:raw_messages"]),
    ("write.batch_log", [f"{B1}:message_items"]),
    ("fold.mid_fold", [f"{B1}:message_items"]),
    ("write.master_versions", [f"{B1}:fold_masters"]),
    ("fold.after_versions", [f"{B1}:fold_masters"]),
    ("write.master_documents", [f"{B1}:fold_masters"]),
]
# Batch 2 after a clean batch 1: fold step 2 over step 1's tables, then the model over a
# committed model step.
SECOND_BATCH_SEQUENCE = [
    ("write.dead_letters", [B2]),
    ("write.message_outcomes", [f"{B2}:fold_masters"]),
    ("fold.after_documents", [f"{B2}:fold_masters"]),
    ("write.fold_steps", [f"{B2}:fold_masters"]),
    ("write.events", [f"{B2}:fold_masters"]),
    ("write.markets", [f"{B2}:interpreted_model"]),
    ("write.selections", [f"{B2}:interpreted_model"]),
    ("write.model_steps", [f"{B2}:interpreted_model"]),
]
# A fold step that rewinds (the batches were classified again after a fix) dies in its deletes,
# then between its deletes and its appends.
REWIND_SEQUENCE = [
    ("write.rewind", [f"{B2}:fold_masters"]),
    ("fold.after_rewind", [f"{B2}:fold_masters"]),
]

INVALID = {"not-well-formed": 0.05, "schema-invalid": 0.04, "orphan-update": 0.04}
# The feed (seed 23) races three masters; filtering one of them gives the message log all four
# outcomes to account for: applied, duplicate, filtered, dead-lettered.
SELECTOR = "masterId <> 'SOU-20261121-1730'"


def converge_after_kills(
    tmp_path: Path,
    request: pytest.FixtureRequest,
    *,
    messages: int,
    clean_runs: list[str],
    sequence: list[tuple[str, list[str]]],
    final: list[str],
    steps: list[int],
    outcomes: set[str] | None = None,
    timeout: float = 900,
) -> None:
    """Land `messages` of the feed (40 per batch), run `clean_runs` in this process, then one
    process per point of `sequence`, each SIGKILLed there; finish with `final` in this process
    and check the lake against the reference fold and the message log. `timeout`: seconds each
    killed process may take to reach its point."""
    from sis_platform.resources import config

    data, home = tmp_path / "data", tmp_path / "dagster"
    env = {**platform_env(data), "SIS_SELECTOR": SELECTOR}
    resources = config.resources(env)
    with resources["queue"].open().producer() as producer:
        for m in generate_feed(seed=23, messages=messages, invalid=INVALID, duplicates=0.05):
            producer.put(m.body, message_id=m.message_id)
    tick_until_empty(home, env)
    zone = resources["landing"].zone()
    assert zone.catalog.keys() == [B1, B2][: (messages + 39) // 40]

    spark: Any = request.getfixturevalue("spark")  # this process's session checks the lake
    for spec in clean_runs:
        run(home, env, spec)
    for point, runs in sequence:
        code = drive(
            tmp_path,
            "run",
            *runs,
            crash_at=point,
            extra_env={"SIS_SELECTOR": SELECTOR},
            timeout=timeout,
        )
        assert code == SIGKILLED, f"the run(s) {runs} finished without reaching {point}"
    for spec in final:  # the last restart
        run(home, env, spec)
    # Each killed driver left its scratch (jar copies, shuffle blocks) in its own folder, and
    # the next driver's start removed it: only this process's folder is left.
    scratch = data / "spark-scratch"
    assert [p.name for p in scratch.iterdir()] == [f"{socket.gethostname()}-{os.getpid()}"]

    lake = resources["lake"].lake(spark)
    logged = logged_messages(zone.catalog)
    assert_lake_matches_reference(lake, reference_for(logged, selector=Selector.compile(SELECTOR)))
    assert_log_accounts_for_every_message(lake, zone)
    if outcomes is not None:
        found = {r["outcome"] for r in lake.read(MESSAGE_OUTCOMES).select("outcome").collect()}
        assert found == outcomes
    assert [r["fold_step"] for r in lake.read(FOLD_STEPS).orderBy("fold_step").collect()] == steps
    assert [r["fold_step"] for r in lake.read(MODEL_STEPS).orderBy("fold_step").collect()] == steps
    # The model was refreshed over every committed step despite its own kills: one event row
    # per live master, at the master's version.
    masters = lake.read(MASTER_DOCUMENTS).where("document IS NOT NULL AND NOT filtered")
    live = {r["master_id"]: r["version"] for r in masters.collect()}
    assert {r["master_id"]: r["version"] for r in lake.read(EVENTS).collect()} == live
