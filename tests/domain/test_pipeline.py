from __future__ import annotations

from collections import Counter, defaultdict

import pytest
from lxml import etree

from sis_platform.domain.fold import ItemResult, MasterState, PatchCache, fold_master
from sis_platform.domain.items import Item
from sis_platform.domain.limits import Limits
from sis_platform.domain.pipeline import (
    DEFAULT_REDELIVERY_LIMIT,
    DeadLetter,
    LoggedMessage,
    MessageResult,
    ReferencePipeline,
    classify_message,
    valid_items_by_master,
)
from sis_platform.domain.reasons import Outcome, Reason
from sis_platform.simulator.generator import INVALID_REASONS, generate_feed
from sis_platform.standards.selector import Selector
from tests.domain.sportsdata_fixtures import (
    ASCOT_1430,
    ASCOT_1500,
    GO_SOFT,
    MISSING_NODE,
    PRICE_7_TO_9,
    ROMFORD_1912,
    event,
    master,
    update,
)


def mid(n: int) -> str:
    return f"ID:{n:048x}"


def log(*bodies: bytes) -> list[LoggedMessage]:
    return [LoggedMessage(mid(n), body) for n, body in enumerate(bodies, start=1)]


def run(messages, **kwargs) -> ReferencePipeline:
    pipeline = ReferencePipeline(**kwargs)
    pipeline.process(messages)
    return pipeline


APPLIED = (Outcome.APPLIED, None)


def summary(pipeline: ReferencePipeline) -> list[tuple]:
    return [
        (r.message_id, getattr(r, "position", None), r.outcome, r.reason) for r in pipeline.results
    ]


def test_master_then_update_produces_two_versions():
    pipeline = run(log(master(event()), update(ASCOT_1430, GO_SOFT)))
    assert summary(pipeline) == [
        (mid(1), 0, Outcome.APPLIED, None),
        (mid(2), 0, Outcome.APPLIED, None),
    ]
    state = pipeline.masters[ASCOT_1430]
    assert state.version == 2
    assert etree.fromstring(state.document).get("going") == "soft"
    assert [(v.version, v.operation, v.message_id) for v in pipeline.versions] == [
        (1, "new", mid(1)),
        (2, "update", mid(2)),
    ]
    assert pipeline.dead_letters == []


def test_redelivered_message_is_a_duplicate_and_its_update_is_applied_once():
    messages = log(master(event()), update(ASCOT_1430, PRICE_7_TO_9))
    messages.append(LoggedMessage(mid(2), messages[1].body, delivery_count=2))
    pipeline = run(messages)
    assert summary(pipeline)[-1] == (mid(2), None, Outcome.DUPLICATE, None)
    assert pipeline.masters[ASCOT_1430].version == 2


def test_same_id_later_in_the_log_is_a_duplicate_even_after_a_dead_letter():
    pipeline = run(
        [
            LoggedMessage(mid(1), b"<broken"),
            LoggedMessage(mid(1), master(event())),
        ]
    )
    assert summary(pipeline) == [
        (mid(1), None, Outcome.DEAD_LETTERED, Reason.NOT_WELL_FORMED),
        (mid(1), None, Outcome.DUPLICATE, None),
    ]
    assert pipeline.masters == {}


def test_duplicates_are_recognised_across_process_calls():
    pipeline = ReferencePipeline()
    pipeline.process(log(master(event())))
    pipeline.process([LoggedMessage(mid(1), master(event(going="heavy")))])
    assert pipeline.results[-1].outcome is Outcome.DUPLICATE
    assert pipeline.masters[ASCOT_1430].version == 1


def test_delivery_over_the_redelivery_limit_is_dead_lettered_whatever_the_body():
    limit = DEFAULT_REDELIVERY_LIMIT
    pipeline = run(
        [
            LoggedMessage(mid(1), master(event()), delivery_count=limit),
            LoggedMessage(mid(2), update(ASCOT_1430, GO_SOFT), delivery_count=limit + 1),
            LoggedMessage(mid(3), b"<broken", delivery_count=limit + 1),
        ]
    )
    assert summary(pipeline) == [
        (mid(1), 0, Outcome.APPLIED, None),
        (mid(2), None, Outcome.DEAD_LETTERED, Reason.REDELIVERY_LIMIT),
        (mid(3), None, Outcome.DEAD_LETTERED, Reason.REDELIVERY_LIMIT),
    ]
    assert pipeline.masters[ASCOT_1430].version == 1


