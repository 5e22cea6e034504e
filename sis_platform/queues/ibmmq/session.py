"""The IBM MQ consumer session: gets under syncpoint, bounded in size, and commit / backout of
the unit of work, with reconnecting where nothing is lost by it.

- Gets are MQGMO_SYNCPOINT: a got message stays invisible to other consumers until MQCMIT
  (gone) or MQBACK (reinstated with BackoutCount + 1). A message over the backout threshold or
  the get limit is moved aside in the unit instead of returned (moves.py).
- Bounded gets: the first MQGET has a 64 KiB buffer (the simulated feed's largest body is
  27.6 KB). A longer message fails with 2080 MQRC_TRUNCATED_MSG_FAILED and stays on the queue,
  and the MQMD and its length come back with the error; it is then got with a buffer of
  exactly its length, matched by MsgId. A buffer never exceeds the message, because one larger
  than the channel's negotiated maximum fails with 2010 MQRC_DATA_LENGTH_ERROR whatever the
  message (the MQCD offers MQ's 100 MiB, so the server-connection channel's MAXMSGL decides).
  A message over `max_get_bytes` (default DEFAULT_MAX_GET_BYTES, twice the platform's largest
  accepted body) is never returned: it is moved aside. Memory per get is therefore bounded by
  the message, which MAXMSGL of the queue, queue manager and channel bounds (4 MiB by default,
  100 MiB at most); a message up to `max_get_bytes` reaches intake, which dead-letters one
  over SIS_MAX_MESSAGE_BYTES `too-large`, with its record in the log. If no queue takes an
  over-size message, it is delivered, and intake does the same.
- MQRC 2033 (MQRC_NO_MSG_AVAILABLE) is an empty queue, not an error.
- A connection lost with no message in the unit of work is reconnected (once per get). A
  connection lost with messages in the unit is never papered over: the queue manager backs
  that unit out, so the caller gets SourceUnavailable and the messages come again later.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, NamedTuple

from sis_platform.queues.base import QueueSession, ReceivedMessage
from sis_platform.queues.ibmmq.message import to_received_message
from sis_platform.queues.ibmmq.moves import move_aside, why_not_returned
from sis_platform.queues.ibmmq.mqi import (
    MQRC_BACKED_OUT,
    MQRC_DATA_LENGTH_ERROR,
    MQRC_NO_MSG_AVAILABLE,
    MQRC_TRUNCATED_MSG_FAILED,
    reason_of,
)

if TYPE_CHECKING:
    from sis_platform.queues.ibmmq.connection import Connection
    from sis_platform.queues.ibmmq.source import IbmMqQueue

log = logging.getLogger(__name__)

# The first MQGET's buffer: the simulated feed's largest body is 27.6 KB, so nearly every
# message is got in one call; a longer one is got again with a buffer of its exact length.
_FIRST_GET_BYTES = 64 * 1024


class Got(NamedTuple):
    """A message got whole under syncpoint: its MQMD and the bytes MQGET returned."""

    md: Any
    raw: bytes


class GetOptions(NamedTuple):
    """A fresh MQMD and the MQGMO for one MQGET."""

    md: Any
    gmo: Any


def get_options(conn: Connection, wait_ms: int) -> GetOptions:
    cmqc = conn.cmqc
    # A fresh MQMD per get: MQGET fills MsgId/CorrelId in, and a reused MQMD would make the
    # next get match only that message id.
    md = conn.pymqi.MD()
    gmo = conn.pymqi.GMO()
    gmo.Options = (
        cmqc.MQGMO_SYNCPOINT
        | cmqc.MQGMO_WAIT
        | cmqc.MQGMO_FAIL_IF_QUIESCING
        # Properties always as an MQRFH2 in the body (then parsed and stripped), whatever the
        # queue's PROPCTL says; MQGMO_CONVERT is deliberately off: the body is kept byte for
        # byte, as the provider sent it (the message log hashes those bytes).
        | cmqc.MQGMO_PROPERTIES_FORCE_MQRFH2
    )
    gmo.Version = cmqc.MQGMO_VERSION_4
    gmo.MatchOptions = cmqc.MQMO_NONE
    gmo.WaitInterval = wait_ms
    return GetOptions(md, gmo)


def get_whole(conn: Connection, wait_ms: int) -> Got | None:
    """The next message under syncpoint, whole (None: another consumer took the message seen
    first before it could be got whole; ask again).

    The first MQGET has a small buffer, enough for nearly every feed message; a longer message
    fails with 2080, stays on the queue, and tells its length, and is then got with a buffer
    of exactly that length, matched by MsgId (the head of a shared queue may have changed). A
    buffer never exceeds the message, so it never exceeds what the channel allows (a larger
    buffer fails with 2010 whatever the message), and a message over `max_get_bytes` costs
    one buffer of its own length, bounded by MAXMSGL.
    """
    source = conn.source
    first = get_options(conn, wait_ms)
    try:
        body = conn.queue.get(min(source.max_get_bytes, _FIRST_GET_BYTES), first.md, first.gmo)
    except conn.pymqi.MQMIError as exc:
        if reason_of(exc) != MQRC_TRUNCATED_MSG_FAILED:
            raise
        # pymqi has filled the MQMD in and gives the full length (MQGET's DataLength).
        length = int(getattr(exc, "original_length", 0) or 0)
    else:
        return Got(first.md, bytes(body))
    whole = get_options(conn, 0)
    whole.md.MsgId = first.md.MsgId
    whole.gmo.MatchOptions = conn.cmqc.MQMO_MATCH_MSG_ID
    try:
        body = conn.queue.get(length, whole.md, whole.gmo)
    except conn.pymqi.MQMIError as exc:
        if reason_of(exc) == MQRC_NO_MSG_AVAILABLE:
            return None
        if reason_of(exc) == MQRC_DATA_LENGTH_ERROR:
            # No MQ client can get it: it stays at the head of the queue until the channel
            # allows it. Say so, with what to change.
            raise source.error(
                "MQGET",
                f"queue {source.queue}: message ID:{bytes(first.md.MsgId).hex()} of "
                f"{length} bytes is longer than the channel allows; raise the "
                "server-connection channel's MAXMSGL to the queue's",
                exc,
            ) from exc
        raise
    return Got(whole.md, bytes(body))


class IbmMqSession(QueueSession):
    def __init__(self, source: IbmMqQueue) -> None:
        self._source = source
        self._conn: Connection | None = source.open_connection(opening="input")
        self._delivered = 0  # messages returned to the caller in the current unit of work
        self._lost: BaseException | None = None  # the failure that cost us the unit of work
        self._closed = False

    def get(self, wait_seconds: float = 0.0) -> ReceivedMessage | None:
        self._check_open()
        source = self._source
        deadline = source.clock() + max(0.0, wait_seconds)
        reconnected = False
        while True:
            conn = self._connection()
            wait_ms = int(max(0.0, deadline - source.clock()) * 1000)
            try:
                got = get_whole(conn, min(wait_ms, source.max_wait_ms))
                if got is None:
                    continue  # another consumer took it meanwhile
                why = why_not_returned(conn, got.md, got.raw)
                if why is not None and move_aside(conn, got.md, got.raw, why):
                    continue
            except source.pymqi.MQMIError as exc:
                if reason_of(exc) == MQRC_NO_MSG_AVAILABLE:
                    return None
                if not source.is_transient(exc):
                    raise source.error("MQGET", f"queue {source.queue}", exc) from exc
                held = self._delivered
                self._drop(exc)
                if held or reconnected:
                    raise source.unavailable(
                        f"connection lost during MQGET with {held} message(s) in the unit "
                        "of work (the queue manager backs them out; they come again)"
                        if held
                        else "connection lost again right after reconnecting",
                        exc,
                    ) from exc
                log.warning(
                    "%s: connection lost (%s); reconnecting",
                    source.description,
                    source.reason_name(reason_of(exc)),
                )
                reconnected = True
                continue
            self._delivered += 1
            return to_received_message(got.md, got.raw, source.pymqi.CMQC)

    def commit(self) -> None:
        self._check_open()
        source = self._source
        if self._lost is not None:
            lost, self._lost = self._lost, None
            if self._conn is not None:
                self._rollback_quietly(self._conn)
            self._delivered = 0
            raise source.unavailable(
                "the unit of work was lost with its connection and backed out by the queue "
                "manager; nothing was committed",
                lost,
            ) from lost
        conn = self._conn
        if conn is None:
            self._delivered = 0
            return
        try:
            conn.commit()
        except source.pymqi.MQMIError as exc:
            reason = reason_of(exc)
            self._delivered = 0
            if reason == MQRC_BACKED_OUT:
                # 2003: the queue manager backed the unit out instead (e.g. after a client
                # reconnect): nothing was consumed.
                raise source.unavailable("MQCMIT backed out instead of committing", exc) from exc
            if source.is_transient(exc):
                self._drop(exc)
                self._lost = None
                raise source.unavailable(
                    "connection lost during MQCMIT: the outcome is unknown, the messages "
                    "may come again",
                    exc,
                ) from exc
            raise source.error("MQCMIT", f"queue manager {source.queue_manager}", exc) from exc
        self._delivered = 0

    def backout(self) -> None:
        self._check_open()
        self._lost = None
        self._delivered = 0
        conn = self._conn
        if conn is None:
            return  # the queue manager backed out the unit when the connection broke
        source = self._source
        try:
            conn.backout()
        except source.pymqi.MQMIError as exc:
            if not source.is_transient(exc):
                raise source.error("MQBACK", f"queue manager {source.queue_manager}", exc) from exc
            # A broken connection's unit is backed out by the queue manager: same outcome.
            self._drop(exc)
            self._lost = None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        conn, self._conn = self._conn, None
        self._delivered = 0
        self._lost = None
        if conn is not None:
            conn.close(backout=True)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self._source.description}: session is closed")

    def _connection(self) -> Connection:
        if self._conn is None:
            self._conn = self._source.open_connection(opening="input")
            log.info("%s: reconnected", self._source.description)
        return self._conn

    def _drop(self, exc: BaseException) -> None:
        """Forget a failed connection; its unit of work is gone (backed out)."""
        conn, self._conn = self._conn, None
        if self._delivered:
            self._lost = exc
        self._delivered = 0
        if conn is not None:
            # Quiescing (2161/2202) leaves the connection up with the unit open: back out
            # explicitly before MQDISC, which would commit it.
            conn.close(backout=True)

    def _rollback_quietly(self, conn: Connection) -> None:
        try:
            conn.backout()
        except self._source.pymqi.MQMIError as exc:
            if not self._source.is_transient(exc):
                raise
            self._drop(exc)
            self._lost = None
