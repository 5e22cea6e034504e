"""The IBM MQ source: the provider's Sportsdata queue read through pymqi.

pymqi is an optional extra (`pip install 'sis-platform[ibmmq]'`) and needs the IBM MQ C client
library (the IBM MQ redistributable client, `libmqic_r.so`) at run time. It is imported only
when a connection is opened, so this module imports without it.

What the queue manager does and what this module does (docs/design.md "Sources"):
- Gets are MQGMO_SYNCPOINT: a got message stays invisible to other consumers until MQCMIT
  (gone) or MQBACK (reinstated with BackoutCount + 1).
- The queue manager counts backouts but does not act on BOTHRESH/BOQNAME: that is the
  getting application's job (IBM's JMS client does it too). This module reads both with MQINQ
  when it opens the queue and moves a message whose BackoutCount >= BOTHRESH to BOQNAME inside
  the unit of work, instead of returning it. A queue without a threshold (BOTHRESH 0, MQ's
  default, or an alias that has none) gets the platform's (`backout_threshold`,
  DEFAULT_BACKOUT_THRESHOLD = 10 unless configured; 0 turns it off), so a message that kills
  its consumer stops coming back there too; a blank BOQNAME is replaced by `backout_queue`.
  * No backout queue, or one refusing the message (2085 not defined, 2053 full, 2051 put
    inhibited, 2035 not authorized): the message goes to the queue manager's dead-letter queue
    behind an MQDLH (reason 2362 MQRC_BACKOUT_THRESHOLD_REACHED), as IBM's JMS client does.
  * Neither queue usable (not defined, put fails): the message is delivered as usual, with an
    error logged each time. The platform's own redelivery limit then dead-letters it, so it is
    neither lost nor silently stuck.
  * The move belongs to the caller's unit of work: commit makes it final, backout undoes it
    (the message returns with BackoutCount + 1 and is moved again by the next get). The
    consumer commits even a unit in which get() returned nothing, which makes such moves final.
- Bounded gets: the first MQGET has a 64 KiB buffer (the simulated feed's largest body is
  27.6 KB). A longer message fails with 2080 MQRC_TRUNCATED_MSG_FAILED and stays on the queue,
  and the MQMD and its length come back with the error; it is then got with a buffer of
  exactly its length, matched by MsgId. A buffer never exceeds the message, because one larger
  than the channel's negotiated maximum fails with 2010 MQRC_DATA_LENGTH_ERROR whatever the
  message (the MQCD offers MQ's 100 MiB, so the server-connection channel's MAXMSGL decides).
  A message over `max_get_bytes` (default DEFAULT_MAX_GET_BYTES, twice the platform's largest
  accepted body) is never returned: it is moved like a message over the backout threshold
  (same targets; MQDLH reason 2080), with an error naming its id and size. Memory per get is
  therefore bounded by the message, which MAXMSGL of the queue, queue manager and channel
  bounds (4 MiB by default, 100 MiB at most); a message up to `max_get_bytes` reaches intake,
  which dead-letters one over SIS_MAX_MESSAGE_BYTES `too-large`, with its record in the log.
  If no queue takes an over-size message, it is delivered, and intake does the same.
- MQRC 2033 (MQRC_NO_MSG_AVAILABLE) is an empty queue, not an error.
- Connection-level reasons (2009 MQRC_CONNECTION_BROKEN, 2059 MQRC_Q_MGR_NOT_AVAILABLE, 2538
  MQRC_HOST_NOT_AVAILABLE, 2161/2162 queue manager quiescing/stopping, 2202/2203 connection
  quiescing/stopping, ...) are transient: reconnect with exponential backoff and jitter, a
  bounded number of times, then SourceUnavailable. A connection lost with messages in the unit
  of work is never papered over: the queue manager backs that unit out, so the caller gets
  SourceUnavailable and the messages come again later.
- Every other reason is a configuration or programming error and raises IbmMqError, which
  names the MQ call, the object and the reason code.
"""

from __future__ import annotations

import copy
import logging
import os
import random
import re
import struct
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal
from xml.etree import ElementTree

from sis_platform.queues.base import (
    DEFAULT_BACKOUT_THRESHOLD,
    DEFAULT_MAX_GET_BYTES,
    QueueProducer,
    QueueSession,
    QueueSource,
    ReceivedMessage,
    SourceUnavailable,
)

log = logging.getLogger(__name__)

ClientReconnect = Literal["disabled", "as_def", "any", "qmgr"]
Opening = Literal["input", "output", "nothing"]

# Reason codes this module acts on (cmqc.h; part of the MQI, stable across MQ versions).
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

ENV_PREFIX = "SIS_IBMMQ_"
ENV_REQUIRED = ("QMGR", "CHANNEL", "CONN", "QUEUE")

_JMS_ID = re.compile(r"ID:([0-9a-fA-F]{48})\Z")
# The first MQGET's buffer: the simulated feed's largest body is 27.6 KB, so nearly every
# message is got in one call; a longer one is got again with a buffer of its exact length.
_FIRST_GET_BYTES = 64 * 1024
# MQ's largest message length (100 MiB). Offered in the MQCD so the channel's limit is the
# server-connection channel's MAXMSGL; the MQCD default (4 MiB) would cap it below that.
_MQ_MAX_MESSAGE_LENGTH = 104_857_600
_MQ_NAME_LENGTH = 48
# MQDLH version 1 in native integer order: StrucId, Version, Reason, DestQName, DestQMgrName,
# Encoding, CodedCharSetId, Format, PutApplType, PutApplName, PutDate, PutTime (172 bytes).
_DLH = struct.Struct("=4sii48s48sii8si28s8s8s")
_PUT_APPL_NAME = b"sis-platform"


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


@dataclass(frozen=True)
class Rfh2:
    """One MQRFH2 header: where the next part starts and how it is encoded, and its folders."""

    length: int
    encoding: int
    ccsid: int
    format: bytes
    name_value_ccsid: int
    folders: tuple[str, ...]


