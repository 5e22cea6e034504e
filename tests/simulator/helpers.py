"""Shared helpers for the simulator tests: reading the envelope of a simulated message."""

from __future__ import annotations

import re
from functools import cache

from sis_platform.simulator.generator import FeedSimulator, SimulatedMessage

_ROOT = re.compile(rb"<sportsdata\b([^>]*)>")
_ATTRIBUTE = re.compile(rb'\s([a-z]+)="([^"]*)"')

ALL_INVALID = {
    "not-well-formed": 0.01,
    "schema-invalid": 0.01,
    "invalid-envelope": 0.01,
    "ids-mismatch": 0.01,
    "too-large": 0.01,
    "unlocated-node": 0.01,
    "invalid-result": 0.01,
    "orphan-update": 0.01,
}
MESSAGE_LEVEL = (
    "not-well-formed",
    "schema-invalid",
    "invalid-envelope",
    "ids-mismatch",
    "too-large",
)
ITEM_LEVEL = ("unlocated-node", "invalid-result", "orphan-update")
SMALL_LIMIT = 256 * 1024


def envelope(message: SimulatedMessage) -> dict[str, str]:
    """The root attributes of a well-formed message (by pattern: no parser involved)."""
    match = _ROOT.search(message.body)
    assert match is not None, message.body[:200]
    return {k.decode(): v.decode() for k, v in _ATTRIBUTE.findall(match.group(1))}


def ids(message: SimulatedMessage) -> list[str]:
    return envelope(message)["id"].split()


@cache
def _generated(dirty: bool) -> tuple[tuple[SimulatedMessage, ...], dict[str, str]]:
    if dirty:
        simulator = FeedSimulator(
            3, 12_000, invalid=ALL_INVALID, duplicates=0.02, max_bytes=SMALL_LIMIT
        )
    else:
        simulator = FeedSimulator(1, 12_000)
    messages = tuple(simulator)
    return messages, simulator.masters()


def clean_day() -> tuple[SimulatedMessage, ...]:
    """One realistic clean day (seed 1), generated once and shared by read-only tests."""
    return _generated(False)[0]


def clean_day_masters() -> dict[str, str]:
    """The simulator's model of every master at the end of the clean day."""
    return _generated(False)[1]


def dirty_day() -> tuple[SimulatedMessage, ...]:
    """A day (seed 3) with 1% of every invalid kind and 2% duplicates, generated once."""
    return _generated(True)[0]


def dirty_day_masters() -> dict[str, str]:
    return _generated(True)[1]
