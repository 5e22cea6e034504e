"""The resource bounds (sis_platform.domain.limits) where the domain enforces them: parsing a
message, splitting it, and folding an update into its master. Over a bound, a message or an
item is dead-lettered `too-complex` with a detail naming the bound, its value and its setting.
"""

from __future__ import annotations

import pytest

from sis_platform.domain.fold import MasterState, fold_master
from sis_platform.domain.items import Item, split_message
from sis_platform.domain.limits import DEFAULT_LIMITS, Limits
from sis_platform.domain.messages import InvalidMessage, parse_message
from sis_platform.domain.pipeline import DeadLetter, LoggedMessage, classify_message
from sis_platform.domain.reasons import Outcome, Reason
from sis_platform.standards.xmlpatch import Patch
from tests.domain.sportsdata_fixtures import (
    ASCOT_1430,
    GO_SOFT,
    PRICE_7_TO_9,
    WIN_MARKET,
    event,
    master,
    update,
)


def rejected(body: bytes, limits: Limits = DEFAULT_LIMITS) -> InvalidMessage:
    with pytest.raises(InvalidMessage) as caught:
        parse_message(body, limits=limits)
    return caught.value


def add(content: str, sel: str = "/event") -> str:
    return f'<add sel="{sel}">{content}</add>'


def attributes(n: int) -> str:
    return " ".join(f'a{i}=""' for i in range(n))


def declarations(n: int, first: int = 0) -> str:
    """`n` namespace declarations, none of them used: lxml does not count them as attributes."""
    return " ".join(f'xmlns:n{i}="urn:n:{i}"' for i in range(first, first + n))


# --- parsing: structural bounds, before RELAX NG -----------------------------------------------

# Each case: a bound, a message exactly at it (accepted) and one just over it (too-complex), and
# the detail expected for the latter. An update's root is at depth 1, its operation at 2.
BOUNDS = {
    "max_elements": (
        Limits(max_elements=10),
        update("A", add("<x/>" * 8)),  # sportsdata, add, 8 x: 10
        update("A", add("<x/>" * 9)),
        "at least 11 elements, over the limit of 10 (SIS_MAX_ELEMENTS)",
    ),
    "max_elements-comments-count": (
        Limits(max_elements=10),
        update("A", add("<!---->" * 8)),
        update("A", add("<!---->" * 4 + "<?pi?>" * 5)),
        "at least 11 elements, over the limit of 10 (SIS_MAX_ELEMENTS)",
    ),
    "max_depth": (
        Limits(max_depth=6),
        update("A", add("<x>" * 4 + "</x>" * 4)),
        update("A", add("<x>" * 5 + "</x>" * 5)),
        "<x> at depth 7 (line 1), over the limit of 6 (SIS_MAX_DEPTH)",
    ),
    "max_attributes": (
        Limits(max_attributes=5),
        update("A", add(f"<x {attributes(5)}/>")),
        update("A", add(f"<x {attributes(6)}/>")),
        "<x> with 6 attributes (line 1), over the limit of 5 (SIS_MAX_ATTRIBUTES)",
    ),
    "max_namespaces": (
        Limits(max_namespaces=5),
        update("A", add(f"<x {declarations(5)}/>")),
        update("A", add(f"<x {declarations(6)}/>")),
        "<x> with 6 namespace declarations (line 1), over the limit of 5 (SIS_MAX_NAMESPACES)",
    ),
    "max_namespaces-on-the-root": (
        Limits(max_namespaces=5),
        update("A", GO_SOFT, extra=" " + declarations(5)),
        update("A", GO_SOFT, extra=" " + declarations(6)),
        "<sportsdata> with 6 namespace declarations (line 1), over the limit of 5 "
        "(SIS_MAX_NAMESPACES)",
    ),
    "max_document_namespaces": (
        Limits(max_document_namespaces=6),
        update("A", add(f"<x {declarations(3)}/><x {declarations(3, 3)}/>")),
        update("A", add(f"<x {declarations(3)}/><x {declarations(3, 3)}/><x xmlns:z='urn:z'/>")),
        "at least 7 namespace declarations, over the limit of 6 (SIS_MAX_DOCUMENT_NAMESPACES)",
    ),
    "max_children": (
        Limits(max_children=5),
        update("A", add("<x>" + "<y/>" * 5 + "</x>")),
        update("A", add("<x>" + "<y/>" * 4 + "<!---->" + "<y/>" + "</x>")),
        "<x> with at least 6 children, over the limit of 5 (SIS_MAX_CHILDREN)",
    ),
    "max_ids": (
        Limits(max_ids=3),
        update("A B C", GO_SOFT),
        update("A B C D", GO_SOFT),
        "4 ids, over the limit of 3 (SIS_MAX_IDS)",
    ),
    "max_patch_operations": (
        Limits(max_patch_operations=3),
        update("A", GO_SOFT * 3),
        update("A", GO_SOFT * 2 + "<!-- not an operation -->" + GO_SOFT * 2),
        "4 patch operations, over the limit of 3 (SIS_MAX_PATCH_OPERATIONS)",
    ),
}