class Rfh2Error(ValueError):
    """The bytes announced as an MQRFH2 header are not one."""


def load_pymqi() -> Any:
    """Import pymqi, or explain what is missing."""
    try:
        import pymqi
    except ImportError as exc:  # also raised when pymqi is there but libmqic_r.so is not
        raise IbmMqClientMissing(
            "The IBM MQ source needs pymqi (install the extra: pip install "
            "'sis-platform[ibmmq]') and the IBM MQ C client library it loads (the IBM MQ "
            "redistributable client, libmqic_r.so, found through LD_LIBRARY_PATH or "
            f"/opt/mqm): {exc}"
        ) from exc
    return pymqi


class _Secret:
    """A password that does not show itself in repr, logs or tracebacks."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "'***'"

    __str__ = __repr__


class IbmMqQueue(QueueSource):
    """One queue on an IBM MQ queue manager, reached as an MQ client over TCP.

    `conn_name` is the MQ connection name, "host(port)" or a comma-separated list of them for
    a multi-instance queue manager. `cipher_spec` (e.g. "ANY_TLS12_OR_HIGHER") turns on TLS and
    then `key_repository` names the client key database stem (without ".kdb"). `user` and
    `password` go to the queue manager in an MQCSP (connection authentication).

    `client_reconnect` sets the MQCNO reconnect option. The default "disabled" leaves
    reconnecting to this class, whose attempts are bounded and visible in the logs; MQ's own
    automatic reconnect can block a call for up to its reconnect timeout (30 minutes by
    default), longer than a sensor tick should ever take.

    `max_wait_ms` caps the MQGET WaitInterval, so one get() never waits longer than that even
    when asked to. `max_get_bytes` is the largest message got whole; `backout_threshold` and
    `backout_queue` apply where the queue has no BOTHRESH / BOQNAME (module docstring).
    Connecting makes up to `reconnect_attempts` attempts, the retries spaced by
    `backoff_delay` (doubling from `reconnect_initial_delay` up to `reconnect_max_delay`).

    `sleep`, `jitter` and `clock` are injectable so tests never wait; `pymqi_module` replaces
    the pymqi import (tests pass a fake).
    """

    def __init__(
        self,
        queue_manager: str,
        channel: str,
        conn_name: str,
        queue: str,
        user: str | None = None,
        password: str | None = None,
        cipher_spec: str | None = None,
        key_repository: str | None = None,
        certificate_label: str | None = None,
        *,
        max_wait_ms: int = 60_000,
        max_get_bytes: int = DEFAULT_MAX_GET_BYTES,
        backout_threshold: int = DEFAULT_BACKOUT_THRESHOLD,
        backout_queue: str | None = None,
        client_reconnect: ClientReconnect = "disabled",
        reconnect_attempts: int = 4,
        reconnect_initial_delay: float = 0.5,
        reconnect_max_delay: float = 8.0,
        sleep: Callable[[float], None] = time.sleep,
        jitter: Callable[[], float] = random.random,
        clock: Callable[[], float] = time.monotonic,
        pymqi_module: Any = None,
    ) -> None:
        for label, value in (
            ("queue_manager", queue_manager),
            ("channel", channel),
            ("conn_name", conn_name),
            ("queue", queue),
        ):
            if not value or not value.strip():
                raise ValueError(f"IbmMqQueue needs a {label}")
        if user and password is None:
            raise ValueError("IbmMqQueue: a user needs a password (connection authentication)")
        if reconnect_attempts < 1:
            raise ValueError("reconnect_attempts must be at least 1")
        if max_wait_ms < 0:
            raise ValueError("max_wait_ms must not be negative")
        if max_get_bytes < 1:
            raise ValueError("max_get_bytes must be at least 1")
        if backout_threshold < 0:
            raise ValueError("backout_threshold must not be negative")
        if backout_queue is not None and backout_queue.strip() == queue.strip():
            raise ValueError("backout_queue must differ from queue")
        self.queue_manager = queue_manager
        self.channel = channel
        self.conn_name = conn_name
        self.queue = queue
        self.user = user or None
        self._password = _Secret(password) if password is not None else None
        self.cipher_spec = cipher_spec or None
        self.key_repository = key_repository or None
        self.certificate_label = certificate_label or None
        self.max_wait_ms = max_wait_ms
        self.max_get_bytes = max_get_bytes
        self.backout_threshold = backout_threshold
        self.backout_queue = backout_queue.strip() if backout_queue else None
        self.client_reconnect: ClientReconnect = client_reconnect
        self.reconnect_attempts = reconnect_attempts
        self.reconnect_initial_delay = reconnect_initial_delay
        self.reconnect_max_delay = reconnect_max_delay
        self._sleep = sleep
        self._jitter = jitter
        self._clock = clock
        self._pymqi = pymqi_module

    @classmethod
    def from_env(cls, environ: Mapping[str, str], **options: Any) -> IbmMqQueue:
        """Build from SIS_IBMMQ_* variables (docs/ibmmq.md lists them)."""
        missing = missing_env(environ)
        if missing:
            raise ValueError(f"IBM MQ source not configured: set {', '.join(missing)}")

        def var(name: str) -> str | None:
            return environ.get(ENV_PREFIX + name) or None

        reconnect = var("RECONNECT") or "disabled"
        if reconnect not in ("disabled", "as_def", "any", "qmgr"):
            raise ValueError(
                f"{ENV_PREFIX}RECONNECT must be disabled, as_def, any or qmgr, not {reconnect!r}"
            )
        return cls(
            queue_manager=environ[ENV_PREFIX + "QMGR"],
            channel=environ[ENV_PREFIX + "CHANNEL"],
            conn_name=environ[ENV_PREFIX + "CONN"],
            queue=environ[ENV_PREFIX + "QUEUE"],
            user=var("USER"),
            password=var("PASSWORD") if var("USER") else None,
            cipher_spec=var("CIPHER_SPEC"),
            key_repository=var("KEY_REPOSITORY"),
            certificate_label=var("CERT_LABEL"),
            client_reconnect=reconnect,  # type: ignore[arg-type]  # checked just above
            **options,
        )

    @property
    def description(self) -> str:
        parts = [f"channel {self.channel}", f"conn {self.conn_name}"]
        if self.cipher_spec:
            parts.append(f"TLS {self.cipher_spec}")
        if self.user:
            parts.append(f"user {self.user}")
        return (
            f"IBM MQ queue {self.queue} on queue manager {self.queue_manager} ({', '.join(parts)})"
        )

    def __repr__(self) -> str:
        return f"IbmMqQueue({self.description})"

    def connect(self) -> QueueSession:
        return _Session(self)

    def producer(self) -> QueueProducer:
        return _Producer(self)

    def with_queue(self, queue: str) -> IbmMqQueue:
        """The same queue manager and settings, another queue (e.g. to drain BOQNAME)."""
        other = copy.copy(self)
        other.queue = queue
        return other

    @contextmanager
    def connected_queue_manager(self) -> Iterator[Any]:
        """A pymqi QueueManager connected with these settings and no queue open, for
        administration (PCF) and tests; disconnected on exit, without committing anything
        left open (MQBACK first)."""
        conn = self.open_connection(opening="nothing")
        try:
            yield conn.qmgr
        finally:
            conn.close(backout=True)

    # -- plumbing shared by sessions and producers ---------------------------------------

    @property
    def pymqi(self) -> Any:
        if self._pymqi is None:
            self._pymqi = load_pymqi()
        return self._pymqi

    def reason_name(self, reason: int) -> str:
        return reason_name(reason, getattr(self._pymqi, "CMQC", None))

    def is_transient(self, exc: BaseException) -> bool:
        return isinstance(exc, self.pymqi.MQMIError) and _reason(exc) in CONNECTION_REASONS

    def error(self, call: str, target: str, exc: BaseException) -> IbmMqError:
        reason = _reason(exc)
        return IbmMqError(call, target, _comp(exc), reason, self.reason_name(reason))

    def unavailable(self, what: str, exc: BaseException) -> SourceUnavailable:
        reason = _reason(exc)
        return SourceUnavailable(
            f"{self.description}: {what}: {self.reason_name(reason)} ({reason})"
        )

    def backoff_delay(self, retry: int) -> float:
        """Delay before retry number `retry` (1, 2, ...): exponential, capped, with "equal
        jitter" (half fixed, half random) so many consumers do not reconnect in step."""
        ceiling = min(self.reconnect_max_delay, self.reconnect_initial_delay * 2 ** (retry - 1))
        return ceiling / 2 + self._jitter() * ceiling / 2

    def open_connection(self, opening: Opening) -> _Connection:
        """Connect, retrying transient failures with backoff; SourceUnavailable when spent."""
        last: BaseException | None = None
        for attempt in range(self.reconnect_attempts):
            if attempt:
                delay = self.backoff_delay(attempt)
                log.warning(
                    "%s: connection attempt %d of %d failed (%s); retrying in %.2fs",
                    self.description,
                    attempt,
                    self.reconnect_attempts,
                    self.reason_name(_reason(last)) if last is not None else "?",
                    delay,
                )
                self._sleep(delay)
            try:
                return _Connection(self, opening)
            except self.pymqi.MQMIError as exc:
                if not self.is_transient(exc):
                    raise
                last = exc
        assert last is not None
        raise self.unavailable(
            f"queue manager not reachable after {self.reconnect_attempts} attempts", last
        ) from last

    def now(self) -> datetime:
        return datetime.now(UTC)


