"""What a folded stretch commits to the serving store: the `GroupCommit` the fold stage
(`fold.py`) hands to the commit stage (`applier.py`).

Each changed master's row, its model rows (`interpret`; None when it has no document or is
filtered, as the lake's model leaves such a master out), one change row per new version, the
dead letters with the original body and one outcome row per message or item, and the log
position the commit brings the store to. Pure functions of the folded stretch, its landed
messages and the masters' states before it.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Mapping, Sequence

from sis_platform.domain.fold import ItemResult, MasterState
from sis_platform.domain.interpret import Interpretation, interpret
from sis_platform.domain.pipeline import FoldedStretch
from sis_platform.log.landing import LandedMessage
from sis_platform.runtime.logs import concerning
from sis_platform.serving.records import (
    ChangeRow,
    DeadLetterRow,
    GroupCommit,
    MasterRow,
    OutcomeRow,
)

log = logging.getLogger(__name__)


def group_commit(
    folded: FoldedStretch,
    messages: Sequence[LandedMessage],
    before: Mapping[str, MasterState],
    rows: Mapping[str, MasterRow],
    *,
    ahead: Iterable[str] | None = None,
) -> GroupCommit:
    """The commit of `folded` (of `messages`; `before`: the folded masters' states before it,
    `rows`: their rows as the store holds them). `ahead`: the masters of a part committed
    ahead of the store's position (the position stays, the messages are not completed); None:
    the stretch's last part, which moves the position and completes every message."""
    masters = changed_masters(folded, before, rows)
    return GroupCommit(
        position=messages[-1].position,
        masters=masters,
        model={row.master_id: model(row) for row in masters},
        changes=changes(folded, messages),
        dead_letters=dead_letters(folded, messages),
        outcomes=outcomes(folded, messages),
        ahead=() if ahead is None else tuple(ahead),
        completes=len(messages) if ahead is None else None,
    )


def changed_masters(
    folded: FoldedStretch, before: Mapping[str, MasterState], rows: Mapping[str, MasterRow]
) -> list[MasterRow]:
    """A row per folded master whose state changed and that the reference keeps (it exists,
    is stale or is filtered; an orphan update leaves no master), with the message id of its
    last version."""
    last_message: dict[str, str] = {}
    for entry in folded.versions:
        last_message[entry.value.master_id] = entry.value.message_id
    changed = []
    for master_id, state in folded.states.items():
        if not (state.exists or state.stale or state.filtered):
            continue
        if before.get(master_id) == state:
            continue
        previous = rows.get(master_id)
        message_id = last_message.get(master_id, previous.message_id if previous else None)
        changed.append(
            MasterRow(
                master_id=master_id,
                version=state.version,
                document=state.document,
                message_id=message_id,
                stale=state.stale,
                filtered=state.filtered,
            )
        )
    return changed


def model(row: MasterRow) -> Interpretation | None:
    """The master's model rows; None removes them (no document, or filtered: the lake's model
    reads only `document IS NOT NULL AND NOT filtered`)."""
    if row.document is None or row.filtered:
        return None
    try:
        return interpret(row.master_id, row.document)
    except Exception:
        # The fold only keeps valid events, so this is a bug in reading one master: it must
        # not stop the live path for every other master. The lake records it in
        # model_failures; here the master is left out of the model and logged.
        log.exception(
            "cannot interpret master %s version %d",
            row.master_id,
            row.version,
            extra=concerning(master_id=row.master_id),
        )
        return None


def changes(folded: FoldedStretch, messages: Sequence[LandedMessage]) -> list[ChangeRow]:
    """One change row per new version, in feed order."""
    rows = []
    for entry in folded.versions:
        version, landed = entry.value, messages[entry.offset]
        rows.append(
            ChangeRow(
                master_id=version.master_id,
                version=version.version,
                message_id=version.message_id,
                position=version.position,
                batch_seq=landed.position.batch_seq,
                msg_seq=landed.position.msg_seq,
                put_time=landed.put_time,
                operation=version.operation,
                document_sha256=hashlib.sha256(version.document).hexdigest(),
            )
        )
    return rows


def dead_letters(folded: FoldedStretch, messages: Sequence[LandedMessage]) -> list[DeadLetterRow]:
    """One row per dead letter, with the original body."""
    rows = []
    for entry in folded.dead_letters:
        dead, landed = entry.value, messages[entry.offset]
        rows.append(
            DeadLetterRow(
                message_id=dead.message_id,
                master_id=dead.master_id,
                position=dead.position,
                reason=str(dead.reason),
                detail=dead.detail,
                batch_seq=landed.position.batch_seq,
                msg_seq=landed.position.msg_seq,
                body=dead.body,
            )
        )
    return rows


def outcomes(folded: FoldedStretch, messages: Sequence[LandedMessage]) -> list[OutcomeRow]:
    """One outcome row per message decided as a whole and per item."""
    rows = []
    for entry in folded.results:
        result, landed = entry.value, messages[entry.offset]
        rows.append(
            OutcomeRow(
                message_id=result.message_id,
                batch_seq=landed.position.batch_seq,
                msg_seq=landed.position.msg_seq,
                position=entry.position,
                master_id=result.master_id if isinstance(result, ItemResult) else None,
                outcome=str(result.outcome),
                reason=None if result.reason is None else str(result.reason),
            )
        )
    return rows
