from __future__ import annotations

import copy

import pytest
from lxml import etree

from sis_platform.domain.messages import parse_xml
from sis_platform.domain.patchscope import patch_scope, validate_patched
from sis_platform.domain.pipeline import DeadLetter, LoggedMessage, classify_message
from sis_platform.domain.schema import validate_event
from sis_platform.simulator.generator import generate_feed
from sis_platform.standards.xmlpatch import Patch, PatchError
from tests.domain.sportsdata_fixtures import event, update

WIN_7_PRICE = (
    ("event", ()),
    ("market", (("id", "WIN"),)),
    ("selection", (("id", "7"),)),
    ("price", ()),
)
WIN_7 = WIN_7_PRICE[:-1]
WIN = WIN_7[:-1]
EVENT = WIN[:-1]


GOING = '<replace sel="/event/@going">soft</replace>'


def scope_of(*operations: str):
    return patch_scope(parse_xml(update("A", *operations)))


def test_attribute_changes_are_shallow_regions_at_their_elements():
    scope = scope_of(
        "<replace sel=\"/event/market[@id='WIN']/selection[@id='7']/price/@num\">9</replace>",
        "<replace sel=\"/event/market[@id='WIN']/selection[@id='7']/price/@den\">2</replace>",
        "<add sel=\"/event/market[@id='WIN']/selection[@id='7']/price\" type=\"@at\">x</add>",
        "<remove sel='/event/market[@id=\"WIN\"]/@places'/>",
        '<replace sel="/event/@going">soft</replace>',
    )
    assert scope is not None
    assert scope.shallow == (WIN_7_PRICE, WIN, EVENT)
    assert scope.deep == ()


def test_element_changes_are_deep_regions_at_the_changed_parent():
    scope = scope_of(
        "<remove sel=\"/event/market[@id='WIN']/selection[@id='7']/price\"/>",
        "<add sel=\"/event/market[@id='WIN']/selection[@id='7']\" pos=\"after\"><x/></add>",
        "<add sel=\"/event/market[@id='WIN']/selection[@id='7']\"><price num='1' den='1'/></add>",
        "<replace sel=\"/event/market[@id='WIN']/selection[@id='3']\"><x/></replace>",
    )
    assert scope is not None
    # Selection 7's region lies inside the market's, which is checked whole.
    assert scope.deep == (WIN,)
    assert scope.shallow == ()


def test_regions_inside_a_deep_region_are_checked_with_it():
    scope = scope_of(
        "<remove sel=\"/event/market[@id='WIN']/selection[@id='7']/price\"/>",
        "<replace sel=\"/event/market[@id='WIN']/selection[@id='7']/@status\">x</replace>",
        "<replace sel=\"/event/market[@id='EW']/selection[@id='7']/@status\">x</replace>",
    )
    assert scope is not None
    assert scope.deep == (WIN_7,)
    assert scope.shallow == ((*WIN[:1], ("market", (("id", "EW"),)), WIN_7[2]),)


@pytest.mark.parametrize(
    "operation",
    [
        '<add sel="/event"><market id="FC" type="forecast" status="open"/></add>',
        '<add sel="/event/market[@id=\'WIN\']" pos="before"><x/></add>',
        "<replace sel=\"/event/market[@id='WIN']\"><x/></replace>",
        "<remove sel=\"/event/market[@id='WIN']\"/>",
        '<replace sel="/event/market[1]/@status">closed</replace>',
        '<replace sel="//price/@num">9</replace>',
        '<replace sel="/event/market[count(//*)=1]/@status">closed</replace>',
        "<replace sel=\"/event/market[@id='WIN']/selection[@id='7']/@id\">8</replace>",
        '<add sel="/event" type="@id">x</add>',
        '<add sel="/event" type="namespace::x">urn:x</add>',
        "<replace sel=\"/event/market[@id='WIN']/text()\">x</replace>",
        '<replace sel="/event/x:market/@status">closed</replace>',
        '<replace sel="/event">x</replace>',
        '<add sel="/event/@going">x</add>',
        '<replace sel="/event/*/@status">closed</replace>',
    ],
    ids=[
        "add-market-to-event",
        "sibling-of-market",
        "replace-market",
        "remove-market",
        "positional",
        "descendant",
        "function",
        "key-changed",
        "key-added",
        "namespace",
        "text-node",
        "prefixed",
        "root",
        "add-to-attribute",
        "wildcard",
    ],
)
def test_other_patches_are_validated_whole(operation):
    # A change to the event's own children, or a selector outside the plain form.
    key_read = "<replace sel=\"/event/market[@id='WIN']/@status\">closed</replace>"
    assert scope_of(key_read, operation) is None


