"""Parsing and validating one Sportsdata message body (SPORTSDATA.md, "The message",
"The document", "Invalid items and poison messages").

`parse_message` either returns a `ParsedMessage` or raises `InvalidMessage` with the reason
the whole message is dead-lettered. Checks run cheapest first and each input is parsed once
and validated once:

1. `too-large`: the body is longer than `limits.max_message_bytes` (default 4 MB), checked
   before parsing.
2. `not-well-formed`: not XML, not UTF-8, or carrying a DOCTYPE. The parser never resolves
   entities, loads a DTD or touches the network, and keeps libxml2's size limits
   (huge_tree=False); any DOCTYPE is rejected outright since the feed never needs one and
   internal-subset entities are the classic expansion attack.
3. `schema-invalid` when the root is not an unqualified `sportsdata` element.
4. `invalid-envelope`: the root attributes (SPORTSDATA.md table): unknown attribute,
   category not master/update, type missing on a master or present on an update, id list
   empty, an id not matching `[A-Za-z0-9_.:-]{1,64}`, an id twice, `sent` not an xs:dateTime.
   These are checked in code before the schema so the reason names the envelope.
5. `schema-invalid`: anything else the RELAX NG rejects (events, patch operations).
6. `ids-mismatch` (master only): exactly one `event` per listed id, `@id` equal to it,
   which RELAX NG cannot express.

The body is decoded as UTF-8 whatever its XML declaration says (the feed is UTF-8 by
contract), so a Latin-1 body is `not-well-formed` rather than silently re-decoded.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from lxml import etree

from sis_platform.domain.limits import DEFAULT_LIMITS, Limits
from sis_platform.domain.reasons import Reason
from sis_platform.domain.schema import validate_envelope

DEFAULT_MAX_BYTES = DEFAULT_LIMITS.max_message_bytes

ENVELOPE_ATTRIBUTES = frozenset({"category", "type", "id", "sent"})

# SPORTSDATA.md, "The document": an id matches [A-Za-z0-9_.:-]{1,64}; ids are separated by
# XML whitespace only (a no-break space is not a separator, and not an id character either).
_ID = re.compile(r"[A-Za-z0-9_.:\-]{1,64}")
_XML_SPACE = " \t\r\n"
_XML_SPACE_RUN = re.compile(r"[ \t\r\n]+")

# xs:dateTime lexical form (XML Schema Part 2, 3.2.7). Years outside 0001-9999 and 24:00:00
# are valid there but not representable as a Python datetime; they are rejected.
_DATETIME = re.compile(
    r"(?P<date>\d{4}-\d{2}-\d{2})T(?P<time>\d{2}:\d{2}:\d{2})(?:\.(?P<fraction>\d+))?"
    r"(?P<zone>Z|[+-]\d{2}:\d{2})?"
)


class InvalidMessage(Exception):
    """The whole message is invalid: dead-lettered at once, never retried."""

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail

    def __reduce__(self) -> tuple[type[InvalidMessage], tuple[Reason, str]]:
        # Exceptions pickle their args by default; ours has two, so say so (Spark executors).
        return (InvalidMessage, (self.reason, self.detail))


@dataclass(frozen=True)
class ParsedMessage:
    """A valid message: envelope attributes and the parsed root (not picklable: stays local)."""

    category: Literal["master", "update"]
    type: Literal["new", "refresh"] | None
    ids: tuple[str, ...]
    sent: datetime | None
    root: etree._Element


@functools.cache
def _parser() -> etree.XMLParser:
    return etree.XMLParser(
        encoding="utf-8",
        resolve_entities=False,
        no_network=True,
        load_dtd=False,
        dtd_validation=False,
        huge_tree=False,
        collect_ids=False,
    )


def parse_xml(body: bytes) -> etree._Element:
    """Parse trusted-or-not UTF-8 XML with the hardened parser; raises etree.XMLSyntaxError.

    Also used for payloads this package produced itself (split events, patched masters).
    """
    return etree.fromstring(body, _parser())


def parse_message(body: bytes, *, limits: Limits = DEFAULT_LIMITS) -> ParsedMessage:
    """Parse and validate one message body; raises InvalidMessage (see the module docstring)."""
    max_bytes = limits.max_message_bytes
    if len(body) > max_bytes:
        raise InvalidMessage(
            Reason.TOO_LARGE,
            f"body is {len(body)} bytes, over the limit of {max_bytes} (SIS_MAX_MESSAGE_BYTES)",
        )
    try:
        root = parse_xml(body)
    except etree.XMLSyntaxError as error:
        raise InvalidMessage(Reason.NOT_WELL_FORMED, str(error)) from None
    except ValueError as error:  # e.g. lxml refusing input it cannot decode at all
        raise InvalidMessage(Reason.NOT_WELL_FORMED, str(error)) from None
    if root.getroottree().docinfo.doctype:
        raise InvalidMessage(Reason.NOT_WELL_FORMED, "a DOCTYPE (DTD) is not allowed")
    if root.tag != "sportsdata":
        raise InvalidMessage(
            Reason.SCHEMA_INVALID, f"root element is {root.tag!r}, expected 'sportsdata'"
        )

    category, type_, ids, sent = _envelope(root)

    schema_error = validate_envelope(root)
    if schema_error is not None:
        raise InvalidMessage(Reason.SCHEMA_INVALID, schema_error)

    if category == "master":
        _check_event_ids(root, ids)
    return ParsedMessage(category=category, type=type_, ids=ids, sent=sent, root=root)


def _envelope(
    root: etree._Element,
) -> tuple[
    Literal["master", "update"], Literal["new", "refresh"] | None, tuple[str, ...], datetime | None
]:
    attributes = root.attrib
    unknown = sorted(str(name) for name in attributes.keys() if name not in ENVELOPE_ATTRIBUTES)
    if unknown:
        raise InvalidMessage(Reason.INVALID_ENVELOPE, f"unknown root attribute(s): {unknown}")

    raw_category = attributes.get("category")
    raw_type = attributes.get("type")
    category: Literal["master", "update"]
    type_: Literal["new", "refresh"] | None
    if raw_category == "master":
        category = "master"
        if raw_type == "new":
            type_ = "new"
        elif raw_type == "refresh":
            type_ = "refresh"
        elif raw_type is None:
            raise InvalidMessage(Reason.INVALID_ENVELOPE, "a master message needs @type")
        else:
            raise InvalidMessage(
                Reason.INVALID_ENVELOPE, f"@type is {raw_type!r}, expected 'new' or 'refresh'"
            )
    elif raw_category == "update":
        category = "update"
        type_ = None
        if raw_type is not None:
            raise InvalidMessage(Reason.INVALID_ENVELOPE, "an update message must not have @type")
    elif raw_category is None:
        raise InvalidMessage(Reason.INVALID_ENVELOPE, "@category is missing")
    else:
        raise InvalidMessage(
            Reason.INVALID_ENVELOPE,
            f"@category is {raw_category!r}, expected 'master' or 'update'",
        )

    ids = parse_id_list(attributes.get("id"))

    raw_sent = attributes.get("sent")
    sent = None if raw_sent is None else parse_datetime(raw_sent)
    return category, type_, ids, sent


def parse_id_list(value: str | None) -> tuple[str, ...]:
    """The master ids of an `id` attribute, in order; raises InvalidMessage(invalid-envelope)."""
    if value is None:
        raise InvalidMessage(Reason.INVALID_ENVELOPE, "@id is missing")
    stripped = value.strip(_XML_SPACE)
    if not stripped:
        raise InvalidMessage(Reason.INVALID_ENVELOPE, "@id lists no master id")
    ids = tuple(_XML_SPACE_RUN.split(stripped))
    seen: set[str] = set()
    for master_id in ids:
        if not _ID.fullmatch(master_id):
            raise InvalidMessage(
                Reason.INVALID_ENVELOPE,
                f"master id {master_id!r} does not match [A-Za-z0-9_.:-]{{1,64}}",
            )
        if master_id in seen:
            raise InvalidMessage(Reason.INVALID_ENVELOPE, f"master id {master_id!r} listed twice")
        seen.add(master_id)
    return ids


def parse_datetime(value: str) -> datetime:
    """An xs:dateTime as a datetime (aware when it has a zone, naive otherwise).

    Raises InvalidMessage(invalid-envelope): only the envelope's `sent` goes through here; the
    event's dates are left to the schema.
    """
    match = _DATETIME.fullmatch(value.strip(_XML_SPACE))
    if match is None:
        raise InvalidMessage(Reason.INVALID_ENVELOPE, f"@sent {value!r} is not an xs:dateTime")
    fraction = (match["fraction"] or "")[:6].ljust(6, "0")
    zone = match["zone"] or ""
    if zone == "Z":
        zone = "+00:00"
    try:
        return datetime.fromisoformat(f"{match['date']}T{match['time']}.{fraction}{zone}")
    except ValueError as error:
        raise InvalidMessage(
            Reason.INVALID_ENVELOPE, f"@sent {value!r} is not a valid date and time: {error}"
        ) from None


def _check_event_ids(root: etree._Element, ids: tuple[str, ...]) -> None:
    # The schema has already made every child an `event` with a well-formed @id
    # (comments and processing instructions aside).
    listed = set(ids)
    found: set[str] = set()
    for event in root.iterchildren("event"):
        event_id = event.get("id")
        if event_id not in listed:
            raise InvalidMessage(
                Reason.IDS_MISMATCH, f"event {event_id!r} is not listed in @id {list(ids)}"
            )
        if event_id in found:
            raise InvalidMessage(Reason.IDS_MISMATCH, f"event {event_id!r} appears twice")
        found.add(event_id)
    missing = [master_id for master_id in ids if master_id not in found]
    if missing:
        raise InvalidMessage(Reason.IDS_MISMATCH, f"no event for listed id(s) {missing}")
