"""StompQueue: a queue on a STOMP broker, its settings, connecting with bounded retries,
browsing, and the delivery count of a message the broker hands out.

Delivery count: ActiveMQ counts redeliveries itself (it raises a message's redelivery counter when
a consumer goes away with it unacked), but its MESSAGE frames carry only `redelivered:true`
(FrameTranslator copies the JMS headers and properties; the counter and JMSXDeliveryCount are
neither), and the flag survives a broker restart only with the destination policy
`persistJMSRedelivered="true"`, and even then not always (a broker stopped under load can return a
message unflagged). scripts/activemq.sh leaves that policy off: it makes the broker store every
message synchronously and again before its first dispatch, which slows a backlog's drain several
times over, and a count that misses a broker restart is still a lower bound. Nor does the broker
act on its counter for a consumer that disconnects, crashes or unsubscribes: its `redeliveryPlugin`
(`maximumRedeliveries`, then the DLQ) acts only where the broker would dead-letter a message, i.e.
on a poison ack (NACK, which a unit of work cannot send, see session.py), and it redelivers through
the scheduler, behind later messages. Configuring it on the broker would change nothing here. So
the count is kept here: each time a get hands out a message flagged redelivered, it first records
one more redelivery of its broker message id in `RedeliveryCounts` (deliveries.py), a small SQLite
file when `redelivery_counts` names one (the platform's configuration always does), and
`delivery_count` is 1 + the redeliveries recorded. The file outlives the process, so a message that
kills its consumer is counted across restarts. A message the broker only prefetched for a consumer
that went away comes back flagged too, and is counted once more than it was handed out; without the
file (memory only) a new process sees 2, a lower bound.

TLS (DESIGN.md invariant 9): `tls` unset means TLS for any broker that is not on this host
(transport.is_loopback) or whenever a CA or client certificate is given; the broker's
certificate and host name are always verified. A password is never sent in clear to a broker
off this host unless `allow_plaintext_credentials` says so: the constructor refuses.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sis_platform.queues.base import (
    QueueSource,
    ReceivedMessage,
    SourceUnavailable,
)
from sis_platform.queues.deliveries import RedeliveryCounts
from sis_platform.queues.stomp.frames import (
    ACTIVEMQ_DLQ,
    broker_id,
    is_redelivered,
    queue_destination,
    received_message,
)
from sis_platform.queues.stomp.link import Endpoint, Link, LinkLost
from sis_platform.queues.stomp.producer import StompProducer
from sis_platform.queues.stomp.session import StompSession
from sis_platform.runtime.backoff import AROUND, Backoff
from sis_platform.settings.transport import TlsFiles, is_loopback
from sis_platform.settings.variables import (
    DEFAULT_BACKOUT_THRESHOLD,
    DEFAULT_STOMP_HEARTBEATS,
    DEFAULT_STOMP_PREFETCH,
)

log = logging.getLogger(__name__)


class StompQueue(QueueSource):
    """A queue on a STOMP broker. Cheap to construct; connects in `connect()`/`producer()`.

    `redelivery_counts` is the file that keeps delivery counts across processes (see the
    module docstring); without one they live in this object, so keep one instance per process
    (the resource caches it).
    """

    def __init__(
        self,
        host: str,
        port: int,
        destination: str,
        user: str | None = None,
        password: str | None = None,
        heartbeats: tuple[int, int] = DEFAULT_STOMP_HEARTBEATS,
        selector: str | None = None,
        *,
        prefetch: int = DEFAULT_STOMP_PREFETCH,
        backout_threshold: int = DEFAULT_BACKOUT_THRESHOLD,
        backout_queue: str | None = None,
        redelivery_counts: Path | None = None,
        vhost: str | None = None,
        connect_timeout: float = 10.0,
        receipt_timeout: float = 30.0,
        connect_attempts: int = 3,
        retry_initial_seconds: float = 0.5,
        retry_max_seconds: float = 10.0,
        tls: bool | None = None,
        ca_file: str | Path | None = None,
        cert_file: str | Path | None = None,
        key_file: str | Path | None = None,
        key_password: str | None = None,
        allow_plaintext_credentials: bool = False,
    ) -> None:
        if prefetch < 1:
            raise ValueError(f"prefetch must be >= 1, got {prefetch}")
        if backout_threshold < 0:
            raise ValueError(f"backout_threshold must be >= 0, got {backout_threshold}")
        if connect_attempts < 1:
            raise ValueError(f"connect_attempts must be >= 1, got {connect_attempts}")
        self.destination = queue_destination(destination)
        self.selector = selector
        self.prefetch = prefetch
        self.backout_threshold = backout_threshold
        self.backout_queue = queue_destination(backout_queue) if backout_queue else ACTIVEMQ_DLQ
        # Without a threshold nothing is moved, so the backout queue's own source (whose
        # default backout queue is itself, ActiveMQ.DLQ) is allowed.
        if backout_threshold and self.backout_queue == self.destination:
            raise ValueError("backout_queue must differ from destination")
        self.connect_attempts = connect_attempts
        self.retry_initial_seconds = retry_initial_seconds
        self.retry_max_seconds = retry_max_seconds
        self.allow_plaintext_credentials = allow_plaintext_credentials
        self._endpoint = Endpoint(
            host=host,
            port=port,
            user=user,
            password=password,
            heartbeats=heartbeats,
            vhost=vhost,
            connect_timeout=connect_timeout,
            receipt_timeout=receipt_timeout,
            tls=_tls(host, port, tls, ca_file, cert_file, key_file, key_password),
        )
        if (
            self._endpoint.tls is None
            and password
            and not is_loopback(host)
            and not allow_plaintext_credentials
        ):
            raise ValueError(
                f"refusing to send the password in clear to STOMP broker {host}:{port}, which is"
                " not on this host: use TLS, or allow plaintext credentials explicitly"
            )
        self._redeliveries = RedeliveryCounts(redelivery_counts)

    @property
    def description(self) -> str:
        who = f"{self._endpoint.user}@" if self._endpoint.user else ""
        extras = []
        if self.selector:
            extras.append(f"selector {self.selector!r}")
        if self.backout_threshold:
            extras.append(f"backout threshold {self.backout_threshold} -> {self.backout_queue}")
        else:
            extras.append("no backout threshold")
        suffix = f" ({', '.join(extras)})" if extras else ""
        scheme = "stomp+ssl" if self._endpoint.tls is not None else "stomp"
        return f"{scheme}://{who}{self._endpoint}{self.destination}{suffix}"

    def __repr__(self) -> str:
        return f"StompQueue({self.description!r})"

    @property
    def tls(self) -> TlsFiles | None:
        """The TLS files in use, or None for a connection in clear."""
        return self._endpoint.tls

    def connect(self) -> StompSession:
        return StompSession(self)

    def producer(self) -> StompProducer:
        return StompProducer(self)

    def backout_source(self) -> StompQueue:
        """The backout queue as a source of its own (to drain or inspect it); it has no
        backout threshold of its own."""
        ep = self._endpoint
        return StompQueue(
            ep.host,
            ep.port,
            self.backout_queue,
            ep.user,
            ep.password,
            ep.heartbeats,
            backout_threshold=0,
            vhost=ep.vhost,
            connect_timeout=ep.connect_timeout,
            receipt_timeout=ep.receipt_timeout,
            connect_attempts=self.connect_attempts,
            tls=ep.tls is not None,
            ca_file=ep.tls.ca_file if ep.tls else None,
            cert_file=ep.tls.cert_file if ep.tls else None,
            key_file=ep.tls.key_file if ep.tls else None,
            key_password=ep.tls.key_password if ep.tls else None,
            allow_plaintext_credentials=self.allow_plaintext_credentials,
        )

    def browse(self, destination: str | None = None) -> list[ReceivedMessage]:
        """The messages on the queue (or `destination`), without consuming them, through an
        ActiveMQ queue-browser subscription (`browser:true`, ended by a `browser:end` frame).
        Messages held unacked by a consumer are not shown."""
        dest = queue_destination(destination) if destination else self.destination
        link = self.open_link()
        sub = f"browse-{uuid.uuid4().hex[:12]}"
        found: list[ReceivedMessage] = []
        try:
            link.send(
                lambda: link.conn.subscribe(dest, id=sub, ack="auto", headers={"browser": "true"})
            )
            while True:
                deadline = time.monotonic() + self._endpoint.receipt_timeout
                frame = link.next_message(deadline, sub)
                if frame is None:
                    raise SourceUnavailable(f"browsing {dest} on {self._endpoint} timed out")
                if frame.headers.get("browser") == "end":
                    return found
                found.append(self.message(frame, record=False))
        except LinkLost as e:
            raise SourceUnavailable(f"browsing {dest} on {self._endpoint}: {e}") from e
        finally:
            link.close()

    def browse_backout(self) -> list[ReceivedMessage]:
        """The backout queue's messages in order, without consuming them."""
        return self.browse(self.backout_queue)

    def open_link(self) -> Link:
        """A connected STOMP link, retried with exponential backoff and jitter."""
        backoff = Backoff(
            first=self.retry_initial_seconds, most=self.retry_max_seconds, jitter=AROUND
        )
        last: SourceUnavailable | None = None
        for attempt in range(1, self.connect_attempts + 1):
            link = Link(self._endpoint)
            try:
                link.open()
                if attempt > 1:
                    log.info("STOMP broker %s reachable again", self._endpoint)
                return link
            except SourceUnavailable as e:
                last = e
            if attempt == self.connect_attempts:
                break
            # Jitter around the exponential step, so restarted consumers do not stampede.
            pause = backoff.delay(attempt)
            log.warning(
                "STOMP broker %s unavailable (attempt %d/%d), retrying in %.1fs: %s",
                self._endpoint,
                attempt,
                self.connect_attempts,
                pause,
                last,
            )
            time.sleep(pause)
        raise SourceUnavailable(
            f"{self.description} unavailable after {self.connect_attempts} attempt(s): {last}"
        )

    def message(self, frame: Any, *, record: bool) -> ReceivedMessage:
        """The message a frame carries. `record`: it is being handed out, so a redelivery is
        counted (durably, before the caller sees it); a browse only looks the count up."""
        return received_message(frame, self.redeliveries(frame, record=record))

    def redeliveries(self, frame: Any, *, record: bool) -> int:
        """How many times the message a frame carries was delivered before (`message`)."""
        if not is_redelivered(frame):
            return 0
        counts, message_id = self._redeliveries, broker_id(frame)
        return counts.record(message_id) if record else max(1, counts.count(message_id))

    def forget_redeliveries(self, broker_ids: Iterable[str]) -> None:
        """Drop the counts of messages the broker no longer has (committed)."""
        self._redeliveries.forget(broker_ids)


def _tls(
    host: str,
    port: int,
    tls: bool | None,
    ca_file: str | Path | None,
    cert_file: str | Path | None,
    key_file: str | Path | None,
    key_password: str | None,
) -> TlsFiles | None:
    """The TLS files for a connection to host:port, or None for one in clear (module docstring:
    unset `tls` means TLS unless the broker is on this host and no TLS file is given). The
    files are checked here, so a bad one fails at configuration, not at the first connect."""
    files = tuple(None if f is None else str(f) for f in (ca_file, cert_file, key_file))
    if tls is None:
        tls = any(files) or not is_loopback(host)
    if not tls:
        if any(files):
            raise ValueError(f"TLS files given for STOMP broker {host}:{port} with TLS off")
        return None
    ca, cert, key = files
    chosen = TlsFiles(ca_file=ca, cert_file=cert, key_file=key, key_password=key_password)
    chosen.context()
    return chosen