@pytest.mark.parametrize(
    "sel",
    [
        "event/market[@id='WIN']/@status",
        '/event/market[@id="WIN"]/@status',
        "/event / market[ @id = 'WIN' ] / @status",
    ],
    ids=["relative", "double-quotes", "spaces"],
)
def test_plain_selectors_spelled_differently_have_the_scope_of_their_canonical_form(sel):
    # One parser (sis_platform.standards.xpath): RFC 5261 evaluates a relative selector from the
    # document root node, and whitespace and quote style do not change a path.
    canonical = scope_of("<replace sel=\"/event/market[@id='WIN']/@status\">closed</replace>")
    assert canonical == scope_of(f"<replace sel={etree_quote(sel)}>closed</replace>")
    assert canonical is not None and canonical.shallow == (WIN,)


def etree_quote(value: str) -> str:
    return '"' + value.replace('"', "&quot;") + '"'


def test_selectors_over_the_limits_are_validated_whole():
    steps = "/event" + "/market" * 70 + "/@status"
    assert scope_of(f'<replace sel="{steps}">closed</replace>') is None


def test_operations_under_a_default_namespace_are_validated_whole():
    body = update("A", GOING).replace(b"<sportsdata ", b'<sportsdata xmlns:x="urn:x" ')
    assert patch_scope(parse_xml(body)) is not None
    body = update("A", GOING).replace(b"<replace ", b'<replace xmlns="urn:x" ')
    assert patch_scope(parse_xml(body)) is None


def test_key_change_is_allowed_when_no_selector_reads_that_key():
    assert scope_of('<replace sel="/event/@id">B</replace>') is not None


# --- validate_patched agrees with validate_event -----------------------------------------------


def patched(operation_scope: str, change) -> tuple[etree._ElementTree, object]:
    tree = parse_xml(event().encode()).getroottree()
    change(tree.getroot())
    return tree, scope_of(operation_scope)


PRICE_OP = "<replace sel=\"/event/market[@id='WIN']/selection[@id='7']/price/@num\">x</replace>"
GOING_OP = '<replace sel="/event/@going">x</replace>'
ADD_OP = "<add sel=\"/event/market[@id='WIN']/selection[@id='3']\" pos=\"after\"><x/></add>"


def price(root):
    return root.find("market/selection[@id='7']/price")


def add_selection(attributes: str):
    def change(root):
        market = root.find("market")
        market.insert(1, etree.fromstring(f"<selection {attributes}/>"))

    return change


@pytest.mark.parametrize(
    ("operation", "change"),
    [
        (PRICE_OP, lambda root: price(root).set("num", "9")),
        (PRICE_OP, lambda root: price(root).set("num", "0")),
        (PRICE_OP, lambda root: price(root).set("colour", "red")),
        (GOING_OP, lambda root: root.set("going", "soft")),
        (GOING_OP, lambda root: root.set("status", "running")),
        (GOING_OP, lambda root: root.attrib.pop("course")),
        (ADD_OP, add_selection('id="4" name="New" status="runner"')),
        (ADD_OP, add_selection('id="4" name="New" status="sleeping"')),
        (ADD_OP, add_selection('id="4" status="runner"')),
        # The selector finds nothing (or two) in the result: validated whole.
        (ADD_OP, lambda root: root.find("market/selection[@id='3']").set("id", "9")),
        (ADD_OP, lambda root: root.find("market/selection[@id='7']").set("id", "3")),
        (PRICE_OP, lambda root: root.remove(root.find("market"))),
    ],
    ids=[
        "valid-price",
        "zero-price",
        "unknown-price-attribute",
        "valid-going",
        "bad-event-status",
        "missing-course",
        "valid-new-selection",
        "bad-new-selection",
        "incomplete-new-selection",
        "region-gone",
        "region-twice",
        "shallow-region-gone",
    ],
)
def test_validate_patched_gives_the_same_answer_and_text_as_validating_the_whole(operation, change):
    tree, scope = patched(operation, change)
    assert scope is not None
    assert validate_patched(tree, scope) == validate_event(tree)


