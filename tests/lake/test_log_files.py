"""Delta's log files on a local lake are written through Hadoop's FileSystem API
(sis_platform/lake/driver/conf.py, LOCAL_FILE_WRITES): a commit starts no `readlink` process,
and the log store and checksum writer are the ones configured."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.delta_log import log_store_class

pytestmark = [pytest.mark.spark, pytest.mark.cost(10)]


def _processes_started(spark: Any, folder: Path, action: Callable[[], None]) -> list[str]:
    """The command lines of the processes the driver's JVM started while `action` ran, from a
    Java Flight Recorder recording of its jdk.ProcessStart events."""
    jvm = spark.sparkContext._jvm
    recording = jvm.jdk.jfr.Recording()
    try:
        recording.enable("jdk.ProcessStart")
        recording.start()
        action()
        recording.stop()
        dump = jvm.java.io.File(str(folder / "processes.jfr")).toPath()
        recording.dump(dump)
        events = jvm.jdk.jfr.consumer.RecordingFile.readAllEvents(dump)
        return [str(event.getString("command")) for event in events]
    finally:
        recording.close()


def test_a_commit_to_a_local_table_starts_no_readlink_process(tmp_path, spark):
    table = str(tmp_path / "table")
    spark.range(3).write.format("delta").save(table)  # creates the table and its folders

    def commit() -> None:
        spark.range(3, 6).write.format("delta").mode("append").save(table)

    commands = _processes_started(spark, tmp_path, commit)
    assert spark.read.format("delta").load(table).count() == 6
    # Through FileContext a commit starts one per name its renames look up (the JSON, the
    # checksum, their temporary names and checksum files).
    assert [c for c in commands if c.split()[0] == "readlink"] == []
    # What is left is Hadoop setting the mode of each new file (no native library here).
    assert {c.split()[0] for c in commands} <= {"chmod"}


def test_a_local_table_is_written_by_the_configured_log_store_and_checksum_writer(tmp_path, spark):
    table = str(tmp_path / "table")
    spark.range(1).write.format("delta").save(table)
    assert log_store_class(spark, table) == "io.delta.storage.LocalLogStore"
    jvm = spark.sparkContext._jvm
    log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, table)
    # Delta writes a commit's .crc through Spark's checkpoint file manager, built from the
    # table's Hadoop configuration.
    manager = jvm.org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager
    created = manager.create(log.logPath(), log.newDeltaHadoopConf())
    assert created.getClass().getSimpleName() == "FileSystemBasedCheckpointFileManager"
