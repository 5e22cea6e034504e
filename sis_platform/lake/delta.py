"""Reading and writing the platform's Delta tables at explicit locations.

Tables live at `<base_path>/<table name>` (a local folder, or s3a://, abfss://, gs:// on a
cluster): paths, not a metastore, so the same code runs on a laptop and a cluster, and every
asset says in its metadata exactly where it wrote (STYLE.md: no IO manager hiding the location).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sis_platform.faults import kill_during_write
from sis_platform.lake.tables import Table

if TYPE_CHECKING:
    from delta.tables import DeltaTable
    from pyspark.sql import DataFrame, SparkSession


class Lake:
    def __init__(self, spark: SparkSession, base_path: str) -> None:
        self.spark = spark
        self.base_path = base_path.rstrip("/")

    def path(self, table: Table) -> str:
        return f"{self.base_path}/{table.name}"

    def exists(self, table: Table) -> bool:
        from delta.tables import DeltaTable

        return bool(DeltaTable.isDeltaTable(self.spark, self.path(table)))

    def ensure(self, *tables: Table) -> None:
        """Create each table empty, with its schema and partitioning, if it does not exist."""
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
        """The table's current Delta version (its latest commit)."""
        row = self.table(table).history(1).select("version").first()
        assert row is not None
        return int(row["version"])

    def replace_where(self, table: Table, df: DataFrame, condition: str) -> None:
        """Atomically replace the rows matching `condition` with `df`: one Delta commit, so a
        re-run of the same partition replaces its rows instead of appending them again."""
        df = kill_during_write(df, f"write.{table.name}")
        (
            df.select(*[f.name for f in table.schema().fields])
            .write.format("delta")
            .mode("overwrite")
            .option("replaceWhere", condition)
            .save(self.path(table))
        )

    def append(self, table: Table, df: DataFrame) -> None:
        df = kill_during_write(df, f"write.{table.name}")
        (
            df.select(*[f.name for f in table.schema().fields])
            .write.format("delta")
            .mode("append")
            .save(self.path(table))
        )
