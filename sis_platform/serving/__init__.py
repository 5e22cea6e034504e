"""The serving store: the live path's current masters, interpreted model, dead letters, message
outcomes and ordered change log, committed by sis-live group by group with the log position it
has applied, and read by Opportunity Management (docs/serving.md). `reader.py` the read API
(`ServingReader`, opened by `open_reader`: what Opportunity Management may call), `writer.py`
what sis-live's applier and the platform's assets write (`ServingWriter`, `open_writer`),
`backend.py` the connection, transactions and schema both stand on (`sqlite.py`, `postgres.py`
its backends, `opening.py` which one a URL opens), `schema.py` the tables, `records.py` and
`rows.py` what is read and committed, `location.py` the URL.

A URL names SQLite (`sqlite:///path`, the default under SIS_DATA_DIR) or PostgreSQL
(`postgresql://user@host:port/dbname`, its password in SIS_SERVING_PASSWORD).
"""

from __future__ import annotations

from sis_platform.serving.reader import ServingReader, open_reader
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
    StoreNotReady,
    StoreStatus,
)
from sis_platform.serving.writer import CRASH_POINT, ServingWriter, open_writer

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
    "ServingReader",
    "ServingUnavailable",
    "ServingWriter",
    "StoreHalt",
    "StoreNotReady",
    "StoreStatus",
    "StoredMaster",
    "open_reader",
    "open_writer",
]
