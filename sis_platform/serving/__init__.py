"""The serving store: the live path's current masters, interpreted model, dead letters, message
outcomes and ordered change log, committed by sis-live group by group with the log position it
has applied, and read by Opportunity Management (docs/serving.md). `store.py` the SQL both
backends share (`sqlite.py`, `postgres.py`), `schema.py` its tables, `records.py` and `rows.py`
what is read and committed, `location.py` its URL.

`open_store(url)` opens one: SQLite (`sqlite:///path`, the default under SIS_DATA_DIR) or
PostgreSQL (`postgresql://user@host:port/dbname`, its password in SIS_SERVING_PASSWORD).
"""

from __future__ import annotations

from sis_platform.serving.location import (
    PostgresLocation,
    SqliteLocation,
    parse_location,
    shown_url,
)
from sis_platform.serving.records import (
    Change,
    ChangeRow,
    ChangesPruned,
    DeadLetter,
    DeadLetterRow,
    DeadLettersPruned,
    GroupCommit,
    HistoryPruned,
    LakeProgress,
    MasterRow,
    OutcomeRow,
    PositionConflict,
    Pruned,
    Retention,
    ServingUnavailable,
    StoredMaster,
    StoreHalt,
    StoreStatus,
)
from sis_platform.serving.sqlite import DEFAULT_BUSY_TIMEOUT_SECONDS, SqliteStore
from sis_platform.serving.store import CRASH_POINT, ServingStore
from sis_platform.settings import load_settings

__all__ = [
    "CRASH_POINT",
    "Change",
    "ChangeRow",
    "ChangesPruned",
    "DeadLetter",
    "DeadLetterRow",
    "DeadLettersPruned",
    "GroupCommit",
    "HistoryPruned",
    "LakeProgress",
    "MasterRow",
    "OutcomeRow",
    "PositionConflict",
    "Pruned",
    "Retention",
    "ServingStore",
    "ServingUnavailable",
    "StoreHalt",
    "StoreStatus",
    "StoredMaster",
    "open_store",
]


def open_store(
    url: str | None = None, *, busy_timeout: float = DEFAULT_BUSY_TIMEOUT_SECONDS
) -> ServingStore:
    """The serving store at `url` (None: the configured SIS_SERVING_URL), its schema created if
    missing. ValueError (naming the URL, password-free) for a URL that names no store;
    ServingUnavailable if it cannot be reached. `busy_timeout`: how long a SQLite writer waits
    for the lock before ServingUnavailable."""
    if url is None:
        url = load_settings().serving.url
    location = parse_location(url)
    if isinstance(location, SqliteLocation):
        return SqliteStore(location.path, busy_timeout, shown=shown_url(url))
    return _postgres_store(location)


def _postgres_store(location: PostgresLocation) -> ServingStore:
    # psycopg is the optional `postgres` extra: imported only when a PostgreSQL URL is opened,
    # so a SQLite deployment (the default) does not need it installed.
    from sis_platform.serving.postgres import PostgresStore

    return PostgresStore(location)
