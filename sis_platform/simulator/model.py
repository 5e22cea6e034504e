"""The simulator's own copy of each master document, and how it is written as XML.

The generator mutates these objects exactly as the patches it emits would mutate the master
(RFC 5261 semantics: `add` appends, or inserts after a sibling with `pos="after"`), so every
selector it writes is evaluated against the document the consumer will hold at that point.
Documents are written without indentation: whitespace-only text nodes would otherwise become
part of the master and make `remove` leave stray text behind.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final


def attr(value: str) -> str:
    """Escape an attribute value for a double-quoted attribute."""
    if "&" in value or "<" in value or '"' in value or ">" in value:
        value = (
            value.replace("&", "&amp;")
            .replace("<", "&lt;")
            .replace(">", "&gt;")
            .replace('"', "&quot;")
        )
    return value


def text(value: str) -> str:
    """Escape character data."""
    if "&" in value or "<" in value or ">" in value:
        value = value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return value


# The bookmakers' fractional odds ladder, shortest first. Prices move along it a step or two.
LADDER: Final[tuple[tuple[int, int], ...]] = (
    (1, 5),
    (2, 9),
    (1, 4),
    (2, 7),
    (1, 3),
    (4, 11),
    (2, 5),
    (4, 9),
    (1, 2),
    (8, 15),
    (4, 7),
    (8, 13),
    (4, 6),
    (8, 11),
    (4, 5),
    (5, 6),
    (10, 11),
    (1, 1),
    (11, 10),
    (6, 5),
    (5, 4),
    (11, 8),
    (6, 4),
    (13, 8),
    (7, 4),
    (15, 8),
    (2, 1),
    (9, 4),
    (5, 2),
    (11, 4),
    (3, 1),
    (10, 3),
    (7, 2),
    (4, 1),
    (9, 2),
    (5, 1),
    (11, 2),
    (6, 1),
    (13, 2),
    (7, 1),
    (15, 2),
    (8, 1),
    (17, 2),
    (9, 1),
    (10, 1),
    (11, 1),
    (12, 1),
    (14, 1),
    (16, 1),
    (18, 1),
    (20, 1),
    (22, 1),
    (25, 1),
    (28, 1),
    (33, 1),
    (40, 1),
    (50, 1),
    (66, 1),
    (80, 1),
    (100, 1),
)
LADDER_INDEX: Final[dict[tuple[int, int], int]] = {p: i for i, p in enumerate(LADDER)}


def _nearest_rung(odds: float) -> int:
    return min(range(len(LADDER)), key=lambda i: abs(LADDER[i][0] / LADDER[i][1] - odds))


# Place odds are a quarter of the win odds, rounded to the ladder (each-way terms 1/4).
PLACE_RUNG: Final[tuple[int, ...]] = tuple(_nearest_rung(n / d / 4) for n, d in LADDER)


@dataclass(slots=True)
class Price:
    num: int
    den: int
    at: str | None

    def xml(self) -> str:
        if self.at is None:
            return f'<price num="{self.num}" den="{self.den}"/>'
        return f'<price num="{self.num}" den="{self.den}" at="{self.at}"/>'


@dataclass(slots=True)
class Selection:
    id: str
    name: str
    status: str
    number: int | None = None
    jockey: str | None = None
    trainer: str | None = None
    price: Price | None = None

    def copy(self) -> Selection:
        price = None if self.price is None else Price(self.price.num, self.price.den, self.price.at)
        return Selection(
            self.id, self.name, self.status, self.number, self.jockey, self.trainer, price
        )

    def xml(self, extra: str = "") -> str:
        parts = [f'<selection id="{self.id}"']
        if self.number is not None:
            parts.append(f' number="{self.number}"')
        parts.append(f' name="{attr(self.name)}" status="{self.status}"')
        if self.jockey is not None:
            parts.append(f' jockey="{attr(self.jockey)}"')
        if self.trainer is not None:
            parts.append(f' trainer="{attr(self.trainer)}"')
        parts.append(extra)
        if self.price is None:
            parts.append("/>")
        else:
            parts.append(">")
            parts.append(self.price.xml())
            parts.append("</selection>")
        return "".join(parts)


@dataclass(slots=True)
class Market:
    id: str
    type: str
    status: str
    places: int | None = None
    selections: dict[str, Selection] = field(default_factory=dict)

    def xml(self) -> str:
        head = f'<market id="{self.id}" type="{self.type}" status="{self.status}"'
        if self.places is not None:
            head += f' places="{self.places}"'
        if not self.selections:
            return head + "/>"
        return head + ">" + "".join(s.xml() for s in self.selections.values()) + "</market>"

    def insert_after(self, after_id: str, selection: Selection) -> None:
        """`add pos="after"` on a sibling selection: keep document order in the dict."""
        items = list(self.selections.items())
        at = next(i for i, (k, _) in enumerate(items) if k == after_id) + 1
        items.insert(at, (selection.id, selection))
        self.selections = dict(items)


@dataclass(slots=True)
class Event:
    id: str
    sport: str
    country: str
    course: str
    name: str
    start: str
    status: str
    going: str | None = None
    markets: dict[str, Market] = field(default_factory=dict)

    def xml(self, *, event_extra: str = "", override_id: str | None = None) -> str:
        """The master document (the `event` element). `event_extra` and `override_id` exist
        only so the generator can corrupt a copy for an invalid message."""
        event_id = self.id if override_id is None else override_id
        head = (
            f'<event id="{event_id}" sport="{self.sport}" country="{self.country}"'
            f' course="{attr(self.course)}" name="{attr(self.name)}" start="{self.start}"'
            f' status="{self.status}"'
        )
        if self.going is not None:
            head += f' going="{attr(self.going)}"'
        head += event_extra
        return head + ">" + "".join(m.xml() for m in self.markets.values()) + "</event>"


def event_selector() -> str:
    return "/event"


def market_selector(market_id: str) -> str:
    return f"/event/market[@id='{market_id}']"


def selection_selector(market_id: str, selection_id: str) -> str:
    return f"/event/market[@id='{market_id}']/selection[@id='{selection_id}']"


# RFC 5261 patch operations, written as the provider writes them.


def replace_op(sel: str, value: str) -> str:
    return f'<replace sel="{attr(sel)}">{text(value)}</replace>'


def add_attribute_op(sel: str, name: str, value: str) -> str:
    return f'<add sel="{attr(sel)}" type="@{name}">{text(value)}</add>'


def add_element_op(sel: str, element_xml: str, pos: str | None = None) -> str:
    where = "" if pos is None else f' pos="{pos}"'
    return f'<add sel="{attr(sel)}"{where}>{element_xml}</add>'


def remove_op(sel: str) -> str:
    return f'<remove sel="{attr(sel)}"/>'


# Message envelopes (docs/feed.md, "The document").

XML_DECLARATION: Final[str] = '<?xml version="1.0" encoding="UTF-8"?>\n'


def master_body(
    category_type: str | None,
    ids: str,
    sent: str,
    events_xml: str,
    *,
    extra_root: str = "",
) -> str:
    """A master message. `category_type` is "new" or "refresh"; None leaves `type` out (only
    ever wanted for an invalid envelope)."""
    type_attr = "" if category_type is None else f' type="{category_type}"'
    return (
        f'{XML_DECLARATION}<sportsdata category="master"{type_attr} id="{ids}"'
        f' sent="{sent}"{extra_root}>{events_xml}</sportsdata>'
    )


def update_body(ids: str, sent: str, ops: list[str], *, extra_root: str = "") -> str:
    return (
        f'{XML_DECLARATION}<sportsdata category="update" id="{ids}" sent="{sent}"{extra_root}>'
        f"{''.join(ops)}</sportsdata>"
    )
