"""The duplicate rule both paths apply (sis_platform/domain/dedup.py): a copy is a duplicate when
its nearest earlier copy lies in its batch or within the window's batches before it; the
reference pipeline applies it per message, in stretches that never hold one id's first copy
twice."""

from __future__ import annotations

import pytest

from sis_platform.domain.dedup import DEFAULT_DEDUP_WINDOW_BATCHES, Copies, DedupWindow
from sis_platform.domain.pipeline import (
    LoggedMessage,
    ReferencePipeline,
    StretchBeyondWindow,
    classify_stretch,
)
from sis_platform.domain.reasons import Outcome
from tests.domain.sportsdata_fixtures import ASCOT_1430, GO_SOFT, event, master, update


def test_a_window_counts_its_batches_back_from_a_copy():
    window = DedupWindow(3)
    assert window.oldest(10) == 7 and window.oldest(2) == 0
    assert window.counts(7, 10) and window.counts(10, 10) and not window.counts(6, 10)
    unbounded = DedupWindow(0)
    assert not unbounded.bounded and unbounded.oldest(10**9) == 0 and unbounded.counts(0, 10**9)
    assert DedupWindow().batches == DEFAULT_DEDUP_WINDOW_BATCHES == 21_600
    with pytest.raises(ValueError, match="0 \\(unbounded\\) or more"):
        DedupWindow(-1)


def test_a_window_holds_a_stretch_no_longer_than_itself():
    assert DedupWindow(100).holds_stretch(100) and not DedupWindow(100).holds_stretch(101)
    assert DedupWindow(0).holds_stretch(10**9)


def test_the_nearest_earlier_copy_decides():
    copies = Copies(DedupWindow(3), {"a": 2})
    assert copies.duplicate("a", 5) and not copies.duplicate("a", 6)
    copies.add("a", 6)  # a first copy anew: the copies after it count from it
    assert copies.duplicate("a", 9) and not copies.duplicate("a", 10)
    copies.add("a", 4)  # an earlier batch never moves the latest copy back
    assert copies.duplicate("a", 9)
    assert not copies.duplicate("b", 1) and "b" not in copies and "a" in copies
    snapshot = copies.snapshot()
    copies.add("b", 1)
    assert "b" not in snapshot


def _message(message_id: str, body: bytes, batch_seq: int) -> LoggedMessage:
    return LoggedMessage(message_id, body, batch_seq=batch_seq)


NEW = master(event(ASCOT_1430))
SOFT = update(ASCOT_1430, GO_SOFT)


def test_a_copy_beyond_the_window_is_processed_as_a_first_copy():
    log = [
        _message("m1", NEW, 1),
        _message("m2", SOFT, 1),
        _message("m2", SOFT, 4),  # 3 batches after: a duplicate
        _message("m2", SOFT, 8),  # 4 after the copy in batch 4: applied again
    ]
    windowed = ReferencePipeline(window=DedupWindow(3))
    windowed.process(log)
    outcomes = [r.outcome for r in windowed.results]
    assert outcomes == [Outcome.APPLIED, Outcome.APPLIED, Outcome.DUPLICATE, Outcome.APPLIED]
    assert windowed.masters[ASCOT_1430].version == 3
    # The same log with the whole log as the window: the copy in batch 8 is a duplicate too.
    whole = ReferencePipeline(window=DedupWindow(0))
    whole.process(log)
    assert [r.outcome for r in whole.results][-1] is Outcome.DUPLICATE
    assert whole.masters[ASCOT_1430].version == 2
    # Stretch by stretch (as sis-live and the lake fold), the same results.
    split = ReferencePipeline(window=DedupWindow(3))
    for message in log:
        split.process([message])
    assert split.results == windowed.results and split.masters == windowed.masters


def test_a_stretch_holding_two_first_copies_of_an_id_is_refused():
    log = [_message("m1", NEW, 1), _message("m1", NEW, 9)]
    with pytest.raises(StretchBeyondWindow, match="spans more batches than the dedup window"):
        classify_stretch(log, Copies(DedupWindow(3)))