@pytest.mark.parametrize(("limits", "at", "over", "detail"), BOUNDS.values(), ids=BOUNDS.keys())
def test_a_message_at_a_bound_is_accepted_and_one_over_it_is_too_complex(limits, at, over, detail):
    assert parse_message(at, limits=limits).category == "update"
    error = rejected(over, limits)
    assert error.reason is Reason.TOO_COMPLEX
    assert error.detail == detail


def test_the_master_events_are_held_to_the_same_bounds():
    body = master(event())
    assert rejected(body, Limits(max_elements=5)).reason is Reason.TOO_COMPLEX
    assert rejected(body, Limits(max_depth=3)).reason is Reason.TOO_COMPLEX
    assert parse_message(body, limits=Limits(max_depth=5)).ids == (ASCOT_1430,)


@pytest.mark.parametrize(
    ("body", "bound"),
    [
        # Measured before the bounds: 24,000 attributes in <add> took RELAX NG 4.4 GB and 15 s,
        # 200,000 children 42 s.
        (update("A", add(f"<x {attributes(24_000)}/>")), "SIS_MAX_ATTRIBUTES"),
        (update("A", add("<x>" + "<y/>" * 200_000 + "</x>")), "SIS_MAX_CHILDREN"),
        (update("A", add("<w>" + "<y/>" * 4_000 + "</w>") * 13), "SIS_MAX_ELEMENTS"),
        (update("A", add("<x>" * 100 + "</x>" * 100)), "SIS_MAX_DEPTH"),
        (update(" ".join(f"ID{i}" for i in range(20_000)), GO_SOFT), "SIS_MAX_IDS"),
        (update("A", GO_SOFT * 1_001), "SIS_MAX_PATCH_OPERATIONS"),
        # lxml leaves namespace declarations out of `attrib`: 150,000 of them on the root fit in
        # 4 MiB and passed every bound: three such updates of 40 operations each took the
        # reference pipeline 10.8 s and 1,356 MiB, all applied.
        (update("A", GO_SOFT * 40, extra=" " + declarations(150_000)), "SIS_MAX_NAMESPACES"),
        (
            master(event(), extra=" " + declarations(150_000)),
            "SIS_MAX_NAMESPACES",
        ),
        (
            update("A", add(("<w>" + f"<x {declarations(8)}/>" * 5 + "</w>") * 4_000)),
            "SIS_MAX_DOCUMENT_NAMESPACES",
        ),
    ],
    ids=[
        "attributes",
        "children",
        "elements",
        "depth",
        "ids",
        "operations",
        "namespaces-on-the-root-of-an-update",
        "namespaces-on-the-root-of-a-master",
        "namespaces-spread-over-elements",
    ],
)
def test_the_defect_sized_messages_are_too_complex_under_the_default_limits(body, bound):
    dead_letter = classify_message(LoggedMessage("ID:1", body))
    assert isinstance(dead_letter, DeadLetter)
    assert dead_letter.reason is Reason.TOO_COMPLEX
    assert bound in dead_letter.detail


