"""The store unavailable: PostgreSQL stopped, SQLite locked by another writer. The writer's
calls raise ServingUnavailable with nothing committed, and work again once the store is back."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from sis_platform.log.landing import LogPosition
from sis_platform.serving import ServingUnavailable, StoredMaster, open_writer
from tests.pg import PASSWORD_VARIABLE, PgCluster
from tests.serving.groups import document, group


def test_postgresql_stopped_then_started(pg: PgCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PASSWORD_VARIABLE, pg.password)
    url = pg.url(pg.new_database())
    with open_writer(url) as store:
        store.commit(group((1, 0), [("M1", 1)]))
        pg.stop()
        try:
            for call in (
                lambda: store.commit(group((1, 1), [("M1", 2)])),
                store.heartbeat,
                store.position,
                lambda: store.wait_for_changes(1, 0.01),
            ):
                with pytest.raises(ServingUnavailable, match="serving store"):
                    call()
        finally:
            pg.start()
        # The same store object reconnects: the refused group commits now.
        assert store.position() == LogPosition(1, 0)
        store.commit(group((1, 1), [("M1", 2)]))
        assert store.master("M1") == StoredMaster(2, document("M1", 2))
        assert store.wait_for_changes(1, 0.01) == 2


def test_postgresql_without_the_password(pg: PgCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PASSWORD_VARIABLE, pg.password)
    url = pg.url(pg.new_database())
    monkeypatch.delenv(PASSWORD_VARIABLE)
    with pytest.raises(ServingUnavailable, match="password"):
        open_writer(url)


def test_postgresql_unreachable_at_open(tmp_path: Path) -> None:
    with pytest.raises(ServingUnavailable):
        open_writer(f"postgresql://sis@/nothing?host={tmp_path}")


def test_sqlite_locked_past_the_busy_timeout(tmp_path: Path) -> None:
    path = tmp_path / "serving.db"
    with open_writer(f"sqlite:///{path}", busy_timeout=0.05) as store:
        store.commit(group((1, 0), [("M1", 1)]))
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another writer holds the lock
        try:
            with pytest.raises(ServingUnavailable, match="locked"):
                store.commit(group((1, 1), [("M1", 2)]))
            with pytest.raises(ServingUnavailable):
                store.heartbeat()
            # Readers are not blocked by a writer (WAL).
            assert store.master("M1") == StoredMaster(1, document("M1", 1))
        finally:
            other.execute("ROLLBACK")
            other.close()
        store.commit(group((1, 1), [("M1", 2)]))
        assert store.position() == LogPosition(1, 1)


def test_sqlite_disk_full(tmp_path: Path) -> None:
    """A database that cannot grow (max_page_count stands in for a full disk: SQLITE_FULL)."""
    with open_writer(f"sqlite:///{tmp_path / 'serving.db'}") as store:
        store.commit(group((1, 0), [("M1", 1)]))
        conn = store._backend.connection()
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {pages}")
        big = group((1, 200), [(f"M{n}", 1) for n in range(200)], runners=20)
        with pytest.raises(ServingUnavailable, match="full"):
            store.commit(big)
        assert store.position() == LogPosition(1, 0)
        assert store.master("M7") is None
        # The store reopens its connection after an outage, without the limit: space is back.
        store.commit(big)
        assert store.position() == LogPosition(1, 200)


def test_sqlite_files_are_private(tmp_path: Path) -> None:
    folder = tmp_path / "data" / "serving"
    path = folder / "serving.db"
    with open_writer(f"sqlite:///{path}") as store:
        store.commit(group((1, 0), [("M1", 1)]))
        modes = {p.name: p.stat().st_mode & 0o777 for p in folder.iterdir()}
        assert modes == {
            "serving.db": 0o600,
            "serving.db-wal": 0o600,
            "serving.db-shm": 0o600,
            "serving.db.doorbell": 0o700,
        }
        assert folder.stat().st_mode & 0o777 == 0o700


def test_sqlite_relative_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with open_writer("sqlite:///rel/serving.db") as store:
        store.commit(group((1, 0), [("M1", 1)]))
    assert (tmp_path / "rel" / "serving.db").is_file()


def test_the_configured_store_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIS_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("SIS_SERVING_URL", raising=False)
    with open_writer() as store:
        store.commit(group((1, 0), [("M1", 1)]))
    assert (tmp_path / "serving" / "serving.db").is_file()


def test_a_store_of_another_schema_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "serving.db"
    open_writer(f"sqlite:///{path}").close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE position SET schema_version = 99")
    with pytest.raises(RuntimeError, match="schema version 99"):
        open_writer(f"sqlite:///{path}")
