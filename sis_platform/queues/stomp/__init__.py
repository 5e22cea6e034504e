"""A JMS broker over STOMP 1.2 (ActiveMQ 5.17 is what we test against) through stomp.py.

Modules:
- source.py: StompQueue, its settings, connecting with bounded retries, browsing, and the
  delivery count ActiveMQ does not send (kept in deliveries.RedeliveryCounts);
- session.py: how MQ syncpoint semantics map onto STOMP transactions and subscriptions
  (consuming, backout, why never NACK, the backout threshold and queue, outages);
- link.py: one STOMP connection, its receipts and the loss of it;
- frames.py: message ids, bodies, properties, the backout copy;
- producer.py: persistent, receipted sends.

The broker setting the platform relies on (`strictOrderDispatch`) is set by
scripts/activemq.sh, which leaves `persistJMSRedelivered` off; session.py and source.py say why.
"""

from sis_platform.queues.stomp.frames import (
    ACTIVEMQ_DLQ,
    BACKOUT_COUNT_PROPERTY,
    ID_PROPERTY,
    ORIGINAL_DESTINATION_PROPERTY,
    queue_destination,
)
from sis_platform.queues.stomp.producer import StompProducer
from sis_platform.queues.stomp.session import StompSession
from sis_platform.queues.stomp.source import StompQueue

__all__ = [
    "ACTIVEMQ_DLQ",
    "BACKOUT_COUNT_PROPERTY",
    "ID_PROPERTY",
    "ORIGINAL_DESTINATION_PROPERTY",
    "StompProducer",
    "StompQueue",
    "StompSession",
    "queue_destination",
]
