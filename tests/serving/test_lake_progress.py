"""The lake's progress in the serving store (ServingWriter.record_lake_progress), on SQLite and
PostgreSQL: absent until recorded, replaced by each record (one row), read back exactly, seen by
another connection, and added to a version 4 store by the upgrade."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sis_platform.serving import LakeProgress, ServingWriter, open_writer
from tests.serving.downgrade import downgrade
from tests.serving.groups import table

AT = datetime(2026, 3, 1, 12, 0, 0, 250000, tzinfo=UTC)


def _without_recorded_at(progress: LakeProgress | None) -> LakeProgress | None:
    return None if progress is None else progress._replace(recorded_at=None)


def test_the_lake_progress_is_absent_until_the_lake_records_it(store: ServingWriter) -> None:
    assert store.lake_progress() is None


def test_each_record_replaces_the_one_row_and_another_connection_reads_it(
    store: ServingWriter, open_readers: Any
) -> None:
    before = datetime.now(UTC)
    store.record_lake_progress(LakeProgress(3, 7, AT, 2))
    reader = open_readers()
    read = reader.lake_progress()
    assert _without_recorded_at(read) == LakeProgress(3, 7, AT, 2)
    assert read is not None and read.recorded_at is not None and read.recorded_at >= before
    assert read.committed_at.tzinfo is not None  # UTC, on both backends

    later = datetime(2026, 3, 1, 12, 5, tzinfo=UTC)
    store.record_lake_progress(LakeProgress(4, 9, later, 5))
    assert _without_recorded_at(reader.lake_progress()) == LakeProgress(4, 9, later, 5)
    # A rebuilt lake starts its steps again: its newest record is the lake's state.
    store.record_lake_progress(LakeProgress(1, 2, later, 0))
    assert _without_recorded_at(reader.lake_progress()) == LakeProgress(1, 2, later, 0)
    assert len(table(store, "lake_progress", "id")) == 1


def test_a_version_4_store_is_upgraded_with_no_lake_progress(
    store: ServingWriter, store_url: str
) -> None:
    downgrade(store, to=4, without="lake_progress")
    with open_writer(store_url) as upgraded:
        assert upgraded.lake_progress() is None
        upgraded.record_lake_progress(LakeProgress(1, 1, AT, 0))
        assert _without_recorded_at(upgraded.lake_progress()) == LakeProgress(1, 1, AT, 0)
