"""The queue interface every source implements (embedded, STOMP, IBM MQ).

It models an IBM MQ consumer getting under syncpoint: messages got inside a unit of work stay
invisible to other consumers until the unit is committed (they are gone) or backed out (they
are reinstated with their backout count raised by one). A consumer that dies with a unit open
has it backed out by the queue (the embedded queue does it on the next open).

No Dagster import here: sensors reach this through the resources in
`sis_platform.resources.sources`, and the conformance suite in `tests/queues` drives it
directly.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import TracebackType
from typing import Self

from sis_platform.domain.limits import DEFAULT_LIMITS

# The largest message a source returns (the IBM MQ source's SIS_IBMMQ_MAX_GET_BYTES): twice
# the platform's largest accepted body, so a body somewhat over that bound still reaches intake
# and is logged and dead-lettered `too-large`; a larger one is moved to the backout queue.
DEFAULT_MAX_GET_BYTES = 2 * DEFAULT_LIMITS.max_message_bytes


@dataclass(frozen=True)
class ReceivedMessage:
    """One message as the queue delivered it.

    `message_id` is in JMS form: "ID:" followed by 48 lowercase hex digits (the 24-byte MQ
    MsgId) for everything our producers put, on every source. A message put on a STOMP broker
    by another producer keeps the broker's own JMS id verbatim (ActiveMQ:
    "ID:<host>-<port>-<start>-<n>:<session>:<producer>:<seq>"), so code must treat the id as
    an opaque string. `delivery_count` is JMSXDeliveryCount, i.e. MQ BackoutCount + 1; where
    the provider only says "redelivered" (ActiveMQ over STOMP) it is a lower bound, 2.
    """

    message_id: str
    body: bytes
    put_time: datetime  # timezone-aware, UTC
    delivery_count: int = 1
    properties: Mapping[str, object] = field(default_factory=dict)

    @property
    def redelivered(self) -> bool:
        return self.delivery_count > 1


class SourceUnavailable(Exception):
    """The queue cannot be reached now (connection refused, broker down, queue manager
    quiescing). Transient: the caller retries later; nothing was consumed."""


class FencedOff(Exception):
    """This consumer no longer holds the consumer lease: it must not commit or land anything."""


class QueueSession(abc.ABC):
    """An open connection to one queue with at most one unit of work in progress."""

    @abc.abstractmethod
    def get(self, wait_seconds: float = 0.0) -> ReceivedMessage | None:
        """Get the next message under syncpoint, waiting up to `wait_seconds` for one.

        Returns None when the queue is empty (MQRC 2033). Messages over the source's backout
        threshold are moved to its backout queue inside the unit of work and not returned.
        """

    # True when `get_available` finding nothing means the queue has nothing gettable now (the
    # embedded queue reads its own database). False for a broker, which pushes messages over a
    # connection: one may be on its way, so a consumer gathering a group waits a little for it.
    knows_available: bool = False

    def get_available(self, max_messages: int, max_bytes: int) -> list[ReceivedMessage]:
        """Get, under syncpoint and without waiting, the messages available now, in order: up
        to `max_messages`, ending after the one whose body brings their bodies to `max_bytes`
        (so at most `max_bytes` plus one message are held). Empty: none available now. As
        `get`, messages over the backout threshold go to the backout queue and are not
        returned. A source that can claim many messages at once overrides this loop."""
        got: list[ReceivedMessage] = []
        size = 0
        while len(got) < max_messages and size < max_bytes:
            message = self.get(wait_seconds=0.0)
            if message is None:
                break
            got.append(message)
            size += len(message.body)
        return got

    @abc.abstractmethod
    def commit(self) -> None:
        """Commit the unit of work: every message got since the last commit/backout is gone."""

    @abc.abstractmethod
    def backout(self) -> None:
        """Back out the unit of work: its messages are reinstated, backout count + 1."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close the connection; an open unit of work is backed out."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class QueueProducer(abc.ABC):
    """Puts messages on a queue (the feed simulator and tests use it; the platform never puts)."""

    @abc.abstractmethod
    def put(self, body: bytes, message_id: str | None = None) -> str:
        """Put one message (committed at once); returns its JMS message id.

        Passing `message_id` reuses an id, which is how the simulator makes the provider's
        redelivered duplicates.
        """

    @abc.abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def new_message_id() -> str:
    """A fresh JMS message id: "ID:" + 48 hex digits (24 random bytes, like an MQ MsgId)."""
    return "ID:" + os.urandom(24).hex()


class QueueSource(abc.ABC):
    """A configured queue: opens consuming sessions and producers. Cheap to construct; connects
    only when asked, so a sensor can build one per tick."""

    @property
    @abc.abstractmethod
    def description(self) -> str:
        """Where this source points, for logs and the UI (never includes secrets)."""

    @abc.abstractmethod
    def connect(self) -> QueueSession:
        """Open a consuming session; raises SourceUnavailable when the queue cannot be reached."""

    @abc.abstractmethod
    def producer(self) -> QueueProducer:
        """Open a producer on the same queue; raises SourceUnavailable likewise."""
