"""Messages the session must not return, and where they go instead.

The queue manager counts backouts but does not act on BOTHRESH/BOQNAME: that is the getting
application's job (IBM's JMS client does it too). The connection reads both with MQINQ when
it opens the queue, and the session moves a message whose BackoutCount >= BOTHRESH to BOQNAME
inside the unit of work, instead of returning it. A queue without a threshold (BOTHRESH 0,
MQ's default, or an alias that has none) gets the platform's (`backout_threshold`,
DEFAULT_BACKOUT_THRESHOLD = 10 unless configured; 0 turns it off), so a message that kills its
consumer stops coming back there too; a blank BOQNAME is replaced by `backout_queue`.

- No backout queue, or one refusing the message (2085 not defined, 2053 full, 2051 put
  inhibited, 2035 not authorized): the message goes to the queue manager's dead-letter queue
  behind an MQDLH (reason 2362 MQRC_BACKOUT_THRESHOLD_REACHED), as IBM's JMS client does.
- Neither queue usable (not defined, put fails): the message is delivered as usual, with an
  error logged each time. The platform's own redelivery limit then dead-letters it, so it is
  neither lost nor silently stuck.
- The move belongs to the caller's unit of work: commit makes it final, backout undoes it (the
  message returns with BackoutCount + 1 and is moved again by the next get). The consumer
  commits even a unit in which get() returned nothing, which makes such moves final.

A message over `max_get_bytes` is moved the same way (same targets; MQDLH reason 2080), with
an error naming its id and size (session.py says why the size is bounded).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from sis_platform.queues.ibmmq.message import message_id_of
from sis_platform.queues.ibmmq.mqi import (
    MQ_NAME_LENGTH,
    MQRC_BACKOUT_THRESHOLD_REACHED,
    MQRC_TRUNCATED_MSG_FAILED,
    IbmMqError,
    padded,
    reason_of,
)
from sis_platform.runtime.logs import concerning

if TYPE_CHECKING:
    from sis_platform.queues.ibmmq.connection import Connection

log = logging.getLogger(__name__)

# MQDLH version 1 in native integer order: StrucId, Version, Reason, DestQName, DestQMgrName,
# Encoding, CodedCharSetId, Format, PutApplType, PutApplName, PutDate, PutTime (172 bytes).
_DLH = struct.Struct("=4sii48s48sii8si28s8s8s")
_PUT_APPL_NAME = b"sis-platform"


@dataclass(frozen=True)
class MoveReason:
    """Why a got message is moved aside instead of returned."""

    text: str  # for the log lines, e.g. "BackoutCount 10 >= backout threshold 10"
    dead_letter_reason: int  # the MQDLH Reason when it goes to the dead-letter queue
    otherwise: str  # what becomes of it if no queue takes it


class _Target(NamedTuple):
    """A queue a message may be moved to, and the put that moves it there."""

    name: str
    move: Callable[[], None]


def why_not_returned(conn: Connection, md: Any, raw: bytes) -> MoveReason | None:
    """Why a message just got must be moved aside rather than returned, if it must."""
    limit = conn.source.max_get_bytes
    if len(raw) > limit:
        return MoveReason(
            f"{len(raw)} bytes, over the get limit of {limit} (SIS_IBMMQ_MAX_GET_BYTES)",
            MQRC_TRUNCATED_MSG_FAILED,
            "intake must dead-letter it too-large",
        )
    if 0 < conn.backout_threshold <= md.BackoutCount:
        return MoveReason(
            f"BackoutCount {md.BackoutCount} >= backout threshold {conn.backout_threshold}",
            MQRC_BACKOUT_THRESHOLD_REACHED,
            "the platform's redelivery limit must dead-letter it",
        )
    return None


def move_aside(conn: Connection, md: Any, raw: bytes, why: MoveReason) -> bool:
    """Move a message out of the way (to the backout queue, else the dead-letter queue), in
    the unit of work; False if no queue took it and it must be delivered."""
    source = conn.source
    message_id = message_id_of(md)
    targets: list[_Target] = []
    if conn.backout_queue:
        targets.append(_Target(conn.backout_queue, lambda: move_to_backout_queue(conn, md, raw)))
    if conn.dead_letter_queue:
        targets.append(
            _Target(
                conn.dead_letter_queue,
                lambda: move_to_dead_letter_queue(conn, md, raw, why.dead_letter_reason),
            )
        )
    for target in targets:
        try:
            target.move()
        except (source.pymqi.MQMIError, IbmMqError) as exc:  # MQOPEN or MQPUT refused
            if source.is_transient(exc):
                raise
            log.error(
                "%s: cannot move %s (%s) to %s: %s (%d)",
                source.description,
                message_id,
                why.text,
                target.name,
                source.reason_name(reason_of(exc)),
                reason_of(exc),
                extra=concerning(message_id=message_id),
            )
            continue
        log.warning(
            "%s: moved %s to %s: %s",
            source.description,
            message_id,
            target.name,
            why.text,
            extra=concerning(message_id=message_id),
        )
        return True
    log.error(
        "%s: delivering %s although %s: no backout or dead-letter queue took it; %s",
        source.description,
        message_id,
        why.text,
        why.otherwise,
        extra=concerning(message_id=message_id),
    )
    return False


def move_to_backout_queue(conn: Connection, md: Any, raw: bytes) -> None:
    """Put the message as got (same MQMD, so same MsgId) on BOQNAME, in the unit."""
    _put_passing_context(conn, conn.backout_queue, raw, md)


def move_to_dead_letter_queue(conn: Connection, md: Any, raw: bytes, reason: int) -> None:
    """Put the message on the DLQ behind an MQDLH saying why and where it came from."""
    cmqc, source = conn.cmqc, conn.source
    now = source.now()
    header = _DLH.pack(
        cmqc.MQDLH_STRUC_ID,
        cmqc.MQDLH_VERSION_1,
        reason,
        padded(source.queue, MQ_NAME_LENGTH),
        padded(source.queue_manager, MQ_NAME_LENGTH),
        md.Encoding,
        md.CodedCharSetId,
        md.Format,
        cmqc.MQAT_UNIX,
        _PUT_APPL_NAME.ljust(28, b" "),
        now.strftime("%Y%m%d").encode("ascii"),
        (now.strftime("%H%M%S") + f"{now.microsecond // 10_000:02d}").encode("ascii"),
    )
    dead_md = conn.pymqi.MD(**md.get())
    # The MQMD now describes the MQDLH; the MQDLH describes the original data.
    dead_md.Format = cmqc.MQFMT_DEAD_LETTER_HEADER
    dead_md.Encoding = cmqc.MQENC_NATIVE
    dead_md.CodedCharSetId = cmqc.MQCCSI_Q_MGR
    _put_passing_context(conn, conn.dead_letter_queue, header + raw, dead_md)


def _put_passing_context(conn: Connection, name: str, body: bytes, md: Any) -> None:
    cmqc = conn.cmqc
    pmo = conn.pymqi.PMO()
    pmo.Options = cmqc.MQPMO_SYNCPOINT | cmqc.MQPMO_PASS_ALL_CONTEXT | cmqc.MQPMO_FAIL_IF_QUIESCING
    # Pass-all-context takes identity and origin context (user, put application, put date
    # and time) from the input handle's saved context of the message just got.
    pmo.Context = conn.queue.get_handle()
    conn.output(name).put(body, md, pmo)
