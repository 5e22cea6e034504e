"""The message as the platform sees it: a ReceivedMessage built from the MQMD and the bytes
MQGET returned (MQRFH2 headers parsed and stripped, the put time read from the MQMD)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from sis_platform.queues.base import ReceivedMessage
from sis_platform.queues.ibmmq.rfh2 import parse_rfh2, rfh2_properties
from sis_platform.runtime.logs import concerning

log = logging.getLogger(__name__)


def message_id_of(md: Any) -> str:
    """The platform's id of an MQ message: "ID:" + its MsgId in hex (the JMS form)."""
    return "ID:" + bytes(md.MsgId).hex()


def to_received_message(md: Any, raw: bytes, cmqc: Any) -> ReceivedMessage:
    """Turn an MQMD and the bytes MQGET returned into a ReceivedMessage.

    MQRFH2 headers (Format MQHRF2) are parsed and stripped from the body; the body is what
    follows them. A malformed MQRFH2 is left in place with a warning: the platform then sees
    bytes that are not a Sportsdata document and dead-letters the message with those bytes.
    That holds for any error reading the headers, not only the Rfh2Error the parser raises for
    what it checks: reading them is decoding the message's own bytes, with no I/O, so an
    error there is the message's, and raised from get() it would come back with the message
    at every redelivery until the backout threshold moved it aside, unlogged.
    """
    message_id = message_id_of(md)
    body = raw
    properties: dict[str, object] = {}
    fmt, encoding = bytes(md.Format), int(md.Encoding)
    try:
        while fmt == cmqc.MQFMT_RF_HEADER_2:
            header = parse_rfh2(body, encoding)
            properties.update(rfh2_properties(header.folders))
            body = body[header.length :]
            fmt, encoding = header.format, header.encoding
    except Exception as exc:  # the message's own bytes, not an outage (docstring)
        log.warning(
            "%s: MQRFH2 header not understood, kept in the body: %s: %s",
            message_id,
            type(exc).__name__,
            exc,
            extra=concerning(message_id=message_id),
        )
        body, properties = raw, {}
    put_time = mqmd_put_time(md.PutDate, md.PutTime)
    if put_time is None:
        log.warning(
            "%s: unreadable PutDate/PutTime %r %r; using the time of receipt",
            message_id,
            md.PutDate,
            md.PutTime,
            extra=concerning(message_id=message_id),
        )
        put_time = datetime.now(UTC)
    return ReceivedMessage(
        message_id=message_id,
        body=bytes(body),
        put_time=put_time,
        delivery_count=int(md.BackoutCount) + 1,
        properties=properties,
    )


def mqmd_put_time(put_date: bytes, put_time: bytes) -> datetime | None:
    """MQMD PutDate "YYYYMMDD" and PutTime "HHMMSSTH" (hundredths), which MQ sets in UTC."""
    try:
        date, clock = put_date.decode("ascii"), put_time.decode("ascii")
        if len(date) != 8 or len(clock) != 8 or not (date + clock).isdigit():
            return None
        return datetime(
            int(date[0:4]),
            int(date[4:6]),
            int(date[6:8]),
            int(clock[0:2]),
            int(clock[2:4]),
            int(clock[4:6]),
            int(clock[6:8]) * 10_000,
            tzinfo=UTC,
        )
    except (UnicodeDecodeError, ValueError):
        return None
