"""The message source as a Dagster resource: one interface, three implementations.

Sensors annotate `QueueSourceResource`; which implementation is bound is decided once, in
`sis_platform.resources.config`, from the settings (sis_platform/settings/). Each resource only
holds configuration and builds the real client (`sis_platform.queues.*`) when asked, so constructing
one never touches the network.

`open()` returns one source object per process and configuration. Dagster builds fresh
resource objects for every sensor tick, but a source may keep state that must outlive a tick:
`StompQueue` counts redeliveries itself, because ActiveMQ over STOMP only says "redelivered"
(see sis_platform/queues/stomp/); it keeps them in a file when configured to (the platform's
configuration always is), and otherwise in the object.

Every source has a backout threshold (DEFAULT_BACKOUT_THRESHOLD, 10, unless configured; 0
turns it off): a message backed out that many times, e.g. one that kills intake before it is
landed, is moved to the backout queue instead of being delivered again.
"""

from __future__ import annotations

import abc
import hashlib
import json
import os
import threading
from typing import Literal

import dagster as dg
from pydantic import Field

from sis_platform.queues.base import DEFAULT_MAX_GET_BYTES, QueueSource
from sis_platform.queues.factory import open_configured
from sis_platform.settings import (
    DEFAULT_BACKOUT_THRESHOLD,
    DEFAULT_IBMMQ_RECONNECT,
    DEFAULT_QUEUE_NAME,
    DEFAULT_STOMP_DESTINATION,
    DEFAULT_STOMP_HEARTBEATS,
    DEFAULT_STOMP_HOST,
    DEFAULT_STOMP_PORT,
    DEFAULT_STOMP_PREFETCH,
    Backout,
    EmbeddedSourceSettings,
    IbmMqSourceSettings,
    SourceSettings,
    StompSourceSettings,
)

_THRESHOLD = (
    "Backouts after which a message is moved to the backout queue instead of being delivered "
    "again (MQ BOTHRESH; 0 = off). Keep it above the redelivery limit, so that a message "
    "coming back is normally landed and dead-lettered, with its record in the message log, "
    "first; the threshold catches what never reaches the log (a message that kills intake)."
)

_SOURCES: dict[str, QueueSource] = {}
_SOURCES_LOCK = threading.Lock()


class QueueSourceResource(dg.ConfigurableResource, abc.ABC):
    """Where the Sportsdata feed is consumed from."""

    def open(self) -> QueueSource:
        """The configured queue, the same object for the same configuration within this
        process (no connection is made until `connect()`)."""
        with _SOURCES_LOCK:
            key = self._source_key()
            source = _SOURCES.get(key)
            if source is None:
                source = _SOURCES[key] = self.build()
            return source

    @abc.abstractmethod
    def settings(self) -> SourceSettings:
        """The source's settings record (sis_platform/settings/records.py) this configuration
        stands for: what `build` opens, through the one settings-to-source mapping
        (`sis_platform.queues.factory.open_configured`)."""

    @abc.abstractmethod
    def build(self) -> QueueSource:
        """A new source object for this configuration (use `open()`, which caches it)."""

    def _source_key(self) -> str:
        # The pid keeps a forked child from inheriting its parent's objects; the digest keeps a
        # resolved password out of the key while still telling changed credentials apart.
        config = json.dumps(self.model_dump(), sort_keys=True, default=str)
        digest = hashlib.sha256(config.encode()).hexdigest()
        return f"{os.getpid()}:{type(self).__module__}.{type(self).__qualname__}:{digest}"


class EmbeddedQueueResource(QueueSourceResource):
    """A durable local queue with MQ syncpoint semantics: the default, needs no broker."""

    path: str = Field(description="Folder holding the queue's database.")
    queue: str = Field(default=DEFAULT_QUEUE_NAME, description="Queue name inside the folder.")
    backout_threshold: int = Field(default=DEFAULT_BACKOUT_THRESHOLD, ge=0, description=_THRESHOLD)
    backout_queue: str | None = Field(
        default=None, description="MQ BOQNAME: where such messages go (default: <queue>.BACKOUT)."
    )

    def settings(self) -> EmbeddedSourceSettings:
        return EmbeddedSourceSettings(
            path=self.path,
            queue=self.queue,
            backout=Backout(self.backout_threshold, self.backout_queue),
        )

    def build(self) -> QueueSource:
        return open_configured(self.settings())


