"""IbmMqQueue: the IBM MQ source's settings, and what its sessions and producers share:
connecting with bounded retries (exponential backoff with jitter), and turning MQ failures
into IbmMqError or SourceUnavailable.

A connection-level reason (mqi.CONNECTION_REASONS) is transient: open_connection retries it
`reconnect_attempts` times, then raises SourceUnavailable. Any other reason raises IbmMqError
at once.
"""

from __future__ import annotations

import copy
import logging
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from sis_platform.queues.base import (
    DEFAULT_MAX_GET_BYTES,
    QueueProducer,
    QueueSession,
    QueueSource,
    SourceUnavailable,
)
from sis_platform.queues.ibmmq.connection import Connection
from sis_platform.queues.ibmmq.mqi import (
    CONNECTION_REASONS,
    ClientReconnect,
    IbmMqError,
    Opening,
    completion_of,
    load_mqi,
    reason_name,
    reason_of,
)
from sis_platform.queues.ibmmq.producer import IbmMqProducer
from sis_platform.queues.ibmmq.session import IbmMqSession
from sis_platform.runtime.backoff import EQUAL, Backoff
from sis_platform.settings.transport import check_ssl_peer_name
from sis_platform.settings.variables import DEFAULT_BACKOUT_THRESHOLD

log = logging.getLogger(__name__)


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
    then `key_repository` names the client key database stem (without ".kdb");
    `ssl_peer_name` (the channel's SSLPEER, e.g. "CN=QM1,O=SIS,C=GB") pins the queue manager's
    certificate: a certificate whose distinguished name does not match is refused. `user` and
    `password` go to the queue manager in an MQCSP (connection authentication).

    `client_reconnect` sets the MQCNO reconnect option. The default "disabled" leaves
    reconnecting to this class, whose attempts are bounded and visible in the logs; MQ's own
    automatic reconnect can block a call for up to its reconnect timeout (30 minutes by
    default), longer than a sensor tick should ever take.

    `max_wait_ms` caps the MQGET WaitInterval, so one get() never waits longer than that even
    when asked to. `max_get_bytes` is the largest message got whole; `backout_threshold` and
    `backout_queue` apply where the queue has no BOTHRESH / BOQNAME (moves.py).
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
        ssl_peer_name: str | None = None,
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
        check_ssl_peer_name(ssl_peer_name, cipher_spec)
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
        self.ssl_peer_name = ssl_peer_name or None
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
        self.clock = clock
        self._pymqi = pymqi_module

    @property
    def description(self) -> str:
        parts = [f"channel {self.channel}", f"conn {self.conn_name}"]
        if self.cipher_spec:
            parts.append(f"TLS {self.cipher_spec}")
        if self.ssl_peer_name:
            parts.append(f"peer {self.ssl_peer_name}")
        if self.user:
            parts.append(f"user {self.user}")
        return (
            f"IBM MQ queue {self.queue} on queue manager {self.queue_manager} ({', '.join(parts)})"
        )

    def __repr__(self) -> str:
        return f"IbmMqQueue({self.description})"

    def connect(self) -> QueueSession:
        return IbmMqSession(self)

    def producer(self) -> QueueProducer:
        return IbmMqProducer(self)

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
            self._pymqi = load_mqi()
        return self._pymqi

    def reveal_password(self) -> str | None:
        """The password, for the MQCSP only (never for logs or messages)."""
        return self._password.reveal() if self._password is not None else None

    def reason_name(self, reason: int) -> str:
        return reason_name(reason, getattr(self._pymqi, "CMQC", None))

    def is_transient(self, exc: BaseException) -> bool:
        return isinstance(exc, self.pymqi.MQMIError) and reason_of(exc) in CONNECTION_REASONS

    def error(self, call: str, target: str, exc: BaseException) -> IbmMqError:
        reason = reason_of(exc)
        return IbmMqError(call, target, completion_of(exc), reason, self.reason_name(reason))

    def unavailable(self, what: str, exc: BaseException) -> SourceUnavailable:
        reason = reason_of(exc)
        return SourceUnavailable(
            f"{self.description}: {what}: {self.reason_name(reason)} ({reason})"
        )

    def backoff_delay(self, retry: int) -> float:
        """Delay before retry number `retry` (1, 2, ...): exponential, capped, with "equal
        jitter" (half fixed, half random) so many consumers do not reconnect in step."""
        backoff = Backoff(
            first=self.reconnect_initial_delay, most=self.reconnect_max_delay, jitter=EQUAL
        )
        return backoff.delay(retry, self._jitter)

    def open_connection(self, opening: Opening) -> Connection:
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
                    self.reason_name(reason_of(last)) if last is not None else "?",
                    delay,
                )
                self._sleep(delay)
            try:
                return Connection(self, opening)
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