def test_parsing_stops_at_the_bound_before_reading_the_rest_of_the_body():
    # Over max_elements within the first 64 KiB fed to the parser: what follows is never parsed,
    # so the broken end does not make it not-well-formed.
    head = update("A", add("<x/>" * 20_000)).removesuffix(b"</sportsdata>")
    body = head + b"<unclosed" + b" " * 70_000
    error = rejected(body, Limits(max_elements=1_000))
    assert error.reason is Reason.TOO_COMPLEX
    assert "SIS_MAX_ELEMENTS" in error.detail


def test_a_message_that_failed_a_bound_does_not_affect_the_next():
    # The parser is reused: a message abandoned at a bound leaves nothing behind.
    limits = Limits(max_elements=10)
    rejected(update("A", add("<x>" * 9)), limits)
    assert parse_message(update("A", GO_SOFT), limits=limits).ids == ("A",)


def test_ids_are_counted_before_they_are_checked():
    # 4 ids, one of them invalid: the count decides (and costs no per-id work).
    error = rejected(update("A B C !", GO_SOFT), Limits(max_ids=3))
    assert error.reason is Reason.TOO_COMPLEX


# --- splitting ---------------------------------------------------------------------------------


def test_an_update_whose_items_would_carry_more_than_max_split_bytes_is_too_complex():
    body = update("A B C", GO_SOFT)
    operations = len(split_message("ID:1", parse_message(body))[0].payload)
    at = Limits(max_split_bytes=3 * operations)
    assert len(classify_message(LoggedMessage("ID:1", body), limits=at)) == 3
    over = Limits(max_split_bytes=3 * operations - 1)
    dead_letter = classify_message(LoggedMessage("ID:1", body), limits=over)
    assert isinstance(dead_letter, DeadLetter)
    assert dead_letter.reason is Reason.TOO_COMPLEX
    assert dead_letter.detail == (
        f"its 3 items would carry {3 * operations} bytes (3 ids x {operations} bytes of "
        f"operations), over the limit of {3 * operations - 1} (SIS_MAX_SPLIT_BYTES)"
    )


def test_the_default_split_bound_stops_an_update_with_200_ids_and_large_operations():
    big = '<replace sel="/event/@going">' + "x" * 400_000 + "</replace>"
    body = update(" ".join(f"ID{i}" for i in range(200)), big)
    dead_letter = classify_message(LoggedMessage("ID:1", body))
    assert isinstance(dead_letter, DeadLetter)
    assert dead_letter.reason is Reason.TOO_COMPLEX
    assert "SIS_MAX_SPLIT_BYTES" in dead_letter.detail


# --- folding: what a patch may grow a master to -------------------------------------------------

SELECTION = '<selection id="{}" name="x" status="runner"><price num="1" den="1"/></selection>'


def add_selections(first: int, count: int) -> Item:
    content = "".join(SELECTION.format(i) for i in range(first, first + count))
    (item,) = split_message(
        f"ID:{first}", parse_message(update(ASCOT_1430, add(content, "/event/market[@id='WIN']")))
    )
    return item


def new_master(**attributes) -> Item:
    (item,) = split_message("ID:new", parse_message(master(event(**attributes))))
    return item


def test_updates_that_grow_a_master_past_max_elements_are_too_complex_and_mark_it_stale():
    # The fixture's master has 6 elements (event, market, two selections with a price); each
    # update adds 4 selections with a price: 8 elements, so 14, 22, then 30.
    limits = Limits(max_elements=29)
    items = [new_master(), add_selections(100, 4), add_selections(200, 4), add_selections(300, 4)]
    folded = fold_master(ASCOT_1430, None, items, limits=limits)
    assert [r.outcome for r in folded.results] == [Outcome.APPLIED] * 3 + [Outcome.DEAD_LETTERED]
    last = folded.results[-1]
    assert last.reason is Reason.TOO_COMPLEX
    assert last.detail == (
        "the patched master has at least 30 elements, over the limit of 29 (SIS_MAX_ELEMENTS)"
    )
    assert folded.state.stale
    assert folded.state.version == 3
    assert folded.state.document == folded.versions[-1].document


