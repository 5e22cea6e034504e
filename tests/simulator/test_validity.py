"""Simulated feeds against the domain code: the labels say exactly what the consumer will do.

A regular message parses; an `invalid:<reason>` message fails with that reason; a clean day
folds through the reference pipeline with no dead letter and ends with the masters the
simulator modelled; a dirty feed dead-letters exactly the labelled messages, plus
`master-stale` for every update item that reaches a master an invalid patch made stale,
until the next master message for it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

import pytest
from lxml import etree

from sis_platform.domain.limits import Limits
from sis_platform.domain.messages import InvalidMessage, parse_message
from sis_platform.domain.pipeline import LoggedMessage, ReferencePipeline
from sis_platform.domain.reasons import Outcome, Reason
from sis_platform.simulator.generator import FeedSimulator, SimulatedMessage
from tests.simulator.helpers import (
    ITEM_LEVEL,
    MESSAGE_LEVEL,
    SMALL_LIMIT,
    clean_day,
    clean_day_masters,
    dirty_day,
    dirty_day_masters,
    ids,
)

STALE_MAKING = ("invalid:unlocated-node", "invalid:invalid-result")

DeadLetterKey = tuple[str, str | None, str]


def _fold(messages: Iterable[SimulatedMessage], max_bytes: int) -> ReferencePipeline:
    pipeline = ReferencePipeline(limits=Limits(max_message_bytes=max_bytes))
    pipeline.process(LoggedMessage(m.message_id, m.body) for m in messages)
    return pipeline


def _expected_dead_letters(
    messages: Sequence[SimulatedMessage],
) -> tuple[list[DeadLetterKey], set[str]]:
    """The dead letters the labels call for, in feed order, and the masters stale at the end."""
    expected: list[DeadLetterKey] = []
    stale: set[str] = set()
    seen: set[str] = set()
    for message in messages:
        if message.message_id in seen:
            continue  # a redelivery: recorded as a duplicate, never dead-lettered again
        seen.add(message.message_id)
        kind = message.kind
        reason = kind.removeprefix("invalid:")
        if reason in MESSAGE_LEVEL:
            expected.append((message.message_id, None, reason))
        elif kind.startswith("master-"):
            stale -= set(ids(message))
        elif kind == "invalid:orphan-update":
            expected += [(message.message_id, master_id, reason) for master_id in ids(message)]
        elif kind == "invalid:master-stale":
            # Only when an invalid patch was owed and every master was already stale.
            (master_id,) = ids(message)
            assert master_id in stale
            expected.append((message.message_id, master_id, reason))
        elif kind in STALE_MAKING:
            (master_id,) = ids(message)
            assert master_id not in stale, "an invalid patch goes to a master that is not stale"
            expected.append((message.message_id, master_id, reason))
            stale.add(master_id)
        else:
            assert kind == "update", kind
            expected += [
                (message.message_id, master_id, Reason.MASTER_STALE.value)
                for master_id in ids(message)
                if master_id in stale
            ]
    return expected, stale


def _canonical(document: bytes) -> bytes:
    return etree.tostring(etree.fromstring(document), method="c14n")


def _assert_masters_match_the_model(
    pipeline: ReferencePipeline, model: dict[str, str], stale: set[str]
) -> None:
    assert model
    for master_id, xml in model.items():
        state = pipeline.masters[master_id]
        assert state.document is not None
        if master_id in stale:
            assert state.stale
            continue
        assert not state.stale
        assert _canonical(state.document) == _canonical(xml.encode()), master_id


# --- parsing ----------------------------------------------------------------------------------


def test_every_message_not_labelled_invalid_parses() -> None:
    for message in clean_day() + dirty_day():
        if not message.kind.startswith("invalid:"):
            parse_message(message.body, limits=Limits(max_message_bytes=SMALL_LIMIT))


@pytest.mark.parametrize("reason", MESSAGE_LEVEL)
def test_each_invalid_message_fails_with_exactly_its_reason(reason: str) -> None:
    labelled = [m for m in dirty_day() if m.kind == f"invalid:{reason}"]
    assert len(labelled) == 120
    for message in labelled:
        with pytest.raises(InvalidMessage) as error:
            parse_message(message.body, limits=Limits(max_message_bytes=SMALL_LIMIT))
        assert error.value.reason == reason


@pytest.mark.parametrize("reason", ITEM_LEVEL)
def test_item_level_invalid_messages_are_valid_messages(reason: str) -> None:
    labelled = [m for m in dirty_day() if m.kind == f"invalid:{reason}"]
    assert labelled
    for message in labelled:
        parsed = parse_message(message.body, limits=Limits(max_message_bytes=SMALL_LIMIT))
        assert parsed.category == "update" and len(parsed.ids) == 1


def test_every_variant_of_each_reason_appears() -> None:
    # The corruptions vary (truncated, bad UTF-8, unknown attribute, bad enum, ...): with 120 of
    # each kind, the most specific variants must all show up.
    bodies = {
        reason: b"\n".join(m.body for m in dirty_day() if m.kind == f"invalid:{reason}")
        for reason in MESSAGE_LEVEL + ITEM_LEVEL
    }
    assert b"</markets>" in bodies["not-well-formed"] and b" & Co" in bodies["not-well-formed"]
    assert b'colours="' in bodies["schema-invalid"] and b'"scratched"' in bodies["schema-invalid"]
    assert b'category="update" id=' in bodies["invalid-envelope"]
    assert b' type="refresh"' in bodies["invalid-envelope"]
    assert b"<!-- SIS diagnostic" in bodies["too-large"]
    assert b"market[@id='TRI']" in bodies["unlocated-node"]
    assert b">postponed<" in bodies["invalid-result"]


# --- folding ----------------------------------------------------------------------------------


def test_a_clean_day_folds_with_no_dead_letters_into_the_modelled_masters() -> None:
    messages = clean_day()
    pipeline = _fold(messages, SMALL_LIMIT)
    assert pipeline.dead_letters == []
    counts = pipeline.outcome_counts()
    assert set(counts) == {Outcome.APPLIED}
    assert counts[Outcome.APPLIED] == sum(len(ids(m)) for m in messages)
    _assert_masters_match_the_model(pipeline, clean_day_masters(), stale=set())


def test_a_dirty_day_dead_letters_exactly_the_labelled_messages_and_stale_updates() -> None:
    messages = dirty_day()
    pipeline = _fold(messages, SMALL_LIMIT)
    expected, stale = _expected_dead_letters(messages)
    actual = [(d.message_id, d.master_id, str(d.reason)) for d in pipeline.dead_letters]
    assert actual == expected
    reasons = Counter(reason for _, _, reason in actual)
    assert reasons[Reason.MASTER_STALE] > 0  # the scenario really happens
    assert all(reasons[r] == 120 for r in MESSAGE_LEVEL + ITEM_LEVEL)
    duplicates = sum(1 for m in messages if m.kind == "duplicate")
    assert pipeline.outcome_counts()[Outcome.DUPLICATE] == duplicates
    # Every invalid patch was followed by a refresh, so no master ends stale, and every master
    # is the simulator's model again.
    assert stale == set()
    _assert_masters_match_the_model(pipeline, dirty_day_masters(), stale)


def test_stale_masters_recover_over_several_days_of_heavy_invalid_patching() -> None:
    simulator = FeedSimulator(
        21,
        14_500,  # two racing days (12,760 regular messages)
        invalid={"unlocated-node": 0.03, "invalid-result": 0.03, "orphan-update": 0.01},
        duplicates=0.05,
    )
    messages = list(simulator)
    assert len({m.sent.date() for m in messages}) == 2
    pipeline = _fold(messages, 4 * 1024 * 1024)
    expected, stale = _expected_dead_letters(messages)
    actual = [(d.message_id, d.master_id, str(d.reason)) for d in pipeline.dead_letters]
    assert actual == expected
    _assert_masters_match_the_model(pipeline, simulator.masters(), stale)


def test_an_invalid_patch_with_no_master_left_to_break_is_labelled_master_stale() -> None:
    # 8 invalid patches owed among 20 messages (one short race): some come when every master
    # is already stale, and the consumer will call those master-stale, so the label does too.
    simulator = FeedSimulator(3, 20, invalid={"unlocated-node": 0.4})
    messages = list(simulator)
    kinds = Counter(m.kind for m in messages)
    assert kinds["invalid:master-stale"] > 0
    assert kinds["invalid:master-stale"] + kinds["invalid:unlocated-node"] == 8
    pipeline = _fold(messages, 4 * 1024 * 1024)
    expected, stale = _expected_dead_letters(messages)
    actual = [(d.message_id, d.master_id, str(d.reason)) for d in pipeline.dead_letters]
    assert actual == expected
    _assert_masters_match_the_model(pipeline, simulator.masters(), stale)