def missing_env(environ: Mapping[str, str]) -> list[str]:
    """The SIS_IBMMQ_* variables a real queue manager needs that `environ` lacks."""
    return [ENV_PREFIX + name for name in ENV_REQUIRED if not environ.get(ENV_PREFIX + name)]


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


def _reason(exc: BaseException | None) -> int:
    return int(getattr(exc, "reason", 0) or 0)


def _comp(exc: BaseException) -> int:
    return int(getattr(exc, "comp", 2) or 2)


def _mq_name(value: bytes | str) -> str:
    """An MQCHAR field as text: MQ pads names with blanks (or NULs from C strings)."""
    if isinstance(value, bytes):
        value = value.decode("ascii", errors="replace")
    return value.rstrip(" \x00")


def _padded(name: str, length: int) -> bytes:
    return name.encode("ascii")[:length].ljust(length, b" ")


@dataclass(frozen=True)
class _MoveReason:
    """Why a got message is moved aside instead of returned."""

    text: str  # for the log lines, e.g. "BackoutCount 10 >= backout threshold 10"
    dead_letter_reason: int  # the MQDLH Reason when it goes to the dead-letter queue
    otherwise: str  # what becomes of it if no queue takes it


class _Connection:
    """One client connection (MQCONNX) with the source's queue open.

    For input the queue is opened for shared input, inquire (BOTHRESH/BOQNAME) and saving
    context (so a moved message keeps its original identity and origin context).
    """

    def __init__(self, source: IbmMqQueue, opening: Opening) -> None:
        self.source = source
        pymqi = source.pymqi
        self.pymqi = pymqi
        self.cmqc = cmqc = pymqi.CMQC
        self.backout_threshold = 0
        self.backout_queue = ""
        self.dead_letter_queue = ""
        self._outputs: dict[str, Any] = {}
        self.queue: Any = None

        cd = pymqi.CD()
        cd.ChannelName = source.channel.encode("ascii")
        cd.ConnectionName = source.conn_name.encode("ascii")
        cd.ChannelType = cmqc.MQCHT_CLNTCONN
        cd.TransportType = cmqc.MQXPT_TCP
        cd.MaxMsgLength = _MQ_MAX_MESSAGE_LENGTH
        sco = pymqi.SCO()
        if source.cipher_spec:
            cd.SSLCipherSpec = source.cipher_spec.encode("ascii")
        if source.key_repository:
            sco.KeyRepository = source.key_repository.encode("utf-8")
        if source.certificate_label:
            sco.CertificateLabel = source.certificate_label.encode("utf-8")
        options = {
            "disabled": cmqc.MQCNO_RECONNECT_DISABLED,
            "as_def": cmqc.MQCNO_RECONNECT_AS_DEF,
            "any": cmqc.MQCNO_RECONNECT,
            "qmgr": cmqc.MQCNO_RECONNECT_Q_MGR,
        }[source.client_reconnect]
        credentials: dict[str, str] = {}
        if source.user and source._password is not None:
            credentials = {"user": source.user, "password": source._password.reveal()}

        # disconnect_on_exit=False: pymqi would otherwise MQDISC from __del__, and MQDISC
        # commits an open unit of work; a session dropped without close() must not commit.
        self.qmgr = pymqi.QueueManager(None, disconnect_on_exit=False)
        try:
            self.qmgr.connect_with_options(
                source.queue_manager, cd=cd, sco=sco, opts=options, **credentials
            )
        except pymqi.MQMIError as exc:
            if source.is_transient(exc):
                raise
            raise source.error("MQCONNX", f"queue manager {source.queue_manager}", exc) from exc

        try:
            if opening == "input":
                self._open_input()
            elif opening == "output":
                self.queue = self._open(
                    source.queue, cmqc.MQOO_OUTPUT | cmqc.MQOO_FAIL_IF_QUIESCING
                )
        except BaseException:
            self.close(backout=False)
            raise

    def _open(self, name: str, options: int) -> Any:
        try:
            return self.pymqi.Queue(
                self.qmgr, self.pymqi.OD(ObjectName=name.encode("ascii")), options
            )
        except self.pymqi.MQMIError as exc:
            if self.source.is_transient(exc):
                raise
            raise self.source.error("MQOPEN", f"queue {name}", exc) from exc

    def _open_input(self) -> None:
        cmqc, source = self.cmqc, self.source
        self.queue = self._open(
            source.queue,
            cmqc.MQOO_INPUT_AS_Q_DEF
            | cmqc.MQOO_INQUIRE
            | cmqc.MQOO_SAVE_ALL_CONTEXT
            | cmqc.MQOO_FAIL_IF_QUIESCING,
        )
        queue_threshold, queue_backout_queue = self._inquire_backout_attributes()
        if queue_threshold > 0:
            self.backout_threshold, origin = queue_threshold, "BOTHRESH"
        else:
            self.backout_threshold = source.backout_threshold
            origin = "the platform's threshold: the queue has none"
        self.backout_queue = queue_backout_queue or source.backout_queue or ""
        # The dead-letter queue is the fallback when there is no backout queue or it refuses a
        # message; over-size messages need it too, whatever the threshold.
        try:
            self.dead_letter_queue = _mq_name(self.qmgr.inquire(cmqc.MQCA_DEAD_LETTER_Q_NAME))
        except self.pymqi.MQMIError as exc:
            if source.is_transient(exc):
                raise
            log.warning(
                "%s: cannot inquire the dead-letter queue name: %s (%d)",
                source.description,
                source.reason_name(_reason(exc)),
                _reason(exc),
            )
        if self.backout_threshold <= 0:
            log.warning(
                "%s: no backout threshold (BOTHRESH 0 and SIS_BACKOUT_THRESHOLD 0): a message "
                "that kills its consumer before it is landed comes back for ever",
                source.description,
            )
        elif self.backout_queue:
            log.info(
                "%s: messages backed out %d times (%s) are moved to %s",
                source.description,
                self.backout_threshold,
                origin,
                self.backout_queue,
            )
        elif self.dead_letter_queue:
            log.warning(
                "%s: backout threshold %d (%s) but BOQNAME is blank: such messages go to the "
                "dead-letter queue %s; define BOQNAME on the queue",
                source.description,
                self.backout_threshold,
                origin,
                self.dead_letter_queue,
            )
        else:
            log.error(
                "%s: backout threshold %d (%s) but neither BOQNAME nor a dead-letter queue is "
                "defined: messages over the threshold keep being delivered and the platform's "
                "redelivery limit must dead-letter them; define BOQNAME on the queue",
                source.description,
                self.backout_threshold,
                origin,
            )

    def _inquire_backout_attributes(self) -> tuple[int, str]:
        """The queue's BOTHRESH and BOQNAME; (0, "") where it has none."""
        cmqc, source = self.cmqc, self.source
        try:
            threshold = int(self.queue.inquire(cmqc.MQIA_BACKOUT_THRESHOLD))
            backout_queue = _mq_name(self.queue.inquire(cmqc.MQCA_BACKOUT_REQ_Q_NAME))
        except self.pymqi.MQMIError as exc:
            if source.is_transient(exc):
                raise
            if _reason(exc) != MQRC_SELECTOR_ERROR:
                raise source.error("MQINQ", f"queue {source.queue}", exc) from exc
            # 2067: the queue has no such attributes (an alias or remote queue definition).
            log.warning(
                "%s: the queue has no BOTHRESH/BOQNAME (alias or remote definition?): the "
                "platform's backout threshold applies",
                source.description,
            )
            return 0, ""
        return max(0, threshold), backout_queue

    def get(self, wait_ms: int) -> tuple[Any, bytes] | None:
        """The next message under syncpoint, whole (None: another consumer took the message
        seen first before it could be got whole; ask again).

        The first MQGET has a small buffer, enough for nearly every feed message; a longer
        message fails with 2080, stays on the queue, and tells its length, and is then got
        with a buffer of exactly that length, matched by MsgId (the head of a shared queue
        may have changed). A buffer never exceeds the message, so it never exceeds what the
        channel allows (a larger buffer fails with 2010 whatever the message), and a message
        over `max_get_bytes` costs one buffer of its own length, bounded by MAXMSGL.
        """
        md, gmo = self._get_options(wait_ms)
        try:
            body = self.queue.get(min(self.source.max_get_bytes, _FIRST_GET_BYTES), md, gmo)
        except self.pymqi.MQMIError as exc:
            if _reason(exc) != MQRC_TRUNCATED_MSG_FAILED:
                raise
            # pymqi has filled the MQMD in and gives the full length (MQGET's DataLength).
            length = int(getattr(exc, "original_length", 0) or 0)
        else:
            return md, bytes(body)
        md_whole, gmo = self._get_options(0)
        md_whole.MsgId = md.MsgId
        gmo.MatchOptions = self.cmqc.MQMO_MATCH_MSG_ID
        try:
            body = self.queue.get(length, md_whole, gmo)
        except self.pymqi.MQMIError as exc:
            if _reason(exc) == MQRC_NO_MSG_AVAILABLE:
                return None
            if _reason(exc) == MQRC_DATA_LENGTH_ERROR:
                # No MQ client can get it: it stays at the head of the queue until the
                # channel allows it. Say so, with what to change.
                raise self.source.error(
                    "MQGET",
                    f"queue {self.source.queue}: message ID:{bytes(md.MsgId).hex()} of "
                    f"{length} bytes is longer than the channel allows; raise the "
                    "server-connection channel's MAXMSGL to the queue's",
                    exc,
                ) from exc
            raise
        return md_whole, bytes(body)

    def _get_options(self, wait_ms: int) -> tuple[Any, Any]:
        cmqc = self.cmqc
        # A fresh MQMD per get: MQGET fills MsgId/CorrelId in, and a reused MQMD would make
        # the next get match only that message id.
        md = self.pymqi.MD()
        gmo = self.pymqi.GMO()
        gmo.Options = (
            cmqc.MQGMO_SYNCPOINT
            | cmqc.MQGMO_WAIT
            | cmqc.MQGMO_FAIL_IF_QUIESCING
            # Properties always as an MQRFH2 in the body (then parsed and stripped), whatever
            # the queue's PROPCTL says; MQGMO_CONVERT is deliberately off: the body is kept
            # byte for byte, as the provider sent it (the message log hashes those bytes).
            | cmqc.MQGMO_PROPERTIES_FORCE_MQRFH2
        )
        gmo.Version = cmqc.MQGMO_VERSION_4
        gmo.MatchOptions = cmqc.MQMO_NONE
        gmo.WaitInterval = wait_ms
        return md, gmo

    def _output(self, name: str) -> Any:
        queue = self._outputs.get(name)
        if queue is None:
            cmqc = self.cmqc
            queue = self._open(
                name,
                cmqc.MQOO_OUTPUT | cmqc.MQOO_PASS_ALL_CONTEXT | cmqc.MQOO_FAIL_IF_QUIESCING,
            )
            self._outputs[name] = queue
        return queue

    def _put_passing_context(self, name: str, body: bytes, md: Any) -> None:
        cmqc = self.cmqc
        pmo = self.pymqi.PMO()
        pmo.Options = (
            cmqc.MQPMO_SYNCPOINT | cmqc.MQPMO_PASS_ALL_CONTEXT | cmqc.MQPMO_FAIL_IF_QUIESCING
        )
        # Pass-all-context takes identity and origin context (user, put application, put
        # date and time) from the input handle's saved context of the message just got.
        pmo.Context = self.queue.get_handle()
        self._output(name).put(body, md, pmo)

    def move_to_backout_queue(self, md: Any, raw: bytes) -> None:
        """Put the message as got (same MQMD, so same MsgId) on BOQNAME, in the unit."""
        self._put_passing_context(self.backout_queue, raw, md)

    def move_to_dead_letter_queue(self, md: Any, raw: bytes, reason: int) -> None:
        """Put the message on the DLQ behind an MQDLH saying why and where it came from."""
        cmqc, source = self.cmqc, self.source
        now = source.now()
        header = _DLH.pack(
            cmqc.MQDLH_STRUC_ID,
            cmqc.MQDLH_VERSION_1,
            reason,
            _padded(source.queue, _MQ_NAME_LENGTH),
            _padded(source.queue_manager, _MQ_NAME_LENGTH),
            md.Encoding,
            md.CodedCharSetId,
            md.Format,
            cmqc.MQAT_UNIX,
            _PUT_APPL_NAME.ljust(28, b" "),
            now.strftime("%Y%m%d").encode("ascii"),
            (now.strftime("%H%M%S") + f"{now.microsecond // 10_000:02d}").encode("ascii"),
        )
        dead_md = self.pymqi.MD(**md.get())
        # The MQMD now describes the MQDLH; the MQDLH describes the original data.
        dead_md.Format = cmqc.MQFMT_DEAD_LETTER_HEADER
        dead_md.Encoding = cmqc.MQENC_NATIVE
        dead_md.CodedCharSetId = cmqc.MQCCSI_Q_MGR
        self._put_passing_context(self.dead_letter_queue, header + raw, dead_md)

    def put(self, body: bytes, msg_id: bytes) -> bytes:
        cmqc = self.cmqc
        md = self.pymqi.MD()
        md.MsgId = msg_id
        md.Format = cmqc.MQFMT_NONE  # a JMS BytesMessage: plain bytes, no MQRFH2
        md.Persistence = cmqc.MQPER_PERSISTENT  # a feed message must survive a restart
        pmo = self.pymqi.PMO()
        # The id is always chosen here (never MQPMO_NEW_MSG_ID), so a put retried after a
        # broken connection repeats the same id and the platform can recognise the duplicate.
        pmo.Options = cmqc.MQPMO_NO_SYNCPOINT | cmqc.MQPMO_FAIL_IF_QUIESCING
        self.queue.put(body, md, pmo)
        return bytes(md.MsgId)

    def commit(self) -> None:
        self.qmgr.commit()

    def backout(self) -> None:
        self.qmgr.backout()

    def close(self, backout: bool) -> None:
        """Best effort: the connection may already be broken, and then the queue manager
        has backed the unit out itself."""
        handles = [*self._outputs.values(), self.queue]
        self._outputs.clear()
        if backout:
            # MQDISC commits an open unit of work (MQDISC usage notes), so back out first.
            try:
                self.qmgr.backout()
            except self.pymqi.MQMIError as exc:
                if not self.source.is_transient(exc):
                    # The unit is still open: MQDISC now would commit it. Leave the
                    # connection to end with the process, which backs the unit out.
                    log.error(
                        "%s: MQBACK failed (%s, %d); not disconnecting, so as not to commit",
                        self.source.description,
                        self.source.reason_name(_reason(exc)),
                        _reason(exc),
                    )
                    return
        for queue in handles:
            if queue is not None:
                self._quietly("MQCLOSE", queue.close)
        self._quietly("MQDISC", self.qmgr.disconnect)

    def _quietly(self, call: str, action: Callable[[], object]) -> None:
        try:
            action()
        except self.pymqi.Error as exc:
            log.debug("%s: %s during cleanup failed: %s", self.source.description, call, exc)


