"""Drive the platform the way the daemon does, through Dagster's public APIs, in-process.

`Harness` is `sis_platform.testing.inprocess.InProcessPlatform`: a tick evaluates the real sensor
with a real (ephemeral) instance; every run it requests is executed with `execute_in_process` for
its partition, in the order requested (or any order the test chooses). The Delta tables and the
landing zone live under `tmp_path`. What only tests need (a message put at T0 to land directly) is
here.

One setting differs from production's, for every in-process run of the suite:
`SUITE_SPARK_SQL` (below).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from sis_platform.queues.base import ReceivedMessage, new_message_id
from sis_platform.testing.inprocess import LOG_ASSETS, SENSOR, InProcessPlatform, logged_messages

__all__ = [
    "LOG_ASSETS",
    "SENSOR",
    "SUITE_SPARK_CONF",
    "SUITE_SPARK_SQL",
    "T0",
    "Harness",
    "logged_messages",
    "received",
]

# The suite's in-process runs, and the drivers the kill chains start (tests/faults/driver.py),
# interpret Spark's expressions instead of compiling them as a run's driver does (SHORT_LIVED_SQL
# in sis_platform/lake/driver/conf.py). Either gives the same rows; what differs is time:
# compiling pays off on a season's tables, whose scans evaluate every row, and costs more than it
# saves on the suite's tables of a few rows, where most plans are new (figures in docs/testing.md).
# The tests that run the platform in its own processes as deployed (the daemon's, the browser's,
# tests/cluster, tests/connect) keep production's settings. A test's own SIS_SPARK_CONF replaces
# this one.
SUITE_SPARK_SQL = {"spark.sql.codegen.factoryMode": "NO_CODEGEN"}
# The same, as SIS_SPARK_CONF spells it.
SUITE_SPARK_CONF = " ".join(f"{key}={value}" for key, value in SUITE_SPARK_SQL.items())


@dataclass
class Harness(InProcessPlatform):
    """The in-process platform with the suite's Spark setting (SUITE_SPARK_CONF)."""

    def __post_init__(self) -> None:
        self.overrides = {"SIS_SPARK_CONF": SUITE_SPARK_CONF, **self.overrides}
        super().__post_init__()


T0 = datetime(2026, 11, 21, 12, tzinfo=UTC)


def received(
    body: bytes, message_id: str | None = None, delivery_count: int = 1
) -> ReceivedMessage:
    """A message as a source returns it (put at T0), to land straight into the landing zone."""
    return ReceivedMessage(message_id or new_message_id(), body, T0, delivery_count)
