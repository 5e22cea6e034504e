from __future__ import annotations

import pickle

from lxml import etree

from sis_platform.domain.items import Item, selectable_properties, split_message
from sis_platform.domain.messages import parse_message
from sis_platform.domain.schema import validate_event
from tests.domain.sportsdata_fixtures import (
    ASCOT_1430,
    ASCOT_1500,
    GO_SOFT,
    ROMFORD_1912,
    event,
    master,
    update,
)

MESSAGE_ID = "ID:414d5120514d31202020202020202020a1b2c3d4e5f60001"


def test_multi_id_master_splits_into_one_item_per_id_in_id_order():
    # Events in document order 1500, 1912, 1430; the id list decides the order.
    body = master(
        event(ASCOT_1500),
        event(ROMFORD_1912, sport="greyhounds", course="Romford"),
        event(ASCOT_1430),
        ids=f"{ASCOT_1430} {ASCOT_1500} {ROMFORD_1912}",
        type="refresh",
    )
    items = split_message(MESSAGE_ID, parse_message(body))
    assert [(i.position, i.master_id) for i in items] == [
        (0, ASCOT_1430),
        (1, ASCOT_1500),
        (2, ROMFORD_1912),
    ]
    assert {(i.message_id, i.category, i.type) for i in items} == {
        (MESSAGE_ID, "master", "refresh")
    }


def test_master_payload_is_the_standalone_event_document():
    items = split_message(MESSAGE_ID, parse_message(master(event(ASCOT_1430), event(ASCOT_1500))))
    for item in items:
        root = etree.fromstring(item.payload)
        assert root.tag == "event"
        assert root.get("id") == item.master_id
        assert validate_event(root) is None
        assert not item.payload.startswith(b"<?xml")
    assert items[0].payload == event(ASCOT_1430).encode()


def test_master_payload_is_namespace_clean_and_has_no_tail():
    body = master(event(ASCOT_1430), extra=' xmlns:x="urn:unused"').replace(
        b"</event>", b"</event>\n  "
    )
    (item,) = split_message(MESSAGE_ID, parse_message(body))
    assert b"xmlns" not in item.payload
    assert item.payload.endswith(b"</event>")


def test_non_ascii_text_is_kept_as_utf8():
    body = master(event(ASCOT_1430, course="Cagnes-sur-Mer \u00e9t\u00e9"))
    (item,) = split_message(MESSAGE_ID, parse_message(body))
    assert "Cagnes-sur-Mer \u00e9t\u00e9".encode() in item.payload


def test_update_splits_into_items_sharing_one_payload():
    body = update(f"{ASCOT_1500} {ASCOT_1430}", GO_SOFT)
    items = split_message(MESSAGE_ID, parse_message(body))
    assert [(i.position, i.master_id) for i in items] == [(0, ASCOT_1500), (1, ASCOT_1430)]
    assert items[0].payload is items[1].payload
    assert {(i.category, i.type) for i in items} == {("update", None)}
    root = etree.fromstring(items[0].payload)
    assert root.tag == "sportsdata"
    assert [op.tag for op in root] == ["replace"]


def test_update_payload_is_the_operations_without_the_id_list():
    ids = " ".join(f"RACE-{i}" for i in range(50))
    body = update(ids, GO_SOFT, extra=' sent="2026-11-21T12:00:00Z"')
    parsed = parse_message(body)
    items = split_message(MESSAGE_ID, parsed)
    payload = items[0].payload
    assert payload == (
        b'<sportsdata category="update" sent="2026-11-21T12:00:00Z">'
        + GO_SOFT.encode()
        + b"</sportsdata>"
    )
    assert all(item.payload is payload for item in items)
    # The parsed message is left as it was.
    assert list(parsed.root.attrib.items()) == [
        ("category", "update"),
        ("id", ids),
        ("sent", "2026-11-21T12:00:00Z"),
    ]


def test_update_payload_keeps_the_namespace_context_of_its_selectors():
    operation = '<replace xmlns:p="urn:p" sel="/event/@p:going">soft</replace>'
    body = update("A", operation, extra=' xmlns:q="urn:q"')
    (item,) = split_message(MESSAGE_ID, parse_message(body))
    root = etree.fromstring(item.payload)
    assert root.get("id") is None
    assert root.nsmap == {"q": "urn:q"}
    assert root[0].nsmap == {"q": "urn:q", "p": "urn:p"}


def test_item_pickles():
    (item,) = split_message(MESSAGE_ID, parse_message(master(event())))
    assert pickle.loads(pickle.dumps(item)) == item


def test_selectable_properties_of_a_master_item_include_its_event():
    (item,) = split_message(MESSAGE_ID, parse_message(master(event(status="active"))))
    attributes = etree.fromstring(item.payload).attrib
    assert selectable_properties(item, attributes) == {
        "JMSMessageID": MESSAGE_ID,
        "category": "master",
        "type": "new",
        "masterId": ASCOT_1430,
        "position": 0,
        "sport": "horse-racing",
        "country": "GB",
        "course": "Ascot",
        "eventStatus": "active",
    }


def test_selectable_properties_of_an_update_without_master_have_no_type_or_event():
    item = Item(MESSAGE_ID, 1, ASCOT_1500, "update", None, b"<sportsdata/>")
    assert selectable_properties(item) == {
        "JMSMessageID": MESSAGE_ID,
        "category": "update",
        "masterId": ASCOT_1500,
        "position": 1,
    }


def test_selectable_properties_include_delivery_count_when_known():
    item = Item(MESSAGE_ID, 0, ASCOT_1500, "update", None, b"<sportsdata/>")
    first = selectable_properties(item, delivery_count=1)
    again = selectable_properties(item, delivery_count=3)
    assert (first["JMSXDeliveryCount"], first["JMSRedelivered"]) == (1, False)
    assert (again["JMSXDeliveryCount"], again["JMSRedelivered"]) == (3, True)
