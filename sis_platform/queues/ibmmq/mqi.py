"""The MQI vocabulary the IBM MQ source shares: reason codes, the two errors it raises, the
text form of MQ names, and loading the MQI binding (IBM's ibmmq, else pymqi).

Reason codes (cmqc.h; part of the MQI, stable across MQ versions):
- 2033 MQRC_NO_MSG_AVAILABLE is an empty queue, not an error.
- Connection-level reasons (CONNECTION_REASONS: 2009 MQRC_CONNECTION_BROKEN, 2059
  MQRC_Q_MGR_NOT_AVAILABLE, 2538 MQRC_HOST_NOT_AVAILABLE, 2161/2162 queue manager
  quiescing/stopping, 2202/2203 connection quiescing/stopping, ...) are transient: the source
  reconnects with exponential backoff and jitter, a bounded number of times, then raises
  SourceUnavailable.
- Every other reason is a configuration or programming error and raises IbmMqError, which
  names the MQ call, the object and the reason code.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, Literal

ClientReconnect = Literal["disabled", "as_def", "any", "qmgr"]
Opening = Literal["input", "output", "nothing"]

MQRC_BACKED_OUT = 2003
MQRC_NO_MSG_AVAILABLE = 2033
MQRC_SELECTOR_ERROR = 2067
MQRC_TRUNCATED_MSG_FAILED = 2080
MQRC_DATA_LENGTH_ERROR = 2010
MQRC_BACKOUT_THRESHOLD_REACHED = 2362

# The queue manager cannot be reached now or is going away: retry later (transient).
CONNECTION_REASONS: Mapping[int, str] = {
    2009: "MQRC_CONNECTION_BROKEN",
    2018: "MQRC_HCONN_ERROR",  # any call on a connection that has already broken
    2059: "MQRC_Q_MGR_NOT_AVAILABLE",
    2161: "MQRC_Q_MGR_QUIESCING",
    2162: "MQRC_Q_MGR_STOPPING",
    2202: "MQRC_CONNECTION_QUIESCING",
    2203: "MQRC_CONNECTION_STOPPING",
    2537: "MQRC_CHANNEL_NOT_AVAILABLE",
    2538: "MQRC_HOST_NOT_AVAILABLE",
    2543: "MQRC_STANDBY_Q_MGR",  # reached the standby of a multi-instance queue manager
    2548: "MQRC_RECONNECT_FAILED",
    2549: "MQRC_CALL_INTERRUPTED",  # client auto-reconnect happened during the call
}

MQ_NAME_LENGTH = 48


class IbmMqClientMissing(ImportError):
    """pymqi or the IBM MQ C client library it loads is not installed."""


class IbmMqError(Exception):
    """An MQI call failed for a reason that retrying will not fix (configuration, authority,
    a missing object). Names the call, the object and the reason code."""

    def __init__(self, call: str, target: str, comp: int, reason: int, reason_name: str) -> None:
        self.call = call
        self.target = target
        self.comp = comp
        self.reason = reason
        self.reason_name = reason_name
        completion = {1: "MQCC_WARNING", 2: "MQCC_FAILED"}.get(comp, f"completion {comp}")
        super().__init__(f"{call} {target} failed: {reason_name} ({reason}), {completion}")


# The MQI bindings, in the order they are tried: IBM's maintained `ibmmq` (the same classes
# and constants as pymqi: QueueManager, CD, SCO, CSP, CMQC, MQMIError, ...), then pymqi, whose
# development is on hold but which existing installations have.
MQI_MODULES = ("ibmmq", "pymqi")


def load_mqi() -> Any:
    """The MQI binding to use: `ibmmq` when installed, else `pymqi`; IbmMqClientMissing naming
    what to install when neither imports."""
    errors: list[str] = []
    for name in MQI_MODULES:
        try:
            # Imported here, not at module level: both are optional extras that need IBM's C
            # client library, absent on the build machines (the source is tested through the
            # fake in tests/queues/fake_pymqi.py), so the package must import without them.
            return importlib.import_module(name)
        except ImportError as exc:  # also raised when the module is there but libmqic_r.so is not
            errors.append(f"{name}: {exc}")
    raise IbmMqClientMissing(
        "The IBM MQ source needs IBM's ibmmq package (install the extra: pip install "
        "'sis-platform[ibmmq]'; or pymqi, 'sis-platform[pymqi]') and the IBM MQ C client "
        "library it loads (the IBM MQ redistributable client, libmqic_r.so, found through "
        f"LD_LIBRARY_PATH or /opt/mqm): {'; '.join(errors)}"
    )


def reason_name(reason: int, cmqc: Any = None) -> str:
    """The MQRC_* name of a reason code, from pymqi's CMQC when loaded."""
    if cmqc is not None:
        for name in dir(cmqc):
            if name.startswith("MQRC_") and getattr(cmqc, name) == reason:
                return name
    known = {
        MQRC_BACKED_OUT: "MQRC_BACKED_OUT",
        MQRC_NO_MSG_AVAILABLE: "MQRC_NO_MSG_AVAILABLE",
        MQRC_SELECTOR_ERROR: "MQRC_SELECTOR_ERROR",
        **CONNECTION_REASONS,
    }
    return known.get(reason, f"MQRC {reason}")


def reason_of(exc: BaseException | None) -> int:
    """The reason code an MQMIError (or IbmMqError) carries; 0 for anything else."""
    return int(getattr(exc, "reason", 0) or 0)


def completion_of(exc: BaseException) -> int:
    """The completion code an MQMIError carries; MQCC_FAILED (2) when it has none."""
    return int(getattr(exc, "comp", 2) or 2)


def mq_name(value: bytes | str) -> str:
    """An MQCHAR field as text: MQ pads names with blanks (or NULs from C strings)."""
    if isinstance(value, bytes):
        value = value.decode("ascii", errors="replace")
    return value.rstrip(" \x00")


def padded(name: str, length: int) -> bytes:
    """`name` as an MQCHAR field of `length` bytes, blank-padded (or cut)."""
    return name.encode("ascii")[:length].ljust(length, b" ")
