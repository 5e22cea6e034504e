"""Drive the platform the way the daemon does, through Dagster's public APIs, in-process.

`Harness` is `sis_platform.testing.inprocess.InProcessPlatform`: a tick evaluates the real sensor
with a real (ephemeral) instance; every run it requests is executed with `execute_in_process` for
its partition, in the order requested (or any order the test chooses). The Delta tables and the
landing zone live under `tmp_path`. What only tests need (a message put at T0 to land directly) is
here.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sis_platform.queues.base import ReceivedMessage, new_message_id
from sis_platform.testing.inprocess import LOG_ASSETS, SENSOR, logged_messages
from sis_platform.testing.inprocess import InProcessPlatform as Harness

__all__ = ["LOG_ASSETS", "SENSOR", "T0", "Harness", "logged_messages", "received"]

T0 = datetime(2026, 11, 21, 12, tzinfo=UTC)


def received(
    body: bytes, message_id: str | None = None, delivery_count: int = 1
) -> ReceivedMessage:
    """A message as a source returns it (put at T0), to land straight into the landing zone."""
    return ReceivedMessage(message_id or new_message_id(), body, T0, delivery_count)
