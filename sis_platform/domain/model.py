"""The interpreted model's tables, column by column: the one definition the lake's tables
(sis_platform/lake/tables.py), the serving store's (sis_platform/serving/schema.py) and the
interpreter's rows (interpret.py `EventRow`, `MarketRow`, `SelectionRow`) are made from or
checked against (tests/domain/test_model_columns.py). Free of heavy imports: the serving store
reads it without lxml or Spark.

Kinds: `text`; `int` (32-bit: a master's version); `long` (64-bit signed: the Sportsdata schema
bounds every integer it carries to xs:long, maxInclusive 9223372036854775807); `decimal` (the
decimal price num/den + 1, exact to PRICE_PLACES places: up to 2^63, 19 digits before the point,
where a double keeps 15 to 17 significant digits in all); `bool`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

ModelKind = Literal["text", "int", "long", "decimal", "bool"]
PRICE_PLACES: Final = 6  # decimal places of a decimal price (DECIMAL(38, 6))


@dataclass(frozen=True)
class ModelColumn:
    name: str
    kind: ModelKind
    nullable: bool = True


def _key(name: str) -> ModelColumn:
    return ModelColumn(name, "text", nullable=False)


def _text(name: str) -> ModelColumn:
    return ModelColumn(name, "text")


def _long(name: str) -> ModelColumn:
    return ModelColumn(name, "long")


# An event: one row per master, with the master's version and whether it is stale (a patch
# failed after it, so the row shows an older state than the feed's).
EVENT_COLUMNS: Final = (
    _key("master_id"),
    ModelColumn("version", "int", nullable=False),
    *map(_text, ("sport", "country", "course", "name", "start", "status", "going")),
    ModelColumn("stale", "bool", nullable=False),
)
MARKET_COLUMNS: Final = (
    _key("master_id"),
    _key("market_id"),
    _text("type"),
    _text("status"),
    _long("places"),
)
SELECTION_COLUMNS: Final = (
    _key("master_id"),
    _key("market_id"),
    _key("selection_id"),
    _long("number"),
    *map(_text, ("name", "status", "jockey", "trainer")),
    _long("price_num"),
    _long("price_den"),
    ModelColumn("price_decimal", "decimal"),
    _text("price_at"),
)
MODEL_COLUMNS: Final[dict[str, tuple[ModelColumn, ...]]] = {
    "events": EVENT_COLUMNS,
    "markets": MARKET_COLUMNS,
    "selections": SELECTION_COLUMNS,
}
# Columns of the folded master, not of the interpretation: an EventRow does not carry them.
MASTER_STATE_COLUMNS: Final = frozenset({"version", "stale"})
