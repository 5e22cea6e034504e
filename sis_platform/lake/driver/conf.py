"""The Spark configuration every driver of the platform starts with, Dagster-free: Delta's
SQL extension and catalog, Delta's jars, a local driver's scratch and class-data archive, and
the settings short-lived drivers need (the Dagster resource in sis_platform/resources/spark.py,
the class-archive workload and the jar cache build on it).

By default Spark's own resolver fetches `io.delta:delta-spark_<spark>_<scala>:<delta-spark
version>` from Maven Central at first start and caches it (~/.ivy2*). Where that resolver cannot
reach Maven Central, fetch the jars once with `scripts/fetch_delta_jars.sh` (mvn
dependency:copy into a cache folder) and set `SIS_SPARK_JARS_DIR` to that folder: the jars are
then passed as `spark.jars`.
"""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

from sis_platform.settings import (
    DEFAULT_DRIVER_MEMORY,
    DEFAULT_SHUFFLE_PARTITIONS,
    DEFAULT_SPARK_MASTER,
    is_local_master,
)

SCALA_VERSION = "2.13"


def delta_package() -> str:
    """The Maven coordinate of the Delta jar matching the installed pyspark and delta-spark
    (the same rule as delta.pip_utils.configure_spark_with_delta_pip)."""
    spark_major_minor = ".".join(version("pyspark").split(".")[:2])
    return f"io.delta:delta-spark_{spark_major_minor}_{SCALA_VERSION}:{version('delta-spark')}"


# A run's driver plans and runs each of its queries a handful of times. Whole-stage code
# generation writes and compiles (Janino, then the JIT) Java for every new plan, which a driver
# that lives one run does not repay: it is off. Expressions are still compiled (Spark's default
# factoryMode, FALLBACK): the scans that grow with the lake's tables (the model's replaceWhere
# of a step's masters, the dedupe's lookup in message_outcomes) evaluate every row of the
# table through them, and interpreted that doubled a run's time by day 30 (31.8 s on day 1,
# 69.5 s on day 30 without, 51.8 s with; BENCHMARKS.md, "Running for a season"), where on day 1
# it saved nothing measurable. A long-lived driver keeps both: its compiled code is reused run
# after run. Adaptive execution stays on, although a cold driver is a little faster without it:
# it coalesces a write's shuffle partitions into one file, so each write adds fewer files to
# the lake's tables. SIS_SPARK_CONF overrides either setting. FALLBACK is named although it is
# Spark's default: it is the configuration the season benchmark measured (set through
# SIS_SPARK_CONF), and day-1 runs with the setting left to its default were measured slower in
# short A/B runs (cause not found; BENCHMARKS.md, "Running for a season").
SHORT_LIVED_SQL = {
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "FALLBACK",
}
# What the upkeep sets while it rewrites a table's files in bulk (the compaction), whatever
# SIS_SPARK_CONF says of a run's expressions: Delta computes every written row's data-skipping
# statistics with a projection, which without generated code costs ~160 us a row (a compaction
# of day 30's `selections`: 183 s against 30 s; BENCHMARKS.md, "Running for a season").
BULK_WRITE_SQL = {"spark.sql.codegen.factoryMode": "FALLBACK"}
# What the model sets while it replaces a step's masters' rows in events, markets and
# selections, tables whose files carry deletion vectors. Without whole-stage code generation
# Delta reads such a file row by row, filtering the deleted rows one at a time, several times
# slower than with it on a season's tables; whole runs with it cost more than they save on
# small ones, so only these writes take it (the figures: BENCHMARKS.md, "Running for a
# season").
DELETION_VECTOR_SCAN_SQL = {"spark.sql.codegen.wholeStage": "true"}


# What Spark counts opening a file as when it splits a scan into tasks (Spark's default: 4 MiB),
# also its smallest split. At the default, a batch's files (9 MB landed, 17 MB in raw_messages
# at 50,000 messages) split 70/30 between two cores; at 1 MiB about evenly, so the steps that
# read a batch's files (raw_messages, hash_chain_intact, message_items) use both cores.
# SIS_SPARK_CONF overrides it.
FILE_OPEN_COST_BYTES = 1024 * 1024

# How a driver writes Delta's log files (a commit's JSON, its .crc checksum) on a local or
# mounted file system (file: paths; other schemes keep their own log stores). By default both go
# through Hadoop's FileContext, whose no-overwrite rename asks each of the four names involved
# (the file and its checksum file, before and after) for its link status, which Hadoop's local
# file system answers by starting a `readlink` process: eight processes a commit, most of the
# processes a cold run starts. Through the
# FileSystem API the same exists-then-rename is a few system calls. For a commit it is not
# weaker: on a local file system FileContext's no-overwrite rename is exists-then-rename too
# (Delta's HDFSLogStore says as much), so neither is atomic between processes, and LocalLogStore
# adds a lock between one driver's threads. The one difference: LocalLogStore writes the
# `_last_checkpoint` hint in place where HDFSLogStore renames it into place, and Delta reads that
# hint defensively (a torn one is retried, then replaced by listing the log).
# The processes left are `chmod`s of new files (without Hadoop's native library, its local
# file system sets a new file's mode that way).
LOCAL_FILE_WRITES = {
    "spark.delta.logStore.file.impl": "io.delta.storage.LocalLogStore",
    "spark.sql.streaming.checkpointFileManagerClass": (
        "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
    ),
}


