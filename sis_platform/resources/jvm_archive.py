"""A class-data archive (JDK AppCDS) for the Spark driver's JVM: a faster start for every run.

Each Dagster run starts its own local Spark driver, and a fresh JVM spends much of its first
minute loading and verifying the ~20,000 classes of Spark, Delta and Hadoop. A class-data
archive holds them pre-parsed; a JVM started with `-XX:SharedArchiveFile` maps it instead.
`sis-spark-archive` (cli/spark_archive.py, run by scripts/setup.sh) builds one by running a
small Spark and Delta workload in a JVM started with `-XX:ArchiveClassesAtExit`;
`delta_spark_config` then passes the archive to every local driver. Nothing else changes: a
JVM that cannot use the archive (another JDK, another class path) warns and loads its classes
as usual.

The archive lives in the user's cache, never in the repository (it is ~200 MB and specific to
this machine's JDK, virtualenv and jars); its file name carries a key of all three, so an
upgrade builds a new one instead of using a stale one.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sis-platform" / "jvm"


def archive_path() -> Path:
    """The archive for this interpreter's pyspark and delta-spark and the `java` on PATH."""
    java = shutil.which("java") or ""
    key = "|".join(
        [
            version("pyspark"),
            version("delta-spark"),
            sys.prefix,  # the virtualenv: Spark's jars are on the JVM's class path from there
            os.path.realpath(java) if java else "",
        ]
    )
    return cache_dir() / f"spark-driver-{hashlib.sha256(key.encode()).hexdigest()[:16]}.jsa"


def configured_archive(setting: str | None) -> str | None:
    """The archive a driver should use: `setting` is SIS_SPARK_CLASS_ARCHIVE (a path, or `off`);
    by default the one `sis-spark-archive` built, if it exists."""
    if setting == "off":
        return None
    if setting:
        if not Path(setting).is_file():
            raise ValueError(f"SIS_SPARK_CLASS_ARCHIVE={setting!r} is not a file")
        return setting
    default = archive_path()
    return str(default) if default.is_file() else None


def _workload(dump_to: str) -> None:
    """The driver's usual work, so the archive holds the classes a run loads: Delta create,
    replaceWhere, append with txnAppId, merge, time travel, restore; grouped pandas and Arrow
    UDFs; windows; local checkpoints."""
    import pandas as pd
    from delta.tables import DeltaTable
    from pyspark.sql import SparkSession, Window
    from pyspark.sql import functions as F

    from sis_platform.resources.spark import delta_spark_config

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    conf = delta_spark_config(master="local[2]", app_name="sis-spark-archive", class_archive=None)
    conf["spark.driver.extraJavaOptions"] += (
        f" -XX:ArchiveClassesAtExit={dump_to} -Xlog:cds*=error"  # classes it cannot keep: fine
    )
    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    with tempfile.TemporaryDirectory(prefix="sis-spark-archive-") as tmp:
        path = f"{tmp}/t"
        rows = spark.range(200).select(
            F.col("id"),
            (F.col("id") % 4).alias("part"),
            F.col("id").cast("string").alias("s"),
            F.lit(b"x").alias("b"),
        )
        rows.write.format("delta").partitionBy("part").save(path)
        rows.where("part = 1").write.format("delta").mode("overwrite").option(
            "replaceWhere", "part = 1"
        ).save(path)
        rows.limit(5).write.format("delta").mode("append").option("txnAppId", "a").option(
            "txnVersion", 1
        ).save(path)
        table = DeltaTable.forPath(spark, path)
        table.alias("t").merge(
            rows.limit(20).alias("s"), "t.id = s.id"
        ).whenMatchedUpdateAll().whenNotMatchedInsertAll().execute()
        table.delete("id < 3")
        spark.read.format("delta").option("versionAsOf", 1).load(path).exceptAll(
            spark.read.format("delta").load(path)
        ).count()
        table.restoreToVersion(1)
        table.history(1).collect()

        def fold(left: pd.DataFrame, right: pd.DataFrame) -> pd.DataFrame:
            return left.head(1)[["id", "part"]]

        df = spark.read.format("delta").load(path)
        df.groupBy("part").cogroup(df.groupBy("part")).applyInPandas(
            fold, "id long, part long"
        ).localCheckpoint().collect()
        df.select("id", "s").mapInArrow(lambda batches: batches, "id long, s string").count()
        df.withColumn("n", F.row_number().over(Window.partitionBy("part").orderBy("id"))).where(
            "n = 1"
        ).join(df, "id", "left_anti").toLocalIterator()
    # The JVM writes the archive as it exits: it exits when its standard input (the gateway's
    # pipe from this process) closes. Wait for that, so the archive is complete on return.
    jvm = spark.sparkContext._gateway.proc  # type: ignore[union-attr]
    spark.stop()
    jvm.stdin.close()
    jvm.wait(timeout=600)


def build(path: Path | None = None) -> Path:
    """Build the archive (a few minutes) in a child process: the JVM writes it as it exits."""
    path = path or archive_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    subprocess.run(
        [sys.executable, "-m", "sis_platform.resources.jvm_archive", "--dump-to", str(partial)],
        check=True,
    )
    if not partial.is_file():
        raise RuntimeError(f"the JVM exited without writing its class-data archive {partial}")
    partial.replace(path)  # atomic: a concurrent driver start sees the old archive or the new
    return path


if __name__ == "__main__":  # the child process of `build`
    _workload(sys.argv[sys.argv.index("--dump-to") + 1])
