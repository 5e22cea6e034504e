"""`ServingWriter.change_as_of`: the version a store's readers were shown at an instant (the
serving side of `sis-trace --as-of`), on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

import sis_platform.serving.writer as writer_module
from sis_platform.serving import ServingWriter
from tests.serving.groups import group

T0 = datetime(2026, 11, 21, 14, 29, 58, tzinfo=UTC)
SECOND = timedelta(seconds=1)
TICK = timedelta(microseconds=1)


def _commit_at(
    store: ServingWriter,
    monkeypatch: pytest.MonkeyPatch,
    when: datetime,
    position: tuple[int, int],
    masters: list[tuple[str, int]],
) -> None:
    monkeypatch.setattr(writer_module, "utc_now", lambda: when)
    store.commit(group(position, masters))


def test_the_version_shown_at_an_instant(
    store: ServingWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    _commit_at(store, monkeypatch, T0, (1, 1), [("M1", 1), ("M2", 1)])
    _commit_at(store, monkeypatch, T0 + SECOND, (2, 0), [("M1", 2)])
    # A whole second without microseconds, then one with: ordered as instants, not as text.
    _commit_at(store, monkeypatch, T0 + 2 * SECOND + 5 * TICK, (3, 0), [("M1", 3)])

    def version(master_id: str, at: datetime) -> int | None:
        change = store.change_as_of(master_id, at)
        return None if change is None else change.version

    assert version("M1", T0 - TICK) is None
    assert version("M1", T0) == 1
    assert version("M1", T0 + SECOND - TICK) == 1
    assert version("M1", T0 + SECOND) == 2
    assert version("M1", T0 + 2 * SECOND) == 2
    assert version("M1", T0 + 2 * SECOND + 5 * TICK) == 3
    assert version("M2", T0 + 9 * SECOND) == 1
    assert version("M3", T0 + 9 * SECOND) is None
    change = store.change_as_of("M1", T0 + SECOND + TICK)
    assert change is not None
    assert (change.committed_at, change.batch_seq, change.msg_seq) == (T0 + SECOND, 2, 0)
    # An instant in another zone is the same instant.
    assert version("M1", (T0 + SECOND).astimezone(timezone(timedelta(hours=2)))) == 2


def test_a_clock_stepped_back_never_moves_committed_at_backwards(
    store: ServingWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The host's clock is stepped back an hour between two commits (NTP, a VM restored): the
    # second commit is later in the change log, so no reader may have been shown it earlier.
    _commit_at(store, monkeypatch, T0, (1, 0), [("M1", 1)])
    _commit_at(store, monkeypatch, T0 - 3600 * SECOND, (2, 0), [("M1", 2)])
    changes = store.changes()
    assert [c.committed_at for c in changes] == [T0, T0]
    assert store.status().committed_at == T0
    change = store.change_as_of("M1", T0 - 1800 * SECOND)
    assert change is None  # nothing was committed before T0
    latest = store.change_as_of("M1", T0)
    assert latest is not None and latest.version == 2
