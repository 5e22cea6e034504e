"""Reading and writing the platform's Delta tables at explicit locations.

Tables live at `<base_path>/<table name>` (a local folder, or s3a://, abfss://, gs:// on a
cluster): paths, not a metastore, so the same code runs on a laptop and a cluster, and every
asset says in its metadata exactly where it wrote (no IO manager hiding the location).

Table operations beyond reads and DataFrame writes (create, merge, delete, update, restore,
history) are Delta's SQL commands on `delta.`<path>``, not the `DeltaTable` Python API: the
same statements run in a local driver and over Spark Connect against any server with Delta's
SQL extension, where `DeltaTable` needs the server to load the Delta Connect plugin as well.
"""

from __future__ import annotations

import logging
import math
import os
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

# Importing Delta's exceptions installs the conversion of its JVM conflicts into them: a
# conflict raised before that arrives as a bare Py4JJavaError, which the bounded retry
# (retrying_conflicts) does not recognise.
from delta import exceptions as delta_errors
from pyspark.errors import AnalysisException

from sis_platform.lake.tables import Table
from sis_platform.runtime.backoff import AROUND, Backoff
from sis_platform.runtime.faults import kill_during_write
from sis_platform.settings import LakeUpkeepSettings

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)
T = TypeVar("T")

# Bounded retry of a Delta commit that lost an optimistic-concurrency race (docs/design.md: one
# writer per table is the rule, through the sis_fold pool; batch_log and the partitioned
# message-log tables are written by concurrent backfill runs, which can conflict). A write that
# raised a DeltaConcurrentModificationException did not commit, so repeating it is safe.
CONFLICT_ATTEMPTS = 5
CONFLICT_BACKOFF_SECONDS = 0.5


# What DESCRIBE HISTORY says of a path that holds no Delta table (missing or another format).
_NOT_A_DELTA_TABLE = {"DELTA_TABLE_ONLY_OPERATION", "DELTA_MISSING_DELTA_TABLE", "PATH_NOT_FOUND"}


def is_remote(spark: SparkSession) -> bool:
    """A Spark Connect session (no JVM in this process)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def sql_identifier(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def sql_string(value: str) -> str:
    """A Spark SQL string literal (backslash escapes are on by default)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def sql_in(column: str, values: Iterable[str | int]) -> str:
    """`column IN (...)` over literals (strings quoted by `sql_string`, integers as such), in
    sorted order; `false` when there are none. Literals, so Delta prunes partitions and skips
    files by them."""
    literals = [sql_string(v) if isinstance(v, str) else str(int(v)) for v in sorted(values)]
    return f"{column} IN ({', '.join(literals)})" if literals else "false"


def _commit_versions(names: Iterable[str]) -> list[int]:
    versions = []
    for name in names:
        if name.endswith(".json") and name[:-5].isdigit():
            versions.append(int(name[:-5]))
        elif name == "_last_checkpoint":
            versions.append(-1)  # older commits cleaned up: the table exists
    return versions


# Every commit conflict Delta raises. The specific ones do not derive from
# DeltaConcurrentModificationException in delta-spark's Python API, so all are named. Over Spark
# Connect, delta.connect.exceptions maps the server's conflicts onto subclasses of these same
# classes (importing it registers the mapping with PySpark).
CONFLICT_EXCEPTIONS: tuple[type[Exception], ...] = (
    delta_errors.DeltaConcurrentModificationException,
    delta_errors.ConcurrentWriteException,
    delta_errors.MetadataChangedException,
    delta_errors.ProtocolChangedException,
    delta_errors.ConcurrentAppendException,
    delta_errors.ConcurrentDeleteReadException,
    delta_errors.ConcurrentDeleteDeleteException,
    delta_errors.ConcurrentTransactionException,
)


