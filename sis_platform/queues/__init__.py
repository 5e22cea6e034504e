"""Queue sources: one interface (`base.py`) over the embedded file queue (`embedded.py`), STOMP
brokers (`stomp/`) and IBM MQ (`ibmmq/`); `deliveries.py` counts redeliveries where a broker
does not, and `factory.py` opens a source from a URL."""
