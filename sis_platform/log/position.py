"""A message's place in the landed log, `LogPosition`: what sis-live's serving store records as
applied and the landing zone reports as landed. Its own module, free of heavy imports, so that a
reader of the serving store does not load the landing zone's Parquet code."""

from __future__ import annotations

from typing import NamedTuple


class LogPosition(NamedTuple):
    """A message's place in the log: its batch's number and its position in the batch. As a
    consumer's position: the last message applied or landed."""

    batch_seq: int
    msg_seq: int


START_POSITION = LogPosition(0, -1)  # before the first message of the log
# Also as `LogPosition.START` (a NamedTuple's class body cannot hold a constant of its own type).
LogPosition.START = START_POSITION  # type: ignore[attr-defined]