def test_change_outside_the_scope_is_not_seen_which_is_why_the_scope_must_be_proved():
    # Documents the contract: the scope must cover every change (the proof in patchscope).
    tree, scope = patched(PRICE_OP, lambda root: root.set("status", "running"))
    assert validate_event(tree) is not None
    assert validate_patched(tree, scope) is None


def test_root_that_is_no_longer_an_event_is_validated_whole():
    tree = parse_xml(b"<market id='WIN' type='win' status='open'/>").getroottree()
    assert validate_patched(tree, scope_of(GOING_OP)) == validate_event(tree)


# --- on the simulated feed, with the real patch engine ----------------------------------------


def test_scoped_validation_matches_whole_validation_on_a_simulated_day():
    masters: dict[str, etree._ElementTree] = {}
    compared = invalid = 0
    for simulated in generate_feed(7, 3000):
        classified = classify_message(LoggedMessage(simulated.message_id, simulated.body))
        if isinstance(classified, DeadLetter):
            continue
        for item in classified:
            if item.category == "master":
                masters[item.master_id] = parse_xml(item.payload).getroottree()
                continue
            current = masters.get(item.master_id)
            if current is None:
                continue
            operations = parse_xml(item.payload)
            try:
                result = Patch.from_element(operations).apply(current)
            except PatchError:
                continue
            scope = patch_scope(operations)
            assert validate_patched(result, scope) == validate_event(result)
            compared += 1
            if scope is not None and (scope.shallow or scope.deep):
                # The same result broken inside the scope: both must reject it, alike.
                broken = copy.deepcopy(result)
                path = (scope.deep or scope.shallow)[0]
                target = broken.getroot()
                for name, predicates in path[1:]:
                    target = next(
                        child
                        for child in target.iterchildren(name)
                        if all(child.get(k) == v for k, v in predicates)
                    )
                target.set("bogus", "1")
                assert validate_event(broken) is not None
                assert validate_patched(broken, scope) == validate_event(broken)
                invalid += 1
            if validate_event(result) is None:
                masters[item.master_id] = result
    assert compared > 2000
    assert invalid > 2000


def test_validation_with_the_elements_the_engine_located_matches_whole_validation():
    masters: dict[str, bytes] = {}
    reused = 0
    for simulated in generate_feed(9, 3000):
        classified = classify_message(LoggedMessage(simulated.message_id, simulated.body))
        if isinstance(classified, DeadLetter):
            continue
        for item in classified:
            if item.category == "master":
                masters[item.master_id] = item.payload
                continue
            if item.master_id not in masters:
                continue
            operations = parse_xml(item.payload)
            located: dict[str, list[etree._Element]] = {}
            try:
                result = Patch.from_element(operations).apply_in_place(
                    parse_xml(masters[item.master_id]).getroottree(), located
                )
            except PatchError:
                continue
            reused += bool(located)
            error = validate_patched(result, patch_scope(operations), located)
            assert error == validate_event(result)
            if error is None:
                masters[item.master_id] = etree.tostring(result)
    assert reused > 1000


@pytest.mark.parametrize(
    "content", ["<?pi data?><!-- comment -->6", "6<!-- comment -->", "<?pi data?>"]
)
def test_comments_and_processing_instructions_in_content_are_scoped_not_a_crash(content):
    """A comment or processing instruction among an operation's content is not an element:
    the namespace probe passes over it (found by tests/domain/test_fuzz.py)."""
    sel = "/event/market[@id='WIN']/selection[@id='7']/price/@num"
    scope_of(f'<replace sel="{sel}">{content}</replace>')
    scope_of(f"<add sel=\"/event/market[@id='WIN']\">{content}<selection id='9'/></add>")
