"""Which backend a serving store URL opens: SQLite or PostgreSQL, read-only or writable.

`open_backend` is the one place a URL becomes a connection; `open_reader` (reader.py) and
`open_writer` (writer.py) wrap what it opens. SQLite (`sqlite:///path`, the default under
SIS_DATA_DIR) or PostgreSQL (`postgresql://user@host:port/dbname`, its password in
SIS_SERVING_PASSWORD); the URL rules are location.py's.
"""

from __future__ import annotations

from sis_platform.serving.backend import StoreBackend
from sis_platform.serving.location import (
    PostgresLocation,
    SqliteLocation,
    parse_location,
    shown_url,
)
from sis_platform.serving.sqlite import SqliteBackend
from sis_platform.settings import load_settings


def open_backend(url: str | None, busy_timeout: float, *, read_only: bool) -> StoreBackend:
    """The connection to the store at `url` (None: the configured SIS_SERVING_URL). Writable:
    its schema created if missing or upgraded if older. `read_only`: a connection the database
    refuses writes on, to a store a writer has created (`StoreNotReady` otherwise). ValueError
    (naming the URL, password-free) for a URL that names no store; ServingUnavailable if it
    cannot be reached. `busy_timeout`: how long SQLite waits for the lock before
    ServingUnavailable."""
    if url is None:
        url = load_settings().serving.url
    location = parse_location(url)
    if isinstance(location, SqliteLocation):
        return SqliteBackend(location.path, busy_timeout, shown=shown_url(url), read_only=read_only)
    return _postgres_backend(location, read_only)


def _postgres_backend(location: PostgresLocation, read_only: bool) -> StoreBackend:
    # psycopg is the optional `postgres` extra: imported only when a PostgreSQL URL is opened,
    # so a SQLite deployment (the default) does not need it installed.
    from sis_platform.serving.postgres import PostgresBackend

    return PostgresBackend(location, read_only=read_only)
