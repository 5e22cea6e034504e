"""The feed simulator: determinism, exact counts, shares, labels and the shape of a racing day."""

from __future__ import annotations

import itertools
import re
import time
from collections import Counter
from datetime import UTC, date

import pytest

from sis_platform.simulator.generator import (
    INVALID_REASONS,
    FeedSimulator,
    SimulatedMessage,
    generate_feed,
)
from tests.simulator.helpers import (
    ALL_INVALID,
    SMALL_LIMIT,
    clean_day,
    dirty_day,
    envelope,
    ids,
)

VALID_KINDS = {"master-new", "master-refresh", "update"}


def _regular(messages: tuple[SimulatedMessage, ...]) -> list[SimulatedMessage]:
    return [m for m in messages if m.kind in VALID_KINDS]


def test_same_seed_and_arguments_give_byte_identical_feeds() -> None:
    options = {"invalid": {"not-well-formed": 0.02, "unlocated-node": 0.02}, "duplicates": 0.03}
    first = list(generate_feed(5, 3_000, **options))  # type: ignore[arg-type]
    second = list(generate_feed(5, 3_000, **options))  # type: ignore[arg-type]
    assert first == second


def test_different_seeds_give_different_feeds() -> None:
    first = [m.body for m in generate_feed(5, 500)]
    second = [m.body for m in generate_feed(6, 500)]
    assert first != second
    assert [m.message_id for m in generate_feed(5, 50)] != [
        m.message_id for m in generate_feed(6, 50)
    ]


@pytest.mark.parametrize("count", [0, 1, 2, 5, 13, 50, 999, 4_321])
def test_yields_exactly_the_requested_number_of_messages(count: int) -> None:
    assert sum(1 for _ in generate_feed(2, count)) == count


@pytest.mark.parametrize("count", [1, 7, 40, 1_000])
def test_exact_count_holds_with_invalid_messages_and_duplicates(count: int) -> None:
    feed = list(generate_feed(9, count, invalid=ALL_INVALID, duplicates=0.1))
    assert len(feed) == count


def test_a_long_feed_is_generated_lazily() -> None:
    # 1.2 million messages are about 100 racing days; only the first day is planned before the
    # first messages come out.
    started = time.perf_counter()
    head = list(itertools.islice(generate_feed(1, 1_200_000), 2_000))
    assert len(head) == 2_000
    assert time.perf_counter() - started < 10


def test_a_long_feed_runs_over_consecutive_days() -> None:
    feed = generate_feed(4, 30_000)
    days = {m.sent.date() for m in feed}
    assert days == {date(2026, 11, 21), date(2026, 11, 22), date(2026, 11, 23)}


def test_message_ids_are_jms_ids_and_unique_except_duplicates() -> None:
    messages = dirty_day()
    pattern = re.compile(r"ID:[0-9a-f]{48}")
    assert all(pattern.fullmatch(m.message_id) for m in messages)
    originals = [m.message_id for m in messages if m.kind != "duplicate"]
    assert len(set(originals)) == len(originals)


def test_sent_times_are_utc_and_never_go_backwards() -> None:
    messages = dirty_day()
    assert all(m.sent.tzinfo is UTC for m in messages)
    assert all(a.sent <= b.sent for a, b in itertools.pairwise(messages))


def test_envelope_sent_matches_the_message_time() -> None:
    for message in clean_day()[:500]:
        assert envelope(message)["sent"] == message.sent.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_kinds_are_labelled_by_what_the_message_is() -> None:
    for message in clean_day():
        attributes = envelope(message)
        if message.kind == "update":
            assert attributes["category"] == "update" and "type" not in attributes
        else:
            expected = {"master-new": "new", "master-refresh": "refresh"}[message.kind]
            assert attributes["category"] == "master" and attributes["type"] == expected


def test_every_update_follows_a_master_for_each_of_its_ids() -> None:
    created: set[str] = set()
    for message in clean_day():
        listed = ids(message)
        if message.kind == "master-new":
            assert not created & set(listed), "a master is created once"
            created.update(listed)
        else:
            assert set(listed) <= created