class _Session(QueueSession):
    def __init__(self, source: IbmMqQueue) -> None:
        self._source = source
        self._conn: _Connection | None = source.open_connection(opening="input")
        self._delivered = 0  # messages returned to the caller in the current unit of work
        self._lost: BaseException | None = None  # the failure that cost us the unit of work
        self._closed = False

    def get(self, wait_seconds: float = 0.0) -> ReceivedMessage | None:
        self._check_open()
        source = self._source
        deadline = source._clock() + max(0.0, wait_seconds)
        reconnected = False
        while True:
            conn = self._connection()
            wait_ms = int(max(0.0, deadline - source._clock()) * 1000)
            try:
                got = conn.get(min(wait_ms, source.max_wait_ms))
                if got is None:
                    continue  # another consumer took it meanwhile
                md, raw = got
                why = self._why_not_returned(conn, md, raw)
                if why is not None and self._move(conn, md, raw, why):
                    continue
            except source.pymqi.MQMIError as exc:
                if _reason(exc) == MQRC_NO_MSG_AVAILABLE:
                    return None
                if not source.is_transient(exc):
                    raise source.error("MQGET", f"queue {source.queue}", exc) from exc
                held = self._delivered
                self._drop(exc)
                if held or reconnected:
                    raise source.unavailable(
                        f"connection lost during MQGET with {held} message(s) in the unit "
                        "of work (the queue manager backs them out; they come again)"
                        if held
                        else "connection lost again right after reconnecting",
                        exc,
                    ) from exc
                log.warning(
                    "%s: connection lost (%s); reconnecting",
                    source.description,
                    source.reason_name(_reason(exc)),
                )
                reconnected = True
                continue
            self._delivered += 1
            return to_received_message(md, raw, source.pymqi.CMQC)

    def _why_not_returned(self, conn: _Connection, md: Any, raw: bytes) -> _MoveReason | None:
        """Why a message just got must be moved aside rather than returned, if it must."""
        limit = self._source.max_get_bytes
        if len(raw) > limit:
            return _MoveReason(
                f"{len(raw)} bytes, over the get limit of {limit} (SIS_IBMMQ_MAX_GET_BYTES)",
                MQRC_TRUNCATED_MSG_FAILED,
                "intake must dead-letter it too-large",
            )
        if 0 < conn.backout_threshold <= md.BackoutCount:
            return _MoveReason(
                f"BackoutCount {md.BackoutCount} >= backout threshold {conn.backout_threshold}",
                MQRC_BACKOUT_THRESHOLD_REACHED,
                "the platform's redelivery limit must dead-letter it",
            )
        return None

    def _move(self, conn: _Connection, md: Any, raw: bytes, why: _MoveReason) -> bool:
        """Move a message out of the way (to the backout queue, else the dead-letter queue),
        in the unit of work; False if no queue took it and it must be delivered."""
        source = self._source
        message_id = "ID:" + bytes(md.MsgId).hex()
        targets: list[tuple[str, Callable[[], None]]] = []
        if conn.backout_queue:
            targets.append((conn.backout_queue, lambda: conn.move_to_backout_queue(md, raw)))
        if conn.dead_letter_queue:
            targets.append(
                (
                    conn.dead_letter_queue,
                    lambda: conn.move_to_dead_letter_queue(md, raw, why.dead_letter_reason),
                )
            )
        for name, move in targets:
            try:
                move()
            except (source.pymqi.MQMIError, IbmMqError) as exc:  # MQOPEN or MQPUT refused
                if source.is_transient(exc):
                    raise
                log.error(
                    "%s: cannot move %s (%s) to %s: %s (%d)",
                    source.description,
                    message_id,
                    why.text,
                    name,
                    source.reason_name(_reason(exc)),
                    _reason(exc),
                )
                continue
            log.warning("%s: moved %s to %s: %s", source.description, message_id, name, why.text)
            return True
        log.error(
            "%s: delivering %s although %s: no backout or dead-letter queue took it; %s",
            source.description,
            message_id,
            why.text,
            why.otherwise,
        )
        return False

    def commit(self) -> None:
        self._check_open()
        source = self._source
        if self._lost is not None:
            lost, self._lost = self._lost, None
            if self._conn is not None:
                self._rollback_quietly(self._conn)
            self._delivered = 0
            raise source.unavailable(
                "the unit of work was lost with its connection and backed out by the queue "
                "manager; nothing was committed",
                lost,
            ) from lost
        conn = self._conn
        if conn is None:
            self._delivered = 0
            return
        try:
            conn.commit()
        except source.pymqi.MQMIError as exc:
            reason = _reason(exc)
            self._delivered = 0
            if reason == MQRC_BACKED_OUT:
                # 2003: the queue manager backed the unit out instead (e.g. after a client
                # reconnect): nothing was consumed.
                raise source.unavailable("MQCMIT backed out instead of committing", exc) from exc
            if source.is_transient(exc):
                self._drop(exc)
                self._lost = None
                raise source.unavailable(
                    "connection lost during MQCMIT: the outcome is unknown, the messages "
                    "may come again",
                    exc,
                ) from exc
            raise source.error("MQCMIT", f"queue manager {source.queue_manager}", exc) from exc
        self._delivered = 0

    def backout(self) -> None:
        self._check_open()
        self._lost = None
        self._delivered = 0
        conn = self._conn
        if conn is None:
            return  # the queue manager backed out the unit when the connection broke
        source = self._source
        try:
            conn.backout()
        except source.pymqi.MQMIError as exc:
            if not source.is_transient(exc):
                raise source.error("MQBACK", f"queue manager {source.queue_manager}", exc) from exc
            # A broken connection's unit is backed out by the queue manager: same outcome.
            self._drop(exc)
            self._lost = None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        conn, self._conn = self._conn, None
        self._delivered = 0
        self._lost = None
        if conn is not None:
            conn.close(backout=True)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self._source.description}: session is closed")

    def _connection(self) -> _Connection:
        if self._conn is None:
            self._conn = self._source.open_connection(opening="input")
            log.info("%s: reconnected", self._source.description)
        return self._conn

    def _drop(self, exc: BaseException) -> None:
        """Forget a failed connection; its unit of work is gone (backed out)."""
        conn, self._conn = self._conn, None
        if self._delivered:
            self._lost = exc
        self._delivered = 0
        if conn is not None:
            # Quiescing (2161/2202) leaves the connection up with the unit open: back out
            # explicitly before MQDISC, which would commit it.
            conn.close(backout=True)

    def _rollback_quietly(self, conn: _Connection) -> None:
        try:
            conn.backout()
        except self._source.pymqi.MQMIError as exc:
            if not self._source.is_transient(exc):
                raise
            self._drop(exc)
            self._lost = None