def test_a_patch_that_gives_a_region_too_many_children_is_too_complex():
    limits = Limits(max_children=5)
    folded = fold_master(
        ASCOT_1430,
        None,
        [new_master(), add_selections(100, 3), add_selections(200, 1)],
        limits=limits,
    )
    assert [r.reason for r in folded.results] == [None, None, Reason.TOO_COMPLEX]
    assert "<market> with at least 6 children" in (folded.results[-1].detail or "")
    assert "SIS_MAX_CHILDREN" in (folded.results[-1].detail or "")


def test_the_master_stays_valid_under_limits_when_the_updates_fit():
    folded = fold_master(
        ASCOT_1430, None, [new_master(), add_selections(100, 4)], limits=Limits(max_elements=15)
    )
    assert [r.outcome for r in folded.results] == [Outcome.APPLIED, Outcome.APPLIED]


def wide_master(selections: int) -> MasterState:
    # A master as a stored state, beyond this test's max_children, to show which parts of it
    # the fold walks after a patch.
    market = (
        '<market id="WIN" type="win" status="open">'
        + "".join(SELECTION.format(i) for i in range(selections))
        + "</market>"
    )
    return MasterState(ASCOT_1430, 1, event(markets=market).encode())


def update_item(*operations: str) -> Item:
    (item,) = split_message("ID:u", parse_message(update(ASCOT_1430, *operations)))
    return item


@pytest.mark.parametrize(
    ("selector", "reason"),
    [
        # The provider's form: patchscope proves only the market's attributes changed, so the
        # fold checks those and does not walk the market's children.
        ("/event/market[@id='WIN']/@status", None),
        # A positional predicate: no proved scope, so the whole master is walked, and the
        # market's children (already over this test's bound) are found.
        ("/event/market[1]/@status", Reason.TOO_COMPLEX),
    ],
    ids=["scoped", "unscoped"],
)
def test_after_a_patch_the_fold_walks_only_what_the_scope_says_changed(selector, reason):
    operation = f'<replace sel="{selector}">closed</replace>'
    folded = fold_master(
        ASCOT_1430, wide_master(8), [update_item(operation)], limits=Limits(max_children=5)
    )
    assert [r.reason for r in folded.results] == [reason]


def test_the_reference_pipeline_folds_with_its_own_limits():
    from sis_platform.domain.pipeline import ReferencePipeline

    pipeline = ReferencePipeline(limits=Limits(max_children=2))
    body = update(ASCOT_1430, add(SELECTION.format(9), "/event/market[@id='WIN']"))
    pipeline.process([LoggedMessage("ID:1", master(event())), LoggedMessage("ID:2", body)])
    assert [d.reason for d in pipeline.dead_letters] == [Reason.TOO_COMPLEX]
    assert pipeline.masters[ASCOT_1430].stale


def test_price_updates_keep_applying_under_the_default_limits():
    folded = fold_master(ASCOT_1430, None, [new_master(), update_item(PRICE_7_TO_9)])
    assert [r.outcome for r in folded.results] == [Outcome.APPLIED, Outcome.APPLIED]