def test_redelivery_limit_is_configurable():
    pipeline = run([LoggedMessage(mid(1), master(event()), delivery_count=2)], redelivery_limit=1)
    assert pipeline.dead_letters[0].reason is Reason.REDELIVERY_LIMIT


def test_duplicate_is_checked_before_the_redelivery_limit():
    pipeline = run(
        [
            LoggedMessage(mid(1), master(event())),
            LoggedMessage(mid(1), master(event()), delivery_count=99),
        ]
    )
    assert summary(pipeline)[1] == (mid(1), None, Outcome.DUPLICATE, None)
    assert pipeline.dead_letters == []


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"\x00\x01", Reason.NOT_WELL_FORMED),
        (b"<!DOCTYPE sportsdata>" + master(event()), Reason.NOT_WELL_FORMED),
        (master(event(sport="curling")), Reason.SCHEMA_INVALID),
        (update(f"{ASCOT_1430} {ASCOT_1430}", GO_SOFT), Reason.INVALID_ENVELOPE),
        (master(event(ASCOT_1500), ids=ASCOT_1430), Reason.IDS_MISMATCH),
    ],
    ids=["not-well-formed", "doctype", "schema-invalid", "invalid-envelope", "ids-mismatch"],
)
def test_invalid_message_is_dead_lettered_whole_with_its_body(body, reason):
    pipeline = run(log(body))
    (dead,) = pipeline.dead_letters
    assert (dead.message_id, dead.master_id, dead.position) == (mid(1), None, None)
    assert dead.reason is reason
    assert dead.detail
    assert dead.body == body
    assert summary(pipeline) == [(mid(1), None, Outcome.DEAD_LETTERED, reason)]


def test_too_large_boundary_follows_max_bytes():
    body = master(event())
    at_limit = run(log(body), limits=Limits(max_message_bytes=len(body)))
    over = run(log(body), limits=Limits(max_message_bytes=len(body) - 1))
    assert at_limit.results[0].outcome is Outcome.APPLIED
    assert over.dead_letters[0].reason is Reason.TOO_LARGE


def test_invalid_message_does_not_block_other_masters():
    pipeline = run(
        log(
            master(event(ASCOT_1430)),
            b"<sportsdata category='update' id='x'>",
            update(ASCOT_1430, GO_SOFT),
        )
    )
    assert pipeline.masters[ASCOT_1430].version == 2


def test_item_dead_letters_keep_master_position_and_original_body():
    body = update(f"{ASCOT_1500} {ASCOT_1430}", MISSING_NODE)
    pipeline = run(log(master(event(ASCOT_1430)), body))
    assert [(d.master_id, d.position, d.reason, d.body) for d in pipeline.dead_letters] == [
        (ASCOT_1500, 0, Reason.ORPHAN_UPDATE, body),
        (ASCOT_1430, 1, Reason.UNLOCATED_NODE, body),
    ]


def test_multi_master_update_applies_to_each_master_independently():
    place = '<market id="PLACE" type="place" status="open"/>'
    pipeline = run(
        log(
            master(event(ASCOT_1430), event(ASCOT_1500, markets=place)),
            update(f"{ASCOT_1430} {ASCOT_1500} {ROMFORD_1912}", MISSING_NODE),
            update(f"{ASCOT_1430} {ASCOT_1500}", GO_SOFT),
        )
    )
    assert summary(pipeline)[2:] == [
        (mid(2), 0, Outcome.DEAD_LETTERED, Reason.UNLOCATED_NODE),
        (mid(2), 1, Outcome.APPLIED, None),
        (mid(2), 2, Outcome.DEAD_LETTERED, Reason.ORPHAN_UPDATE),
        (mid(3), 0, Outcome.DEAD_LETTERED, Reason.MASTER_STALE),
        (mid(3), 1, Outcome.APPLIED, None),
    ]
    assert pipeline.masters[ASCOT_1430] == MasterState(
        ASCOT_1430, 1, pipeline.versions[0].document, stale=True
    )
    assert pipeline.masters[ASCOT_1500].version == 3
    assert ROMFORD_1912 not in pipeline.masters


