"""A signed landing zone holding batches landed in groups, as sis-live lands them, and what the
merge tests compare before and after a merge: each batch's rows, the log read back from the
start, and the chain check of every batch."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa

from sis_platform.domain.limits import DEFAULT_LIMITS
from sis_platform.log.chain import GENESIS_LINK, Problem
from sis_platform.log.landing import (
    START_POSITION,
    ClosedBy,
    GroupWriter,
    LandingZone,
    LogPosition,
    batch_key,
)
from sis_platform.log.landing.signed import signature_problems
from sis_platform.queues.base import ReceivedMessage, new_message_id

NOW = datetime(2026, 11, 21, 14, 30, tzinfo=UTC)


def sealed_zone(data_dir: Path) -> LandingZone:
    """The platform's own landing zone under `data_dir`: signed with the log key, witnessed."""
    from sis_platform.resources import config

    return config.resources({"SIS_DATA_DIR": str(data_dir)})["landing"].zone()


def land_in_groups(zone: LandingZone, batches: int, groups: int, *, leave_open: bool) -> None:
    """`batches` sealed batches of `groups` one- or two-message groups each (a group per part,
    each landed a second later), then an open batch of two groups when `leave_open`."""
    writer = GroupWriter(zone.writer)
    n = 0
    for b in range(batches + (1 if leave_open else 0)):
        for g in range(groups if b < batches else 2):
            size = 1 + (g % 2)
            messages = [
                ReceivedMessage(new_message_id(), f"<m n='{n + i}'/>".encode(), NOW, 1 + i)
                for i in range(size)
            ]
            n += size
            writer.land(messages, now=NOW + timedelta(seconds=n))
        if b < batches:
            writer.seal(ClosedBy.SECONDS)


def log_rows(zone: LandingZone) -> dict[str, pa.Table]:
    """Every landed batch's rows, by key."""
    return {key: zone.catalog.read(key) for key in zone.catalog.keys()}


def read_back(
    zone: LandingZone, after: LogPosition = START_POSITION
) -> list[tuple[LogPosition, str, bytes, int]]:
    """The log as sis-live's catch-up reads it from `after` (position, id, body, count)."""
    return [
        (m.position, m.message.message_id, m.message.body, m.message.delivery_count)
        for m in zone.catalog.landed_after(after, DEFAULT_LIMITS)
    ]


def chain_problems(zone: LandingZone) -> list[Problem]:
    """What the chain check finds in the landing zone: every landed batch's file (or parts)
    against its anchor, each anchor signed and following the one before."""
    from sis_platform.lake.spark.chain import verify_landing_file

    problems: list[Problem] = []
    prev = GENESIS_LINK.hex()
    for seq in range(1, len(zone.catalog.keys()) + 1):
        key = batch_key(seq)
        anchor = zone.catalog.anchors.read(key)
        assert anchor is not None and anchor.first_prev == prev
        problems += signature_problems(zone.catalog, key, anchor)
        problems += verify_landing_file(zone, key, prev, anchor)
        prev = anchor.head
    return problems
