"""The workload that fills the Spark driver's class-data archive (see jvm_archive.py).

Run as `python -m sis_platform.lake.driver.archive_workload ARCHIVE`, the child process of
`jvm_archive.build`: it starts a local Spark driver whose JVM writes the classes it loaded to
ARCHIVE as it exits.
"""

from __future__ import annotations

import sys
import tempfile

import pandas as pd
from delta.tables import DeltaTable
from pyspark.sql import SparkSession, Window
from pyspark.sql import functions as F

from sis_platform.lake.driver.conf import delta_spark_config
from sis_platform.lake.driver.jars import resolved_jars_dir
from sis_platform.settings import python_workers_use_this_interpreter


def run(dump_to: str) -> None:
    """The driver's usual work, so the archive holds the classes a run loads: Delta create,
    replaceWhere, append with txnAppId, merge, time travel, restore; grouped pandas and Arrow
    UDFs; windows; local checkpoints."""
    python_workers_use_this_interpreter()
    conf = delta_spark_config(
        master="local[2]",
        app_name="sis-spark-archive",
        jars_dir=resolved_jars_dir(),
        class_archive=None,
    )
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


if __name__ == "__main__":
    run(sys.argv[1])