def test_a_clean_feed_is_all_regular_messages() -> None:
    kinds = Counter(m.kind for m in clean_day())
    assert set(kinds) == VALID_KINDS
    assert kinds["update"] > 10 * kinds["master-new"]


def test_a_day_is_a_realistic_uk_and_irish_racing_card() -> None:
    races: dict[str, bytes] = {}
    for message in clean_day():
        if message.kind == "master-new":
            for master_id in ids(message):
                races[master_id] = message.body
    meetings = {master_id.split("-")[0] for master_id in races}
    assert 12 <= len(meetings) <= 25
    assert 140 <= len(races) <= 220
    assert all(re.fullmatch(r"[A-Z]{3}-20261121-\d{4}", master_id) for master_id in races)
    bodies = b"".join(races.values())
    assert b'sport="horse-racing"' in bodies and b'sport="greyhounds"' in bodies
    assert b'country="GB"' in bodies and b'country="IE"' in bodies
    assert b'type="each-way"' in bodies and b'type="forecast"' in bodies
    assert b"jockey=" in bodies and b"trainer=" in bodies
    # Escaping and UTF-8 are exercised: names with & and ' and non-ASCII letters.
    assert b"&amp;" in bodies and b"O'Brien" in bodies and "Ó".encode() in bodies


def test_races_at_a_meeting_are_15_to_35_minutes_apart() -> None:
    by_meeting: dict[str, list[int]] = {}
    for message in clean_day():
        if message.kind == "master-new":
            for master_id in ids(message):
                course, _, hhmm = master_id.split("-")
                by_meeting.setdefault(course, []).append(int(hhmm[:2]) * 60 + int(hhmm[2:]))
    for minutes in by_meeting.values():
        gaps = [b - a for a, b in itertools.pairwise(sorted(minutes))]
        assert all(15 <= gap <= 35 for gap in gaps)


def test_a_day_has_a_multi_id_going_update_for_one_meeting() -> None:
    going = [
        m
        for m in clean_day()
        if m.kind == "update" and len(ids(m)) > 1 and b'sel="/event/@going"' in m.body
    ]
    assert going
    for message in going:
        assert len({master_id.split("-")[0] for master_id in ids(message)}) == 1
        assert message.body.count(b"<replace ") == 1


def test_a_day_has_a_multi_id_master_message() -> None:
    assert any(m.kind.startswith("master-") and len(ids(m)) > 1 for m in clean_day())


def test_updates_use_every_kind_of_patch_operation() -> None:
    bodies = b"".join(m.body for m in clean_day() if m.kind == "update")
    for needle in (
        b'/price/@num">',
        b'/price/@den">',
        b'/price/@at">',
        b'type="@status">non-runner</add>',
        b'/@status">non-runner</replace>',
        b'/@status">suspended</replace>',
        b'/@status">open</replace>',
        b'sel="/event/@status">active<',
        b'sel="/event/@status">off<',
        b'sel="/event/@status">finished<',
        b">winner</replace>",
        b">placed</replace>",
        b">loser</replace>",
        b'/price"/>',  # remove a non-runner's price
        b'<add sel="/event"><market ',  # a new market
    ):
        assert needle in bodies, needle


def test_greyhound_reserves_are_added_after_the_withdrawn_trap() -> None:
    # Seed 1's first day has no reserve; look over a few days.
    bodies = b"".join(m.body for m in generate_feed(2, 40_000) if m.kind == "update")
    assert b'pos="after"><selection id="R' in bodies
    assert b">withdrawn<" in bodies


def test_invalid_and_duplicate_shares_are_exact() -> None:
    kinds = Counter(m.kind for m in dirty_day())
    for reason in ALL_INVALID:
        assert kinds[f"invalid:{reason}"] == 120
    assert kinds["duplicate"] == 240
    assert sum(kinds.values()) == 12_000


@pytest.mark.parametrize("share", [0.001, 0.05, 0.3])
def test_a_single_share_is_honoured(share: float) -> None:
    kinds = Counter(m.kind for m in generate_feed(11, 4_000, invalid={"orphan-update": share}))
    assert kinds["invalid:orphan-update"] == round(share * 4_000)


