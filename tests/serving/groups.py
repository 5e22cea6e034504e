"""Group commits for the serving store's tests: masters with real documents and their model."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sis_platform.domain.interpret import interpret
from sis_platform.log.landing import LogPosition
from sis_platform.serving import (
    ChangeRow,
    DeadLetterRow,
    GroupCommit,
    MasterRow,
    OutcomeRow,
    ServingWriter,
)

PUT_TIME = datetime(2026, 11, 25, 6, 0, 0, 123456, tzinfo=UTC)


def document(master_id: str, version: int, runners: int = 2) -> bytes:
    """An event with one market of `runners` selections; prices change with the version."""
    selections = "".join(
        f'<selection id="{master_id}-s{n}" number="{n}" name="Horse {n}" status="runner">'
        f'<price num="{version * n}" den="3" at="2026-11-25T06:00:00Z"/></selection>'
        for n in range(1, runners + 1)
    )
    return (
        f'<event id="{master_id}" sport="horse-racing" country="GB" course="Ascot" '
        f'name="Race {master_id}" start="2026-11-25T14:00:00Z" status="open">'
        f'<market id="{master_id}-win" type="win" status="open" places="1">{selections}</market>'
        "</event>"
    ).encode()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def group(
    position: tuple[int, int],
    masters: Sequence[tuple[str, int]],
    *,
    first_msg_seq: int | None = None,
    dead: Sequence[str] = (),
    removed: Sequence[str] = (),
    runners: int = 2,
) -> GroupCommit:
    """A group ending at `position`: one message per (master id, version) applied, in order
    up to the position, then one dead-lettered message per id in `dead`; `removed` masters
    have their model rows removed (their master row kept, not stale)."""
    batch_seq, last = position
    count = len(masters) + len(dead) + len(removed)
    msg_seq = last - count + 1 if first_msg_seq is None else first_msg_seq
    rows: list[MasterRow] = []
    model: dict[str, Any] = {}
    changes: list[ChangeRow] = []
    outcomes: list[OutcomeRow] = []
    for master_id, version in masters:
        doc = document(master_id, version, runners)
        message_id = f"msg-{master_id}-{version}"
        rows.append(MasterRow(master_id, version, doc, message_id, False, False))
        model[master_id] = interpret(master_id, doc)
        changes.append(
            ChangeRow(
                master_id, version, message_id, 0, batch_seq, msg_seq, PUT_TIME, "upsert", sha(doc)
            )
        )
        outcomes.append(OutcomeRow(message_id, batch_seq, msg_seq, 0, master_id, "applied", None))
        msg_seq += 1
    for master_id in removed:
        rows.append(MasterRow(master_id, 1, None, None, False, True))
        model[master_id] = None
        message_id = f"msg-filtered-{master_id}"
        outcomes.append(OutcomeRow(message_id, batch_seq, msg_seq, 0, master_id, "filtered", None))
        msg_seq += 1
    letters = []
    for message_id in dead:
        letters.append(
            DeadLetterRow(message_id, None, None, "invalid", "not XML", batch_seq, msg_seq, b"<x")
        )
        outcomes.append(
            OutcomeRow(message_id, batch_seq, msg_seq, -1, None, "dead-lettered", "invalid")
        )
        msg_seq += 1
    return GroupCommit(LogPosition(batch_seq, last), rows, model, changes, letters, outcomes)


def table(store: ServingWriter, name: str, order: str = "master_id") -> list[tuple[Any, ...]]:
    """Every row of a table, as a reader's SQL sees it."""
    return store._backend.run(
        lambda conn: store._backend.fetch_all(conn, f"SELECT * FROM {name} ORDER BY {order}")
    )
