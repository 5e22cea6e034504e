"""What STOMP frames carry for the platform: destinations, message ids, bodies, put times,
application properties, and the copy of a message sent to the backout queue.

- Message ids: JMS providers assign ids and a STOMP client cannot choose ActiveMQ's
  (`message-id` on SEND is discarded; the broker's form is `ID:<host>-<port>-<start>-<n>:...`,
  not 48 hex digits) and is never told it on SEND. So the producer puts the id it returns in a
  `sis_message_id` property, and the consumer uses that property when present and the broker's
  `message-id` verbatim otherwise (messages from a foreign producer). A redelivered message on
  a real broker keeps its `message-id`; the simulator's "redelivered duplicates" (the same id
  put twice) are reproduced by putting the same `sis_message_id` twice.
- Bodies are bytes: sends carry `content-length` (ActiveMQ makes a BytesMessage), stomp.py runs
  with `auto_decode=False`, producers send `persistent:true` and wait for the broker's receipt.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sis_platform.queues.base import ReceivedMessage

ID_PROPERTY = "sis_message_id"
BACKOUT_COUNT_PROPERTY = "sis_backout_count"
ORIGINAL_DESTINATION_PROPERTY = "sis_original_destination"
ACTIVEMQ_DLQ = "/queue/ActiveMQ.DLQ"

# Headers that are STOMP or JMS header fields, not application properties.
_FRAME_HEADERS = frozenset(
    {
        "ack",
        "content-length",
        "content-type",
        "correlation-id",
        "destination",
        "expires",
        "JMSXUserID",
        "message-id",
        "original-destination",
        "originalExpiration",
        "persistent",
        "priority",
        "redelivered",
        "reply-to",
        "subscription",
        "timestamp",
        "type",
        ID_PROPERTY,
    }
)


def queue_destination(name: str) -> str:
    """`SPORTSDATA` -> `/queue/SPORTSDATA`; a destination with a leading slash is kept."""
    if not name:
        raise ValueError("destination must not be empty")
    return name if name.startswith("/") else f"/queue/{name}"


def broker_id(frame: Any) -> str:
    """The broker's `message-id` of a MESSAGE frame ("" if it has none)."""
    return str(frame.headers.get("message-id", ""))


def is_redelivered(frame: Any) -> bool:
    """The broker marks a message it has handed out before `redelivered:true`."""
    return bool(frame.headers.get("redelivered") == "true")


def received_message(frame: Any, redeliveries: int) -> ReceivedMessage:
    """The message a MESSAGE frame carries, delivered `redeliveries` times before."""
    headers: Mapping[str, str] = frame.headers
    return ReceivedMessage(
        message_id=headers.get(ID_PROPERTY) or broker_id(frame),
        body=_body(frame),
        put_time=_put_time(headers),
        delivery_count=1 + redeliveries,
        properties={k: v for k, v in headers.items() if k not in _FRAME_HEADERS},
    )


@dataclass
class BackoutCopy:
    """A message to be sent to the backout queue when its unit of work commits."""

    body: bytes
    headers: dict[str, str]


def backout_copy(frame: Any, message: ReceivedMessage, destination: str) -> BackoutCopy:
    """The copy of `message` (got from `destination`) for the backout queue: our message id,
    the original put timestamp and properties, plus `sis_backout_count` and
    `sis_original_destination`; persistent."""
    headers: dict[str, str] = {str(k): str(v) for k, v in message.properties.items()}
    headers.update(
        {
            "persistent": "true",
            ID_PROPERTY: message.message_id,
            BACKOUT_COUNT_PROPERTY: str(message.delivery_count - 1),
            ORIGINAL_DESTINATION_PROPERTY: destination,
        }
    )
    if "timestamp" in frame.headers:
        headers["timestamp"] = frame.headers["timestamp"]  # keeps the original put time
    return BackoutCopy(body=message.body, headers=headers)


def _put_time(headers: Mapping[str, str]) -> datetime:
    try:
        return datetime.fromtimestamp(int(headers["timestamp"]) / 1000, tz=UTC)
    except (KeyError, ValueError):
        return datetime.now(tz=UTC)


def _body(frame: Any) -> bytes:
    body = frame.body
    if body is None:
        return b""
    if isinstance(body, str):  # only if someone turns auto_decode back on
        return body.encode("utf-8")
    return bytes(body)
