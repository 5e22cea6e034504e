"""The STOMP producer: persistent sends, each confirmed by the broker's receipt, carrying the
platform's message id in `sis_message_id` (frames.py says why)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from sis_platform.queues.base import QueueProducer, SourceUnavailable, new_message_id
from sis_platform.queues.stomp.frames import ID_PROPERTY
from sis_platform.queues.stomp.link import BrokerError, Link, LinkLost

if TYPE_CHECKING:
    from sis_platform.queues.stomp.source import StompQueue


class StompProducer(QueueProducer):
    def __init__(self, source: StompQueue) -> None:
        self._source = source
        self._lock = threading.Lock()
        self._link: Link | None = source.open_link()
        self._closed = False

    def put(self, body: bytes, message_id: str | None = None) -> str:
        message_id = message_id or new_message_id()
        source = self._source
        headers = {"persistent": "true", ID_PROPERTY: message_id}
        with self._lock:
            if self._closed:
                raise RuntimeError("producer is closed")
            if self._link is None or self._link.lost:
                if self._link is not None:
                    self._link.abort()
                self._link = None
                self._link = source.open_link()
            link = self._link
            try:
                link.request(
                    lambda receipt: link.conn.send(
                        source.destination, bytes(body), headers={**headers, "receipt": receipt}
                    ),
                    "send",
                )
            except (LinkLost, BrokerError) as e:
                link.abort()
                self._link = None
                # In doubt: the broker may have stored it. Putting it again with the same
                # message_id is safe, the platform drops duplicates by id.
                raise SourceUnavailable(
                    f"put of {message_id} to {source.description} not confirmed: {e}"
                ) from e
        return message_id

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._link is not None:
                self._link.close()
                self._link = None
