"""Getting one landing batch off the queue: get under syncpoint, land durably, then commit.

This is the only place that moves messages from the queue into the platform (docs/design.md
invariant 1). The order of the three steps is the whole point: a crash before `land` returns
leaves every message on the queue (the unit of work is backed out, and redelivered with a
higher delivery count); a crash after `land` but before `commit` leaves the messages both on
the queue and in a batch, and their redelivered copies are later recorded as duplicates by
message id (invariant 2). With a consumer lease, `land` is fenced: a consumer that lost the
lease gets `FencedOff` from it, lands nothing and backs out, so the messages stay on the queue
for the new holder (invariant 8). No Dagster or Spark import: intake (sis_platform/intake/tick.py)
calls this every tick, in the sensor's process.

A message whose body is over the per-message bound (`Limits.max_message_bytes`,
SIS_MAX_MESSAGE_BYTES) is not kept in the batch: its bytes go to an overflow file before the
batch lands (`ZoneWriter.move_aside`) and the batch holds it with an empty body, its real size,
digest and location, to be dead-lettered `too-large` downstream (invariant 6, "Bounded cost").
Intake then holds at most one such body at a time, for as long as it takes to write it out. A
unit of work backed out after that leaves the file behind: it is named by its digest, so the
redelivered copy is written to the same file.

Before its first get, `consume_batch` proves the landing zone writable (`ZoneWriter.probe`)
and checks it has room for the largest batch it may get (`ZoneWriter.ensure_room`).
Every backout raises the backout count of every message in the unit of work, and a source moves
a message to its backout queue past its threshold (queues/base.py): if a landing outage were
found only when landing, each failed tick would bring the whole batch's valid messages closer to
the backout queue, unlogged (invariant 4: a transient failure never dead-letters a valid
message). Found first, it fails the tick with nothing got.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from sis_platform.domain.limits import DEFAULT_LIMITS, Limits
from sis_platform.log.landing import (
    ClosedBy,
    LandedBatch,
    MovedAside,
    ZoneWriter,
    landing_bytes_bound,
)
from sis_platform.queues.base import QueueSession, ReceivedMessage
from sis_platform.runtime.faults import crash_point
from sis_platform.settings import (
    DEFAULT_BATCH_MAX_BYTES,
    DEFAULT_BATCH_MAX_MESSAGES,
    DEFAULT_BATCH_MAX_SECONDS,
    DEFAULT_GET_WAIT_SECONDS,
)

if TYPE_CHECKING:
    from sis_platform.intake.lease import Fence

# The most messages one `get_available` claims while a batch gathers: a few hundred
# milliseconds of a backlog's landing at most, and the feed's messages one at a time.
GET_CHUNK_MESSAGES = 1_000


@dataclass(frozen=True)
class BatchLimits:
    """The bounds of one landing batch (their defaults, and why: sis_platform/settings/)."""

    max_messages: int = DEFAULT_BATCH_MAX_MESSAGES
    max_bytes: int = DEFAULT_BATCH_MAX_BYTES
    max_seconds: float = DEFAULT_BATCH_MAX_SECONDS
    get_wait_seconds: float = DEFAULT_GET_WAIT_SECONDS

    def __post_init__(self) -> None:
        if self.max_messages < 1 or self.max_bytes < 1 or self.max_seconds <= 0:
            raise ValueError(f"batch limits must be positive: {self}")


def consume_batch(
    session: QueueSession,
    writer: ZoneWriter,
    limits: BatchLimits,
    *,
    before_commit: Callable[[LandedBatch], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    fence: Fence | None = None,
    message_limits: Limits = DEFAULT_LIMITS,
) -> LandedBatch | None:
    """Get up to one batch's worth of messages, land them, commit. None when the queue was
    empty. `fence` is the consumer lease's proof of holding (checked by `land` right before the
    batch is claimed). A body over `message_limits.max_message_bytes` is moved aside as it
    arrives (see the module docstring). `before_commit` runs between landing and commit (fault
    injection in tests); if it, or `land`, raises, the unit of work is backed out."""
    writer.probe()  # before any get: a landing outage must not back out (and count) messages
    # ... nor a disk too full for this batch: its bodies up to the batch's bytes plus the one
    # body that may pass them (a larger one is moved aside).
    bodies = limits.max_bytes + message_limits.max_message_bytes
    writer.ensure_room(landing_bytes_bound(limits.max_messages, bodies))
    deadline = clock() + limits.max_seconds
    messages: list[ReceivedMessage | MovedAside] = []
    size = 0
    try:
        while True:
            if len(messages) >= limits.max_messages:
                closed_by = ClosedBy.MESSAGES
                break
            if size >= limits.max_bytes:
                closed_by = ClosedBy.BYTES
                break
            remaining = deadline - clock()
            if remaining <= 0:
                closed_by = ClosedBy.SECONDS
                break
            # What is available now, claimed together (one transaction on the embedded queue,
            # instead of two a message); a chunk ends after the body that brings it to the
            # per-message bound, so it holds at most one body over that bound.
            arrived = session.get_available(
                min(GET_CHUNK_MESSAGES, limits.max_messages - len(messages)),
                min(limits.max_bytes - size, message_limits.max_message_bytes),
            )
            if not arrived:
                message = session.get(wait_seconds=min(limits.get_wait_seconds, remaining))
                if message is None:
                    # No message within the wait. Cut short by the deadline, it says nothing
                    # of the queue: a backlog is still one.
                    closed_by = ClosedBy.SECONDS if clock() >= deadline else ClosedBy.DRAINED
                    break
                arrived = [message]
                del message  # the chunk's list holds the only reference to the body
            for message in arrived:
                if len(message.body) > message_limits.max_message_bytes:
                    messages.append(move_aside(writer, message))
                else:
                    messages.append(message)
                    size += len(message.body)
            del message  # drop this loop's reference to the last body before the next get
            arrived.clear()
        if not messages:
            session.commit()  # nothing got; ends the (empty) unit of work cleanly
            return None
        crash_point("consume.after_get")
        batch = writer.land(messages, fence=fence, closed_by=closed_by)
        crash_point("consume.after_land")
        if before_commit is not None:
            before_commit(batch)
    except BaseException:
        session.backout()
        raise
    session.commit()
    return batch


def move_aside(writer: ZoneWriter, message: ReceivedMessage) -> MovedAside:
    """The message with its body written to an overflow file and dropped from memory."""
    body = writer.move_aside(message.body)
    return MovedAside(replace(message, body=b""), body)
