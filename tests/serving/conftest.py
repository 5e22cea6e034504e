"""Fixtures of the serving store's tests: every store test runs on SQLite and on PostgreSQL (a
throwaway cluster per test session, tests/pg.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sis_platform.serving import ServingReader, ServingWriter, open_reader, open_writer
from tests.pg import PASSWORD_VARIABLE, PgCluster, cluster

BACKENDS = ("sqlite", "postgresql")


@pytest.fixture(scope="session")
def pg() -> Iterator[PgCluster]:
    with cluster() as running:
        yield running


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store_url(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> str:
    """A new, empty store's URL; for PostgreSQL its password is in SIS_SERVING_PASSWORD."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'serving' / 'serving.db'}"
    pg: PgCluster = request.getfixturevalue("pg")
    monkeypatch.setenv(PASSWORD_VARIABLE, pg.password)
    return pg.url(pg.new_database())


@pytest.fixture
def open_writers(store_url: str) -> Iterator[Callable[[], ServingWriter]]:
    """Opens writers (each its own connection) on `store_url`; all closed after the test."""
    opened: list[ServingWriter] = []

    def opener() -> ServingWriter:
        opened.append(open_writer(store_url))
        return opened[-1]

    yield opener
    for store in opened:
        store.close()


@pytest.fixture
def open_readers(store_url: str) -> Iterator[Callable[[], ServingReader]]:
    """Opens readers (each its own connection) on `store_url`, as Opportunity Management does;
    all closed after the test."""
    opened: list[ServingReader] = []

    def opener() -> ServingReader:
        opened.append(open_reader(store_url))
        return opened[-1]

    yield opener
    for reader in opened:
        reader.close()


@pytest.fixture
def store(open_writers: Callable[[], ServingWriter]) -> ServingWriter:
    return open_writers()
