"""Splitting a message into items, and what a JMS selector sees of an item
(docs/feed.md, "Items: splitting a message").

An item is the unit of processing: one per listed master id, keeping the message id and the
id's 0-based position in the message's id list. Items carry bytes only, so they pickle and
cross into Spark unchanged:

- a master item's payload is its `event` serialized as a standalone document (no XML
  declaration, UTF-8, no namespace declarations inherited from the envelope, no tail);
- an update item's payload is the message's root without its `id` list, whose children are
  the patch operations: what every item of the message applies, and nothing else. It is one
  bytes object shared by every item of the message, so the patch engine can compile it once
  (fold.PatchCache) and apply it to each master; rows that leave the process (Spark) each carry
  a copy, so a message whose items would carry more than `limits.max_split_bytes` together is
  dead-lettered `too-complex` instead of split.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass

from lxml import etree

from sis_platform.domain.limits import DEFAULT_LIMITS, Limits
from sis_platform.domain.messages import InvalidMessage, ParsedMessage, limit_detail
from sis_platform.domain.reasons import Reason


@dataclass(frozen=True)
class Item:
    message_id: str
    position: int
    master_id: str
    category: str  # "master" | "update"
    type: str | None  # "new" | "refresh" for a master item, None for an update item
    payload: bytes


def serialize(node: etree._Element | etree._ElementTree) -> bytes:
    """The canonical bytes of a document this package stores: UTF-8, no XML declaration."""
    return etree.tostring(node, encoding="utf-8")


def standalone_event(event: etree._Element, *, inherits: bool | None = None) -> bytes:
    """An `event` (possibly inside an envelope) serialized as its own document.

    `inherits` says whether the envelope declares namespaces, when the caller knows (a master
    message's events share one envelope): `event.nsmap` builds the whole in-scope map, every
    URI decoded, so reading it once per message rather than once per event keeps the split
    linear in the message (SIS_MAX_DOCUMENT_NAMESPACES bounds that map; its URIs can still
    fill the body).
    """
    if inherits is None:
        inherits = bool(event.nsmap)
    if inherits or _declares_namespaces(event):
        # In-scope declarations from the envelope would otherwise be copied onto the event;
        # the event vocabulary is unqualified (schema), so every declaration is unused.
        event = copy.deepcopy(event)
        etree.cleanup_namespaces(event)
    return etree.tostring(event, encoding="utf-8", with_tail=False)


def _declares_namespaces(element: etree._Element) -> bool:
    # iterwalk reports an element's own declarations (start-ns) before its start event.
    for event, _ in etree.iterwalk(element, events=("start-ns", "start")):
        return event == "start-ns"
    return False


def operations_payload(root: etree._Element) -> bytes:
    """An update message's root serialized without its `id` list: the patch operations under
    the envelope element that carries their namespace context (RFC 5261 resolves `sel`
    prefixes against the operation's in-scope declarations).

    The id list is taken off `root` while it is serialized and put back, in its place, before
    returning: copying the tree instead would double a large message's memory.
    """
    attributes = dict(root.attrib)
    if "id" not in attributes:
        return serialize(root)
    del root.attrib["id"]
    try:
        return serialize(root)
    finally:
        root.attrib.clear()
        root.attrib.update(attributes)


def split_message(
    message_id: str, message: ParsedMessage, *, limits: Limits = DEFAULT_LIMITS
) -> list[Item]:
    """One item per listed id, in id order (the order the ids are listed in the message).

    Raises InvalidMessage(too-complex) when the items would carry more than
    `limits.max_split_bytes` bytes together.
    """
    if message.category == "master":
        events = {event.get("id"): event for event in message.root.iterchildren("event")}
        inherits = bool(message.root.nsmap)
        payloads = [
            standalone_event(events[master_id], inherits=inherits) for master_id in message.ids
        ]
        total = sum(len(payload) for payload in payloads)
        what = f"its {len(payloads)} master items would carry {total} bytes"
    else:
        payload = operations_payload(message.root)
        payloads = [payload] * len(message.ids)
        total = len(payload) * len(payloads)
        what = (
            f"its {len(payloads)} items would carry {total} bytes "
            f"({len(payloads)} ids x {len(payload)} bytes of operations)"
        )
    if total > limits.max_split_bytes:
        raise InvalidMessage(Reason.TOO_COMPLEX, limit_detail(what, "max_split_bytes", limits))
    return [
        Item(
            message_id=message_id,
            position=position,
            master_id=master_id,
            category=message.category,
            type=message.type,
            payload=payload,
        )
        for position, (master_id, payload) in enumerate(zip(message.ids, payloads, strict=True))
    ]


# Event attributes a selector sees under the same name; the event's @status is "eventStatus"
# (plain "status" would be ambiguous next to the market and selection statuses).
EVENT_PROPERTIES = ("sport", "country", "course")
EVENT_STATUS_PROPERTY = "eventStatus"


def selectable_properties(
    item: Item,
    master_attributes: Mapping[str, str] | None = None,
    *,
    delivery_count: int | None = None,
) -> dict[str, object]:
    """The properties a JMS message selector sees for `item`.

    `master_attributes` are the attributes of the master being processed: for a master item
    its own `event`, for an update item the master's current `event` (None when there is no
    master). A property that is unknown is absent, which a selector reads as NULL.
    JMSXDeliveryCount and JMSRedelivered are only present when `delivery_count` is given.
    """
    properties: dict[str, object] = {
        "JMSMessageID": item.message_id,
        "category": item.category,
        "masterId": item.master_id,
        "position": item.position,
    }
    if item.type is not None:
        properties["type"] = item.type
    if master_attributes is not None:
        for name in EVENT_PROPERTIES:
            value = master_attributes.get(name)
            if value is not None:
                properties[name] = value
        status = master_attributes.get("status")
        if status is not None:
            properties[EVENT_STATUS_PROPERTY] = status
    if delivery_count is not None:
        properties["JMSXDeliveryCount"] = delivery_count
        properties["JMSRedelivered"] = delivery_count > 1
    return properties
