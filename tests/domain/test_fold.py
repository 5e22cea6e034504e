from __future__ import annotations

import pickle

import pytest
from lxml import etree

from sis_platform.domain.fold import (
    WARNING_NEW_FOR_EXISTING,
    WARNING_REFRESH_FOR_MISSING,
    ItemResult,
    MasterState,
    PatchCache,
    fold_master,
)
from sis_platform.domain.items import Item, split_message
from sis_platform.domain.messages import parse_message
from sis_platform.domain.reasons import STALE_REASONS, Outcome, Reason
from sis_platform.domain.schema import validate_event
from sis_platform.standards.selector import Selector
from tests.domain.sportsdata_fixtures import (
    ASCOT_1430,
    ASCOT_1500,
    GO_SOFT,
    MISSING_NODE,
    PRICE_7_TO_9,
    event,
    master,
    update,
)

_counter = iter(range(1_000_000))


def items_of(body: bytes) -> list[Item]:
    return split_message(f"ID:{next(_counter):048x}", parse_message(body))


def master_item(master_id: str = ASCOT_1430, type: str = "new", **attributes) -> Item:
    (item,) = items_of(master(event(master_id, **attributes), type=type))
    return item


def update_item(*operations: str, master_id: str = ASCOT_1430) -> Item:
    (item,) = items_of(update(master_id, *operations))
    return item


def doc(state_or_document) -> etree._Element:
    document = getattr(state_or_document, "document", state_or_document)
    return etree.fromstring(document)


def outcomes(results: list[ItemResult]) -> list[tuple[Outcome, Reason | None]]:
    return [(r.outcome, r.reason) for r in results]


APPLIED = (Outcome.APPLIED, None)
FILTERED = (Outcome.FILTERED, None)


# --- master items ------------------------------------------------------------------------------


def test_master_new_creates_version_1_with_the_event_as_document():
    item = master_item()
    result = fold_master(ASCOT_1430, None, [item])
    assert result.state == MasterState(ASCOT_1430, 1, item.payload)
    (version,) = result.versions
    assert (version.version, version.operation, version.document) == (1, "new", item.payload)
    assert (version.message_id, version.position) == (item.message_id, 0)
    (applied,) = result.results
    assert (applied.outcome, applied.version, applied.warning) == (Outcome.APPLIED, 1, None)


def test_master_new_for_existing_master_replaces_it_with_a_warning():
    first = fold_master(ASCOT_1430, None, [master_item(going="good")]).state
    again = master_item(going="heavy")
    result = fold_master(ASCOT_1430, first, [again])
    assert result.state.version == 2
    assert doc(result.state).get("going") == "heavy"
    (applied,) = result.results
    assert (applied.outcome, applied.warning) == (Outcome.APPLIED, WARNING_NEW_FOR_EXISTING)


def test_master_refresh_replaces_the_document_whole():
    first = fold_master(ASCOT_1430, None, [master_item()]).state
    refresh = master_item(type="refresh", status="off", markets="")
    result = fold_master(ASCOT_1430, first, [refresh])
    assert result.state.document == refresh.payload
    assert result.versions[0].operation == "refresh"
    assert result.results[0].warning is None


def test_master_refresh_for_missing_master_creates_it_with_a_warning():
    result = fold_master(ASCOT_1430, None, [master_item(type="refresh")])
    assert result.state.version == 1
    assert result.results[0].outcome is Outcome.APPLIED
    assert result.results[0].warning == WARNING_REFRESH_FOR_MISSING


# --- update items ------------------------------------------------------------------------------


def test_update_applies_and_advances_the_version():
    created = fold_master(ASCOT_1430, None, [master_item()]).state
    result = fold_master(ASCOT_1430, created, [update_item(GO_SOFT, PRICE_7_TO_9)])
    assert result.state.version == 2
    patched = doc(result.state)
    assert patched.get("going") == "soft"
    assert patched.find("market/selection[@id='7']/price").get("num") == "9"
    (version,) = result.versions
    assert (version.version, version.operation) == (2, "update")
    assert version.document == result.state.document
    assert validate_event(patched) is None
    assert outcomes(result.results) == [APPLIED]


def test_update_for_missing_master_is_dead_lettered_orphan_update():
    result = fold_master(ASCOT_1430, None, [update_item(GO_SOFT)])
    assert outcomes(result.results) == [(Outcome.DEAD_LETTERED, Reason.ORPHAN_UPDATE)]
    assert result.state == MasterState(ASCOT_1430, 0, None)
    assert result.versions == []