def test_master_message_items_are_applied_in_id_order():
    pipeline = run(
        log(
            master(event(ASCOT_1500), event(ASCOT_1430), ids=f"{ASCOT_1430} {ASCOT_1500}"),
        )
    )
    assert [(v.master_id, v.position) for v in pipeline.versions] == [
        (ASCOT_1430, 0),
        (ASCOT_1500, 1),
    ]


def test_stale_master_recovers_on_refresh():
    pipeline = run(
        log(
            master(event()),
            update(ASCOT_1430, MISSING_NODE),
            update(ASCOT_1430, GO_SOFT),
            master(event(going="firm"), type="refresh"),
            update(ASCOT_1430, GO_SOFT),
        )
    )
    assert [r.reason for r in pipeline.results] == [
        None,
        Reason.UNLOCATED_NODE,
        Reason.MASTER_STALE,
        None,
        None,
    ]
    state = pipeline.masters[ASCOT_1430]
    assert (state.version, state.stale) == (3, False)


def test_selector_filters_items_and_every_message_is_accounted_for():
    selector = Selector.compile("sport = 'horse-racing'")
    pipeline = run(
        log(
            master(event(ASCOT_1430), event(ROMFORD_1912, sport="greyhounds", course="Romford")),
            update(f"{ASCOT_1430} {ROMFORD_1912}", GO_SOFT),
            update(ROMFORD_1912, GO_SOFT),
        ),
        selector=selector,
    )
    assert summary(pipeline) == [
        (mid(1), 0, Outcome.APPLIED, None),
        (mid(1), 1, Outcome.FILTERED, None),
        (mid(2), 0, Outcome.APPLIED, None),
        (mid(2), 1, Outcome.FILTERED, None),
        (mid(3), 0, Outcome.FILTERED, None),
    ]
    assert pipeline.masters[ROMFORD_1912].filtered
    assert pipeline.dead_letters == []


def test_every_message_ends_applied_duplicate_filtered_or_dead_lettered():
    messages = log(
        master(event(ASCOT_1430)),
        update(ASCOT_1430, GO_SOFT),
        update(ASCOT_1500, GO_SOFT),
        b"junk",
        master(event(ROMFORD_1912, sport="greyhounds", course="Romford")),
    )
    messages.append(messages[1])
    pipeline = run(messages, selector=Selector.compile("sport = 'horse-racing'"))
    by_message = defaultdict(set)
    for result in pipeline.results:
        by_message[result.message_id].add(result.outcome)
    assert set(by_message) == {m.message_id for m in messages}
    assert pipeline.outcome_counts() == {
        Outcome.APPLIED: 2,
        Outcome.DEAD_LETTERED: 2,
        Outcome.FILTERED: 1,
        Outcome.DUPLICATE: 1,
    }


def test_incremental_processing_equals_one_batch():
    messages = log(
        master(event(ASCOT_1430), event(ASCOT_1500)),
        update(f"{ASCOT_1500} {ASCOT_1430}", GO_SOFT),
        update(ASCOT_1430, MISSING_NODE),
        b"<nope/>",
        update(ASCOT_1430, PRICE_7_TO_9),
        master(event(ASCOT_1430, going="firm"), type="refresh"),
        update(f"{ASCOT_1430} {ASCOT_1500}", PRICE_7_TO_9),
        update(ROMFORD_1912, GO_SOFT),
    )
    messages.insert(3, messages[1])
    batch = run(messages)
    one_by_one = ReferencePipeline()
    for message in messages:
        one_by_one.process([message])
    for name in ("masters", "versions", "dead_letters", "results"):
        assert getattr(one_by_one, name) == getattr(batch, name), name


