"""Which masters a backlog folds first (`SIS_PRIORITY`): an ordered list of JMS selectors.

The feed contract's message selection asks that messages can be selected, ignored or
prioritized by their properties; `SIS_SELECTOR` selects and ignores, this prioritizes. The
selectors see the same item properties as `SIS_SELECTOR` (items.selectable_properties: the
item's own, and its master's event attributes), joined by `;` outside quoted strings, e.g.
`sport = 'horse-racing' AND country = 'GB'; sport = 'greyhounds'`.

A master's class in a stretch of the log is the index of the first selector that any of its
items there matches (len(selectors): none). The event attributes an item is tested with are its
own for a master item, and otherwise those of the master's document as last folded (the stored
one, or the stretch's latest master item before it). Only the order in which masters are folded
and published changes: each master's items stay in feed order and its result is the same, as
the masters of a stretch fold independently (pipeline.fold_stretch).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from lxml import etree

from sis_platform.domain.items import Item, selectable_properties
from sis_platform.standards.selector import InvalidSelector, Selector

SEPARATOR = ";"
# Bytes of a document fed to the pull parser at a time while looking for its root element.
_CHUNK = 4096


def split_selectors(text: str) -> list[str]:
    """The selectors of a `SIS_PRIORITY` value, split at each `;` outside a quoted string
    (a JMS string literal is in single quotes, with `''` for a quote inside it)."""
    parts: list[str] = []
    current: list[str] = []
    quoted = False
    for char in text:
        if char == "'":
            quoted = not quoted
        if char == SEPARATOR and not quoted:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [part.strip() for part in parts]


@dataclass(frozen=True)
class Priority:
    """The compiled selectors of `SIS_PRIORITY`, earliest first."""

    selectors: tuple[Selector, ...]

    @classmethod
    def compile(cls, text: str) -> Priority:
        """Compile a `SIS_PRIORITY` value; raises InvalidSelector naming the selector (1-based)
        that is invalid or empty."""
        compiled = []
        for number, part in enumerate(split_selectors(text), start=1):
            if not part:
                raise InvalidSelector(f"priority selector {number} is empty", text, 0)
            try:
                compiled.append(Selector.compile(part))
            except InvalidSelector as error:
                raise InvalidSelector(
                    f"priority selector {number}: {error.reason}", part, error.position
                ) from None
        return cls(tuple(compiled))

    @property
    def classes(self) -> int:
        """How many classes a master can be in: one per selector, and the rest."""
        return len(self.selectors) + 1

    def master_class(self, items: Sequence[Item], document: bytes | None) -> int:
        """The class of a master whose items in the stretch are `items` (feed order) and
        whose document before them is `document` (None: none)."""
        best = len(self.selectors)
        attributes: Mapping[str, str] | None = None
        parsed_from: bytes | None = None
        for item in items:
            source = item.payload if item.category == "master" else document
            if source is not None and source is not parsed_from:
                attributes, parsed_from = event_attributes(source), source
            if item.category == "master":
                document = item.payload
            # No document yet (an update before any master): no attributes were read either.
            properties = selectable_properties(item, attributes)
            for index in range(best):
                if self.selectors[index].matches(properties):
                    best = index
                    break
            if best == 0:
                break
        return best

    def order(
        self, groups: Mapping[str, Sequence[Item]], document_of: Callable[[str], bytes | None]
    ) -> list[list[str]]:
        """The master ids of `groups` per class, earliest class first (every class listed,
        empty or not), each in the order `groups` has them."""
        classes: list[list[str]] = [[] for _ in range(self.classes)]
        for master_id, items in groups.items():
            classes[self.master_class(items, document_of(master_id))].append(master_id)
        return classes


def event_attributes(document: bytes) -> dict[str, str]:
    """The attributes of a document's root element (the event's), reading no further than
    its start tag. The document is one the package produced (a split event or a folded
    master); one it cannot read has no attributes."""
    parser = etree.XMLPullParser(
        events=("start",), resolve_entities=False, no_network=True, load_dtd=False
    )
    try:
        for offset in range(0, len(document), _CHUNK):
            parser.feed(document[offset : offset + _CHUNK])
            for _, element in parser.read_events():
                return dict(element.attrib)
    except etree.XMLSyntaxError:
        pass
    return {}
