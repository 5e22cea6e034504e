"""The reader/writer split: what Opportunity Management opens reads and cannot write."""

from __future__ import annotations

import inspect
from collections.abc import Callable

from sis_platform.serving import ServingReader, ServingWriter, StoredMaster, open_reader
from tests.serving.groups import document, group

# The read API (docs/serving.md): a method added to the reader is added here on purpose.
READ_API = {
    "change_as_of",
    "changes",
    "close",
    "dead_letters",
    "lake_progress",
    "last_seq",
    "master",
    "message_at",
    "position",
    "retention",
    "status",
    "versions_at",
    "wait_for_changes",
}
# What only the writer has: sis-live's fold reads and commit, its state, the platform's records
# and history pruning.
WRITER_ONLY = {
    "ahead",
    "clear_halt",
    "commit",
    "halt",
    "heartbeat",
    "masters_state",
    "prune",
    "record_checked",
    "record_lake_progress",
    "seen",
}


def _public_methods(cls: type) -> set[str]:
    return {name for name, _ in inspect.getmembers(cls, inspect.isfunction) if name[0] != "_"}


def test_the_reader_has_the_read_api_and_no_method_that_writes() -> None:
    assert _public_methods(ServingReader) == READ_API
    assert _public_methods(ServingWriter) - _public_methods(ServingReader) == WRITER_ONLY


def test_an_opened_reader_reads_what_the_writer_commits_and_cannot_write(
    store: ServingWriter, open_readers: Callable[[], ServingReader]
) -> None:
    reader = open_readers()
    assert not isinstance(reader, ServingWriter)
    assert not any(hasattr(reader, name) for name in WRITER_ONLY)

    store.commit(group((1, 0), [("M1", 1)]))

    assert reader.master("M1") == StoredMaster(1, document("M1", 1))
    assert [c.master_id for c in reader.changes()] == ["M1"]
    assert reader.position() == store.position()


def test_open_reader_opens_the_configured_store_by_default(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SIS_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("SIS_SERVING_URL", raising=False)
    with open_reader() as reader:
        assert reader.last_seq() == 0
    assert (tmp_path / "serving" / "serving.db").is_file()
