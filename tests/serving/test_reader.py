"""The reader/writer split: what Opportunity Management opens reads and cannot write."""

from __future__ import annotations

import inspect
import sqlite3
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from sis_platform.log.position import LogPosition
from sis_platform.serving import (
    ServingReader,
    ServingUnavailable,
    ServingWriter,
    StoredMaster,
    StoreNotReady,
    open_reader,
    open_writer,
)
from tests.serving.downgrade import downgrade
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
    "latest_copies",
    "masters_state",
    "prune",
    "record_checked",
    "record_lake_progress",
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
    with open_writer() as writer:
        writer.commit(group((1, 0), [("M1", 1)]))
    assert (tmp_path / "serving" / "serving.db").is_file()
    with open_reader() as reader:
        assert reader.last_seq() == 1


# Writes a reader's own connection refuses, whatever the reader's class allows: one per kind.
RAW_WRITES = {
    "insert": "INSERT INTO halt (id, reason, detail, raised_at) "
    "VALUES (1, 'om', 'written by a reader', '2026-12-03T00:00:00+00:00')",
    "update": "UPDATE position SET messages = 7 WHERE id = 1",
    "delete": "DELETE FROM masters",
    "create": "CREATE TABLE om_scratch (x INTEGER)",
}


def _refused_write(backend: str) -> tuple[type[Exception], str]:
    """The database's own refusal of a write on a read-only connection."""
    if backend == "sqlite":
        return sqlite3.OperationalError, "attempt to write a readonly database"
    return psycopg.errors.ReadOnlySqlTransaction, "read-only transaction"


@pytest.mark.parametrize("statement", sorted(RAW_WRITES))
def test_a_readers_connection_refuses_writes_issued_by_raw_sql(
    store: ServingWriter,
    open_readers: Callable[[], ServingReader],
    backend: str,
    statement: str,
) -> None:
    store.commit(group((1, 0), [("M1", 1)]))
    before = store.status()
    reader = open_readers()
    error, message = _refused_write(backend)

    with pytest.raises(error, match=message):
        reader._backend.run(lambda conn: conn.execute(RAW_WRITES[statement]))

    # Nothing changed, and the reader still reads.
    assert store.status() == before
    assert store.master("M1") == StoredMaster(1, document("M1", 1))
    assert reader.master("M1") == StoredMaster(1, document("M1", 1))
    assert reader.status() == before


def test_a_reader_opened_beside_a_live_writer_reads_each_commit(
    store: ServingWriter, open_readers: Callable[[], ServingReader]
) -> None:
    store.commit(group((1, 0), [("M1", 1)]))
    reader = open_readers()
    assert reader.master("M1") == StoredMaster(1, document("M1", 1))

    store.commit(group((1, 1), [("M1", 2), ("M2", 1)]))

    assert reader.master("M1") == StoredMaster(2, document("M1", 2))
    assert [(c.master_id, c.version) for c in reader.changes(after_seq=1)] == [
        ("M1", 2),
        ("M2", 1),
    ]
    assert reader.status() == store.status()


def test_a_sqlite_reader_alone_reads_and_a_writer_after_it_commits(tmp_path: Path) -> None:
    """WAL mode without its -wal and -shm files (the last writer closed and removed them): the
    read-only connection makes them, a writer then opens beside it, and what the reader leaves
    behind on closing does not stop the next writer."""
    db = tmp_path / "serving" / "serving.db"
    url = f"sqlite:///{db}"
    with open_writer(url) as writer:
        writer.commit(group((1, 0), [("M1", 1)]))
    assert not db.with_name("serving.db-wal").exists()

    with open_reader(url) as reader:
        assert reader.master("M1") == StoredMaster(1, document("M1", 1))
        with open_writer(url) as writer:
            writer.commit(group((1, 1), [("M2", 1)]))
        assert reader.master("M2") == StoredMaster(1, document("M2", 1))
        assert reader.position() == LogPosition(1, 1)

    with open_writer(url) as writer:
        writer.commit(group((2, 0), [("M1", 2)]))
        assert writer.master("M1") == StoredMaster(2, document("M1", 2))
    with open_reader(url) as reader:
        assert reader.position() == LogPosition(2, 0)


def test_a_reader_of_a_store_not_created_yet_fails_naming_sis_live(
    store_url: str, backend: str, tmp_path: Path
) -> None:
    """No SQLite file, or a PostgreSQL database without the store's tables: the reader creates
    nothing (it cannot), and says who does."""
    with pytest.raises(StoreNotReady, match=r"no serving store at .*: sis-live creates it") as e:
        open_reader(store_url)
    assert isinstance(e.value, ServingUnavailable)  # sensors report it as the store unavailable
    if backend == "sqlite":
        assert not (tmp_path / "serving").exists()
    with open_writer(store_url):
        pass
    with open_reader(store_url) as reader:
        assert reader.position() == LogPosition(0, -1)


def test_a_reader_of_an_empty_sqlite_file_fails_naming_sis_live(tmp_path: Path) -> None:
    db = tmp_path / "serving.db"
    db.touch()
    with pytest.raises(StoreNotReady, match=r"no serving store at .*: sis-live creates it"):
        open_reader(f"sqlite:///{db}")
    assert db.stat().st_size == 0


def test_a_reader_of_an_older_schema_fails_until_a_writer_upgrades_it(
    store: ServingWriter, store_url: str
) -> None:
    store.commit(group((1, 0), [("M1", 1)]))

    downgrade(store, to=4, without="lake_progress")

    with pytest.raises(StoreNotReady, match=r"schema version 4.*sis-live upgrades it"):
        open_reader(store_url)
    with open_writer(store_url):
        pass
    with open_reader(store_url) as reader:
        assert reader.lake_progress() is None
        assert reader.master("M1") == StoredMaster(1, document("M1", 1))
