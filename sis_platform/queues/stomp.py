"""A JMS broker over STOMP 1.2 (ActiveMQ 5.17 is what we test against) through stomp.py.

How MQ syncpoint semantics map onto STOMP, and what ActiveMQ 5.17 actually does (each point is
exercised by tests/queues against a real broker):

- Consuming: one subscription with `ack:client` and a bounded `activemq.prefetchSize`. Every
  message handed to the caller is ACKed at once *inside a STOMP transaction* that is the unit
  of work. For a `client` subscription ActiveMQ turns a transacted ACK into a "delivered" ack:
  it acknowledges nothing yet, it only opens the prefetch window by one, so a unit can be far
  larger than the prefetch while the broker never pushes more than `prefetch` messages we have
  not asked for. `commit()` sends COMMIT with a receipt and waits for it; the broker then acks
  everything the transaction ACKed (one cumulative ack) and only then are the messages gone.
  Why not `client-individual`: there a transacted ACK is a real ack inside the broker
  transaction, and when a consumer dies with the unit open ActiveMQ removes the consumer
  first (redelivering the messages it had only prefetched) and rolls the transaction back
  after, so the unit's messages can come back *behind* the prefetched ones. With delivered
  acks every unacked message goes back in one piece, in order.
- Backout: ABORT drops the pending acks, but ActiveMQ keeps the messages dispatched to the same
  subscription; they are redelivered only when the consumer goes away. So backout is ABORT +
  UNSUBSCRIBE + SUBSCRIBE (a new subscription id): the broker puts the messages back at the
  head of the queue in their original order and marks them `redelivered:true`. Messages that
  were prefetched but never handed to the caller are redelivered (and marked) too; keep the
  prefetch small. A consumer that disconnects, crashes (SIGKILL) or loses its TCP connection
  gets the same treatment from the broker. Keeping the order across *repeated* backouts needs
  the destination policy `strictOrderDispatch="true"` on the broker (scripts/activemq.sh sets
  it): without it ActiveMQ 5.17 appends a backed-out unit behind earlier backed-out messages
  it has not redelivered yet.
- NACK is not a backout on ActiveMQ: it is a "poison ack" that moves the message straight to
  the dead-letter queue (ActiveMQ.DLQ by default), and it is refused inside a transaction
  ("Poison ack cannot be transacted", which also marks the transaction rollback-only). We never
  send NACK.
- Delivery count: ActiveMQ counts redeliveries itself (it raises a message's redelivery
  counter when a consumer goes away with it unacked), but its MESSAGE frames carry only
  `redelivered:true` (FrameTranslator copies the JMS headers and properties; the counter and
  JMSXDeliveryCount are neither), and the flag survives a broker restart only with the
  destination policy `persistJMSRedelivered="true"` (scripts/activemq.sh sets it). Nor does
  the broker act on its counter for a consumer that disconnects, crashes or unsubscribes: its
  `redeliveryPlugin` (`maximumRedeliveries`, then the DLQ) acts only where the broker would
  dead-letter a message, i.e. on a poison ack (NACK, which a unit of work cannot send, see
  above), and it redelivers through the scheduler, behind later messages. Configuring it on
  the broker would change nothing here. So the count is kept here: each time a
  get hands out a message flagged redelivered, it first records one more redelivery of its
  broker message id in `RedeliveryCounts` (deliveries.py), a small SQLite file when
  `redelivery_counts` names one (the platform's configuration always does), and
  `delivery_count` is 1 + the redeliveries recorded. The file outlives the process, so a
  message that kills its consumer is counted across restarts. A message the broker only
  prefetched for a consumer that went away comes back flagged too, and is counted once more
  than it was handed out; without the file (memory only) a new process sees 2, a lower bound.
- Backout threshold / backout queue (DEFAULT_BACKOUT_THRESHOLD, 10, unless configured; 0 turns
  it off; default queue ActiveMQ.DLQ): a get that meets a message whose backout count
  (delivery_count - 1) has reached the threshold does not return it: it is ACKed in the unit
  like any other message and remembered; `commit()` first SENDs a copy to `backout_queue`
  (persistent, confirmed by receipt) and then commits, which acks the original. A backout
  forgets the move, as with IBM MQ's JMS client, whose move is part of the unit of work. If the
  connection fails between the two, the copy is already on the backout queue and the original
  comes back and is moved again: a duplicate there, never a lost message. The copy keeps our
  message id, the original put timestamp and properties, and records `sis_backout_count` and
  `sis_original_destination`.
- Message ids: JMS providers assign ids and a STOMP client cannot choose ActiveMQ's
  (`message-id` on SEND is discarded; the broker's form is `ID:<host>-<port>-<start>-<n>:...`,
  not 48 hex digits) and is never told it on SEND. So the producer puts the id it returns in a
  `sis_message_id` property, and the consumer uses that property when present and the broker's
  `message-id` verbatim otherwise (messages from a foreign producer). A redelivered message on
  a real broker keeps its `message-id`; the simulator's "redelivered duplicates" (the same id
  put twice) are reproduced by putting the same `sis_message_id` twice.
- Bodies are bytes: sends carry `content-length` (ActiveMQ makes a BytesMessage), stomp.py runs
  with `auto_decode=False`, producers send `persistent:true` and wait for the broker's receipt.
- Outages: a receiver thread (stomp.py's) hands frames to the caller through a Condition; a
  lost connection (socket closed, heartbeat timeout) wakes the waiting caller at once. With no
  unit of work open, the session reconnects with exponential backoff and jitter and raises
  SourceUnavailable if the broker stays down. With a unit open, the broker has already rolled
  it back, so the caller gets SourceUnavailable and must back out (which is then a no-op).
"""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import stomp
import stomp.exception