@pytest.mark.parametrize(
    ("operation", "reason"),
    [
        (MISSING_NODE, Reason.UNLOCATED_NODE),
        ('<remove sel="/event"/>', Reason.INVALID_ROOT_ELEMENT_OPERATION),
        ('<replace sel="/event/@going"><soft/></replace>', Reason.INVALID_NODE_TYPES),
        ('<add sel="/event/p:market"><x/></add>', Reason.INVALID_NAMESPACE_PREFIX),
        ('<remove sel="/event/market" ws="before"/>', Reason.INVALID_WHITESPACE_DIRECTIVE),
        ('<add sel="/event/market" type="wrong">x</add>', Reason.INVALID_ATTRIBUTE_VALUE),
        ('<replace sel="">soft</replace>', Reason.INVALID_ATTRIBUTE_VALUE),
        ('<add sel="/event" type="@x" pos="before">x</add>', Reason.INVALID_PATCH_DIRECTIVE),
        ("<replace sel=\"id('x')\">x</replace>", Reason.UNSUPPORTED_ID_FUNCTION),
        ('<add sel="/event" type="namespace::x"></add>', Reason.INVALID_NAMESPACE_URI),
    ],
    ids=[
        "unlocated",
        "remove-root",
        "element-for-attribute",
        "unbound-prefix",
        "no-whitespace",
        "bad-type",
        "empty-sel",
        "pos-with-attribute",
        "id-function",
        "empty-namespace-uri",
    ],
)
def test_failed_patch_is_dead_lettered_with_the_rfc5261_error_and_marks_the_master_stale(
    operation, reason
):
    created = fold_master(ASCOT_1430, None, [master_item()]).state
    result = fold_master(ASCOT_1430, created, [update_item(operation)])
    assert outcomes(result.results) == [(Outcome.DEAD_LETTERED, reason)]
    assert reason in STALE_REASONS
    assert result.results[0].detail
    assert result.state == MasterState(ASCOT_1430, 1, created.document, stale=True)
    assert result.versions == []


def test_failing_second_operation_leaves_the_master_unchanged():
    created = fold_master(ASCOT_1430, None, [master_item()]).state
    result = fold_master(ASCOT_1430, created, [update_item(GO_SOFT, MISSING_NODE)])
    assert outcomes(result.results) == [(Outcome.DEAD_LETTERED, Reason.UNLOCATED_NODE)]
    assert result.state.document == created.document
    assert result.state.version == 1


@pytest.mark.parametrize(
    "operation",
    [
        '<replace sel="/event/@status">running</replace>',
        '<add sel="/event" type="@colour">red</add>',
        "<add sel=\"/event/market[@id='WIN']\"><runner/></add>",
        "<remove sel=\"/event/market[@id='WIN']/@type\"/>",
        '<replace sel="/event/@id">ASC-20261121-1500</replace>',
    ],
    ids=["bad-status", "unknown-attribute", "unknown-element", "missing-attribute", "id-change"],
)
def test_schema_invalid_result_is_dead_lettered_invalid_result_and_marks_the_master_stale(
    operation,
):
    created = fold_master(ASCOT_1430, None, [master_item()]).state
    result = fold_master(ASCOT_1430, created, [update_item(operation)])
    assert outcomes(result.results) == [(Outcome.DEAD_LETTERED, Reason.INVALID_RESULT)]
    assert result.state == MasterState(ASCOT_1430, 1, created.document, stale=True)


def test_update_for_stale_master_is_dead_lettered_master_stale():
    created = fold_master(ASCOT_1430, None, [master_item()]).state
    result = fold_master(ASCOT_1430, created, [update_item(MISSING_NODE), update_item(GO_SOFT)])
    assert outcomes(result.results) == [
        (Outcome.DEAD_LETTERED, Reason.UNLOCATED_NODE),
        (Outcome.DEAD_LETTERED, Reason.MASTER_STALE),
    ]
    assert result.state.stale
    assert result.state.document == created.document


