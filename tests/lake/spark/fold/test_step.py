"""fold_step on a small Delta lake, without Dagster: new batches, a gap, a changed batch's rewind,
an explicit rewind and a master whose fold raises, each checked against the reference
pipeline."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sis_platform.domain.dedup import DedupWindow
from sis_platform.domain.limits import DEFAULT_LIMITS
from sis_platform.lake.spark.fold import FoldFailure, fold_all, fold_step, known_failures
from sis_platform.lake.spark.fold import step as step_module
from sis_platform.lake.tables import (
    FOLD_FAILURES,
    FOLD_STEPS,
    MASTER_DOCUMENTS,
    MESSAGE_OUTCOMES,
)
from sis_platform.runtime.faults import InjectedFailure
from tests.domain.sportsdata_fixtures import (
    ASCOT_1430,
    ASCOT_1500,
    GO_SOFT,
    PRICE_7_TO_9,
    event,
    master,
    update,
)
from tests.lake.spark.fold.lakes import log_batch, message, new_lake
from tests.reference import assert_lake_matches_reference, reference_for

pytestmark = [pytest.mark.spark, pytest.mark.cost(330)]


def test_steps_over_new_batches_match_the_reference(spark, tmp_path):
    lake = new_lake(spark, tmp_path)
    soft = message(update(ASCOT_1430, GO_SOFT))
    first = [message(master(event(ASCOT_1430))), soft, message(b"<not-xml")]
    second = [
        message(soft.body, soft.message_id, delivery_count=2),  # redelivered: a duplicate
        message(update(ASCOT_1430, PRICE_7_TO_9)),
        message(update(ASCOT_1500, GO_SOFT)),  # an orphan
    ]
    log_batch(lake, 1, first)
    log_batch(lake, 2, second)
    steps = fold_all(lake)
    assert [(s.fold_step, s.first_batch_seq, s.last_batch_seq) for s in steps] == [(2, 1, 2)]
    (s,) = steps
    assert (s.messages, s.applied, s.duplicates, s.dead_lettered) == (6, 3, 1, 2)
    assert s.masters_changed == 1 and s.waiting_for is None
    assert_lake_matches_reference(lake, reference_for(first + second))


def test_with_a_priority_its_masters_documents_commit_before_the_others(spark, tmp_path):
    lake = new_lake(spark, tmp_path)
    first = [message(master(event(ASCOT_1430))), message(master(event(ASCOT_1500)))]
    second = [message(update(ASCOT_1430, GO_SOFT)), message(update(ASCOT_1500, PRICE_7_TO_9))]
    log_batch(lake, 1, first)
    fold_step(lake)
    log_batch(lake, 2, second)
    before = lake.version(MASTER_DOCUMENTS)
    fold_step(lake, priority=f"masterId = 'nobody'; masterId = '{ASCOT_1500}'")
    assert lake.version(MASTER_DOCUMENTS) == before + 2  # the priority class's commit, the rest

    def versions(version):
        rows = lake.read(MASTER_DOCUMENTS, version=version).collect()
        return {r["master_id"]: r["version"] for r in rows}

    assert versions(before) == {ASCOT_1430: 1, ASCOT_1500: 1}
    assert versions(before + 1) == {ASCOT_1430: 1, ASCOT_1500: 2}  # ahead of the other master
    assert versions(before + 2) == {ASCOT_1430: 2, ASCOT_1500: 2}
    assert_lake_matches_reference(lake, reference_for(first + second))


def test_a_redelivery_in_a_later_step_is_a_duplicate(spark, tmp_path, monkeypatch):
    # Without broadcast: a step with more ids than the fold broadcasts (a catch-up over many
    # batches) looks them up in message_outcomes by a join Spark plans; the same duplicates
    # must come out.
    monkeypatch.setattr("sis_platform.lake.spark.fold.dedupe.BROADCAST_STEP_IDS_MAX", 0)
    lake = new_lake(spark, tmp_path)
    soft = message(update(ASCOT_1430, GO_SOFT))
    first = [message(master(event(ASCOT_1430))), soft]
    second = [
        message(soft.body, soft.message_id, delivery_count=2),
        message(update(ASCOT_1430, PRICE_7_TO_9)),
    ]
    log_batch(lake, 1, first)
    assert fold_step(lake).applied == 2
    log_batch(lake, 2, second)
    result = fold_step(lake)
    assert (result.fold_step, result.duplicates, result.applied) == (2, 1, 1)
    assert_lake_matches_reference(lake, reference_for(first + second))
    outcomes = sorted(
        (r["batch_seq"], r["outcome"])
        for r in lake.read(MESSAGE_OUTCOMES).collect()
        if r["message_id"] == soft.message_id
    )
    assert outcomes == [(1, "applied"), (2, "duplicate")]


def test_a_copy_beyond_the_dedup_window_is_applied_again_as_the_reference_does(spark, tmp_path):
    # Window 1: the copy of batch 1's update in batch 3 is two batches on, so a first copy
    # anew (applied again); the copy of batch 2's in batch 3 is a duplicate.
    window = DedupWindow(1)
    lake = new_lake(spark, tmp_path)
    soft = message(update(ASCOT_1430, GO_SOFT))
    price = message(update(ASCOT_1430, PRICE_7_TO_9))
    batches = {
        1: [message(master(event(ASCOT_1430))), soft],
        2: [price],
        3: [message(soft.body, soft.message_id), message(price.body, price.message_id)],
    }
    for seq, messages in batches.items():
        log_batch(lake, seq, messages)
        fold_step(lake, window=window)
    outcomes = sorted(
        (r["batch_seq"], r["outcome"])
        for r in lake.read(MESSAGE_OUTCOMES).collect()
        if r["message_id"] in (soft.message_id, price.message_id)
    )
    assert outcomes == [(1, "applied"), (2, "applied"), (3, "applied"), (3, "duplicate")]
    logged = [replace(m, batch_seq=seq) for seq, ms in batches.items() for m in ms]
    assert_lake_matches_reference(lake, reference_for(logged, window=window))


def test_the_fold_waits_at_a_missing_batch(spark, tmp_path):
    lake = new_lake(spark, tmp_path)
    log_batch(lake, 1, [message(master(event(ASCOT_1430)))])
    log_batch(lake, 3, [message(update(ASCOT_1430, GO_SOFT))])
    result = fold_step(lake)
    assert (result.fold_step, result.last_batch_seq, result.waiting_for) == (1, 1, 2)
    assert fold_step(lake).fold_step is None
    assert fold_step(lake).waiting_for == 2


def test_a_changed_batch_rewinds_the_masters_it_touches(spark, tmp_path):
    lake = new_lake(spark, tmp_path)
    first = [message(master(event(ASCOT_1430), event(ASCOT_1500)))]
    second = [message(update(ASCOT_1430, GO_SOFT)), message(update(ASCOT_1500, GO_SOFT))]
    # Batch 1 classified under a bound that dead-letters its message; the updates are orphans.
    log_batch(lake, 1, first, limits=replace(DEFAULT_LIMITS, max_ids=1))
    log_batch(lake, 2, second)
    assert fold_step(lake).dead_lettered == 3
    # The fix: batch 1 classified again. Both masters are rewound and refolded.
    log_batch(lake, 1, first)
    result = fold_step(lake)
    assert result.changed_batches == (1,)
    assert (result.fold_step, result.rewound_masters, result.applied) == (3, 2, 4)
    assert_lake_matches_reference(lake, reference_for(first + second))
    assert fold_step(lake).fold_step is None


def test_an_explicit_rewind_refolds_to_the_same_lake(spark, tmp_path):
    lake = new_lake(spark, tmp_path)
    messages = [
        message(master(event(ASCOT_1430))),
        message(update(ASCOT_1430, GO_SOFT)),
        message(update(ASCOT_1430, PRICE_7_TO_9)),
    ]
    log_batch(lake, 1, messages[:2])
    log_batch(lake, 2, messages[2:])
    fold_all(lake)
    before = sorted(lake.read(MASTER_DOCUMENTS).select("master_id", "version").collect())
    result = fold_step(lake, rewind={ASCOT_1430: 2})
    assert (result.fold_step, result.rewound_masters, result.applied) == (3, 1, 1)
    assert sorted(lake.read(MASTER_DOCUMENTS).select("master_id", "version").collect()) == before
    assert_lake_matches_reference(lake, reference_for(messages))


def test_a_master_whose_fold_raises_fails_the_step_then_is_quarantined(
    spark, tmp_path, monkeypatch
):
    lake = new_lake(spark, tmp_path)
    messages = [message(master(event(ASCOT_1430))), message(master(event(ASCOT_1500)))]
    log_batch(lake, 1, messages)
    failure = InjectedFailure(ASCOT_1430, "raise")
    monkeypatch.setattr(step_module, "injected_fold_failure", lambda: failure)
    with pytest.raises(FoldFailure, match=ASCOT_1430):
        fold_step(lake, quarantine_after=1)
    assert lake.read(FOLD_STEPS).count() == 0  # nothing committed
    assert list(known_failures(lake, 1).quarantined) == [ASCOT_1430]
    [row] = lake.read(FOLD_FAILURES).collect()
    assert (row["master_id"], row["kind"], row["fold_step"]) == (ASCOT_1430, "error", 1)
    result = fold_step(lake, quarantine_after=1)
    assert (result.applied, result.dead_lettered) == (1, 1)
    documents = {r["master_id"] for r in lake.read(MASTER_DOCUMENTS).collect()}
    assert documents == {ASCOT_1500}
