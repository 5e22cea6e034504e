"""The poison policy (sis_platform/domain/poison.py), the rules both paths apply to the failures
they recorded: the lake's fold_failures and classify_failures, sis-live's failures.json."""

from __future__ import annotations

from sis_platform.domain.fold import MasterState
from sis_platform.domain.items import Item
from sis_platform.domain.poison import (
    Held,
    PoisonPolicy,
    classify_deaths_detail,
    held_back,
    quarantine_detail,
)
from sis_platform.domain.reasons import Outcome, Reason

POLICY = PoisonPolicy(quarantine_after=3)


def test_a_timed_out_classification_is_too_complex_whatever_the_deaths():
    assert POLICY.held_message(timed_out="over", deaths=0) == Held(Reason.TOO_COMPLEX, "over")
    assert POLICY.held_message(timed_out="over", deaths=5) == Held(Reason.TOO_COMPLEX, "over")


def test_a_message_is_quarantined_at_the_threshold_of_deaths_not_before():
    assert POLICY.held_message(timed_out=None, deaths=0) is None
    assert POLICY.held_message(timed_out=None, deaths=2) is None
    assert POLICY.held_message(timed_out=None, deaths=3) == Held(
        Reason.QUARANTINED, classify_deaths_detail(3)
    )


def test_masters_are_quarantined_at_the_threshold_with_their_count_and_last_error():
    failures = [("a", "e1"), ("b", "x"), ("a", "e2"), ("b", "y"), ("a", "e3"), ("c", "z")]
    assert POLICY.quarantined(failures) == {"a": quarantine_detail(3, "e3")}
    assert PoisonPolicy(quarantine_after=1).quarantined(failures) == {
        "a": quarantine_detail(3, "e3"),
        "b": quarantine_detail(2, "y"),
        "c": quarantine_detail(1, "z"),
    }
    assert POLICY.quarantined([]) == {}
    assert not POLICY.quarantines(2) and POLICY.quarantines(3)


def test_a_held_back_master_keeps_its_state_and_dead_letters_every_item():
    state = MasterState(master_id="m", version=4, document=b"<doc/>")
    items = [
        Item("u1", 0, "m", "update", None, b"<u/>"),
        Item("u2", 0, "m", "update", None, b"<u/>"),
    ]
    result = held_back("m", state, items, "fold failed 3 times: boom")
    assert result.state == state
    assert [(r.message_id, r.outcome, r.reason, r.detail, r.version) for r in result.results] == [
        ("u1", Outcome.DEAD_LETTERED, Reason.QUARANTINED, "fold failed 3 times: boom", None),
        ("u2", Outcome.DEAD_LETTERED, Reason.QUARANTINED, "fold failed 3 times: boom", None),
    ]
    assert held_back("new", None, items, "d").state == MasterState("new", 0, None)