def test_stale_set_by_invalid_result_blocks_later_updates():
    created = fold_master(ASCOT_1430, None, [master_item()]).state
    invalid = update_item('<replace sel="/event/@status">running</replace>')
    result = fold_master(ASCOT_1430, created, [invalid, update_item(GO_SOFT)])
    assert outcomes(result.results) == [
        (Outcome.DEAD_LETTERED, Reason.INVALID_RESULT),
        (Outcome.DEAD_LETTERED, Reason.MASTER_STALE),
    ]


@pytest.mark.parametrize("type", ["new", "refresh"])
def test_master_new_or_refresh_clears_stale_and_updates_apply_again(type):
    stale = MasterState(ASCOT_1430, 4, master_item().payload, stale=True)
    result = fold_master(ASCOT_1430, stale, [master_item(type=type), update_item(GO_SOFT)])
    assert outcomes(result.results) == [APPLIED, APPLIED]
    assert result.state.version == 6
    assert not result.state.stale
    assert doc(result.state).get("going") == "soft"


def test_stale_state_carries_across_calls():
    created = fold_master(ASCOT_1430, None, [master_item()]).state
    stale = fold_master(ASCOT_1430, created, [update_item(MISSING_NODE)]).state
    result = fold_master(ASCOT_1430, stale, [update_item(GO_SOFT)])
    assert outcomes(result.results) == [(Outcome.DEAD_LETTERED, Reason.MASTER_STALE)]


def test_a_group_folds_to_the_same_result_as_item_by_item():
    items = [
        master_item(),
        update_item(GO_SOFT),
        update_item(MISSING_NODE),
        update_item(PRICE_7_TO_9),
        master_item(type="refresh", going="firm"),
        update_item(PRICE_7_TO_9),
        update_item('<replace sel="/event/@status">off</replace>'),
    ]
    whole = fold_master(ASCOT_1430, None, items)
    state: MasterState | None = None
    versions, results = [], []
    for item in items:
        step = fold_master(ASCOT_1430, state, [item])
        state = step.state
        versions += step.versions
        results += step.results
    assert whole.state == state
    assert whole.versions == versions
    assert whole.results == results
    assert [v.version for v in whole.versions] == [1, 2, 3, 4, 5]
    assert doc(whole.state).get("status") == "off"


def test_one_update_message_applies_to_each_master_independently():
    # One message for two masters; only the second has a PLACE market for the patch to find.
    place = '<market id="PLACE" type="place" status="open"/>'
    first = fold_master(ASCOT_1430, None, [master_item(ASCOT_1430)]).state
    second = fold_master(ASCOT_1500, None, [master_item(ASCOT_1500, markets=place)]).state
    items = items_of(update(f"{ASCOT_1430} {ASCOT_1500}", MISSING_NODE))
    cache = PatchCache()
    a = fold_master(ASCOT_1430, first, [items[0]], patches=cache)
    b = fold_master(ASCOT_1500, second, [items[1]], patches=cache)
    assert outcomes(a.results) == [(Outcome.DEAD_LETTERED, Reason.UNLOCATED_NODE)]
    assert a.state.stale
    assert outcomes(b.results) == [APPLIED]
    assert (b.results[0].position, b.state.version) == (1, 2)
    assert doc(b.state).find("market").get("status") == "closed"


def test_patch_cache_compiles_a_message_once():
    cache = PatchCache()
    payload = items_of(update(f"{ASCOT_1430} {ASCOT_1500}", GO_SOFT))[0].payload
    assert cache.get(payload) is cache.get(bytes(bytearray(payload)))


def test_patch_cache_drops_the_least_recently_used():
    cache = PatchCache(maxsize=1)
    one = update_item(GO_SOFT).payload
    two = update_item(PRICE_7_TO_9).payload
    first = cache.get(one)
    cache.get(two)
    assert cache.get(one) is not first


def test_state_and_results_pickle():
    result = fold_master(ASCOT_1430, None, [master_item(), update_item(MISSING_NODE)])
    assert pickle.loads(pickle.dumps(result)) == result


def test_items_of_another_master_are_refused():
    with pytest.raises(ValueError):
        fold_master(ASCOT_1500, None, [master_item(ASCOT_1430)])
    with pytest.raises(ValueError):
        fold_master(ASCOT_1500, MasterState(ASCOT_1430, 0, None), [])


# --- selector ----------------------------------------------------------------------------------

HORSES = Selector.compile("sport = 'horse-racing'")


