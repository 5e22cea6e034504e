"""The Sportsdata RELAX NG schema, compiled once per process (docs/feed.md, "The document").

`schema/sportsdata.rnc` is authoritative; `schema/sportsdata.rng` is its rnc2rng conversion,
checked in so that loading needs no converter (a test keeps the two equal). Three validators
come from the one grammar:

- the envelope schema (the grammar's own `start`, root `sportsdata`) for whole messages;
- the event schema (the same grammar with `start` replaced by `<ref name="event"/>`) for
  a standalone master document, which is what a master is after splitting and after every
  patch (docs/feed.md, "Update messages": the patched document must still be valid);
- the fragment schema (start: any one of event, market, selection, price) for checking just
  the part of a master an update changed (sis_platform.domain.patchscope).

All are compiled lazily on first use and cached for the life of the process (one compile per
Spark Python worker). lxml validators keep their error log on the instance, so use them from
one thread at a time (Spark Python workers are single-threaded).
"""

from __future__ import annotations

import functools
from pathlib import Path

from lxml import etree

SCHEMA_DIR = Path(__file__).resolve().parent / "schema"
RNC_PATH = SCHEMA_DIR / "sportsdata.rnc"
RNG_PATH = SCHEMA_DIR / "sportsdata.rng"

_RNG_NS = "http://relaxng.org/ns/structure/1.0"
EVENT_DEFINE = "event"
# The defines of the event vocabulary's elements, each named after its element.
VOCABULARY_DEFINES = ("event", "market", "selection", "price")


def _load_grammar() -> etree._ElementTree:
    # The grammar is our own checked-in file, but parse it as strictly as any input.
    parser = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False)
    return etree.parse(str(RNG_PATH), parser)


@functools.cache
def envelope_schema() -> etree.RelaxNG:
    """The compiled schema for a whole message (root `sportsdata`)."""
    return etree.RelaxNG(_load_grammar())


def _with_start(*defines: str) -> etree.RelaxNG:
    # The grammar with its start replaced by the named defines (a choice if several).
    grammar = _load_grammar()
    start = grammar.getroot().find(f"{{{_RNG_NS}}}start")
    if start is None:
        raise RuntimeError(f"{RNG_PATH} has no <start>")
    for child in list(start):
        start.remove(child)
    parent = start if len(defines) == 1 else etree.SubElement(start, f"{{{_RNG_NS}}}choice")
    for name in defines:
        etree.SubElement(parent, f"{{{_RNG_NS}}}ref", name=name)
    return etree.RelaxNG(grammar)


@functools.cache
def event_schema() -> etree.RelaxNG:
    """The compiled schema for a standalone master document (root `event`)."""
    return _with_start(EVENT_DEFINE)


@functools.cache
def fragment_schema() -> etree.RelaxNG:
    """Any one element of the event vocabulary with its subtree (event, market, selection or
    price), for re-validating the part of a master a patch changed (patchscope)."""
    return _with_start(*VOCABULARY_DEFINES)


# libxml2 reports the alternatives it tried around a failure as well as the failure: "failed
# to validate content/attributes" of every ancestor, and "Expecting an element X, got nothing"
# for the branch of a choice it abandoned. Those say little in a dead letter, so the first
# error of another kind is reported when there is one.
_VAGUE_ERRORS = frozenset(
    {"RELAXNG_ERR_CONTENTVALID", "RELAXNG_ERR_ATTRVALID", "RELAXNG_ERR_NOELEM"}
)


def _first_error(schema: etree.RelaxNG) -> str:
    errors = list(schema.error_log)
    if not errors:
        return "invalid against the schema"
    error = next((e for e in errors if e.type_name not in _VAGUE_ERRORS), errors[0])
    where = f"{error.path}: " if error.path else ""
    return f"line {error.line}: {where}{error.message}"


def validate_envelope(root: etree._Element | etree._ElementTree) -> str | None:
    """None when `root` is a valid message, else the first error."""
    schema = envelope_schema()
    if schema.validate(root):
        return None
    return _first_error(schema)


def validate_event(event: etree._Element | etree._ElementTree) -> str | None:
    """None when `event` is a valid standalone master document, else the first error.

    An element that is not its document's root is validated as if it were (lxml validates the
    subtree), so an `event` inside an envelope can be checked without copying it.
    """
    schema = event_schema()
    if schema.validate(event):
        return None
    return _first_error(schema)
