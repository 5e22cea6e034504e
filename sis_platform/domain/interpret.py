"""The interpreted model: a master document read as rows of events, markets and selections.

This is what Opportunity Management reads. Prices are fractional odds (docs/feed.md); the
decimal price (num/den + 1) is added because that is what downstream pricing compares.

Integers are read as xs:integer's lexical form (XML Schema Part 2, 3.3.13), which is what the
schema accepted: XML whitespace around, an optional sign, then decimal digits, leading zeros
allowed (`" +007 "` is 7). The schema bounds them to a signed 64-bit long, the model's type.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal

from sis_platform.domain.messages import parse_xml
from sis_platform.domain.model import PRICE_PLACES

# xs:integer after whitespace collapsing; only ASCII digits (Python's int() also takes other
# scripts' digits and underscores, which XML Schema does not).
# Sign, leading zeros, digits: each character can be read one way only, so matching is linear.
_XS_INTEGER = re.compile(r"[ \t\r\n]*([+-]?)0*([1-9][0-9]*|0)[ \t\r\n]*")
_LONG_DIGITS = 19  # digits of 2**63
_LONG_MIN = -(2**63)
_LONG_MAX = 2**63 - 1


# The rows of the model's tables (sis_platform/domain/model.py), without the folded master's
# own columns (version, stale).
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
    price_decimal: Decimal | None
    price_at: str | None


@dataclass(frozen=True)
class Interpretation:
    event: EventRow
    markets: list[MarketRow]
    selections: list[SelectionRow]


def xs_integer(value: str | None) -> int | None:
    """An xs:integer attribute value as an int; None when absent, not an xs:integer, or outside
    a signed 64-bit long (which a schema-valid document never holds)."""
    if value is None:
        return None
    match = _XS_INTEGER.fullmatch(value)
    if match is None or len(match[2]) > _LONG_DIGITS:
        # Leading zeros aside: any number of them is valid, and int() refuses over 4,300 digits.
        return None
    number = int(match[1] + match[2])
    return number if _LONG_MIN <= number <= _LONG_MAX else None


def interpret(master_id: str, document: bytes) -> Interpretation:
    """Rows for one master document (a valid `event` element, as the fold guarantees)."""
    root = parse_xml(document)
    get = root.get
    event = EventRow(
        master_id,
        get("sport"),
        get("country"),
        get("course"),
        get("name"),
        get("start"),
        get("status"),
        get("going"),
    )
    markets: list[MarketRow] = []
    selections: list[SelectionRow] = []
    for market in root.iterchildren("market"):
        market_id = market.get("id", "")
        markets.append(
            MarketRow(
                master_id,
                market_id,
                market.get("type"),
                market.get("status"),
                xs_integer(market.get("places")),
            )
        )
        for sel in market.iterchildren("selection"):
            price = sel.find("price")
            num = xs_integer(price.get("num")) if price is not None else None
            den = xs_integer(price.get("den")) if price is not None else None
            selections.append(
                SelectionRow(
                    master_id,
                    market_id,
                    sel.get("id", ""),
                    xs_integer(sel.get("number")),
                    sel.get("name"),
                    sel.get("status"),
                    sel.get("jockey"),
                    sel.get("trainer"),
                    num,
                    den,
                    decimal_price(num, den),
                    price.get("at") if price is not None else None,
                )
            )
    return Interpretation(event, markets, selections)


def decimal_price(num: int | None, den: int | None) -> Decimal | None:
    """Fractional odds num/den as a decimal price, num/den + 1, rounded half to even at
    PRICE_PLACES, exactly: computed on integers, since num may have 19 digits and a double
    keeps 15 to 17 significant digits. None without a price (or with a zero denominator)."""
    if num is None or not den:
        return None
    if den < 0:
        num, den = -num, -den
    quotient, remainder = divmod(num * 10**PRICE_PLACES, den)
    if 2 * remainder > den or (2 * remainder == den and quotient % 2):
        quotient += 1
    return Decimal(f"{quotient + 10**PRICE_PLACES}e-{PRICE_PLACES}")
