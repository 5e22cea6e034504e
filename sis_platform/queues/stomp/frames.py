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

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sis_platform.queues.base import ReceivedMessage
from sis_platform.runtime.logs import concerning

log = logging.getLogger(__name__)

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


def message_id_of(frame: Any) -> str:
    """The platform's id of the message a frame carries (module docstring)."""
    return str(frame.headers.get(ID_PROPERTY) or broker_id(frame))


def received_message(frame: Any, redeliveries: int) -> ReceivedMessage:
    """The message a MESSAGE frame carries, delivered `redeliveries` times before."""
    message_id = message_id_of(frame)
    return ReceivedMessage(
        message_id=message_id,
        body=_body(frame),
        put_time=_put_time(frame.headers, message_id),
        delivery_count=1 + redeliveries,
        properties=_properties(frame.headers),
    )


@dataclass
class BackoutCopy:
    """A message to be sent to the backout queue when its unit of work commits."""

    body: bytes
    headers: dict[str, str]


def backout_copy(frame: Any, redeliveries: int, destination: str) -> BackoutCopy:
    """The copy of the message a frame carries (got from `destination`, redelivered
    `redeliveries` times) for the backout queue: our message id, the original put timestamp and
    properties, plus `sis_backout_count` and `sis_original_destination`; persistent. Built from
    the frame as it is, without reading any header's value, so a message whose headers cannot
    be read is moved aside all the same."""
    headers: dict[str, str] = {str(k): str(v) for k, v in _properties(frame.headers).items()}
    headers.update(
        {
            "persistent": "true",
            ID_PROPERTY: message_id_of(frame),
            BACKOUT_COUNT_PROPERTY: str(redeliveries),
            ORIGINAL_DESTINATION_PROPERTY: destination,
        }
    )
    if "timestamp" in frame.headers:
        headers["timestamp"] = frame.headers["timestamp"]  # keeps the original put time
    return BackoutCopy(body=_body(frame), headers=headers)


def _properties(headers: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k not in _FRAME_HEADERS}


def _put_time(headers: Mapping[str, str], message_id: str) -> datetime:
    """The `timestamp` header (JMSTimestamp, milliseconds since the epoch, UTC), or the time
    of receipt when there is none or it is no time a datetime holds: any producer can set the
    header (ActiveMQ passes any long on, RabbitMQ any text), and a message must never fail its
    get because of it (it would come back at every redelivery)."""
    received = datetime.now(tz=UTC)
    text = headers.get("timestamp")
    if text is None:
        return received
    try:
        return datetime.fromtimestamp(int(text) / 1000, tz=UTC)
    except (ValueError, OverflowError, OSError) as exc:
        log.warning(
            "%s: unreadable timestamp header %r (%s); using the time of receipt",
            message_id,
            text[:40],
            exc,
            extra=concerning(message_id=message_id),
        )
        return received


def _body(frame: Any) -> bytes:
    body = frame.body
    if body is None:
        return b""
    if isinstance(body, str):  # only if someone turns auto_decode back on
        return body.encode("utf-8")
    return bytes(body)
