"""Queue sources: one interface (base.py) over the embedded file queue, STOMP brokers and IBM MQ,
and the factory that opens one from a URL."""