class _Producer(QueueProducer):
    def __init__(self, source: IbmMqQueue) -> None:
        self._source = source
        self._conn: _Connection | None = source.open_connection(opening="output")
        self._closed = False

    def put(self, body: bytes, message_id: str | None = None) -> str:
        if self._closed:
            raise RuntimeError(f"{self._source.description}: producer is closed")
        source = self._source
        if message_id is None:
            msg_id = os.urandom(24)  # like an MQ MsgId, unique across processes
        else:
            match = _JMS_ID.match(message_id)
            if match is None:
                raise ValueError(f"not a JMS message id (ID: + 48 hex digits): {message_id!r}")
            msg_id = bytes.fromhex(match.group(1))
        reconnected = False
        while True:
            if self._conn is None:
                self._conn = source.open_connection(opening="output")
            try:
                return "ID:" + self._conn.put(body, msg_id).hex()
            except source.pymqi.MQMIError as exc:
                if not source.is_transient(exc):
                    raise source.error("MQPUT", f"queue {source.queue}", exc) from exc
                conn, self._conn = self._conn, None
                conn.close(backout=False)
                if reconnected:
                    raise source.unavailable("connection lost during MQPUT", exc) from exc
                reconnected = True

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close(backout=False)


# -- the message as the platform sees it --------------------------------------------------


