"""Comparing a serving store's contents with the reference pipeline, exactly (a SQLite store by
its path; either backend through an open connection)."""

from __future__ import annotations

import hashlib
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

from sis_platform.domain.fold import ItemResult
from sis_platform.domain.pipeline import ReferencePipeline


def assert_store_matches_reference(db: Path, ref: ReferencePipeline) -> None:
    """Masters (version, document, stale, filtered), the change log, dead letters (with their
    bodies) and outcomes of the store at `db` equal the reference's."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        assert_rows_match_reference(conn, ref)
    finally:
        conn.close()


def assert_rows_match_reference(conn: Any, ref: ReferencePipeline) -> None:
    """As `assert_store_matches_reference`, on an open DB-API connection with `execute` (sqlite3
    or psycopg): the same SQL reads both backends."""
    masters = {
        m: (v, bytes(d) if d is not None else None, bool(s), bool(f))
        for m, v, d, s, f in conn.execute(
            "SELECT master_id, version, document, stale, filtered FROM masters"
        )
    }
    changes = sorted(
        conn.execute(
            "SELECT master_id, version, message_id, position, operation, document_sha256"
            " FROM changes"
        )
    )
    dead = Counter(
        (i, m, p, r, d, bytes(b))
        for i, m, p, r, d, b in conn.execute(
            "SELECT message_id, master_id, position, reason, detail, body FROM dead_letters"
        )
    )
    outcomes = Counter(
        conn.execute(
            "SELECT message_id, position, master_id, outcome, reason FROM message_outcomes"
        )
    )
    expected_masters = {
        m: (s.version, s.document, s.stale, s.filtered) for m, s in ref.masters.items()
    }
    assert sorted(masters) == sorted(expected_masters)
    assert masters == expected_masters
    expected_changes = sorted(
        (
            v.master_id,
            v.version,
            v.message_id,
            v.position,
            v.operation,
            hashlib.sha256(v.document).hexdigest(),
        )
        for v in ref.versions
    )
    assert changes == expected_changes
    assert dead == Counter(
        (d.message_id, d.master_id, d.position, str(d.reason), d.detail, d.body)
        for d in ref.dead_letters
    )
    assert outcomes == Counter(_outcome(r) for r in ref.results)


def _outcome(result: object) -> tuple[object, ...]:
    reason = getattr(result, "reason", None)
    if isinstance(result, ItemResult):
        return (
            result.message_id,
            result.position,
            result.master_id,
            str(result.outcome),
            None if reason is None else str(reason),
        )
    return (
        result.message_id,  # type: ignore[attr-defined]
        -1,
        None,
        str(result.outcome),  # type: ignore[attr-defined]
        None if reason is None else str(reason),
    )