def delta_spark_config(
    *,
    master: str = DEFAULT_SPARK_MASTER,
    app_name: str = "sis-platform",
    shuffle_partitions: int = DEFAULT_SHUFFLE_PARTITIONS,
    driver_memory: str = DEFAULT_DRIVER_MEMORY,
    ui_enabled: bool = True,
    jars_dir: str | None = None,
    class_archive: str | None = None,
    long_lived: bool = False,
    extra: dict[str, str] | None = None,
) -> dict[str, str]:
    """Spark's configuration for the platform: a driver's, or for `sc://` a Spark Connect
    client's (its session's SQL settings only). `class_archive`: a JVM class-data archive for a
    local driver (see jvm_archive.py), None for none. `long_lived`: the driver serves many runs
    (a Spark Connect server, one process running batch after batch), not one run: it keeps
    the full JIT and Spark's code generation (SHORT_LIVED_SQL)."""
    # The session's own SQL settings: the only ones a Spark Connect client may set.
    session: dict[str, str] = {
        # A handful of shuffle partitions: a batch is thousands of rows, not billions, and the
        # default 200 tiny tasks per shuffle cost more than the work on two cores.
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # Delta rebuilds a table's snapshot with 50 tasks by default: for tables of a few
        # hundred files that is pure scheduling overhead on every read and write.
        "spark.databricks.delta.snapshotPartitions": str(max(1, shuffle_partitions)),
        "spark.sql.files.openCostInBytes": str(FILE_OPEN_COST_BYTES),
        # VACUUM lists a table's folder in a job of this many tasks. Spark's default (10,000)
        # cost 24-47 s per VACUUM of a table of a few files on two cores, against 4-5 s at 4
        # (scripts/bench_upkeep.py, BENCHMARKS.md "The lake's upkeep").
        "spark.sql.sources.parallelPartitionDiscovery.parallelism": str(max(1, shuffle_partitions)),
    }
    if master.startswith("sc://"):
        # Delta's extension, memory and jars are the server's (cli/spark_connect.py); setting
        # them from a client fails (static settings of a running driver).
        return {"spark.remote": master, **session, **(extra or {})}
    conf: dict[str, str] = {
        "spark.app.name": app_name,
        "spark.master": master,
        "spark.driver.memory": driver_memory,
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        **session,
        "spark.ui.enabled": str(ui_enabled).lower(),
        "spark.ui.showConsoleProgress": "false",
        # Hadoop's file systems set each file's and folder's mode themselves, from this mask
        # (default 022: files 0644, folders 0755), whatever the process's umask: the lake's
        # files are its user's alone (sis_platform/runtime/private.py). A lake that another account
        # must read is opened to it with SIS_SPARK_CONF (or the object store's own policies).
        "spark.hadoop.fs.permissions.umask-mode": "077",
        **LOCAL_FILE_WRITES,
    }
    # A run's JVMs live for one run: the C2 JIT compiler would spend a core for minutes
    # optimising code that runs a few times. C1 only starts fast and is plenty for batch-sized
    # work. But a C1-only JVM sizes its code cache for a small client program (48 MB), which
    # Spark and Delta fill early in a run, after which the JVM stops compiling (everything new
    # runs interpreted) and dies with "Out of space in CodeCache for adapters". 240 MB is the
    # tiered JVM's own default; only the part in use is resident.
    # A long-lived driver keeps C2: it repays its compile time within a few runs, and the
    # saving grows with every run after them.
    # The throughput collector, not the JVM's default G1: the work is batches, where a pause of
    # a few hundred milliseconds costs nothing, and G1's concurrent marking costs CPU beside
    # every run.
    options = ["-XX:+UseParallelGC", "-XX:ReservedCodeCacheSize=240m"]
    if not long_lived:
        options.insert(0, "-XX:TieredStopAtLevel=1")
        conf.update(SHORT_LIVED_SQL)
    archive: list[str] = []
    if is_local_master(master):
        conf["spark.driver.host"] = "127.0.0.1"
        conf["spark.driver.bindAddress"] = "127.0.0.1"
        if class_archive:
            archive.append(f"-XX:SharedArchiveFile={class_archive}")
    else:
        # On a cluster the driver is still the run's process (client mode) and the executors
        # run the tasks; they live as long as that driver (one application per run), so they
        # start and plan the same way, and take the same options.
        conf["spark.executor.extraJavaOptions"] = " ".join(options)
    conf["spark.driver.extraJavaOptions"] = " ".join(options + archive)
    if jars_dir:
        jars = sorted(str(p) for p in Path(jars_dir).glob("*.jar"))
        if not jars:
            raise ValueError(f"SIS_SPARK_JARS_DIR={jars_dir!r} holds no jars")
        conf["spark.jars"] = ",".join(jars)
    else:
        conf["spark.jars.packages"] = delta_package()
    conf.update(extra or {})
    return conf