def to_received_message(md: Any, raw: bytes, cmqc: Any) -> ReceivedMessage:
    """Turn an MQMD and the bytes MQGET returned into a ReceivedMessage.

    MQRFH2 headers (Format MQHRF2) are parsed and stripped from the body; the body is what
    follows them. A malformed MQRFH2 is left in place with a warning: the platform then sees
    bytes that are not a Sportsdata document and dead-letters the message with those bytes.
    """
    message_id = "ID:" + bytes(md.MsgId).hex()
    body = raw
    properties: dict[str, object] = {}
    fmt, encoding = bytes(md.Format), int(md.Encoding)
    try:
        while fmt == cmqc.MQFMT_RF_HEADER_2:
            header = parse_rfh2(body, encoding)
            properties.update(rfh2_properties(header.folders))
            body = body[header.length :]
            fmt, encoding = header.format, header.encoding
    except Rfh2Error as exc:
        log.warning("%s: MQRFH2 header not understood, kept in the body: %s", message_id, exc)
        body, properties = raw, {}
    put_time = mqmd_put_time(md.PutDate, md.PutTime)
    if put_time is None:
        log.warning(
            "%s: unreadable PutDate/PutTime %r %r; using the time of receipt",
            message_id,
            md.PutDate,
            md.PutTime,
        )
        put_time = datetime.now(UTC)
    return ReceivedMessage(
        message_id=message_id,
        body=bytes(body),
        put_time=put_time,
        delivery_count=int(md.BackoutCount) + 1,
        properties=properties,
    )


