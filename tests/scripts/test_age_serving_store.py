"""scripts/age_serving_store.py: a store given a season's rows holds a copy of the base day per
day in the tables kept for good, the window's copies in the windowed ones, and each older
copy's last change per master, with its log position left at the start."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import pytest

from sis_platform.log.landing import START_POSITION
from sis_platform.serving import open_reader

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"

pytestmark = pytest.mark.cost(5)


@pytest.fixture
def age_serving_store(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import age_serving_store

    yield age_serving_store
    sys.modules.pop("age_serving_store", None)


def _count(db: Path, sql: str) -> int:
    conn = sqlite3.connect(db)
    try:
        (n,) = conn.execute(sql).fetchone()
        return int(n)
    finally:
        conn.close()


def test_an_aged_store_holds_the_kept_rows_of_every_day_and_the_window_of_the_rest(
    age_serving_store, tmp_path: Path
) -> None:
    base_db, db = tmp_path / "base.db", tmp_path / "serving.db"
    age_serving_store.build_base(base_db, seed=3, batches=6)
    url = f"sqlite:///{db}"

    figures = age_serving_store.age(url, 4, seed=3, history_days=2, batches=6)

    def base(sql: str) -> int:
        return _count(base_db, sql)

    masters = base("SELECT COUNT(*) FROM masters")
    assert masters and figures["masters_rows"] == 4 * masters
    assert figures["selections_rows"] == 4 * base("SELECT COUNT(*) FROM selections")
    # Outcomes: the dedup window (30 days) holds all four days; dead letters: the last two.
    assert figures["message_outcomes_rows"] == 4 * base("SELECT COUNT(*) FROM message_outcomes")
    dead = base("SELECT COUNT(*) FROM dead_letters")
    assert dead and figures["dead_letters_rows"] == 2 * dead
    # The change log: two days whole, each master's last change of the two older ones.
    changes, last = (
        base("SELECT COUNT(*) FROM changes"),
        base("SELECT COUNT(DISTINCT master_id) FROM changes"),
    )
    assert changes > last and figures["changes_rows"] == 2 * changes + 2 * last
    assert _count(db, "SELECT MAX(batch_seq) FROM changes") < 0  # below any batch landed later
    # A body over the bound is dead-lettered as intake lands it: without its bytes.
    largest = _count(db, "SELECT MAX(LENGTH(body)) FROM dead_letters")
    assert largest < age_serving_store.DEFAULT_LIMITS.max_message_bytes
    with open_reader(url) as store:
        assert store.status().position == START_POSITION
        some = _count(db, "SELECT COUNT(*) FROM masters WHERE master_id LIKE '%~3'")
        assert some == masters
