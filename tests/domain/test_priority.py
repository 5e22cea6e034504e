"""SIS_PRIORITY's selectors: how a value is split and compiled, and which class a master is in."""

from __future__ import annotations

import pytest

from sis_platform.domain.items import Item
from sis_platform.domain.priority import Priority, event_attributes, split_selectors
from sis_platform.standards.selector import InvalidSelector

EVENT = b'<event id="E1" sport="greyhounds" country="IE" course="Limerick"><market/></event>'
HORSES = b'<event id="E1" sport="horse-racing" country="GB" course="Ascot"/>'


def _master(payload: bytes, message_id: str = "m1") -> Item:
    return Item(message_id, 0, "E1", "master", "refresh", payload)


def _update(message_id: str = "u1") -> Item:
    return Item(message_id, 0, "E1", "update", None, b"<update/>")


def test_selectors_are_split_at_semicolons_outside_quoted_strings():
    text = "course = 'A;B' ; sport = 'it''s; fine'; country = 'IE'"
    assert split_selectors(text) == ["course = 'A;B'", "sport = 'it''s; fine'", "country = 'IE'"]


@pytest.mark.parametrize(
    ("text", "named"),
    [("sport = 'x';;country = 'IE'", "priority selector 2 is empty"), ("sport = ", "selector 1")],
)
def test_an_empty_or_invalid_selector_is_refused_with_its_number(text, named):
    with pytest.raises(InvalidSelector, match=named):
        Priority.compile(text)


def test_a_master_is_in_the_class_of_the_first_selector_any_of_its_items_matches():
    priority = Priority.compile("country = 'GB'; sport = 'greyhounds'; category = 'update'")
    assert priority.classes == 4
    assert priority.master_class([_master(EVENT)], None) == 1
    assert priority.master_class([_master(EVENT), _master(HORSES, "m2")], None) == 0
    # An update item is tested with the event attributes of the master's document before it.
    assert priority.master_class([_update()], HORSES) == 0
    assert priority.master_class([_update()], EVENT) == 1
    assert priority.master_class([_update()], None) == 2  # no document: no event attributes
    assert Priority.compile("sport = 'cricket'").master_class([_master(EVENT)], None) == 1


def test_an_update_after_a_master_item_is_tested_with_that_item_s_event():
    priority = Priority.compile("country = 'GB' AND category = 'update'")
    assert priority.master_class([_master(HORSES), _update()], EVENT) == 0
    assert priority.master_class([_master(EVENT), _update()], HORSES) == 1


def test_order_lists_every_class_in_feed_order():
    priority = Priority.compile("sport = 'greyhounds'")
    groups = {"b": [_update()], "a": [_master(EVENT)], "c": [_update()]}
    documents = {"b": EVENT, "c": HORSES}
    assert priority.order(groups, documents.get) == [["b", "a"], ["c"]]


def test_event_attributes_read_the_root_only_and_tolerate_what_they_cannot_read():
    long_tail = EVENT[:-8] + b"<m/>" * 50_000 + b"</event>"
    assert event_attributes(long_tail)["course"] == "Limerick"
    assert event_attributes(b"not xml") == {}
    assert event_attributes(b"") == {}