class StompQueueResource(QueueSourceResource):
    """A JMS broker over STOMP (ActiveMQ, Artemis, RabbitMQ)."""

    host: str = DEFAULT_STOMP_HOST
    port: int = DEFAULT_STOMP_PORT
    destination: str = DEFAULT_STOMP_DESTINATION
    user: str | None = None
    password: str | None = Field(
        default=None, repr=False, description="Set from an EnvVar, never inline."
    )
    selector: str | None = Field(
        default=None,
        description="JMS selector over message headers, applied by the broker; messages it "
        "does not select stay on the queue (unlike the feed selector, which records them).",
    )
    heartbeats: list[int] = Field(
        default=list(DEFAULT_STOMP_HEARTBEATS),
        min_length=2,
        max_length=2,
        description="STOMP heart-beats [send, receive] in milliseconds (0 turns one off): a "
        "broker silent for about twice this is taken as gone and the connection reopened.",
    )
    vhost: str | None = Field(
        default=None,
        description="The CONNECT frame's host header, for a broker with virtual hosts "
        "(None: the broker's host name).",
    )
    prefetch: int = Field(
        default=DEFAULT_STOMP_PREFETCH,
        description="Messages the broker pushes ahead of our gets; half of it is ACKed at "
        "once. Those a consumer had not got when it crashed or backed out come back flagged "
        "redelivered and are counted as a delivery.",
    )
    backout_threshold: int = Field(default=DEFAULT_BACKOUT_THRESHOLD, ge=0, description=_THRESHOLD)
    backout_queue: str | None = Field(
        default=None, description="Where such messages go (default: ActiveMQ.DLQ)."
    )
    redelivery_counts: str | None = Field(
        default=None,
        description="File (SQLite) where the source counts the redeliveries it hands out, "
        "since ActiveMQ over STOMP only flags them; it outlives the process, so a message that "
        "kills its consumer still reaches the backout threshold. None: counted in memory only.",
    )
    tls: bool = Field(
        default=False,
        description="Connect over TLS, verifying the broker's certificate and host name "
        "(the settings turn it on for any broker not on this host).",
    )
    ca_file: str | None = Field(
        default=None,
        description="PEM file of the CA(s) the broker's certificate must chain to "
        "(None: the system's trust store).",
    )
    cert_file: str | None = Field(
        default=None, description="PEM client certificate, for a broker that asks for one."
    )
    key_file: str | None = Field(default=None, description="PEM key of the client certificate.")
    key_password: str | None = Field(
        default=None, repr=False, description="Password of the client key: an EnvVar, never inline."
    )
    allow_plaintext_credentials: bool = Field(
        default=False,
        description="Send the password in clear to a broker not on this host (without TLS).",
    )

    def settings(self) -> StompSourceSettings:
        return StompSourceSettings(
            redelivery_counts=self.redelivery_counts,
            host=self.host,
            port=self.port,
            destination=self.destination,
            user=self.user,
            has_password=self.password is not None,
            selector=self.selector,
            prefetch=self.prefetch,
            heartbeats=(self.heartbeats[0], self.heartbeats[1]),
            vhost=self.vhost,
            backout=Backout(self.backout_threshold, self.backout_queue),
            tls=self.tls,
            ca_file=self.ca_file,
            cert_file=self.cert_file,
            key_file=self.key_file,
            has_key_password=self.key_password is not None,
            allow_plaintext_credentials=self.allow_plaintext_credentials,
        )

    def build(self) -> QueueSource:
        return open_configured(
            self.settings(), password=self.password, key_password=self.key_password
        )


class IbmMqQueueResource(QueueSourceResource):
    """IBM MQ through pymqi (extra `ibmmq`; needs the IBM MQ client library)."""

    queue_manager: str
    channel: str
    conn_name: str = Field(description='MQ CONNAME, e.g. "mq1(1414),mq2(1414)".')
    queue: str
    user: str | None = None
    password: str | None = Field(
        default=None, repr=False, description="Set from an EnvVar, never inline."
    )
    cipher_spec: str | None = None
    key_repository: str | None = None
    certificate_label: str | None = Field(
        default=None, description="Client certificate label in the key repository (mutual TLS)."
    )
    ssl_peer_name: str | None = Field(
        default=None,
        description="The channel's SSLPEER: the queue manager certificate's distinguished "
        "name must match it (e.g. 'CN=QM1,O=SIS,C=GB'); needs cipher_spec.",
    )
    client_reconnect: Literal["disabled", "as_def", "any", "qmgr"] = Field(
        default=DEFAULT_IBMMQ_RECONNECT,
        description="MQ client auto-reconnect. 'disabled' leaves reconnecting to the source "
        "(bounded, logged); MQ's own can block a call for up to 30 minutes.",
    )
    backout_threshold: int = Field(
        default=DEFAULT_BACKOUT_THRESHOLD,
        ge=0,
        description="Applied when the queue has no BOTHRESH of its own (BOTHRESH 0): " + _THRESHOLD,
    )
    backout_queue: str | None = Field(
        default=None,
        description="Used when the queue has no BOQNAME; without either, such messages go to "
        "the queue manager's dead-letter queue.",
    )
    max_get_bytes: int = Field(
        default=DEFAULT_MAX_GET_BYTES,
        gt=0,
        description="Largest message returned. A larger one is moved to the backout queue in "
        "the unit of work and never returned (default: twice the platform's largest accepted "
        "body, so a body somewhat over that still reaches the message log as too-large).",
    )

    def settings(self) -> IbmMqSourceSettings:
        return IbmMqSourceSettings(
            queue_manager=self.queue_manager,
            channel=self.channel,
            conn_name=self.conn_name,
            queue=self.queue,
            max_get_bytes=self.max_get_bytes,
            user=self.user,
            has_password=self.password is not None,
            cipher_spec=self.cipher_spec,
            key_repository=self.key_repository,
            certificate_label=self.certificate_label,
            ssl_peer_name=self.ssl_peer_name,
            client_reconnect=self.client_reconnect,
            backout=Backout(self.backout_threshold, self.backout_queue),
        )

    def build(self) -> QueueSource:
        return open_configured(self.settings(), password=self.password)
