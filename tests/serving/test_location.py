"""Serving store URLs: which store each names, and the ones refused."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from sis_platform.serving import open_reader, open_writer
from sis_platform.serving.location import (
    PostgresLocation,
    SqliteLocation,
    parse_location,
    shown_url,
)


@pytest.mark.parametrize(
    ("url", "path"),
    [
        ("sqlite:////abs/data/serving.db", Path("/abs/data/serving.db")),
        ("sqlite:///rel/serving.db", Path("rel/serving.db")),
        ("sqlite:////a%20b/serving.db", Path("/a b/serving.db")),
    ],
)
def test_sqlite_paths(url: str, path: Path) -> None:
    assert parse_location(url) == SqliteLocation(path)


@pytest.mark.parametrize(
    "url", ["sqlite://host/x.db", "sqlite:///", "sqlite:////data/", "sqlite:///x.db?mode=ro"]
)
def test_sqlite_urls_refused(url: str) -> None:
    with pytest.raises(ValueError, match="serving store URL"):
        parse_location(url)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        # Loopback and sockets: as given.
        ("postgresql://om@localhost:5432/serving", "postgresql://om@localhost:5432/serving"),
        ("postgresql://om@127.0.0.1/serving", "postgresql://om@127.0.0.1/serving"),
        ("postgresql://om@[::1]:5433/serving", "postgresql://om@[::1]:5433/serving"),
        ("postgresql://om@%2Frun%2Fpg/serving", "postgresql://om@%2Frun%2Fpg/serving"),
        ("postgresql://om@/serving?host=/run/pg", "postgresql://om@/serving?host=/run/pg"),
        # Another host: verified TLS unless the URL says otherwise.
        (
            "postgresql://om@db.example.com:5432/serving",
            "postgresql://om@db.example.com:5432/serving?sslmode=verify-full",
        ),
        (
            "postgresql://om@10.0.0.5/serving?application_name=x",
            "postgresql://om@10.0.0.5/serving?application_name=x&sslmode=verify-full",
        ),
        (
            "postgresql://om@db.example.com/serving?sslmode=require",
            "postgresql://om@db.example.com/serving?sslmode=require",
        ),
        (
            "postgresql://om@localhost,db2.example.com/serving",
            "postgresql://om@localhost,db2.example.com/serving?sslmode=verify-full",
        ),
    ],
)
def test_postgresql_urls(url: str, expected: str) -> None:
    location = parse_location(url)
    assert isinstance(location, PostgresLocation)
    assert location.url == expected and location.shown == url


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://om:hunter2@db.example.com/serving",
        "postgresql://om@db.example.com/serving?password=hunter2",
    ],
)
@pytest.mark.parametrize("opener", [open_reader, open_writer])
def test_a_password_in_the_url_is_refused_without_showing_it(
    url: str, opener: Callable[[str], object]
) -> None:
    with pytest.raises(ValueError, match="SIS_SERVING_PASSWORD") as raised:
        opener(url)
    assert "hunter2" not in str(raised.value)


@pytest.mark.parametrize(
    "url",
    [
        "mysql://om@db/serving",
        "serving.db",
        "postgresql://om@db.example.com/",
        "postgresql://om@db.example.com:notaport/serving",
    ],
)
@pytest.mark.parametrize("opener", [open_reader, open_writer])
def test_urls_that_name_no_store(url: str, opener: Callable[[str], object]) -> None:
    with pytest.raises(ValueError, match="serving store URL"):
        opener(url)


def test_shown_url_keeps_a_url_without_a_password_as_given() -> None:
    for url in ("sqlite:////srv/sis/serving.db", "sqlite:///data/serving.db"):
        assert shown_url(url) == url


def test_shown_url_masks_a_password() -> None:
    assert shown_url("postgresql://om:secret@db/x") == "postgresql://om:***@db/x"
    assert shown_url("postgresql://om@db/x") == "postgresql://om@db/x"
    assert shown_url("postgresql://om@db/x?password=pw&sslmode=require") == (
        "postgresql://om@db/x?password=***&sslmode=require"
    )


@pytest.mark.parametrize(
    ("url", "libpq_env"),
    [
        # hostaddr is where libpq connects; the host name only checks the certificate.
        ("postgresql://om@localhost/serving?hostaddr=10.0.0.5", {}),
        ("postgresql://om@localhost,localhost/serving?hostaddr=127.0.0.1,10.0.0.5", {}),
        ("postgresql://om@localhost/serving", {"PGHOSTADDR": "10.0.0.5"}),
        # No host in the URL: libpq takes PGHOST.
        ("postgresql://om@/serving", {"PGHOST": "db.example.com"}),
        ("postgresql://om@/serving", {"PGHOST": "localhost,db.example.com"}),
        # A service's file may name any host (or hostaddr): it is not this host's to assume.
        ("postgresql://om@/serving?service=serving", {}),
        ("postgresql://om@localhost/serving", {"PGSERVICE": "serving"}),
    ],
)
def test_a_url_that_names_this_host_but_reaches_another_gets_verified_tls(
    url: str, libpq_env: dict[str, str]
) -> None:
    location = parse_location(url, libpq_env)
    assert isinstance(location, PostgresLocation)
    assert location.url.endswith("sslmode=verify-full")


@pytest.mark.parametrize(
    ("url", "libpq_env"),
    [
        ("postgresql://om@localhost/serving?hostaddr=127.0.0.1", {}),
        ("postgresql://om@localhost/serving", {"PGHOST": "db.example.com"}),  # the URL's wins
        ("postgresql://om@/serving", {"PGHOST": "/run/postgresql"}),
        ("postgresql://om@/serving", {"PGHOSTADDR": "::1"}),
        ("postgresql://om@/serving", {}),
    ],
)
def test_a_server_on_this_host_is_reached_as_given(url: str, libpq_env: dict[str, str]) -> None:
    location = parse_location(url, libpq_env)
    assert isinstance(location, PostgresLocation)
    assert location.url == url
