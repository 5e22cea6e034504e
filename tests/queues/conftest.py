from __future__ import annotations

from tests.queues.broker import activemq, activemq_outage, activemq_tls

__all__ = ["activemq", "activemq_outage", "activemq_tls"]
