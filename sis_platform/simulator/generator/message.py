"""The feed's vocabulary: a simulated message, the kinds it is labelled with, and the bounds
and defaults every part of the generator shares."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime
from typing import Final

from sis_platform.domain.reasons import Reason

KIND_MASTER_NEW: Final = "master-new"
KIND_MASTER_REFRESH: Final = "master-refresh"
KIND_UPDATE: Final = "update"
KIND_DUPLICATE: Final = "duplicate"
INVALID_PREFIX: Final = "invalid:"

# The invalid kinds the generator can make, by reason code. The first five are whole-message
# reasons; the rest are item reasons of a well-formed, schema-valid update.
INVALID_REASONS: Final[tuple[Reason, ...]] = (
    Reason.NOT_WELL_FORMED,
    Reason.SCHEMA_INVALID,
    Reason.INVALID_ENVELOPE,
    Reason.IDS_MISMATCH,
    Reason.TOO_LARGE,
    Reason.UNLOCATED_NODE,
    Reason.INVALID_RESULT,
    Reason.ORPHAN_UPDATE,
)
# Invalid patches: the consumer marks the master stale, so a refresh must follow.
STALE_MAKING_REASONS: Final[frozenset[Reason]] = frozenset(
    {Reason.UNLOCATED_NODE, Reason.INVALID_RESULT}
)

DEFAULT_START: Final = date(2026, 11, 21)
DEFAULT_MAX_BYTES: Final = 4 * 1024 * 1024
MIN_MAX_BYTES: Final = 64 * 1024
# About one realistic UK/IE day (roughly 17 meetings, 170 races); longer feeds run more days.
DAY_MESSAGES: Final = 12_000
# Redeliveries repeat one of the last few messages ("a little later").
DUPLICATE_WINDOW: Final = 32


@dataclass(frozen=True, slots=True)
class SimulatedMessage:
    """One message as the provider puts it on the queue.

    `kind` is "master-new", "master-refresh", "update", "duplicate" (a redelivery: same id and
    body as an earlier message) or "invalid:<reason>" with a reason code from
    `sis_platform.domain.reasons`. `sent` is the put time (UTC).
    """

    message_id: str
    body: bytes
    kind: str
    sent: datetime
