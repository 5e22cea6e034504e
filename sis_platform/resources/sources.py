"""The message source as a Dagster resource: one interface, three implementations.

Sensors annotate `QueueSourceResource`; which implementation is bound is decided once, in
`sis_platform.config`. Each resource only holds configuration and opens the real client
(`sis_platform.queues.*`) when asked, so constructing one never touches the network.
"""

from __future__ import annotations

import abc
from pathlib import Path

import dagster as dg
from pydantic import Field

from sis_platform.queues.base import QueueSource


class QueueSourceResource(dg.ConfigurableResource, abc.ABC):
    """Where the Sportsdata feed is consumed from."""

    @abc.abstractmethod
    def open(self) -> QueueSource:
        """The configured queue (no connection is made until `connect()`)."""


class EmbeddedQueueResource(QueueSourceResource):
    """A durable local queue with MQ syncpoint semantics: the default, needs no broker."""

    path: str = Field(description="Folder holding the queue's database.")
    queue: str = Field(default="SPORTSDATA", description="Queue name inside the folder.")
    backout_threshold: int = Field(
        default=0, description="MQ BOTHRESH: deliveries before a message moves to the backout "
        "queue (0 = off; the platform's redelivery limit still applies)."
    )
    backout_queue: str | None = Field(default=None, description="MQ BOQNAME.")

    def open(self) -> QueueSource:
        from sis_platform.queues.embedded import EmbeddedQueue

        return EmbeddedQueue(
            Path(self.path),
            queue=self.queue,
            backout_threshold=self.backout_threshold,
            backout_queue=self.backout_queue,
        )


class StompQueueResource(QueueSourceResource):
    """A JMS broker over STOMP (ActiveMQ, Artemis, RabbitMQ)."""

    host: str = "127.0.0.1"
    port: int = 61613
    destination: str = "/queue/SPORTSDATA"
    user: str | None = None
    password: str | None = Field(default=None, description="Set from an EnvVar, never inline.")

    def open(self) -> QueueSource:
        from sis_platform.queues.stomp import StompQueue

        return StompQueue(
            host=self.host,
            port=self.port,
            destination=self.destination,
            user=self.user,
            password=self.password,
        )


class IbmMqQueueResource(QueueSourceResource):
    """IBM MQ through pymqi (extra `ibmmq`; needs the IBM MQ client library)."""

    queue_manager: str
    channel: str
    conn_name: str = Field(description='MQ CONNAME, e.g. "mq1(1414),mq2(1414)".')
    queue: str
    user: str | None = None
    password: str | None = Field(default=None, description="Set from an EnvVar, never inline.")
    cipher_spec: str | None = None
    key_repository: str | None = None

    def open(self) -> QueueSource:
        from sis_platform.queues.ibmmq import IbmMqQueue

        return IbmMqQueue(
            queue_manager=self.queue_manager,
            channel=self.channel,
            conn_name=self.conn_name,
            queue=self.queue,
            user=self.user,
            password=self.password,
            cipher_spec=self.cipher_spec,
            key_repository=self.key_repository,
        )
