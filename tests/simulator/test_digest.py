"""The generated feed, pinned by digest: a refactoring of the simulator must not change a byte.

Each case hashes every message (id, kind, put time, body, length-prefixed) and, at the end,
the simulator's model of every master. A deliberate change to what the simulator generates
updates these digests in the same commit, and says why.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import date

import pytest

from sis_platform.simulator.generator import FeedSimulator
from tests.simulator.helpers import ALL_INVALID, SMALL_LIMIT

CASES: dict[str, tuple[Callable[[], FeedSimulator], str]] = {
    "clean day": (
        lambda: FeedSimulator(1, 12_000),
        "eabd04c9df35ed4fbc5c9cc75607fb64f8d2e9ff82e6ea414cc2a69e9ac0c878",
    ),
    "dirty day": (
        lambda: FeedSimulator(
            3, 12_000, invalid=ALL_INVALID, duplicates=0.02, max_bytes=SMALL_LIMIT
        ),
        "848ae276f81ddb4106a34c08584f061e810553aa9ac1e566b2cfadc1c206e0eb",
    ),
    "three summer days": (
        lambda: FeedSimulator(
            7,
            26_000,
            start=date(2026, 6, 1),
            invalid={"unlocated-node": 0.03, "orphan-update": 0.01},
            duplicates=0.01,
            max_bytes=SMALL_LIMIT,
        ),
        "6b303626ba040337b9854180033fa99605004b7d67eedb6be20de06c493b8d5c",
    ),
    "tiny feed": (
        lambda: FeedSimulator(
            11, 40, invalid={"invalid-result": 0.2, "too-large": 0.05}, max_bytes=SMALL_LIMIT
        ),
        "a19eaad71f764103d3c4e76a9baa5062de9268c3a149de1103cb6ddbdd3cb3d7",
    ),
}


def _digest(simulator: FeedSimulator) -> str:
    h = hashlib.sha256()
    for m in simulator:
        for part in (m.message_id.encode(), m.kind.encode(), m.sent.isoformat().encode(), m.body):
            h.update(len(part).to_bytes(8, "big"))
            h.update(part)
    for master_id, xml in sorted(simulator.masters().items()):
        h.update(master_id.encode())
        h.update(xml.encode())
    return h.hexdigest()


@pytest.mark.parametrize("case", list(CASES))
def test_a_seeded_feed_has_a_fixed_digest(case: str) -> None:
    make, expected = CASES[case]
    assert _digest(make()) == expected