def test_spark_recipe_reproduces_the_pipeline():
    """Dedupe by message id in landing order, classify each message, fold per master over its
    items sorted by (landing order, position): the recipe the Spark fold follows."""
    messages = log(
        master(event(ASCOT_1430), event(ASCOT_1500)),
        update(f"{ASCOT_1500} {ASCOT_1430}", GO_SOFT),
        update(ASCOT_1430, MISSING_NODE),
        update(ASCOT_1430, PRICE_7_TO_9),
        master(event(ASCOT_1430, going="firm"), type="new"),
        update(f"{ASCOT_1430} {ASCOT_1500}", PRICE_7_TO_9),
        update(ROMFORD_1912, GO_SOFT),
    )
    messages.insert(2, messages[1])
    pipeline = run(messages)

    first_copy: dict[str, int] = {}
    for order, message in enumerate(messages):
        first_copy.setdefault(message.message_id, order)
    keyed_items: list[tuple[int, Item]] = []
    message_dead: list[DeadLetter] = []
    for order, message in enumerate(messages):
        if first_copy[message.message_id] != order:
            continue
        classified = classify_message(message)
        if isinstance(classified, DeadLetter):
            message_dead.append(classified)
        else:
            keyed_items += [(order, item) for item in classified]
    groups: dict[str, list[tuple[int, Item]]] = defaultdict(list)
    for order, item in keyed_items:
        groups[item.master_id].append((order, item))
    cache = PatchCache()
    states: dict[str, MasterState] = {}
    results: list[ItemResult] = []
    for master_id, group in groups.items():
        group.sort(key=lambda pair: (pair[0], pair[1].position))
        folded = fold_master(master_id, None, [item for _, item in group], patches=cache)
        states[master_id] = folded.state
        results += folded.results

    assert {k: v for k, v in states.items() if v.exists} == pipeline.masters
    item_results = [r for r in pipeline.results if isinstance(r, ItemResult)]
    assert sorted(results, key=lambda r: (r.message_id, r.position)) == sorted(
        item_results, key=lambda r: (r.message_id, r.position)
    )
    duplicates = [r for r in pipeline.results if isinstance(r, MessageResult)]
    assert [d.message_id for d in duplicates] == [mid(2)]


def test_classify_message_returns_items_or_a_dead_letter():
    items = classify_message(LoggedMessage(mid(7), update(f"{ASCOT_1430} {ASCOT_1500}", GO_SOFT)))
    assert isinstance(items, list)
    assert [(i.message_id, i.position, i.master_id) for i in items] == [
        (mid(7), 0, ASCOT_1430),
        (mid(7), 1, ASCOT_1500),
    ]
    dead = classify_message(LoggedMessage(mid(8), b"x" * 11), limits=Limits(max_message_bytes=10))
    assert isinstance(dead, DeadLetter)
    assert (dead.reason, dead.master_id, dead.position) == (Reason.TOO_LARGE, None, None)


def test_simulated_feed_outcomes_match_the_simulators_labels():
    """The simulator labels what each message is meant to be; the pipeline must agree.

    One known difference: the simulator keeps sending updates for a master it has made stale
    (until its refresh) and labels them "update"; docs/feed.md makes them `master-stale`.
    """
    invalid = {str(reason): 0.004 for reason in INVALID_REASONS}
    feed = list(generate_feed(5, 6000, invalid=invalid, duplicates=0.01))
    pipeline = run([LoggedMessage(m.message_id, m.body) for m in feed])
    outcomes: dict[str, list[tuple[Outcome, Reason | None]]] = defaultdict(list)
    for result in pipeline.results:
        outcomes[result.message_id].append((result.outcome, result.reason))
    seen: set[str] = set()
    checked: Counter[str] = Counter()
    for message in feed:
        results = outcomes[message.message_id]
        if message.message_id in seen:
            assert message.kind == "duplicate"
            assert (Outcome.DUPLICATE, None) in results
            checked["duplicate"] += 1
            continue
        seen.add(message.message_id)
        first = [r for r in results if r[0] is not Outcome.DUPLICATE]
        if message.kind.startswith("invalid:"):
            reason = Reason(message.kind.removeprefix("invalid:"))
            assert (Outcome.DEAD_LETTERED, reason) in first, (message.kind, first)
            checked[str(reason)] += 1
        elif message.kind == "update":
            assert set(first) <= {APPLIED, (Outcome.DEAD_LETTERED, Reason.MASTER_STALE)}
            checked["update"] += 1
        else:
            assert set(first) == {APPLIED}, (message.kind, first)
            checked[message.kind] += 1
    assert set(checked) >= {str(reason) for reason in INVALID_REASONS} | {"duplicate", "update"}


def test_valid_items_by_master_keeps_first_copies_and_valid_items_in_feed_order():
    messages = log(master(event()), update(ASCOT_1430, GO_SOFT), b"<not-well-formed")
    redelivered = [*messages, messages[1]]
    groups = valid_items_by_master(redelivered)
    assert list(groups) == [ASCOT_1430]
    assert [item.message_id for item in groups[ASCOT_1430]] == [mid(1), mid(2)]