def test_invalid_messages_are_spread_over_the_feed() -> None:
    positions = [i for i, m in enumerate(dirty_day()) if m.kind == "invalid:schema-invalid"]
    quarters = Counter(4 * i // 12_000 for i in positions)
    assert all(15 <= quarters[q] <= 45 for q in range(4))


def test_duplicates_repeat_a_recent_regular_message() -> None:
    messages = dirty_day()
    first_seen: dict[str, tuple[int, bytes]] = {}
    for index, message in enumerate(messages):
        if message.kind != "duplicate":
            first_seen.setdefault(message.message_id, (index, message.body))
            continue
        original_index, body = first_seen[message.message_id]
        assert body == message.body
        assert messages[original_index].kind in VALID_KINDS
        assert 0 < index - original_index < 200


def test_too_large_messages_are_over_the_limit_and_no_others_are() -> None:
    for message in dirty_day():
        if message.kind == "invalid:too-large":
            assert SMALL_LIMIT < len(message.body) <= SMALL_LIMIT + 64 * 1024
        else:
            assert len(message.body) <= SMALL_LIMIT


def test_too_large_at_the_default_limit_is_over_four_mebibytes() -> None:
    big = [m for m in generate_feed(1, 200, invalid={"too-large": 0.01}) if "too" in m.kind]
    assert len(big) == 2
    assert all(len(m.body) > 4 * 1024 * 1024 for m in big)


def test_an_invalid_patch_is_followed_by_a_refresh_of_its_master() -> None:
    messages = dirty_day()
    pending: set[str] = set()
    for message in messages:
        if message.kind in ("invalid:unlocated-node", "invalid:invalid-result"):
            (master_id,) = ids(message)
            pending.add(master_id)
        elif message.kind.startswith("master-"):
            pending -= set(ids(message))
    assert not pending


def test_orphan_updates_name_masters_that_never_exist() -> None:
    messages = dirty_day()
    created = {i for m in messages if m.kind == "master-new" for i in ids(m)}
    orphans = [i for m in messages if m.kind == "invalid:orphan-update" for i in ids(m)]
    assert orphans and not set(orphans) & created


def test_start_date_moves_the_day_and_summer_time_applies() -> None:
    summer = list(generate_feed(1, 300, start=date(2026, 6, 20)))
    new = next(m for m in summer if m.kind == "master-new")
    assert "-20260620-" in ids(new)[0]
    assert b'start="2026-06-20T' in new.body and b':00+01:00"' in new.body
    winter = next(m for m in generate_feed(1, 300) if m.kind == "master-new")
    assert b':00+00:00"' in winter.body


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"invalid": {"bogus": 0.1}}, "unknown invalid kind"),
        ({"invalid": {"master-stale": 0.1}}, "unknown invalid kind"),
        ({"invalid": {"too-large": 1.5}}, "within [0, 1]"),
        ({"duplicates": -0.1}, "within [0, 1]"),
        ({"invalid": {"too-large": 0.6}, "duplicates": 0.6}, "more than 1"),
        ({"invalid": {"too-large": 1.0}}, "at least one regular message"),
        ({"max_bytes": 1000}, "max_bytes"),
        ({"messages": -1}, "messages"),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, object], message: str) -> None:
    arguments: dict[str, object] = {"seed": 1, "messages": 100, **kwargs}
    with pytest.raises(ValueError, match=re.escape(message)):
        generate_feed(**arguments)  # type: ignore[arg-type]


def test_every_supported_reason_can_be_asked_for() -> None:
    invalid = {reason.value: 0.05 for reason in INVALID_REASONS}
    kinds = Counter(m.kind for m in generate_feed(8, 1_000, invalid=invalid))
    assert {k for k in kinds if k.startswith("invalid:")} == {
        f"invalid:{r}" for r in INVALID_REASONS
    }


def test_a_simulator_is_iterated_once() -> None:
    simulator = FeedSimulator(1, 10)
    assert len(list(simulator)) == 10
    with pytest.raises(RuntimeError):
        iter(simulator)
