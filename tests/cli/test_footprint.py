"""sis-footprint counts what the platform keeps: the landing zone's files, each Delta table's
data files, deletion vectors and log entries, the serving store's growing tables, and Dagster's
partitions and runs."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pytest

from sis_platform.cli import footprint
from sis_platform.log.landing import LandingZone
from sis_platform.serving import open_writer
from tests.harness import received


def _write(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)


def test_the_landing_zone_s_batches_parts_and_anchors_are_counted(tmp_path: Path) -> None:
    zone = LandingZone(tmp_path / "landing")
    zone.writer.land([received(b"<a/>"), received(b"<b/>")])
    zone.writer.land([received(b"<c/>")])
    _write(tmp_path / "landing" / "batches" / "0000000003" / "part-00000.parquet", 10)
    _write(tmp_path / "landing" / "batches" / "0000000003" / "part-00001.parquet", 20)

    found = footprint.landing_footprint(tmp_path / "landing")

    assert found.batch_files.files == 2 and found.batch_files.bytes > 0
    assert (found.batch_folders, found.part_files) == (1, footprint.Files(2, 30))
    assert found.anchors.files == 2


def test_each_delta_table_s_files_are_counted_by_kind(tmp_path: Path) -> None:
    events = tmp_path / "lake" / "events"
    _write(events / "part-0001.snappy.parquet", 100)
    _write(events / "part-0002.snappy.parquet", 50)
    _write(events / "deletion_vector_1.bin", 7)
    _write(events / "_delta_log" / "00000000000000000000.json", 3)
    _write(events / "_delta_log" / "00000000000000000001.json", 3)
    raw = tmp_path / "lake" / "raw_messages"
    _write(raw / "batch_key=0000000001" / "part-0001.snappy.parquet", 9)
    _write(raw / "_delta_log" / "00000000000000000000.json", 3)
    _write(tmp_path / "lake" / "_inflight" / "marker.json", 1)  # not a table

    found = footprint.lake_footprint(str(tmp_path / "lake"))

    assert sorted(found) == ["events", "raw_messages"]
    assert found["events"] == footprint.TableFootprint(
        data_files=footprint.Files(2, 150),
        deletion_vectors=footprint.Files(1, 7),
        log_entries=footprint.Files(2, 6),
    )
    assert found["raw_messages"].data_files == footprint.Files(1, 9)
    assert footprint.lake_footprint("s3a://bucket/lake") == {}


def test_the_serving_store_s_growing_tables_are_counted(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'serving.db'}"
    open_writer(url).close()

    size, rows = footprint.serving_footprint(url)

    assert size is not None and size > 0
    assert rows == {"changes": 0, "message_outcomes": 0, "dead_letters": 0}


@pytest.mark.dagster
def test_the_command_prints_every_part_as_json(tmp_path, monkeypatch, capsys) -> None:
    home = tmp_path / "dagster"
    home.mkdir()
    with dg.DagsterInstance.from_config(str(home)) as instance:
        instance.add_dynamic_partitions("batches", ["0000000001", "0000000002"])
    monkeypatch.setenv("SIS_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    LandingZone(tmp_path / "data" / "landing").writer.land([received(b"<a/>")])

    assert footprint.main(["--json"]) == 0

    printed = json.loads(capsys.readouterr().out)
    assert printed["landing"]["batch_files"]["files"] == 1
    assert printed["dagster"]["partitions"] == 2
    assert printed["dagster"]["runs"] == 0