def mqmd_put_time(put_date: bytes, put_time: bytes) -> datetime | None:
    """MQMD PutDate "YYYYMMDD" and PutTime "HHMMSSTH" (hundredths), which MQ sets in UTC."""
    try:
        date, clock = put_date.decode("ascii"), put_time.decode("ascii")
        if len(date) != 8 or len(clock) != 8 or not (date + clock).isdigit():
            return None
        return datetime(
            int(date[0:4]),
            int(date[4:6]),
            int(date[6:8]),
            int(clock[0:2]),
            int(clock[2:4]),
            int(clock[4:6]),
            int(clock[6:8]) * 10_000,
            tzinfo=UTC,
        )
    except (UnicodeDecodeError, ValueError):
        return None


_RFH2_FIXED_LENGTH = 36  # MQRFH_STRUC_LENGTH_FIXED_2
_FOLDER_CODECS = {1208: "utf-8", 819: "latin-1", 437: "cp437", 850: "cp850", 1252: "cp1252"}
_UTF16_CCSIDS = frozenset({1200, 13488, 17584})


def parse_rfh2(data: bytes, encoding: int) -> Rfh2:
    """Parse the MQRFH2 at the start of `data`; `encoding` is the MQ encoding of the structure
    before it (the MQMD's), which fixes the byte order of its integers."""
    if len(data) < _RFH2_FIXED_LENGTH or data[:4] != b"RFH ":
        raise Rfh2Error("no MQRFH2 structure id")
    # MQENC_INTEGER_NORMAL (1) is big-endian; MQENC_INTEGER_REVERSED (2, x86) little-endian.
    order = ">" if encoding & 0x0F == 1 else "<"
    version, length, next_encoding, next_ccsid = struct.unpack_from(order + "4i", data, 4)
    next_format = data[20:28]
    _flags, name_value_ccsid = struct.unpack_from(order + "2i", data, 28)
    if version != 2:
        raise Rfh2Error(f"MQRFH2 version {version}, expected 2")
    if length < _RFH2_FIXED_LENGTH or length > len(data):
        raise Rfh2Error(f"MQRFH2 StrucLength {length} outside 36..{len(data)}")
    folders: list[str] = []
    position = _RFH2_FIXED_LENGTH
    while position < length:
        if position + 4 > length:
            raise Rfh2Error("MQRFH2 folder length runs past StrucLength")
        (folder_length,) = struct.unpack_from(order + "i", data, position)
        position += 4
        if folder_length < 0 or position + folder_length > length:
            raise Rfh2Error(f"MQRFH2 folder of {folder_length} bytes runs past StrucLength")
        raw_folder = data[position : position + folder_length]
        folders.append(_decode_folder(raw_folder, name_value_ccsid, order))
        position += folder_length
    return Rfh2(length, next_encoding, next_ccsid, next_format, name_value_ccsid, tuple(folders))


