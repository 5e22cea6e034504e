"""RedeliveryCounts: the redelivery counts a source keeps where the broker only flags them."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from sis_platform.queues.base import SourceUnavailable
from sis_platform.queues.deliveries import RedeliveryCounts


def test_counts_survive_a_new_object_on_the_same_file(tmp_path: Path) -> None:
    path = tmp_path / "stomp" / "redeliveries.db"
    first = RedeliveryCounts(path)
    assert [first.record("ID:a"), first.record("ID:a"), first.record("ID:b")] == [1, 2, 1]
    first.close()  # as a process that dies: nothing is flushed at close
    again = RedeliveryCounts(path)
    assert (again.count("ID:a"), again.count("ID:b"), again.count("ID:c")) == (2, 1, 0)
    assert again.record("ID:a") == 3


def test_forget_drops_the_entries_of_committed_messages(tmp_path: Path) -> None:
    counts = RedeliveryCounts(tmp_path / "r.db")
    for key in ("ID:a", "ID:b", "ID:c"):
        counts.record(key)
    counts.forget(["ID:a", "ID:c", "ID:never-counted"])
    counts.forget([])
    assert (counts.count("ID:a"), counts.count("ID:b"), counts.entries()) == (0, 1, 1)


def test_entries_are_bounded_and_the_oldest_go_first(tmp_path: Path) -> None:
    counts = RedeliveryCounts(tmp_path / "r.db", max_entries=1000)
    for n in range(3072):  # pruned every 1024 new entries
        counts.record(f"ID:{n}")
    assert counts.entries() == 1000
    assert (counts.count("ID:2071"), counts.count("ID:2072"), counts.count("ID:3071")) == (0, 1, 1)


def test_in_memory_counts_need_no_file(tmp_path: Path) -> None:
    counts = RedeliveryCounts(None)
    assert (counts.record("ID:a"), counts.record("ID:a")) == (1, 2)
    assert RedeliveryCounts(None).count("ID:a") == 0  # another object knows nothing
    assert list(tmp_path.iterdir()) == []


def test_the_file_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    RedeliveryCounts(path).record("ID:a")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_an_unusable_file_is_a_source_outage(tmp_path: Path) -> None:
    not_a_folder = tmp_path / "file"
    not_a_folder.write_bytes(b"")
    counts = RedeliveryCounts(not_a_folder / "r.db")
    with pytest.raises(SourceUnavailable, match="redelivery counts"):
        counts.record("ID:a")
