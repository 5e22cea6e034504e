"""Parsing and validating one Sportsdata message body (docs/feed.md, "A message on the queue",
"The document", "Invalid messages and items"; docs/design.md invariant 6, "Bounded cost").

`parse_message` either returns a `ParsedMessage` or raises `InvalidMessage` with the reason
the whole message is dead-lettered. Checks run cheapest first, each bound before the work it
protects, and the body is parsed once and validated once:

1. `too-large`: the body is longer than `limits.max_message_bytes` (default 4 MiB), checked
   before parsing.
2. `not-well-formed`: the body contains `<!DOCTYPE` or `<!ENTITY` (any case), found by a byte
   scan before lxml sees it. The feed has no DTD; a DOCTYPE is never legitimate, and its
   declarations are how a body reaches the file system (an external parameter entity naming a
   FIFO or a device hangs libxml2 even with DTD loading off) or expands without bound. The scan
   sees what the parser sees: the parser decodes every body as UTF-8 whatever its XML
   declaration says, so markup is ASCII bytes in the body; a UTF-8 BOM is skipped like any
   byte, and UTF-16 or UTF-32 input fails to parse at its first byte (a BOM or a NUL).
3. `not-well-formed`: not XML or not UTF-8 (so a Latin-1 body is rejected rather than silently
   re-decoded), or a reference to an entity that is not one of XML's five predefined ones. The
   parser never resolves entities, loads a DTD or touches the network, keeps libxml2's size
   limits (huge_tree=False), and refuses every external access through its resolver, as
   defence in depth behind step 2.
4. `too-complex`, counted while parsing and aborting at the first bound crossed, so no tree
   larger than the bounds is built and RELAX NG never sees a message beyond them: more than
   `max_elements` nodes (elements, comments and processing instructions), an element deeper
   than `max_depth` (the root is 1), an element with more than `max_attributes` attributes,
   more than `max_namespaces` namespace declarations or more than `max_children` child nodes
   (text aside), more than `max_document_namespaces` declarations in the message. lxml keeps
   declarations out of an element's attributes, so they are counted on their own (lxml's
   "start-ns" events). A body with no more `<` than the smallest of the node bounds, no more
   `=` than `max_attributes` and no more `xmlns` than the smaller namespace bound cannot cross
   one (every node starts with `<`, every attribute has its `=`, every declaration its
   `xmlns`), and is parsed without counting.
5. `schema-invalid` when the root is not an unqualified `sportsdata` element.
6. `invalid-envelope`: the root attributes (docs/feed.md table): unknown attribute,
   category not master/update, type missing on a master or present on an update, id list
   empty, an id not matching `[A-Za-z0-9_.:-]{1,64}`, an id twice, `sent` not an xs:dateTime.
   These are checked in code before the schema so the reason names the envelope. Among them,
   more than `max_ids` ids is `too-complex` (counted before any id is checked or split).
7. `too-complex`: an update with more than `max_patch_operations` operations.
8. `schema-invalid`: anything else the RELAX NG rejects (events, patch operations, an integer
   beyond a signed 64-bit long).
9. `ids-mismatch` (master only): exactly one `event` per listed id, `@id` equal to it,
   which RELAX NG cannot express.

A `too-complex` detail names the bound, its value and its setting, e.g. "412 ids, over the
limit of 200 (SIS_MAX_IDS)" (`limit_detail`).
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from lxml import etree

from sis_platform.domain.limits import DEFAULT_LIMITS, Limits
from sis_platform.domain.reasons import Reason
from sis_platform.domain.schema import validate_envelope

DEFAULT_MAX_BYTES = DEFAULT_LIMITS.max_message_bytes

ENVELOPE_ATTRIBUTES = frozenset({"category", "type", "id", "sent"})

# docs/feed.md, "The document": an id matches [A-Za-z0-9_.:-]{1,64}; ids are separated by
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


class ExternalAccessRefused(Exception):
    """The parser was asked to read an external resource (a DTD, an entity): never allowed."""


class _RefuseExternalAccess(etree.Resolver):
    """Refuses every external resource libxml2 asks for. Behind the DOCTYPE scan, this is what
    keeps the file system and the network out of reach if a declaration ever got through."""

    def resolve(self, system_url: str | None, public_id: str | None, context: object) -> None:
        raise ExternalAccessRefused(f"external resource {system_url or public_id!r} refused")


_PARSER_OPTIONS: dict[str, object] = {
    "encoding": "utf-8",
    "resolve_entities": False,
    "no_network": True,
    "load_dtd": False,
    "dtd_validation": False,
    "huge_tree": False,
    "collect_ids": False,
}


@functools.cache
def _parser() -> etree.XMLParser:
    parser = etree.XMLParser(**_PARSER_OPTIONS)  # type: ignore[arg-type]
    parser.resolvers.add(_RefuseExternalAccess())
    return parser


def parse_xml(body: bytes) -> etree._Element:
    """Parse UTF-8 XML with the hardened parser; raises etree.XMLSyntaxError, or
    ExternalAccessRefused when the document asks for an external resource.

    For payloads this package produced itself (split events, patched masters); a message body
    goes through `parse_message`, which scans and bounds it first.
    """
    return etree.fromstring(body, _parser())


# `<!DOCTYPE` and `<!ENTITY` in any case: XML only knows the upper-case keywords, but a false
# positive costs nothing here (the feed never carries either, even in a comment).
_DECLARATION = re.compile(rb"<!(?i:doctype|entity)")

# Bytes fed to the pull parser at a time: the bounds are checked between chunks, so at most one
# chunk's nodes are built beyond a bound before parsing stops.
_FEED_CHUNK = 64 * 1024

# lxml reports elements as start/end, comments and processing instructions as one event, and
# each namespace declaration as a "start-ns" event before the start of its element.
_EVENTS = ("start", "end", "start-ns", "comment", "pi")


def limit_detail(what: str, bound: str, limits: Limits) -> str:
    """The detail of a `too-complex` dead letter: what was found, the bound's value and its
    setting, e.g. "412 ids, over the limit of 200 (SIS_MAX_IDS)"."""
    return f"{what}, over the limit of {getattr(limits, bound)} (SIS_{bound.upper()})"


def _too_complex(what: str, bound: str, limits: Limits) -> InvalidMessage:
    return InvalidMessage(Reason.TOO_COMPLEX, limit_detail(what, bound, limits))


def _name(node: etree._Element) -> str:
    tag = node.tag
    name = tag if isinstance(tag, str) else "node"
    return name if len(name) <= 64 else name[:61] + "..."


def _line(node: etree._Element) -> str:
    return "" if node.sourceline is None else f" (line {node.sourceline})"


# One pull parser per thread, reused message after message (building one costs about as much as
# parsing a typical message). It is dropped after any message it did not finish, so no event or
# half-built document of that message can reach the next.
_pull = threading.local()


def _pull_parser() -> etree.XMLPullParser:
    parser: etree.XMLPullParser | None = getattr(_pull, "parser", None)
    if parser is None:
        parser = etree.XMLPullParser(events=_EVENTS, **_PARSER_OPTIONS)  # type: ignore[arg-type]
        parser.resolvers.add(_RefuseExternalAccess())
        _pull.parser = parser
    return parser


def _too_small_to_cross_a_bound(body: bytes, limits: Limits) -> bool:
    # Every node starts with "<", so nodes, the children of one element and the depth are each
    # at most their count; every attribute has its "=", every namespace declaration its
    # "xmlns". Most updates are this small, and three byte counts are much cheaper than
    # counting while parsing.
    markup = body.count(b"<")
    return (
        markup <= min(limits.max_elements, limits.max_children, limits.max_depth)
        and body.count(b"=") <= limits.max_attributes
        and body.count(b"xmlns") <= min(limits.max_namespaces, limits.max_document_namespaces)
    )


def _parse_bounded(body: bytes, limits: Limits) -> etree._Element:
    """Parse `body`, counting nodes, depth, attributes and children as lxml builds the tree, and
    stop at the first bound crossed (step 4 of the module docstring); a body too small to cross
    any bound is parsed without counting."""
    if _too_small_to_cross_a_bound(body, limits):
        return parse_xml(body)
    parser = _pull_parser()
    try:
        return _count_while_parsing(parser, body, limits)
    except BaseException:
        _pull.parser = None
        raise


def _count_while_parsing(
    parser: etree.XMLPullParser, body: bytes, limits: Limits
) -> etree._Element:
    def events() -> Iterator[tuple[str, object]]:
        for offset in range(0, max(len(body), 1), _FEED_CHUNK):
            parser.feed(body[offset : offset + _FEED_CHUNK])
            yield from parser.read_events()

    count_nodes(events(), limits)
    root: etree._Element = parser.close()
    return root


def subtree_events(element: etree._Element) -> Iterator[tuple[str, object]]:
    """The events `count_nodes` reads, for a subtree already built (an element and all below;
    the declarations made on `element` itself count, those it inherits do not)."""
    events: Iterator[tuple[str, object]] = etree.iterwalk(element, events=_EVENTS)
    return events


def count_nodes(events: Iterable[tuple[str, object]], limits: Limits, *, depth: int = 1) -> int:
    """The nodes (elements, comments, processing instructions) in a stream of lxml events
    ("start", "end", "start-ns", "comment", "pi") over one document or subtree whose first node
    is at `depth`; raises InvalidMessage(too-complex) at the first structural bound crossed:
    more than `max_elements` nodes, a node deeper than `max_depth`, an element with more than
    `max_attributes` attributes, `max_namespaces` namespace declarations or `max_children`
    child nodes, more than `max_document_namespaces` declarations in all. The stream is
    consumed only up to that point, so a parser feeding it stops there too."""
    max_elements = limits.max_elements
    max_depth = limits.max_depth
    max_children = limits.max_children
    nodes = 0
    declared = _Declarations(limits)
    # Children seen so far of each open element, outermost first, above a placeholder per
    # level above the first node (for a document: one, the document's own children, which no
    # bound applies to). The depth of a node is the length of this stack when it starts.
    children = [0] * depth
    for event, node in events:
        if event == "end":
            children.pop()
            continue
        if event == "start-ns":
            declared.pending += 1
            continue
        assert isinstance(node, etree._Element)
        nodes += 1
        if nodes > max_elements:
            raise _too_complex(f"at least {nodes} elements", "max_elements", limits)
        level = len(children)
        children[-1] += 1
        if children[-1] > max_children and level > 1:
            parent = node.getparent()
            where = "an element" if parent is None else f"<{_name(parent)}>"
            raise _too_complex(
                f"{where} with at least {children[-1]} children", "max_children", limits
            )
        if event != "start":
            continue
        if level > max_depth:
            raise _too_complex(
                f"<{_name(node)}> at depth {level}{_line(node)}", "max_depth", limits
            )
        _check_element(node, declared, limits)
        children.append(0)
    return nodes


class _Declarations:
    """The namespace declarations of a stream of events: those of the element about to start
    (lxml reports them just before it), and all so far."""

    __slots__ = ("limits", "pending", "total")

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.pending = 0
        self.total = 0

    def take(self, node: etree._Element) -> None:
        """Count the pending declarations as `node`'s; raises InvalidMessage(too-complex)."""
        pending, self.pending = self.pending, 0
        if not pending:
            return
        if pending > self.limits.max_namespaces:
            raise _too_complex(
                f"<{_name(node)}> with {pending} namespace declarations{_line(node)}",
                "max_namespaces",
                self.limits,
            )
        self.total += pending
        if self.total > self.limits.max_document_namespaces:
            raise _too_complex(
                f"at least {self.total} namespace declarations",
                "max_document_namespaces",
                self.limits,
            )