def test_a_master_is_recounted_rather_than_rejected_when_its_size_bound_runs_over():
    # The fold bounds a master's nodes by its bytes / 4 (about 100 here, for 6 real elements)
    # plus what each update adds; past max_elements it counts exactly (22 nodes) and applies.
    first = new_master()
    limits = Limits(max_elements=len(first.payload) // 4 + 10)
    items = [first, add_selections(100, 4), add_selections(200, 4), add_selections(300, 4)]
    folded = fold_master(ASCOT_1430, None, items, limits=limits)
    assert [r.outcome for r in folded.results] == [Outcome.APPLIED] * 4


PLACE_MARKET = '<market id="PLACE" type="place" status="open"></market>'


def add_declaring(market_id: str, selection_id: int, declared: str) -> Item:
    """An update adding a selection that makes namespace declarations to one market."""
    content = SELECTION.format(selection_id).replace("<selection ", f"<selection {declared} ", 1)
    body = update(ASCOT_1430, add(content, f"/event/market[@id='{market_id}']"))
    (item,) = split_message(f"ID:{selection_id}", parse_message(body))
    return item


def test_updates_that_grow_a_masters_namespace_declarations_past_the_bound_are_too_complex():
    # Each update's declarations are within the bounds; together they are not. Each update is
    # of the provider's form (an add into one market), whose region alone is walked otherwise.
    limits = Limits(max_document_namespaces=4)
    items = [
        new_master(markets=WIN_MARKET + PLACE_MARKET),
        add_declaring("WIN", 100, declarations(3)),
        add_declaring("PLACE", 200, declarations(3, 3)),
    ]
    folded = fold_master(ASCOT_1430, None, items, limits=limits)
    assert [r.outcome for r in folded.results] == [Outcome.APPLIED] * 2 + [Outcome.DEAD_LETTERED]
    assert folded.results[-1].reason is Reason.TOO_COMPLEX
    assert folded.results[-1].detail == (
        "the patched master has at least 6 namespace declarations, over the limit of 4 "
        "(SIS_MAX_DOCUMENT_NAMESPACES)"
    )
    assert folded.state.stale


# --- caches: what one hostile message can leave behind -----------------------------------------


def test_the_compile_caches_are_keyed_on_the_namespaces_an_operation_uses_only():
    from sis_platform.standards import xmlpatch

    # An operation with content (compiled each time, its selector from the cache) and one
    # without (compiled once, from the operation cache).
    operations = (add(SELECTION.format(9), "/event/market[@id='WIN']"), GO_SOFT)

    def compile_under(first: int) -> None:
        # The same operations under 50 unused declarations that differ from message to message.
        body = update(ASCOT_1430, *operations, extra=" " + declarations(50, first))
        Patch.from_element(parse_message(body).root)

    compile_under(10_000)
    selectors, kept = xmlpatch._compile_selector.cache_info(), len(xmlpatch._OPERATIONS)
    compile_under(20_000)
    after = xmlpatch._compile_selector.cache_info()
    assert (after.hits - selectors.hits, after.currsize - selectors.currsize) == (1, 0)
    assert len(xmlpatch._OPERATIONS) == kept


def test_a_compiled_operation_is_not_cached_under_a_key_larger_than_the_cache_allows():
    from sis_platform.standards import xmlpatch

    # 4,096 such operations would keep 4 GiB of text in the cache.
    value = "x" * 1_000_000
    body = update(ASCOT_1430, f'<replace sel="/event/@name">{value}</replace>')
    Patch.from_element(parse_message(body).root)
    assert all(len(key[2] or "") < len(value) for key in xmlpatch._OPERATIONS)


def test_the_patch_cache_keeps_its_payload_bytes_under_its_budget_but_always_the_newest():
    from sis_platform.domain.fold import PatchCache

    payloads = [
        split_message(f"ID:{c}", parse_message(update(ASCOT_1430, GO_SOFT * n)))[0].payload
        for c, n in (("a", 3), ("b", 4), ("c", 60))
    ]
    cache = PatchCache(max_bytes=len(payloads[0]) + len(payloads[1]))
    for payload in payloads[:2]:
        cache.get(payload)
    assert len(cache) == 2
    cache.get(payloads[2])  # over the budget on its own: kept alone
    assert len(cache) == 1 and cache.bytes == len(payloads[2])


def test_the_patch_scope_caches_no_selector_over_the_length_bound():
    from sis_platform.domain.patchscope import _parse_selector, patch_scope

    # The engine refuses such a selector first; the scope, asked on its own, caches nothing
    # for it either (8,192 entries of 4 MiB selectors would be 32 GiB).
    sel = "/event[@id='" + "x" * 100_000 + "']/@going"
    operations = parse_message(update(ASCOT_1430, GO_SOFT)).root
    operations[0].set("sel", sel)
    before = _parse_selector.cache_info().currsize
    assert patch_scope(operations) is None
    assert _parse_selector.cache_info().currsize == before