def test_master_not_selected_is_filtered_and_marks_the_master_filtered():
    result = fold_master(ASCOT_1430, None, [master_item(sport="greyhounds")], selector=HORSES)
    assert outcomes(result.results) == [FILTERED]
    assert result.state == MasterState(ASCOT_1430, 0, None, filtered=True)
    assert result.versions == []


def test_updates_for_a_filtered_master_are_filtered_not_orphans():
    result = fold_master(
        ASCOT_1430,
        None,
        [master_item(sport="greyhounds"), update_item(GO_SOFT), update_item(MISSING_NODE)],
        selector=HORSES,
    )
    assert outcomes(result.results) == [FILTERED, FILTERED, FILTERED]
    assert not result.state.stale


def test_selected_master_item_ends_the_filtering():
    result = fold_master(
        ASCOT_1430,
        None,
        [
            master_item(sport="greyhounds"),
            update_item(GO_SOFT),
            master_item(type="refresh"),
            update_item(GO_SOFT),
        ],
        selector=HORSES,
    )
    assert outcomes(result.results) == [FILTERED, FILTERED, APPLIED, APPLIED]
    assert result.state.version == 2
    assert not result.state.filtered
    # The refresh found no document: the filtered master was never stored.
    assert result.results[2].warning == WARNING_REFRESH_FOR_MISSING


def test_filtered_refresh_of_an_existing_master_keeps_its_document_and_filters_updates():
    created = fold_master(ASCOT_1430, None, [master_item()]).state
    result = fold_master(
        ASCOT_1430,
        created,
        [master_item(type="refresh", sport="football"), update_item(GO_SOFT)],
        selector=HORSES,
    )
    assert outcomes(result.results) == [FILTERED, FILTERED]
    assert result.state == MasterState(ASCOT_1430, 1, created.document, filtered=True)


def test_update_is_selected_on_the_masters_current_event_attributes():
    created = fold_master(ASCOT_1430, None, [master_item(status="dormant")]).state
    not_off = Selector.compile("eventStatus <> 'off' AND category = 'update'")
    go_off = update_item('<replace sel="/event/@status">off</replace>')
    result = fold_master(ASCOT_1430, created, [go_off, update_item(GO_SOFT)], selector=not_off)
    # The first update is tested while the event is dormant; the second sees it off.
    assert outcomes(result.results) == [APPLIED, FILTERED]
    assert not result.state.stale
    assert result.state.version == 2


def test_selector_sees_position_and_master_id():
    second_only = Selector.compile("category = 'master' OR position = 1")
    items = items_of(update(f"{ASCOT_1500} {ASCOT_1430}", GO_SOFT))
    one = fold_master(ASCOT_1500, None, [master_item(ASCOT_1500), items[0]], selector=second_only)
    two = fold_master(ASCOT_1430, None, [master_item(ASCOT_1430), items[1]], selector=second_only)
    assert outcomes(one.results) == [APPLIED, FILTERED]
    assert outcomes(two.results) == [APPLIED, APPLIED]


def test_update_for_missing_master_is_an_orphan_even_with_a_selector():
    result = fold_master(ASCOT_1430, None, [update_item(GO_SOFT)], selector=HORSES)
    assert outcomes(result.results) == [(Outcome.DEAD_LETTERED, Reason.ORPHAN_UPDATE)]


def test_filtered_update_of_a_stale_master_is_filtered_not_master_stale():
    stale = MasterState(ASCOT_1430, 3, master_item().payload, stale=True)
    masters_only = Selector.compile("category = 'master'")
    result = fold_master(ASCOT_1430, stale, [update_item(GO_SOFT)], selector=masters_only)
    assert outcomes(result.results) == [FILTERED]
    assert result.state.stale


def test_an_update_to_a_price_beyond_a_signed_64_bit_long_is_invalid_result():
    too_big = (
        "<replace sel=\"/event/market[@id='WIN']/selection[@id='7']/price/@num\">"
        "9223372036854775808</replace>"
    )
    largest = too_big.replace("9223372036854775808", "9223372036854775807")
    folded = fold_master(ASCOT_1430, None, [master_item(), update_item(largest)])
    assert outcomes(folded.results) == [APPLIED, APPLIED]
    folded = fold_master(ASCOT_1430, folded.state, [update_item(too_big)])
    assert outcomes(folded.results) == [(Outcome.DEAD_LETTERED, Reason.INVALID_RESULT)]
    assert folded.state.stale
