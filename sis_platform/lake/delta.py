"""Reading and writing the platform's Delta tables at explicit locations.

Tables live at `<base_path>/<table name>` (a local folder, or s3a://, abfss://, gs:// on a
cluster): paths, not a metastore, so the same code runs on a laptop and a cluster, and every
asset says in its metadata exactly where it wrote (STYLE.md: no IO manager hiding the location).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from sis_platform.faults import kill_during_write
from sis_platform.lake.tables import Table

if TYPE_CHECKING:
    from delta.tables import DeltaTable
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)
T = TypeVar("T")

# Bounded retry of a Delta commit that lost an optimistic-concurrency race (DESIGN.md: one
# writer per table is the rule, through the sis_fold pool; batch_log and the partitioned
# message-log tables are written by concurrent backfill runs, which can conflict). A write that
# raised a DeltaConcurrentModificationException did not commit, so repeating it is safe.
CONFLICT_ATTEMPTS = 5
CONFLICT_BACKOFF_SECONDS = 0.5


def _conflict_exceptions() -> tuple[type[Exception], ...]:
    # Every commit conflict Delta raises. The specific ones do not derive from
    # DeltaConcurrentModificationException in delta-spark's Python API, so all are named.
    from delta import exceptions as e

    return (
        e.DeltaConcurrentModificationException, e.ConcurrentWriteException,
        e.MetadataChangedException, e.ProtocolChangedException, e.ConcurrentAppendException,
        e.ConcurrentDeleteReadException, e.ConcurrentDeleteDeleteException,
        e.ConcurrentTransactionException,
    )


class Lake:
    def __init__(
        self,
        spark: SparkSession,
        base_path: str,
        *,
        conflict_attempts: int = CONFLICT_ATTEMPTS,
        conflict_backoff_seconds: float = CONFLICT_BACKOFF_SECONDS,
    ) -> None:
        self.spark = spark
        self.base_path = base_path.rstrip("/")
        self.conflict_attempts = conflict_attempts
        self.conflict_backoff_seconds = conflict_backoff_seconds

    def retrying_conflicts(self, what: str, write: Callable[[], T]) -> T:
        """Run `write` (one Delta commit), again on a concurrency conflict, with exponential
        backoff and jitter, at most `conflict_attempts` times; then the conflict is raised."""
        for attempt in range(1, self.conflict_attempts + 1):
            try:
                return write()
            except _conflict_exceptions() as error:
                if attempt == self.conflict_attempts:
                    raise
                delay = self.conflict_backoff_seconds * 2 ** (attempt - 1)
                delay *= random.uniform(0.5, 1.5)
                log.warning(
                    "%s: Delta conflict (%s), attempt %d of %d, retrying in %.2f s",
                    what, type(error).__name__, attempt, self.conflict_attempts, delay,
                )
                time.sleep(delay)  # backoff between attempts, not synchronisation
        raise AssertionError("unreachable")

    def path(self, table: Table) -> str:
        return f"{self.base_path}/{table.name}"

    def _log_versions(self, table: Table) -> list[int] | None:
        """The commit versions in the table's Delta log (`_delta_log/NNNN.json`), listed through
        the session's Hadoop file system without a Spark job; None where there is no JVM to ask
        (a Spark Connect session)."""
        jvm = getattr(self.spark, "_jvm", None)
        jsc = getattr(getattr(self.spark, "sparkContext", None), "_jsc", None)
        if jvm is None or jsc is None:
            return None
        log = jvm.org.apache.hadoop.fs.Path(self.path(table) + "/_delta_log")
        fs = log.getFileSystem(jsc.hadoopConfiguration())
        if not fs.exists(log):
            return []
        versions = []
        for status in fs.listStatus(log):
            name = status.getPath().getName()
            if name.endswith(".json") and name[:-5].isdigit():
                versions.append(int(name[:-5]))
            elif name == "_last_checkpoint":
                versions.append(-1)  # older commits cleaned up: the table exists
        return versions

    def exists(self, table: Table) -> bool:
        # Listing the log costs a file system call; DeltaTable.isDeltaTable loads a snapshot
        # (a Spark job), which in a fold step's bookkeeping added up to seconds.
        versions = self._log_versions(table)
        if versions is not None:
            return bool(versions)
        from delta.tables import DeltaTable

        return bool(DeltaTable.isDeltaTable(self.spark, self.path(table)))

    def ensure(self, *tables: Table) -> None:
        """Create each table empty, with its schema, partitioning and properties, if it does not
        exist (an existing table keeps its own: see README, "Upgrading a lake")."""
        from delta.tables import DeltaTable

        for table in tables:
            if self.exists(table):
                continue
            builder = (
                DeltaTable.createIfNotExists(self.spark)
                .location(self.path(table))
                .addColumns(table.schema())
            )
            if table.partition_by:
                builder = builder.partitionedBy(*table.partition_by)
            for key, value in table.properties().items():
                builder = builder.property(key, value)
            builder.execute()

    def table(self, table: Table) -> DeltaTable:
        from delta.tables import DeltaTable

        return DeltaTable.forPath(self.spark, self.path(table))

    def read(self, table: Table, *, version: int | None = None) -> DataFrame:
        reader = self.spark.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        return reader.load(self.path(table))

    def version(self, table: Table) -> int:
        """The table's current Delta version (its latest commit): the newest commit file of its
        log, or (Spark Connect) the table's history."""
        versions = self._log_versions(table)
        if versions and max(versions) >= 0:
            return max(versions)
        row = self.table(table).history(1).select("version").first()
        assert row is not None
        return int(row["version"])

    def replace_where(self, table: Table, df: DataFrame, condition: str) -> None:
        """Atomically replace the rows matching `condition` with `df`: one Delta commit, so a
        re-run of the same partition replaces its rows instead of appending them again."""
        df = kill_during_write(df, f"write.{table.name}")
        writer = (
            df.select(*[f.name for f in table.schema().fields])
            .write.format("delta")
            .mode("overwrite")
            .option("replaceWhere", condition)
        )
        self.retrying_conflicts(
            f"{table.name} replaceWhere {condition}", lambda: writer.save(self.path(table))
        )

    def append(self, table: Table, df: DataFrame, *, txn_app_id: str | None = None) -> None:
        """Append `df` in one commit. With `txn_app_id`, the write is made idempotent across its
        own retries: Delta skips an append whose (txnAppId, txnVersion) it has already
        committed. The version is taken once per logical write (wall clock, ns), so a retry of
        this write is skipped if its first attempt did commit, while any later write, even one
        repeating the same step after `recover` restored the table, has a higher version and is
        never skipped."""
        df = kill_during_write(df, f"write.{table.name}")
        writer = (
            df.select(*[f.name for f in table.schema().fields]).write.format("delta").mode("append")
        )
        if txn_app_id is not None:
            writer = writer.option("txnAppId", txn_app_id).option("txnVersion", time.time_ns())
        self.retrying_conflicts(f"{table.name} append", lambda: writer.save(self.path(table)))

    def merge_rows(self, table: Table, rows: DataFrame, *, keys: Sequence[str]) -> None:
        """Upsert `rows` by `keys` (insert or replace whole rows): idempotent by construction."""
        condition = " AND ".join(f"t.{k} = s.{k}" for k in keys)
        rows = kill_during_write(rows, f"write.{table.name}")
        self.retrying_conflicts(
            f"{table.name} merge",
            lambda: self.table(table).alias("t").merge(rows.alias("s"), condition)
            .whenMatchedUpdateAll()
            .whenNotMatchedInsertAll()
            .execute(),
        )
