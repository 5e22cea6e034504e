"""The IBM MQ producer: persistent puts outside syncpoint with a MsgId chosen here, so a put
retried after a broken connection repeats the same id (the feed simulator and the tests put
through it; the platform never does)."""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

from sis_platform.queues.base import QueueProducer

if TYPE_CHECKING:
    from sis_platform.queues.ibmmq.connection import Connection
    from sis_platform.queues.ibmmq.source import IbmMqQueue

_JMS_ID = re.compile(r"ID:([0-9a-fA-F]{48})\Z")


class IbmMqProducer(QueueProducer):
    def __init__(self, source: IbmMqQueue) -> None:
        self._source = source
        self._conn: Connection | None = source.open_connection(opening="output")
        self._closed = False

    def put(self, body: bytes, message_id: str | None = None) -> str:
        if self._closed:
            raise RuntimeError(f"{self._source.description}: producer is closed")
        source = self._source
        if message_id is None:
            msg_id = os.urandom(24)  # like an MQ MsgId, unique across processes
        else:
            match = _JMS_ID.match(message_id)
            if match is None:
                raise ValueError(f"not a JMS message id (ID: + 48 hex digits): {message_id!r}")
            msg_id = bytes.fromhex(match.group(1))
        reconnected = False
        while True:
            if self._conn is None:
                self._conn = source.open_connection(opening="output")
            try:
                return "ID:" + self._conn.put(body, msg_id).hex()
            except source.pymqi.MQMIError as exc:
                if not source.is_transient(exc):
                    raise source.error("MQPUT", f"queue {source.queue}", exc) from exc
                conn, self._conn = self._conn, None
                conn.close(backout=False)
                if reconnected:
                    raise source.unavailable("connection lost during MQPUT", exc) from exc
                reconnected = True

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close(backout=False)
