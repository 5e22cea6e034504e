"""The process the block compaction's kill test kills: a run's Spark driver settling a block of
one of the message log's tables (lake/upkeep.py `compact_blocks`), as the batch run that writes
the block's settling batch does after its write.

    python -m tests.faults.compact TABLE SEQ --home H --data D

The lake is `D/lake`; the crash point comes from `SIS_CRASH_AT` in the environment.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from pyspark.sql import SparkSession

from sis_platform.lake.delta import Lake
from sis_platform.lake.driver.conf import SHORT_LIVED_SQL, delta_spark_config
from sis_platform.lake.driver.jars import resolved_jars_dir
from sis_platform.lake.tables import MESSAGE_ITEMS, RAW_MESSAGES
from sis_platform.lake.upkeep import compact_blocks
from sis_platform.settings import LakeUpkeepSettings
from tests.harness import SUITE_SPARK_SQL

TABLES = {t.name: t for t in (RAW_MESSAGES, MESSAGE_ITEMS)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("table", choices=sorted(TABLES))
    parser.add_argument("seq", type=int)
    parser.add_argument("--home", type=Path, required=True)  # unused: no Dagster here
    parser.add_argument("--data", type=Path, required=True)
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder
    conf = delta_spark_config(
        master="local[2]",
        shuffle_partitions=2,
        ui_enabled=False,
        jars_dir=os.environ.get("SIS_SPARK_JARS_DIR") or resolved_jars_dir(),
        class_archive=None,
        extra={**SHORT_LIVED_SQL, **SUITE_SPARK_SQL},
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    lake = Lake(spark, str(args.data / "lake"), upkeep=LakeUpkeepSettings())
    compact_blocks(lake, TABLES[args.table], [args.seq], lake.upkeep)


if __name__ == "__main__":
    main()