def _decode_folder(raw: bytes, ccsid: int, order: str) -> str:
    if ccsid in _UTF16_CCSIDS:
        codec = "utf-16-be" if order == ">" else "utf-16-le"
    else:
        codec = _FOLDER_CODECS.get(ccsid, "")
        if not codec:
            raise Rfh2Error(f"MQRFH2 NameValueCCSID {ccsid} not supported")
    try:
        text = raw.decode(codec)
    except UnicodeDecodeError as exc:
        raise Rfh2Error(f"MQRFH2 folder not in CCSID {ccsid}: {exc}") from exc
    # Folders are padded to a multiple of four bytes with blanks (some writers use NULs).
    return text.rstrip(" \x00")


# The <jms> folder's fields (IBM MQ "MQRFH2 JMS folder"), as JMS header names.
_JMS_FIELDS: Mapping[str, tuple[str, type]] = {
    "Dst": ("JMSDestination", str),
    "Rto": ("JMSReplyTo", str),
    "Tms": ("JMSTimestamp", int),
    "Exp": ("JMSExpiration", int),
    "Cid": ("JMSCorrelationID", str),
    "Pri": ("JMSPriority", int),
    "Dlv": ("JMSDeliveryMode", int),
    "Gid": ("JMSXGroupID", str),
    "Seq": ("JMSXGroupSeq", int),
}
_XSI = "http://www.w3.org/2001/XMLSchema-instance"
_ROOT_TAG = re.compile(r"\A(\s*<[A-Za-z_][\w.\-]*)")


def rfh2_properties(folders: tuple[str, ...] | list[str]) -> dict[str, object]:
    """Application properties from <usr> (typed by their dt attribute; nested groups become
    dotted names) and JMS header fields from <jms>. Other folders (mcd, mqext) are MQ's own."""
    properties: dict[str, object] = {}
    for text in folders:
        if "xsi:" in text and "xmlns:xsi" not in text:
            # MQ writes null properties as <name xsi:nil="true"/> without declaring xsi.
            text = _ROOT_TAG.sub(rf'\1 xmlns:xsi="{_XSI}"', text, count=1)
        try:
            root = ElementTree.fromstring(text)
        except ElementTree.ParseError as exc:
            raise Rfh2Error(f"MQRFH2 folder is not well-formed XML: {exc}") from exc
        if root.tag == "usr":
            _usr_properties(root, "", properties)
        elif root.tag == "jms":
            for child in root:
                field = _JMS_FIELDS.get(child.tag)
                if field is not None:
                    name, kind = field
                    properties[name] = _typed(child.text or "", kind, child.tag)
    return properties


def _usr_properties(element: ElementTree.Element, prefix: str, out: dict[str, object]) -> None:
    for child in element:
        name = prefix + child.tag
        if len(child):
            _usr_properties(child, name + ".", out)
        elif child.get(f"{{{_XSI}}}nil") == "true":
            out[name] = None
        else:
            out[name] = _usr_value(child.text or "", child.get("dt", "string"), name)


def _usr_value(text: str, dt: str, name: str) -> object:
    if dt in ("i1", "i2", "i4", "i8", "int"):
        return _typed(text, int, name)
    if dt in ("r4", "r8"):
        return _typed(text, float, name)
    if dt == "boolean":
        if text.strip() in ("1", "true"):
            return True
        if text.strip() in ("0", "false"):
            return False
        raise Rfh2Error(f"property {name}: {text!r} is not a boolean")
    if dt == "bin.hex":
        return _typed(text, bytes.fromhex, name)
    return text  # "string", or a type this module does not know


def _typed(text: str, kind: Callable[[str], object], name: str) -> object:
    try:
        return kind(text.strip())
    except ValueError as exc:
        raise Rfh2Error(f"property {name}: {text!r}: {exc}") from exc
