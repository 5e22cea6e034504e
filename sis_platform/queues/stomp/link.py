"""One STOMP connection to the broker (stomp.py underneath), and the loss of it.

stomp.py's receiver thread hands frames to the caller through a Condition; a lost connection
(socket closed, heartbeat timeout) wakes the waiting caller at once. The session decides what
a loss means (session.py): with no unit of work open it reconnects, with a unit open the
broker has already rolled it back and the caller must back out.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import stomp
import stomp.exception

from sis_platform.queues.base import SourceUnavailable
from sis_platform.settings.transport import TlsFiles

log = logging.getLogger(__name__)


class LinkLost(Exception):
    """The STOMP connection is gone (internal; surfaces as SourceUnavailable)."""


class BrokerError(Exception):
    """The broker answered a request with an ERROR frame."""


@dataclass(frozen=True)
class Endpoint:
    """Where the broker is and how to talk to it: over TLS when `tls` is set (the broker's
    certificate and host name verified), else in clear. The password is kept out of the repr."""

    host: str
    port: int
    user: str | None
    password: str | None = field(repr=False)
    heartbeats: tuple[int, int]
    vhost: str | None
    connect_timeout: float
    receipt_timeout: float
    tls: TlsFiles | None = None

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


class Link(stomp.ConnectionListener):
    """One STOMP connection. stomp.py's receiver thread calls the on_* methods; the caller's
    thread waits on one Condition for messages, receipts and connection loss."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self._cond = threading.Condition()
        self._messages: deque[Any] = deque()
        self._replies: dict[str, Any] = {}
        self._connected = False
        self._lost: str | None = None
        self._refusal = ""  # an ERROR without a receipt: the broker closes the connection next
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
        if endpoint.tls is not None:
            tls = endpoint.tls
            # stomp.py wraps the socket in an SSLContext(PROTOCOL_TLS_CLIENT), which verifies
            # the certificate chain and the host name; verify=True keeps both on.
            self.conn.set_ssl(
                for_hosts=[(endpoint.host, endpoint.port)],
                key_file=tls.key_file,
                cert_file=tls.cert_file,
                ca_certs=tls.ca_file,
                password=tls.key_password,
                verify=True,
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
            elif not self._refusal:
                # E.g. a SEND over the broker's size limit: the reason the connection ends. The
                # first one: ActiveMQ may go on to read the rest of the refused frame as another
                # command and refuse that too ("The maximum command length was exceeded").
                self._refusal = message
            self._cond.notify_all()
        if not receipt_id:
            log.warning("STOMP broker %s sent ERROR: %s", self.endpoint, message)

    def on_disconnected(self) -> None:
        refusal = self._refusal
        self._mark_lost(
            f"connection closed after ERROR: {refusal}" if refusal else "connection closed"
        )

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
            self._no_delay()
        except (stomp.exception.StompException, OSError) as e:
            self.abort()
            why = _tls_failure(ep) or repr(e)
            raise SourceUnavailable(f"cannot connect to STOMP broker {ep}: {why}") from e
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
            if reason is None or reason == "connection closed":
                # A broker that requires a client certificate refuses a TLS 1.3 client only
                # after the handshake, and stomp.py does not say why the connection ended.
                reason = _tls_failure(ep) or reason
            raise SourceUnavailable(
                f"STOMP broker {ep} did not complete CONNECT: {reason or 'timed out'}"
            )

    def _no_delay(self) -> None:
        """TCP_NODELAY on the connection's socket. Frames are small and sent in pairs (the ACKs
        of a unit of work, then its COMMIT): with Nagle's algorithm the second waits for the
        broker's delayed ACK of the first, about 40 ms on Linux, on every commit."""
        sock = getattr(self.conn.transport, "socket", None)
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send(self, action: Callable[[], None]) -> None:
        """Send a frame without waiting for anything."""
        if self._lost is not None:
            raise LinkLost(self._lost)
        try:
            action()
        except (stomp.exception.StompException, OSError) as e:
            self._mark_lost(f"send failed: {e!r}")
            raise LinkLost(self.lost_reason) from e

    def request(self, action: Callable[[str], None], what: str) -> None:
        """Send a frame carrying a receipt header and wait for the broker's RECEIPT."""
        receipt = f"{what}-{uuid.uuid4().hex}"
        self.send(lambda: action(receipt))
        deadline = time.monotonic() + self.endpoint.receipt_timeout
        with self._cond:
            while receipt not in self._replies:
                if self._lost is not None:
                    raise LinkLost(self._lost)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise LinkLost(f"no receipt for {what} within {self.endpoint.receipt_timeout}s")
                self._cond.wait(remaining)
            reply = self._replies.pop(receipt)
        if reply.cmd == "ERROR":
            raise BrokerError(reply.headers.get("message", "") or repr(reply.body))

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
                    raise LinkLost(self._lost)
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


_ALERT_WAIT_SECONDS = 2.0


def _tls_failure(ep: Endpoint) -> str | None:
    """Why a TLS connection to `ep` fails, or None if it is not TLS or the handshake succeeds
    now. stomp.py only logs the handshake's error and then raises ConnectFailedException, so
    after a failed connect one handshake is repeated here with the same context to say which
    certificate check refused the broker."""
    if ep.tls is None:
        return None
    try:
        with socket.create_connection((ep.host, ep.port), timeout=ep.connect_timeout) as raw:
            with ep.tls.context().wrap_socket(raw, server_hostname=ep.host) as tls:
                # With TLS 1.3 the broker's verdict on our certificate (an alert) is the first
                # thing it sends after the handshake; a broker content with it sends nothing
                # until it has a CONNECT frame.
                tls.settimeout(min(ep.connect_timeout, _ALERT_WAIT_SECONDS))
                try:
                    tls.recv(1)
                except TimeoutError:
                    pass
                return None
    except ssl.SSLCertVerificationError as e:
        return f"TLS: the broker's certificate is refused ({e.verify_message})"
    except ssl.SSLError as e:
        if "CERTIFICATE" in (e.reason or ""):  # the broker's alert about our certificate
            return f"TLS: the broker refused the client certificate, or its absence ({e.reason})"
        return f"TLS handshake failed: {e}"
    except (OSError, ValueError):
        return None
