"""The STOMP consumer session: MQ syncpoint semantics on a JMS broker over STOMP 1.2, as
ActiveMQ 5.17 actually behaves (each point is exercised by tests/queues against a real
broker).

- Consuming: one subscription with `ack:client` and a bounded `activemq.prefetchSize`. The
  messages handed to the caller are ACKed *inside a STOMP transaction* that is the unit of
  work. For a `client` subscription ActiveMQ turns a transacted ACK into a "delivered" ack:
  it acknowledges nothing yet, it only opens the prefetch window, so a unit can be far larger
  than the prefetch while the broker never pushes more than `prefetch` messages we have not
  asked for. A `client` ACK is cumulative (it covers every earlier message of the
  subscription), so a get ACKs only every half prefetch (enough to keep the window open), and
  `commit()` ACKs the unit's last message if that is not ACKed yet. ActiveMQ's cost for each
  transacted ACK grows with the square of the unit's size (it walks the unit's messages, checking
  each against a list), so fewer ACKs is less of the broker's time (BENCHMARKS.md). `commit()`
  then sends COMMIT with a receipt and waits for it; the broker acks everything the
  transaction ACKed and only then are the messages gone.
  Why not `client-individual`: there a transacted ACK is a real ack inside the broker
  transaction, and when a consumer dies with the unit open ActiveMQ removes the consumer
  first (redelivering the messages it had only prefetched) and rolls the transaction back
  after, so the unit's messages can come back *behind* the prefetched ones. With delivered
  acks every unacked message goes back in one piece, in order.
- Backout: ABORT drops the pending acks, but ActiveMQ keeps the messages dispatched to the same
  subscription; they are redelivered only when the consumer goes away. So backout is ABORT +
  UNSUBSCRIBE + SUBSCRIBE (a new subscription id): the broker puts the messages back at the
  head of the queue in their original order and marks them `redelivered:true`. Messages that
  were prefetched but never handed to the caller are redelivered (and marked) too, so each is
  counted as one more delivery than it had. That is what a larger prefetch costs (up to
  `prefetch` messages per backout or crash, and that many messages held in memory); what it
  buys is fewer round trips and fewer ACKs on a backlog (settings/variables.py). A consumer
  that disconnects, crashes (SIGKILL) or loses its TCP connection gets the same treatment
  from the broker. Keeping the order across *repeated* backouts needs the destination policy
  `strictOrderDispatch="true"` on the broker (scripts/activemq.sh sets it): without it
  ActiveMQ 5.17 appends a backed-out unit behind earlier backed-out messages it has not
  redelivered yet.
- NACK is not a backout on ActiveMQ: it is a "poison ack" that moves the message straight to
  the dead-letter queue (ActiveMQ.DLQ by default), and it is refused inside a transaction
  ("Poison ack cannot be transacted", which also marks the transaction rollback-only). We never
  send NACK.
- Backout threshold / backout queue (DEFAULT_BACKOUT_THRESHOLD, 10, unless configured; 0 turns
  it off; default queue ActiveMQ.DLQ): a get that meets a message whose backout count
  (delivery_count - 1, counted as source.py describes) has reached the threshold does not
  return it, and reads none of its headers (so a header that fails the get cannot keep it
  coming back): it is ACKed in the unit like any other message and remembered; `commit()` first
  SENDs a copy to `backout_queue` (persistent, confirmed by receipt; frames.backout_copy) and
  then commits, which acks the original. A backout forgets the move, as with IBM MQ's JMS
  client, whose move is part of the unit of work. If the connection fails between the two, the
  copy is already on the backout queue and the original comes back and is moved again: a
  duplicate there, never a lost message.
- Outages: with no unit of work open, the session reconnects with exponential backoff and
  jitter and raises SourceUnavailable if the broker stays down. With a unit open, the broker
  has already rolled it back, so the caller gets SourceUnavailable and must back out (which is
  then a no-op).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sis_platform.queues.base import QueueSession, ReceivedMessage, SourceUnavailable
from sis_platform.queues.stomp.frames import (
    BackoutCopy,
    backout_copy,
    broker_id,
    message_id_of,
    received_message,
)
from sis_platform.queues.stomp.link import BrokerError, Link, LinkLost
from sis_platform.runtime.logs import concerning

if TYPE_CHECKING:
    from sis_platform.queues.stomp.source import StompQueue

log = logging.getLogger(__name__)


@dataclass
class _Got:
    broker_id: str
    ack_id: str
    counted: bool  # handed out redelivered, so it has an entry in the redelivery counts


def _send_copy(link: Link, destination: str, copy: BackoutCopy) -> Callable[[str], None]:
    def send(receipt: str) -> None:
        link.conn.send(destination, copy.body, headers={**copy.headers, "receipt": receipt})

    return send


class StompSession(QueueSession):
    def __init__(self, source: StompQueue) -> None:
        self._source = source
        self._lock = threading.RLock()
        self._link: Link | None = None
        self._subscription = ""
        self._tx: str | None = None
        self._unit: list[_Got] = []
        self._acked = 0  # how many of the unit's messages its ACKs cover so far
        self._moves: list[BackoutCopy] = []
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
                    redeliveries = self._source.redeliveries(frame, record=True)
                    self._take(link, frame, counted=redeliveries > 0)
                    threshold = self._source.backout_threshold
                    if threshold and redeliveries >= threshold:
                        # Before any header is read: a message whose headers fail the get
                        # comes back at most `threshold` times.
                        self._move_to_backout(frame, redeliveries)
                        continue
                    return received_message(frame, redeliveries)
                except LinkLost:
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
                    raise LinkLost("not connected")
                if self._acked < len(unit):
                    self._ack_unit(link, tx)
                for move in moves:
                    link.request(_send_copy(link, source.backout_queue, move), "move")
                link.request(
                    lambda receipt: link.conn.commit(tx, headers={"receipt": receipt}), "commit"
                )
            except (LinkLost, BrokerError) as e:
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
                source.forget_redeliveries(g.broker_id for g in unit if g.counted)
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
            except (LinkLost, BrokerError) as e:
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
        except (LinkLost, BrokerError) as e:
            link.abort()
            raise SourceUnavailable(f"cannot subscribe to {self._source.description}: {e}") from e
        self._link = link

    def _subscribe(self, link: Link) -> None:
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

    def _resubscribe(self, link: Link) -> None:
        # Removing the consumer is what makes ActiveMQ redeliver its unacked messages (at the
        # head of the queue, flagged redelivered); a fresh id keeps stale frames apart.
        old = self._subscription
        link.send(lambda: link.conn.unsubscribe(old))
        self._subscribe(link)

    def _live_link(self) -> Link:
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

    def _take(self, link: Link, frame: Any, counted: bool) -> None:
        """Add the message to the unit (its transaction begun with its first message), ACKing
        every half prefetch inside the transaction: with a `client` subscription that only opens
        the prefetch window; COMMIT makes it an ack (module docstring)."""
        if self._tx is None:
            tx = f"tx-{uuid.uuid4().hex}"
            self._tx = tx
            link.send(lambda: link.conn.begin(tx))
        tx = self._tx
        got = _Got(broker_id=broker_id(frame), ack_id=frame.headers["ack"], counted=counted)
        self._unit.append(got)
        if len(self._unit) - self._acked >= max(1, self._source.prefetch // 2):
            self._ack_unit(link, tx)

    def _ack_unit(self, link: Link, tx: str) -> None:
        """ACK the unit's last message in its transaction: a `client` ACK covers every
        message of the unit before it too."""
        last = self._unit[-1]
        link.send(lambda: link.conn.ack(last.ack_id, transaction=tx))
        self._acked = len(self._unit)

    def _move_to_backout(self, frame: Any, redeliveries: int) -> None:
        source = self._source
        copy = backout_copy(frame, redeliveries, source.destination)
        message_id = message_id_of(frame)
        log.warning(
            "%s: message %s reached backout count %d, moving it to %s",
            source.description,
            message_id,
            redeliveries,
            source.backout_queue,
            extra=concerning(message_id=message_id),
        )
        # In the unit like any other message (ACKed by commit() at the latest); the copy is
        # sent by commit().
        self._moves.append(copy)

    def _end_unit(self) -> None:
        self._unit = []
        self._acked = 0
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
