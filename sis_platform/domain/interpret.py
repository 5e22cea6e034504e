"""The interpreted model: a master document read as rows of events, markets and selections.

This is what Opportunity Management reads. Prices are fractional odds (SPORTSDATA.md); the
decimal price (num/den + 1) is added because that is what downstream pricing compares.
"""

from __future__ import annotations

from dataclasses import dataclass

from lxml import etree

_PARSER = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False)


@dataclass(frozen=True)
class EventRow:
    master_id: str
    sport: str | None
    country: str | None
    course: str | None
    name: str | None
    start: str | None
    status: str | None
    going: str | None


@dataclass(frozen=True)
class MarketRow:
    master_id: str
    market_id: str
    type: str | None
    status: str | None
    places: int | None


@dataclass(frozen=True)
class SelectionRow:
    master_id: str
    market_id: str
    selection_id: str
    number: int | None
    name: str | None
    status: str | None
    jockey: str | None
    trainer: str | None
    price_num: int | None
    price_den: int | None
    price_decimal: float | None
    price_at: str | None


@dataclass(frozen=True)
class Interpretation:
    event: EventRow
    markets: list[MarketRow]
    selections: list[SelectionRow]


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.strip().lstrip("-").isdigit() else None


def interpret(master_id: str, document: bytes) -> Interpretation:
    """Rows for one master document (a valid `event` element, as the fold guarantees)."""
    root = etree.fromstring(document, _PARSER)
    get = root.get
    event = EventRow(
        master_id, get("sport"), get("country"), get("course"), get("name"), get("start"),
        get("status"), get("going"),
    )
    markets: list[MarketRow] = []
    selections: list[SelectionRow] = []
    for market in root.iterchildren("market"):
        market_id = market.get("id", "")
        markets.append(
            MarketRow(master_id, market_id, market.get("type"), market.get("status"),
                      _int(market.get("places")))
        )
        for sel in market.iterchildren("selection"):
            price = sel.find("price")
            num = _int(price.get("num")) if price is not None else None
            den = _int(price.get("den")) if price is not None else None
            selections.append(
                SelectionRow(
                    master_id, market_id, sel.get("id", ""), _int(sel.get("number")),
                    sel.get("name"), sel.get("status"), sel.get("jockey"), sel.get("trainer"),
                    num, den,
                    round(num / den + 1, 6) if num is not None and den else None,
                    price.get("at") if price is not None else None,
                )
            )
    return Interpretation(event, markets, selections)
