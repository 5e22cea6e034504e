"""The IBM MQ source: the provider's Sportsdata queue read through the MQI's Python binding.

The binding is IBM's maintained `ibmmq` package (the optional extra: `pip install
'sis-platform[ibmmq]'`) or, where that is not installed, pymqi (`sis-platform[pymqi]`): the same
classes and constants under another module name. Either needs the IBM MQ C client library (the
IBM MQ redistributable client, `libmqic_r.so`) at run time. It is imported only when a
connection is opened (mqi.load_mqi), so this package imports without it; the tests drive it
through the fake in tests/queues/fake_pymqi.py, posing as either module. docs/ibmmq.md is the
operator's guide (variables, TLS, the queue manager side, message size); docs/design.md
"Sources" the contract.

Modules, in the order a message meets them:
- source.py: IbmMqQueue, its settings, connecting with bounded retries, error mapping;
- connection.py: one MQ client connection (channel definition, TLS, MQCONNX, queue handles,
  BOTHRESH/BOQNAME and the dead-letter queue name);
- session.py: gets under syncpoint, bounded in size; commit and backout of the unit of work;
- moves.py: messages over the backout threshold or the get limit, moved to the backout queue
  or the dead-letter queue (MQDLH) inside the unit instead of returned;
- message.py and rfh2.py: the MQMD and body as a ReceivedMessage, MQRFH2 properties;
- producer.py: puts (the simulator and tests);
- mqi.py: reason codes, IbmMqError, IbmMqClientMissing, loading the binding.
"""

from sis_platform.queues.ibmmq.message import mqmd_put_time, to_received_message
from sis_platform.queues.ibmmq.mqi import (
    CONNECTION_REASONS,
    MQRC_BACKED_OUT,
    MQRC_BACKOUT_THRESHOLD_REACHED,
    MQRC_DATA_LENGTH_ERROR,
    MQRC_NO_MSG_AVAILABLE,
    MQRC_SELECTOR_ERROR,
    MQRC_TRUNCATED_MSG_FAILED,
    ClientReconnect,
    IbmMqClientMissing,
    IbmMqError,
    Opening,
    load_mqi,
    reason_name,
)
from sis_platform.queues.ibmmq.rfh2 import Rfh2, Rfh2Error, parse_rfh2, rfh2_properties
from sis_platform.queues.ibmmq.source import IbmMqQueue

__all__ = [
    "CONNECTION_REASONS",
    "MQRC_BACKED_OUT",
    "MQRC_BACKOUT_THRESHOLD_REACHED",
    "MQRC_DATA_LENGTH_ERROR",
    "MQRC_NO_MSG_AVAILABLE",
    "MQRC_SELECTOR_ERROR",
    "MQRC_TRUNCATED_MSG_FAILED",
    "ClientReconnect",
    "IbmMqClientMissing",
    "IbmMqError",
    "IbmMqQueue",
    "Opening",
    "Rfh2",
    "Rfh2Error",
    "load_mqi",
    "mqmd_put_time",
    "parse_rfh2",
    "reason_name",
    "rfh2_properties",
    "to_received_message",
]
