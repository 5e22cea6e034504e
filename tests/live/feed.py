"""A simulated feed as a landed log, for the live path's tests: every corruption kind,
redeliveries, and a few messages over the redelivery limit."""

from __future__ import annotations

import dataclasses
import random
from datetime import UTC, datetime

from sis_platform.domain.pipeline import LoggedMessage
from sis_platform.log.landing import LandedMessage, LogPosition
from sis_platform.simulator.generator import INVALID_REASONS, generate_feed

INVALID = {str(reason): 0.004 for reason in INVALID_REASONS}
PUT_TIME = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


def landed_feed(seed: int, messages: int, batch_size: int = 97) -> list[LandedMessage]:
    """`messages` simulated messages as a log of batches of `batch_size`, a few of them
    delivered over the redelivery limit."""
    rng = random.Random(seed)
    out = []
    for index, message in enumerate(
        generate_feed(seed, messages, invalid=INVALID, duplicates=0.02)
    ):
        count = 6 if rng.random() < 0.003 else 1
        batch_seq = index // batch_size + 1
        out.append(
            LandedMessage(
                LogPosition(batch_seq, index % batch_size),
                LoggedMessage(message.message_id, message.body, count, batch_seq=batch_seq),
                message.sent,
            )
        )
    return out


def groups_of_varying_size(
    log: list[LandedMessage], seed: int, largest: int
) -> list[list[LandedMessage]]:
    rng = random.Random(seed)
    groups, start = [], 0
    while start < len(log):
        size = rng.randint(1, largest)
        groups.append(log[start : start + size])
        start += size
    return groups


def landed_again(
    log: list[LandedMessage], copies: list[LandedMessage], batch_size: int
) -> list[LandedMessage]:
    """`log` with `copies` of its messages landed again after it, in batches of `batch_size`
    (a backout queue replayed, or redeliveries)."""
    first = log[-1].position.batch_seq + 1
    out = list(log)
    for index, landed in enumerate(copies):
        batch_seq = first + index // batch_size
        message = dataclasses.replace(landed.message, batch_seq=batch_seq)
        out.append(
            LandedMessage(LogPosition(batch_seq, index % batch_size), message, landed.put_time)
        )
    return out
