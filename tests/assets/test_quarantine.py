"""Poison isolation for unknown failures (invariant 4, poison vs transient): a master whose fold
fails for an unknown reason (a bug raising, or a Python worker dying) is retried by the retry
policy, quarantined after SIS_QUARANTINE_AFTER failures so the other masters go on, and folded
in feed order once a replay says the fix is in.

The failure is injected with SIS_INJECT_FOLD_FAILURE (read by the fold on the driver and passed
to the workers), the one test hook of the fold. The failing master is known from a structured
fact (its failure row's master_id, a worker's in-flight marker), never from an error's text;
an item that overruns the per-item budget (a hang) is dead-lettered `too-complex`. The same
guard isolates a message whose classification in message_items fails
(SIS_INJECT_CLASSIFY_FAILURE).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from sis_platform.lake.tables import (
    DEAD_LETTERS,
    FOLD_FAILURES,
    MASTER_DOCUMENTS,
    MESSAGE_OUTCOMES,
)
from tests.domain.sportsdata_fixtures import ASCOT_1430, ASCOT_1500, GO_SOFT, event, master, update
from tests.harness import LOG_ASSETS, Harness, received
from tests.reference import assert_lake_matches_reference, reference_for

pytestmark = [
    pytest.mark.spark,
    pytest.mark.dagster,
    pytest.mark.usefixtures("no_retry_backoff"),
    pytest.mark.cost(660),
]


def _retried_steps(h: Harness, run_id: str) -> list[str | None]:
    return [
        e.step_key
        for e in h.instance.all_logs(run_id)
        if e.dagster_event is not None and e.dagster_event.event_type_value == "STEP_UP_FOR_RETRY"
    ]


# Two failures, not the default three: one failing fold attempt fewer per test, same path.
QUARANTINE_AFTER_2 = {"SIS_QUARANTINE_AFTER": "2"}


@dataclass(frozen=True)
class Logged:
    """A data folder where batch 1 is logged and parsed (its fold not run) and batch 2 landed."""

    data_dir: Path
    keys: list[str]


@pytest.fixture(scope="module")
def two_masters_logged(tmp_path_factory: pytest.TempPathFactory, spark) -> Logged:
    """Batch 1: two masters, logged and parsed; batch 2: one update of both, landed. Built once:
    each way of failing the fold works on a copy (the message log does not depend on it)."""
    h = Harness(tmp_path_factory.mktemp("quarantine") / "data", overrides=QUARANTINE_AFTER_2)
    keys = [
        h.zone.writer.land(b).key
        for b in (
            [received(master(event(ASCOT_1430))), received(master(event(ASCOT_1500)))],
            [received(update(f"{ASCOT_1430} {ASCOT_1500}", GO_SOFT))],
        )
    ]
    h.instance.add_dynamic_partitions("batches", keys)
    h.materialize(keys[0], *LOG_ASSETS)
    return Logged(h.data_dir, keys)


@pytest.mark.parametrize("how", ["raise", "crash"])
def test_failing_master_is_quarantined_then_replayed_in_order_after_the_fix(
    how: str, two_masters_logged: Logged, tmp_path, spark, monkeypatch: pytest.MonkeyPatch
):
    # A copy of the prepared folder (Delta tables and the landing zone are plain folders).
    shutil.copytree(two_masters_logged.data_dir, tmp_path / "data")
    h = Harness(tmp_path / "data", overrides=QUARANTINE_AFTER_2)
    keys = two_masters_logged.keys
    h.instance.add_dynamic_partitions("batches", keys)
    monkeypatch.setenv("SIS_INJECT_FOLD_FAILURE", f"{ASCOT_1500}:{how}")

    # One run: the fold of batches 1-2 fails twice on ASCOT_1500 (retried by the retry
    # policy), then quarantines it and folds ASCOT_1430.
    result = h.defs.resolve_job_def("process_batch").execute_in_process(
        partition_key=keys[1], instance=h.instance, raise_on_error=False
    )
    assert result.success
    retries = [
        e
        for e in h.instance.all_logs(result.run_id)
        if e.dagster_event is not None and e.dagster_event.event_type_value == "STEP_UP_FOR_RETRY"
    ]
    assert [e.step_key for e in retries] == ["fold_masters"] * 2
    lake = h.lake(spark)
    failures = lake.read(FOLD_FAILURES).collect()
    assert [(r["master_id"], r["released"]) for r in failures] == [(ASCOT_1500, False)] * 2
    docs = {r["master_id"]: r for r in lake.read(MASTER_DOCUMENTS).collect()}
    assert set(docs) == {ASCOT_1430} and docs[ASCOT_1430]["version"] == 2
    held = sorted((r["master_id"], r["reason"]) for r in lake.read(DEAD_LETTERS).collect())
    assert held == [(ASCOT_1500, "quarantined")] * 2  # its master, then its update

    monkeypatch.delenv("SIS_INJECT_FOLD_FAILURE")  # the fix
    replay = h.defs.resolve_job_def("replay_dead_letters").execute_in_process(
        instance=h.instance,
        run_config={"ops": {"replay": {"config": {"reasons": ["quarantined"]}}}},
    )
    assert replay.success
    assert_lake_matches_reference(lake, reference_for(h.logged_messages()))
    assert all(r["released"] for r in lake.read(FOLD_FAILURES).collect())


def test_error_text_naming_another_master_quarantines_only_the_failing_master(
    tmp_path, spark, monkeypatch: pytest.MonkeyPatch
):
    # ASCOT_1500's document holds the text a failure of ASCOT_1430 would once have carried;
    # the injected error quotes the document, as an lxml error does.
    decoy = f"sis-fold-failure[master_id={ASCOT_1430!r}]"
    h = Harness(tmp_path / "data", overrides={"SIS_QUARANTINE_AFTER": "1"})
    key = h.zone.writer.land(
        [received(master(event(ASCOT_1430))), received(master(event(ASCOT_1500, name=decoy)))]
    ).key
    h.instance.add_dynamic_partitions("batches", [key])
    monkeypatch.setenv("SIS_INJECT_FOLD_FAILURE", f"{ASCOT_1500}:raise")

    # The job logs and parses the batch itself (its first two steps), then folds.
    result = h.defs.resolve_job_def("process_batch").execute_in_process(
        partition_key=key, instance=h.instance, raise_on_error=False
    )
    assert result.success
    assert _retried_steps(h, result.run_id) == ["fold_masters"]
    lake = h.lake(spark)
    failures = lake.read(FOLD_FAILURES).collect()
    assert [(r["master_id"], r["kind"]) for r in failures] == [(ASCOT_1500, "error")]
    assert decoy in failures[0]["error"]  # kept as data, never read for a master id
    docs = {r["master_id"]: r for r in lake.read(MASTER_DOCUMENTS).collect()}
    assert set(docs) == {ASCOT_1430} and docs[ASCOT_1430]["version"] == 1
    assert [(r["master_id"], r["reason"]) for r in lake.read(DEAD_LETTERS).collect()] == [
        (ASCOT_1500, "quarantined")
    ]


def test_item_over_its_budget_is_dead_lettered_too_complex_and_later_batches_fold(
    tmp_path, spark, monkeypatch: pytest.MonkeyPatch
):
    h = Harness(tmp_path / "data", overrides={"SIS_ITEM_BUDGET_SECONDS": "0.5"})
    hung = "msg-hangs-the-fold"
    keys = [
        h.zone.writer.land(b).key
        for b in (
            [
                received(master(event(ASCOT_1430))),
                received(master(event(ASCOT_1500))),
                received(update(ASCOT_1500, GO_SOFT), message_id=hung),
                received(update(ASCOT_1430, GO_SOFT)),
            ],
            [
                received(master(event(ASCOT_1500), type="refresh")),
                received(update(ASCOT_1500, GO_SOFT)),
            ],
        )
    ]
    h.instance.add_dynamic_partitions("batches", keys)
    # Folding the update of message `hung` sleeps with signals blocked until killed.
    monkeypatch.setenv("SIS_INJECT_FOLD_FAILURE", f"{hung}:hang")

    first = h.defs.resolve_job_def("process_batch").execute_in_process(
        partition_key=keys[0], instance=h.instance, raise_on_error=False
    )
    # The step fails once (the watchdog killed its worker); the next attempt dead-letters the
    # item without folding it again and completes the batch.
    assert first.success
    assert _retried_steps(h, first.run_id) == ["fold_masters"]
    lake = h.lake(spark)
    failures = [
        (r["master_id"], r["kind"], r["message_id"], r["position"], r["error"])
        for r in lake.read(FOLD_FAILURES).collect()
    ]
    detail = "took longer than the per-item budget of 0.5 s (SIS_ITEM_BUDGET_SECONDS)"
    assert failures == [(ASCOT_1500, "timeout", hung, 0, detail)]
    letters = [
        (r["message_id"], r["master_id"], r["reason"], r["detail"])
        for r in lake.read(DEAD_LETTERS).collect()
    ]
    assert letters == [(hung, ASCOT_1500, "too-complex", detail)]
    docs = {r["master_id"]: r for r in lake.read(MASTER_DOCUMENTS).collect()}
    assert (docs[ASCOT_1430]["version"], docs[ASCOT_1430]["stale"]) == (2, False)
    assert (docs[ASCOT_1500]["version"], docs[ASCOT_1500]["stale"]) == (1, True)

    h.run(keys[1])  # a later batch folds: the refresh clears the stale mark
    docs = {r["master_id"]: r for r in lake.read(MASTER_DOCUMENTS).collect()}
    assert (docs[ASCOT_1500]["version"], docs[ASCOT_1500]["stale"]) == (3, False)
    outcomes = lake.read(MESSAGE_OUTCOMES).groupBy("outcome").count().collect()
    assert {r["outcome"]: r["count"] for r in outcomes} == {"applied": 5, "dead-lettered": 1}

    monkeypatch.delenv("SIS_INJECT_FOLD_FAILURE")  # the fix; replaying releases the item
    replay = h.defs.resolve_job_def("replay_dead_letters").execute_in_process(
        instance=h.instance,
        run_config={"ops": {"replay": {"config": {"reasons": ["too-complex"]}}}},
    )
    assert replay.success
    assert_lake_matches_reference(lake, reference_for(h.logged_messages()))


def test_message_whose_classification_raises_is_dead_lettered_quarantined_at_once(
    tmp_path, spark, monkeypatch: pytest.MonkeyPatch
):
    h = Harness(tmp_path / "data")
    bad = "msg-classify-raises"
    key = h.zone.writer.land(
        [received(master(event(ASCOT_1430))), received(master(event(ASCOT_1500)), message_id=bad)]
    ).key
    h.instance.add_dynamic_partitions("batches", [key])
    monkeypatch.setenv("SIS_INJECT_CLASSIFY_FAILURE", f"{bad}:raise")

    result = h.run(key)
    assert _retried_steps(h, result.run_id) == []  # a pure function: no attempt would differ
    lake = h.lake(spark)
    [letter] = lake.read(DEAD_LETTERS).collect()
    assert (letter["message_id"], letter["master_id"], letter["reason"]) == (
        bad,
        None,
        "quarantined",
    )
    assert letter["detail"].startswith("classification raised ZeroDivisionError: ")
    docs = {r["master_id"] for r in lake.read(MASTER_DOCUMENTS).collect()}
    assert docs == {ASCOT_1430}


@pytest.mark.parametrize(
    ("how", "retries", "reason", "detail"),
    [
        ("crash", 3, "quarantined", "its Python worker died classifying it 3 times"),
        (
            "hang",
            1,
            "too-complex",
            "took longer than the per-item budget of 0.5 s (SIS_ITEM_BUDGET_SECONDS)",
        ),
    ],
    ids=["crash", "hang"],
)
def test_message_whose_worker_dies_classifying_it_is_held_back_and_the_batch_completes(
    how: str,
    retries: int,
    reason: str,
    detail: str,
    tmp_path,
    spark,
    monkeypatch: pytest.MonkeyPatch,
):
    h = Harness(tmp_path / "data", overrides={"SIS_ITEM_BUDGET_SECONDS": "0.5"})
    bad = "msg-kills-its-worker"
    keys = [
        h.zone.writer.land(b).key
        for b in (
            [
                received(master(event(ASCOT_1430))),
                received(update(ASCOT_1430, GO_SOFT), message_id=bad),
            ],
            [received(master(event(ASCOT_1500)))],
        )
    ]
    h.instance.add_dynamic_partitions("batches", keys)
    monkeypatch.setenv("SIS_INJECT_CLASSIFY_FAILURE", f"{bad}:{how}")

    first = h.defs.resolve_job_def("process_batch").execute_in_process(
        partition_key=keys[0], instance=h.instance, raise_on_error=False
    )
    assert first.success
    assert _retried_steps(h, first.run_id) == ["message_items"] * retries
    lake = h.lake(spark)
    letters = [
        (r["message_id"], r["master_id"], r["reason"], r["detail"])
        for r in lake.read(DEAD_LETTERS).collect()
    ]
    assert letters == [(bad, None, reason, detail)]

    h.run(keys[1])  # a later batch folds
    docs = {r["master_id"]: r["version"] for r in lake.read(MASTER_DOCUMENTS).collect()}
    assert docs == {ASCOT_1430: 1, ASCOT_1500: 1}