from sis_platform.queues.base import (
    DEFAULT_BACKOUT_THRESHOLD,
    QueueProducer,
    QueueSession,
    QueueSource,
    ReceivedMessage,
    SourceUnavailable,
    new_message_id,
)
from sis_platform.queues.deliveries import RedeliveryCounts

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


class _LinkLost(Exception):
    """The STOMP connection is gone (internal; surfaces as SourceUnavailable)."""


class _BrokerError(Exception):
    """The broker answered a request with an ERROR frame."""


@dataclass(frozen=True)
class _Endpoint:
    host: str
    port: int
    user: str | None
    password: str | None
    heartbeats: tuple[int, int]
    vhost: str | None
    connect_timeout: float
    receipt_timeout: float

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


class _Link(stomp.ConnectionListener):
    """One STOMP connection. stomp.py's receiver thread calls the on_* methods; the caller's
    thread waits on one Condition for messages, receipts and connection loss."""

    def __init__(self, endpoint: _Endpoint) -> None:
        self.endpoint = endpoint
        self._cond = threading.Condition()
        self._messages: deque[Any] = deque()
        self._replies: dict[str, Any] = {}
        self._connected = False
        self._lost: str | None = None
        self.conn = stomp.Connection12(
            [(endpoint.host, endpoint.port)],
            heartbeats=endpoint.heartbeats,
            vhost=endpoint.vhost,
            auto_decode=False,
            timeout=endpoint.connect_timeout,
            # One TCP attempt per call: the backoff between attempts is ours (interruptible,
            # logged, bounded), not stomp.py's silent internal loop.
            reconnect_attempts_max=1,
        )
        self.conn.set_listener("sis", self)

    # -- stomp.py receiver thread ------------------------------------------------------------

    def on_connected(self, frame: Any) -> None:
        with self._cond:
            self._connected = True
            self._cond.notify_all()

    def on_message(self, frame: Any) -> None:
        with self._cond:
            self._messages.append(frame)
            self._cond.notify_all()

    def on_receipt(self, frame: Any) -> None:
        with self._cond:
            self._replies[frame.headers.get("receipt-id", "")] = frame
            self._cond.notify_all()

    def on_error(self, frame: Any) -> None:
        message = frame.headers.get("message", "")
        with self._cond:
            receipt_id = frame.headers.get("receipt-id")
            if receipt_id:
                self._replies[receipt_id] = frame
            elif not self._connected:
                # Refused at CONNECT (bad credentials, unknown vhost): no point waiting.
                self._lost = f"broker refused the connection: {message}"
            self._cond.notify_all()
        if not receipt_id:
            log.warning("STOMP broker %s sent ERROR: %s", self.endpoint, message)

    def on_disconnected(self) -> None:
        self._mark_lost("connection closed")

    def on_heartbeat_timeout(self) -> None:
        self._mark_lost("heartbeat timeout")

    def _mark_lost(self, reason: str) -> None:
        with self._cond:
            if self._lost is None:
                self._lost = reason
            self._connected = False
            self._cond.notify_all()

    # -- caller thread -------------------------------------------------------------------------

    @property
    def lost(self) -> bool:
        return self._lost is not None

    @property
    def lost_reason(self) -> str:
        return self._lost or ""

    def open(self) -> None:
        ep = self.endpoint
        try:
            self.conn.connect(ep.user, ep.password, wait=False)
        except (stomp.exception.StompException, OSError) as e:
            self.abort()
            raise SourceUnavailable(f"cannot connect to STOMP broker {ep}: {e!r}") from e
        # stomp.py's own wait_for_connection has no deadline; this one does.
        deadline = time.monotonic() + ep.connect_timeout
        with self._cond:
            while not self._connected and self._lost is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            connected, reason = self._connected, self._lost
        if not connected:
            self.abort()
            raise SourceUnavailable(
                f"STOMP broker {ep} did not complete CONNECT: {reason or 'timed out'}"
            )

    def send(self, action: Callable[[], None]) -> None:
        """Send a frame without waiting for anything."""
        if self._lost is not None:
            raise _LinkLost(self._lost)
        try:
            action()
        except (stomp.exception.StompException, OSError) as e:
            self._mark_lost(f"send failed: {e!r}")
            raise _LinkLost(self.lost_reason) from e

    def request(self, action: Callable[[str], None], what: str) -> None:
        """Send a frame carrying a receipt header and wait for the broker's RECEIPT."""
        receipt = f"{what}-{uuid.uuid4().hex}"
        self.send(lambda: action(receipt))
        deadline = time.monotonic() + self.endpoint.receipt_timeout
        with self._cond:
            while receipt not in self._replies:
                if self._lost is not None:
                    raise _LinkLost(self._lost)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise _LinkLost(
                        f"no receipt for {what} within {self.endpoint.receipt_timeout}s"
                    )
                self._cond.wait(remaining)
            reply = self._replies.pop(receipt)
        if reply.cmd == "ERROR":
            raise _BrokerError(reply.headers.get("message", "") or repr(reply.body))

    def next_message(self, deadline: float, subscription: str) -> Any | None:
        """The next MESSAGE frame of `subscription`, or None at the deadline. Frames of
        earlier subscriptions are dropped: the broker redelivers those messages anyway."""
        with self._cond:
            while True:
                while self._messages:
                    frame = self._messages.popleft()
                    if frame.headers.get("subscription") == subscription:
                        return frame
                if self._lost is not None:
                    raise _LinkLost(self._lost)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)

    def close(self) -> None:
        """DISCONNECT (the broker rolls back an open transaction and redelivers unacked
        messages), then make sure the socket and stomp.py's threads are gone."""
        if not self.lost:
            try:
                self.conn.disconnect()
            except (stomp.exception.StompException, OSError):
                pass
            deadline = time.monotonic() + self.endpoint.receipt_timeout
            with self._cond:
                while self._lost is None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
        self.abort()

    def abort(self) -> None:
        """Drop the socket without a goodbye."""
        self._mark_lost("closed by client")
        try:
            self.conn.transport.disconnect_socket()
        except (stomp.exception.StompException, OSError):
            pass


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
        heartbeats: tuple[int, int] = (10_000, 10_000),
        selector: str | None = None,
        *,
        prefetch: int = 10,
        backout_threshold: int = DEFAULT_BACKOUT_THRESHOLD,
        backout_queue: str | None = None,
        redelivery_counts: Path | None = None,
        vhost: str | None = None,
        connect_timeout: float = 10.0,
        receipt_timeout: float = 30.0,
        connect_attempts: int = 3,
        retry_initial_seconds: float = 0.5,
        retry_max_seconds: float = 10.0,
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
        if self.backout_queue == self.destination:
            raise ValueError("backout_queue must differ from destination")
        self.connect_attempts = connect_attempts
        self.retry_initial_seconds = retry_initial_seconds
        self.retry_max_seconds = retry_max_seconds
        self._endpoint = _Endpoint(
            host=host,
            port=port,
            user=user,
            password=password,
            heartbeats=heartbeats,
            vhost=vhost,
            connect_timeout=connect_timeout,
            receipt_timeout=receipt_timeout,
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
        return f"stomp://{who}{self._endpoint}{self.destination}{suffix}"

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
                found.append(self._message(frame, record=False))
        except _LinkLost as e:
            raise SourceUnavailable(f"browsing {dest} on {self._endpoint}: {e}") from e
        finally:
            link.close()

    def browse_backout(self) -> list[ReceivedMessage]:
        """The backout queue's messages in order, without consuming them."""
        return self.browse(self.backout_queue)

    def open_link(self) -> _Link:
        """A connected STOMP link, retried with exponential backoff and jitter."""
        delay = self.retry_initial_seconds
        last: SourceUnavailable | None = None
        for attempt in range(1, self.connect_attempts + 1):
            link = _Link(self._endpoint)
            try:
                link.open()
                if attempt > 1:
                    log.info("STOMP broker %s reachable again", self._endpoint)
                return link
            except SourceUnavailable as e:
                last = e
            if attempt == self.connect_attempts:
                break
            # Full jitter around the exponential step, so restarted consumers do not stampede.
            pause = delay * random.uniform(0.5, 1.5)
            log.warning(
                "STOMP broker %s unavailable (attempt %d/%d), retrying in %.1fs: %s",
                self._endpoint,
                attempt,
                self.connect_attempts,
                pause,
                last,
            )
            time.sleep(pause)
            delay = min(self.retry_max_seconds, delay * 2)
        raise SourceUnavailable(
            f"{self.description} unavailable after {self.connect_attempts} attempt(s): {last}"
        )

    def _message(self, frame: Any, *, record: bool) -> ReceivedMessage:
        """The message a frame carries. `record`: it is being handed out, so a redelivery is
        counted (durably, before the caller sees it); a browse only looks the count up."""
        headers: Mapping[str, str] = frame.headers
        broker_id = headers.get("message-id", "")
        redeliveries = 0
        if headers.get("redelivered") == "true":
            counts = self._redeliveries
            redeliveries = counts.record(broker_id) if record else max(1, counts.count(broker_id))
        return ReceivedMessage(
            message_id=headers.get(ID_PROPERTY) or broker_id,
            body=_body(frame),
            put_time=_put_time(headers),
            delivery_count=1 + redeliveries,
            properties={k: v for k, v in headers.items() if k not in _FRAME_HEADERS},
        )


@dataclass
class _Got:
    broker_id: str
    ack_id: str
    counted: bool  # handed out redelivered, so it has an entry in the redelivery counts


@dataclass
class _Move:
    body: bytes
    headers: dict[str, str]


def _send_move(link: _Link, destination: str, move: _Move) -> Callable[[str], None]:
    def send(receipt: str) -> None:
        link.conn.send(destination, move.body, headers={**move.headers, "receipt": receipt})

    return send


class StompSession(QueueSession):
    def __init__(self, source: StompQueue) -> None:
        self._source = source
        self._lock = threading.RLock()
        self._link: _Link | None = None
        self._subscription = ""
        self._tx: str | None = None
        self._unit: list[_Got] = []
        self._moves: list[_Move] = []
        self._unit_lost = False
        self._closed = False
        self._attach()

    # -- QueueSession ------------------------------------------------------------------------

    def get(self, wait_seconds: float = 0.0) -> ReceivedMessage | None:
        deadline = time.monotonic() + max(0.0, wait_seconds)
        with self._lock:
            self._require_usable()
            while True:
                link = self._live_link()
                try:
                    frame = link.next_message(deadline, self._subscription)
                    if frame is None:
                        return None
                    message = self._source._message(frame, record=True)
                    self._take(link, frame, counted=message.redelivered)
                    threshold = self._source.backout_threshold
                    if threshold and message.delivery_count - 1 >= threshold:
                        self._move_to_backout(frame, message)
                        continue
                    return message
                except _LinkLost:
                    continue  # _live_link decides: reconnect, or report the lost unit

    def commit(self) -> None:
        with self._lock:
            self._require_usable()
            if self._tx is None:
                return
            tx, unit, moves = self._tx, self._unit, self._moves
            link = self._link
            source = self._source
            try:
                if link is None:
                    raise _LinkLost("not connected")
                for move in moves:
                    link.request(_send_move(link, source.backout_queue, move), "move")
                link.request(
                    lambda receipt: link.conn.commit(tx, headers={"receipt": receipt}), "commit"
                )
            except (_LinkLost, _BrokerError) as e:
                # Outcome in doubt (or rolled back): drop the connection so the broker rolls
                # back whatever is left and redelivers; the landed copies become duplicates.
                self._end_unit()
                self._drop_link()
                raise SourceUnavailable(
                    f"commit of {len(unit)} message(s) on {source.description} not"
                    f" confirmed ({e}); they may be redelivered"
                ) from e
            self._end_unit()
            # Gone from the broker: their counts are of no further use. The commit has
            # happened, so failing to forget them is only logged (the bound evicts them later).
            try:
                source._redeliveries.forget(g.broker_id for g in unit if g.counted)
            except SourceUnavailable as e:
                log.warning("%s: %s", source.description, e)

    def backout(self) -> None:
        with self._lock:
            self._require_open()
            self._unit_lost = False
            if self._tx is None:
                return
            tx = self._tx
            self._end_unit()
            link = self._link
            if link is None or link.lost:
                return  # the broker already rolled the unit back when the connection went
            try:
                link.send(lambda: link.conn.abort(tx))
                self._resubscribe(link)
            except (_LinkLost, _BrokerError) as e:
                log.warning("backout on %s: %s; reconnecting", self._source.description, e)
                self._drop_link()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._tx is not None:
                self._end_unit()
            self._drop_link()

    # -- internals ---------------------------------------------------------------------------

    def _attach(self) -> None:
        link = self._source.open_link()
        try:
            self._subscribe(link)
        except (_LinkLost, _BrokerError) as e:
            link.abort()
            raise SourceUnavailable(f"cannot subscribe to {self._source.description}: {e}") from e
        self._link = link

    def _subscribe(self, link: _Link) -> None:
        source = self._source
        subscription = f"sis-{uuid.uuid4().hex[:16]}"
        headers = {"activemq.prefetchSize": str(source.prefetch)}
        if source.selector:
            headers["selector"] = source.selector

        def subscribe(receipt: str) -> None:
            link.conn.subscribe(
                source.destination,
                id=subscription,
                ack="client",
                headers={**headers, "receipt": receipt},
            )

        link.request(subscribe, "subscribe")
        self._subscription = subscription

    def _resubscribe(self, link: _Link) -> None:
        # Removing the consumer is what makes ActiveMQ redeliver its unacked messages (at the
        # head of the queue, flagged redelivered); a fresh id keeps stale frames apart.
        old = self._subscription
        link.send(lambda: link.conn.unsubscribe(old))
        self._subscribe(link)

    def _live_link(self) -> _Link:
        link = self._link
        if link is not None and not link.lost:
            return link
        reason = link.lost_reason if link is not None else "not connected"
        if self._tx is not None:
            n = len(self._unit)
            self._end_unit()
            self._unit_lost = True
            self._drop_link()
            raise SourceUnavailable(
                f"connection to {self._source.description} lost ({reason}) with {n} message(s)"
                " in the unit of work; the broker rolls it back and redelivers them: back out"
            )
        self._drop_link()
        log.warning("STOMP session on %s reconnecting: %s", self._source.description, reason)
        self._attach()
        assert self._link is not None
        return self._link

    def _take(self, link: _Link, frame: Any, counted: bool) -> None:
        """ACK inside the unit's transaction (begun with the unit's first message): with a
        `client` subscription that only opens the prefetch window; COMMIT makes it an ack."""
        if self._tx is None:
            tx = f"tx-{uuid.uuid4().hex}"
            self._tx = tx
            link.send(lambda: link.conn.begin(tx))
        tx = self._tx
        got = _Got(
            broker_id=frame.headers.get("message-id", ""),
            ack_id=frame.headers["ack"],
            counted=counted,
        )
        self._unit.append(got)
        link.send(lambda: link.conn.ack(got.ack_id, transaction=tx))

    def _move_to_backout(self, frame: Any, message: ReceivedMessage) -> None:
        source = self._source
        headers: dict[str, str] = {str(k): str(v) for k, v in message.properties.items()}
        headers.update(
            {
                "persistent": "true",
                ID_PROPERTY: message.message_id,
                BACKOUT_COUNT_PROPERTY: str(message.delivery_count - 1),
                ORIGINAL_DESTINATION_PROPERTY: source.destination,
            }
        )
        if "timestamp" in frame.headers:
            headers["timestamp"] = frame.headers["timestamp"]  # keeps the original put time
        log.warning(
            "%s: message %s reached backout count %d, moving it to %s",
            source.description,
            message.message_id,
            message.delivery_count - 1,
            source.backout_queue,
        )
        # Already ACKed in the unit by _take; the copy is sent by commit().
        self._moves.append(_Move(body=message.body, headers=headers))

    def _end_unit(self) -> None:
        self._unit = []
        self._moves = []
        self._tx = None

    def _drop_link(self) -> None:
        link, self._link = self._link, None
        if link is not None:
            link.close()

    def _require_open(self) -> None:
        if self._closed:
            raise RuntimeError("session is closed")

    def _require_usable(self) -> None:
        self._require_open()
        if self._unit_lost:
            raise SourceUnavailable(
                f"the unit of work on {self._source.description} was lost with the connection;"
                " call backout() before continuing"
            )


class StompProducer(QueueProducer):
    def __init__(self, source: StompQueue) -> None:
        self._source = source
        self._lock = threading.Lock()
        self._link: _Link | None = source.open_link()
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
            except (_LinkLost, _BrokerError) as e:
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