class Lake:
    def __init__(
        self,
        spark: SparkSession,
        base_path: str,
        *,
        conflict_attempts: int = CONFLICT_ATTEMPTS,
        conflict_backoff_seconds: float = CONFLICT_BACKOFF_SECONDS,
        upkeep: LakeUpkeepSettings | None = None,
    ) -> None:
        self.spark = spark
        # When the fold and the model compact and vacuum their tables (sis_platform/lake/upkeep.py).
        self.upkeep = upkeep if upkeep is not None else LakeUpkeepSettings()
        self.base_path = base_path.rstrip("/")
        self.conflict_attempts = conflict_attempts
        self.conflict_backoff_seconds = conflict_backoff_seconds
        self._conflict_backoff = Backoff(
            first=conflict_backoff_seconds, most=math.inf, jitter=AROUND
        )
        self.remote = is_remote(spark)
        self.writer_tag: str | None = None
        # Over Spark Connect, a lake folder that exists here is the server's (see _log_versions).
        local = base_path.removeprefix("file:") if "://" not in base_path else None
        self._local_base = (
            Path(local)
            if self.remote and local and os.path.isabs(local) and os.path.isdir(local)
            else None
        )
        # Over Spark Connect the conversion is delta.connect's. Imported here, only for a remote
        # session: it pulls in PySpark's Connect client (measured 0.7 s on top of pyspark),
        # which a local driver never uses.
        if self.remote:
            import delta.connect.exceptions  # noqa: F401  (see CONFLICT_EXCEPTIONS)

    def claim_writer(self, role: str) -> list[str]:
        """Make this Lake the writer of `role` (one at a time: the fold's pool), tagging each of
        its later writes with it. Over Spark Connect an operation outlives a client that dies
        (the server runs it on; a killed run's last write could otherwise commit while the
        next run recovers and refolds), so the operations a previous writer of the role left
        running in the deployment's shared session are interrupted first. A local driver dies
        with its run, so there it only tags. Returns the ids of the interrupted operations."""
        interrupted = list(self.spark.interruptTag(role)) if self.remote else []
        if interrupted:
            log.warning(
                "interrupted %d operation(s) a previous %s left running on the Spark Connect "
                "server: %s",
                len(interrupted),
                role,
                ", ".join(interrupted),
            )
        self.writer_tag = role
        return interrupted

    @contextmanager
    def sql_settings(self, settings: Mapping[str, str]) -> Iterator[None]:
        """The session's SQL `settings` for the block, each put back as it was after it (unset
        if it was unset): for work that wants other settings than the run's (the upkeep's
        compaction, the model's writes; lake/driver/conf.py says why)."""
        before = {name: self.spark.conf.get(name, None) for name in settings}
        for name, value in settings.items():
            self.spark.conf.set(name, value)
        try:
            yield
        finally:
            for name, was in before.items():
                if was is None:
                    self.spark.conf.unset(name)
                else:
                    self.spark.conf.set(name, was)

    @contextmanager
    def _tagged(self) -> Iterator[None]:
        # Spark Connect tags are per client thread: each write sets its own (the model writes
        # its three tables from three threads).
        if not (self.remote and self.writer_tag):
            yield
            return
        self.spark.addTag(self.writer_tag)
        try:
            yield
        finally:
            self.spark.removeTag(self.writer_tag)

    def retrying_conflicts(self, what: str, write: Callable[[], T]) -> T:
        """Run `write` (one Delta commit), again on a concurrency conflict, with exponential
        backoff and jitter, at most `conflict_attempts` times; then the conflict is raised."""
        for attempt in range(1, self.conflict_attempts + 1):
            try:
                with self._tagged():
                    return write()
            except CONFLICT_EXCEPTIONS as error:
                if attempt == self.conflict_attempts:
                    raise
                delay = self._conflict_backoff.delay(attempt)
                log.warning(
                    "%s: Delta conflict (%s), attempt %d of %d, retrying in %.2f s",
                    what,
                    type(error).__name__,
                    attempt,
                    self.conflict_attempts,
                    delay,
                )
                time.sleep(delay)  # backoff between attempts, not synchronisation
        raise AssertionError("unreachable")

    def path(self, table: Table) -> str:
        return f"{self.base_path}/{table.name}"

    def _log_versions(self, table: Table) -> list[int] | None:
        """The commit versions in the table's Delta log (`_delta_log/NNNN.json`), listed without
        a Spark job: through the driver's Hadoop file system, or over Spark Connect directly,
        where the lake is a local folder this process sees (a server on this machine: every
        Spark Connect request is a round trip, and a table's history one more job). None where
        neither can list it (Spark Connect, and the lake elsewhere)."""
        if not self.remote:
            jvm = self.spark._jvm
            assert jvm is not None  # a local or cluster driver: py4j
            log = jvm.org.apache.hadoop.fs.Path(self.path(table) + "/_delta_log")
            # The session's Hadoop configuration, as Delta's own reads use: it holds the
            # settings set on the session once it runs (an object store's keys, from
            # SIS_SPARK_SECRET_CONF), which the SparkContext's configuration does not.
            hadoop_conf = self.spark._jsparkSession.sessionState().newHadoopConf()
            fs = log.getFileSystem(hadoop_conf)
            if not fs.exists(log):
                return []
            return _commit_versions(status.getPath().getName() for status in fs.listStatus(log))
        if self._local_base is None:
            return None
        log_dir = self._local_base / table.name / "_delta_log"
        return _commit_versions(os.listdir(log_dir)) if log_dir.is_dir() else []

    def sql_table(self, table: Table) -> str:
        """The table as Delta SQL names it: delta.`<path>`."""
        return "delta." + sql_identifier(self.path(table))

    def exists(self, table: Table) -> bool:
        # Listing the log costs a file system call; a snapshot load (DESCRIBE HISTORY,
        # DeltaTable.isDeltaTable) is a Spark job, which in a fold step's bookkeeping added up
        # to seconds.
        versions = self._log_versions(table)
        if versions is not None:
            return bool(versions)
        return self._history_version(table) is not None

    def ensure(self, *tables: Table) -> None:
        """Create each table empty, with its schema, partitioning and properties, if it does not
        exist (an existing table keeps its own: see README, "Upgrading a lake")."""
        for table in tables:
            if self.exists(table):
                continue
            columns = ", ".join(
                f"{sql_identifier(f.name)} {f.dataType.simpleString()}"
                + ("" if f.nullable else " NOT NULL")
                for f in table.schema().fields
            )
            for column in table.generated:
                columns += (
                    f", {sql_identifier(column.name)} {column.sql_type} NOT NULL"
                    f" GENERATED ALWAYS AS ({column.expression})"
                )
            statement = f"CREATE TABLE IF NOT EXISTS {self.sql_table(table)} ({columns})"
            statement += " USING delta"
            if table.partition_by:
                partitioning = ", ".join(map(sql_identifier, table.partition_by))
                statement += f" PARTITIONED BY ({partitioning})"
            if properties := table.properties():
                statement += " TBLPROPERTIES ({})".format(
                    ", ".join(f"'{k}' = '{v}'" for k, v in sorted(properties.items()))
                )
            self.spark.sql(statement)

    def row_counts(self, *tables: Table) -> dict[str, int]:
        """Each table's rows, by name. Delta answers a count from its files' statistics (and
        deletion vectors' cardinalities) without reading rows; the counts run concurrently, so
        the driver-side work of one (its snapshot, its plan) overlaps the others'."""
        with ThreadPoolExecutor(max(1, len(tables)), thread_name_prefix="row-count") as pool:
            counts = {t.name: pool.submit(self._count, t) for t in tables}
            return {name: future.result() for name, future in counts.items()}

    def _count(self, table: Table) -> int:
        return self.read(table).count()

    def read(self, table: Table, *, version: int | None = None) -> DataFrame:
        reader = self.spark.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        return reader.load(self.path(table))

    def changes(self, table: Table, *, after: int, up_to: int) -> DataFrame:
        """The rows of `table` that commits `after`+1 .. `up_to` inserted, updated or deleted:
        Delta's change data feed (`_change_type`: insert, update_preimage, update_postimage,
        delete; `_commit_version`). Raises where the feed was not recorded for the whole range
        (a table created without it, commits past the log's retention): read the table."""
        return (
            self.spark.read.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", after + 1)
            .option("endingVersion", up_to)
            .load(self.path(table))
        )

    def version(self, table: Table) -> int:
        """The table's current Delta version (its latest commit): the newest commit file of its
        log, or (Spark Connect) the table's history."""
        versions = self._log_versions(table)
        if versions and max(versions) >= 0:
            return max(versions)
        version = self._history_version(table)
        if version is None:
            raise FileNotFoundError(f"no Delta table at {self.path(table)}")
        return version

    def _history_version(self, table: Table) -> int | None:
        """The newest commit's version from the table's history; None where there is no table."""
        try:
            row = (
                self.spark.sql(f"DESCRIBE HISTORY {self.sql_table(table)} LIMIT 1")
                .select("version")
                .first()
            )
        except AnalysisException as error:
            if error.getCondition() in _NOT_A_DELTA_TABLE:
                return None
            raise
        return None if row is None else int(row["version"])

    def restore(self, table: Table, version: int) -> None:
        """Take the table back to `version` (a new commit: later versions stay in its log)."""
        self.retrying_conflicts(
            f"{table.name} restore to {version}",
            lambda: self.spark.sql(
                f"RESTORE TABLE {self.sql_table(table)} TO VERSION AS OF {int(version)}"
            ),
        )

    def delete(self, table: Table, condition: str) -> None:
        """Delete the rows matching the SQL `condition`, in one commit."""
        self.retrying_conflicts(
            f"{table.name} delete where {condition}",
            lambda: self.spark.sql(f"DELETE FROM {self.sql_table(table)} WHERE {condition}"),
        )

    def update(self, table: Table, condition: str, assignments: Mapping[str, str]) -> None:
        """Set columns (to SQL expressions) in the rows matching the SQL `condition`."""
        sets = ", ".join(f"{sql_identifier(c)} = {e}" for c, e in assignments.items())
        self.retrying_conflicts(
            f"{table.name} update where {condition}",
            lambda: self.spark.sql(f"UPDATE {self.sql_table(table)} SET {sets} WHERE {condition}"),
        )

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
        committed. The version is the table's own log position, taken once per logical write
        (the version this write creates if nothing commits before it), so a retry of this
        write is skipped if its first attempt did commit, while any later write, even one
        repeating the same step after `recover` restored the table (a restore is a commit),
        comes after it in the table's log and is never skipped. Never the clock: a write on a
        host whose clock is behind the previous writer's would be skipped silently."""
        df = kill_during_write(df, f"write.{table.name}")
        writer = (
            df.select(*[f.name for f in table.schema().fields]).write.format("delta").mode("append")
        )
        if txn_app_id is not None:
            writer = writer.option("txnAppId", log_position_app_id(txn_app_id)).option(
                "txnVersion", self.version(table) + 1
            )
        self.retrying_conflicts(f"{table.name} append", lambda: writer.save(self.path(table)))

    def merge_rows(
        self, table: Table, rows: DataFrame, *, keys: Sequence[str], where: str | None = None
    ) -> None:
        """Upsert `rows` by `keys` (insert or replace whole rows): idempotent by construction.
        `where` (on the target, aliased `t`) limits the rows that can match, with literals on
        its partition columns so that Delta reads those partitions only; every row to replace
        must satisfy it, or it is inserted beside the old one."""
        condition = " AND ".join(f"t.{sql_identifier(k)} = s.{sql_identifier(k)}" for k in keys)
        if where is not None:
            condition = f"({condition}) AND ({where})"
        self._merge(
            table,
            kill_during_write(rows, f"write.{table.name}"),
            condition,
            "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *",
        )

    def delete_matching(self, table: Table, source: DataFrame, condition: str) -> None:
        """Delete the rows `t` of the table that match a row `s` of `source` on `condition`."""
        self._merge(table, source, condition, "WHEN MATCHED THEN DELETE")

    def _merge(self, table: Table, source: DataFrame, condition: str, clauses: str) -> None:
        # MERGE reads its source by name: a temporary view, named uniquely because a Spark
        # Connect session is shared by the deployment's runs (config.shared_spark_session).
        view = f"sis_merge_source_{uuid.uuid4().hex}"
        source.createOrReplaceTempView(view)
        try:
            self.retrying_conflicts(
                f"{table.name} merge",
                lambda: self.spark.sql(
                    f"MERGE INTO {self.sql_table(table)} AS t USING {view} AS s "
                    f"ON {condition} {clauses}"
                ),
            )
        finally:
            self.spark.catalog.dropTempView(view)


def log_position_app_id(txn_app_id: str) -> str:
    """The Delta txnAppId under which `txn_app_id`'s appends are keyed on the table's log
    position. Distinct from the bare id, which tables written before kept keyed on the wall
    clock (nanoseconds): a log position is far below those, and would be skipped forever."""
    return f"{txn_app_id}@log-position"