def _check_element(node: etree._Element, declared: _Declarations, limits: Limits) -> None:
    """An element's own bounds: its attributes, and the namespace declarations it makes."""
    attributes = len(node.attrib)
    if attributes > limits.max_attributes:
        raise _too_complex(
            f"<{_name(node)}> with {attributes} attributes{_line(node)}",
            "max_attributes",
            limits,
        )
    declared.take(node)


def parse_message(body: bytes, *, limits: Limits = DEFAULT_LIMITS) -> ParsedMessage:
    """Parse and validate one message body; raises InvalidMessage (see the module docstring)."""
    max_bytes = limits.max_message_bytes
    if len(body) > max_bytes:
        raise InvalidMessage(
            Reason.TOO_LARGE,
            f"body is {len(body)} bytes, over the limit of {max_bytes} (SIS_MAX_MESSAGE_BYTES)",
        )
    declaration = _DECLARATION.search(body)
    if declaration is not None:
        raise InvalidMessage(
            Reason.NOT_WELL_FORMED,
            f"{declaration[0].decode('ascii')!r} at byte {declaration.start()}: a DOCTYPE or "
            "entity declaration is not allowed (the feed has no DTD)",
        )
    try:
        root = _parse_bounded(body, limits)
    except etree.XMLSyntaxError as error:
        raise InvalidMessage(Reason.NOT_WELL_FORMED, str(error)) from None
    except ExternalAccessRefused as error:
        raise InvalidMessage(Reason.NOT_WELL_FORMED, str(error)) from None
    except ValueError as error:  # e.g. lxml refusing input it cannot decode at all
        raise InvalidMessage(Reason.NOT_WELL_FORMED, str(error)) from None
    if root.getroottree().docinfo.doctype:
        raise InvalidMessage(Reason.NOT_WELL_FORMED, "a DOCTYPE (DTD) is not allowed")
    if root.tag != "sportsdata":
        raise InvalidMessage(
            Reason.SCHEMA_INVALID, f"root element is {root.tag!r}, expected 'sportsdata'"
        )

    category, type_, ids, sent = _envelope(root, limits)

    # len() counts comments and processing instructions too: only then are elements counted.
    if category == "update" and len(root) > limits.max_patch_operations:
        operations = sum(1 for _ in root.iterchildren(tag=etree.Element))
        if operations > limits.max_patch_operations:
            raise _too_complex(f"{operations} patch operations", "max_patch_operations", limits)

    schema_error = validate_envelope(root)
    if schema_error is not None:
        raise InvalidMessage(Reason.SCHEMA_INVALID, schema_error)

    if category == "master":
        _check_event_ids(root, ids)
    return ParsedMessage(category=category, type=type_, ids=ids, sent=sent, root=root)


def _envelope(
    root: etree._Element, limits: Limits
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

    ids = parse_id_list(attributes.get("id"), limits=limits)

    raw_sent = attributes.get("sent")
    sent = None if raw_sent is None else parse_datetime(raw_sent)
    return category, type_, ids, sent


def parse_id_list(value: str | None, *, limits: Limits = DEFAULT_LIMITS) -> tuple[str, ...]:
    """The master ids of an `id` attribute, in order; raises InvalidMessage: invalid-envelope,
    or too-complex for more than `limits.max_ids` ids (counted before any id is checked)."""
    if value is None:
        raise InvalidMessage(Reason.INVALID_ENVELOPE, "@id is missing")
    stripped = value.strip(_XML_SPACE)
    if not stripped:
        raise InvalidMessage(Reason.INVALID_ENVELOPE, "@id lists no master id")
    ids = tuple(_XML_SPACE_RUN.split(stripped))
    if len(ids) > limits.max_ids:
        raise _too_complex(f"{len(ids)} ids", "max_ids", limits)
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
