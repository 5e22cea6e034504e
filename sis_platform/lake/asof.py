"""As-of answers: a master document as the platform showed it at a past instant.

A dispute asks "what did we show for this race at 14:29:58?". `master_as_of` answers for one
master id and one instant from the fold's committed history, never by scanning the log:

- `master_versions` filtered on the master id (Delta's file statistics skip every file that
  cannot hold it): every committed version, with the message and log position that made it;
- `fold_steps` (one row per step): when each version's step committed, i.e. from when the
  lake's `master_documents` showed it;
- `raw_messages`, read only in the batches of those versions' messages: when the
  platform received each message;
- where the live path runs, the serving store's change log (`ServingReader.change_as_of`): from
  when sis-live's store showed each version.

"Shown at T" is the version in force at T where Opportunity Management reads: the serving store
when one is given (its change committed at or before T), otherwise the lake (its fold step
committed at or before T). Beside it the answer names the latest version whose message had been
received by T: when the two differ, a newer message had arrived and was not shown yet.

The serving store keeps only each master's current document, so a version's document comes
from `master_versions`; a version sis-live has applied and the lake has not folded yet is
answered from the store's current document when it is that version (and has no document
otherwise: the lake will have it after its next fold step).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pyspark.sql import functions as F

from sis_platform.lake.spark.fold import committed_step
from sis_platform.lake.spark.items import logged_condition
from sis_platform.lake.tables import FOLD_STEPS, MASTER_VERSIONS, RAW_MESSAGES
from sis_platform.lake.trace import spark_utc
from sis_platform.log.landing import batch_key
from sis_platform.serving.backend import as_utc

if TYPE_CHECKING:
    from sis_platform.lake.delta import Lake
    from sis_platform.serving import ServingReader

LAKE = "lake"
SERVING_STORE = "serving store"


@dataclass(frozen=True)
class MasterVersion:
    """One committed version of a master and the facts a dispute needs about it."""

    master_id: str
    version: int
    operation: str  # new | refresh | update
    message_id: str
    batch_seq: int
    msg_seq: int
    received_at: datetime | None  # when the platform received the message (None: not logged)
    in_lake_from: datetime | None  # its fold step's commit (None: not folded yet)
    fold_step: int | None = None  # the committed step that wrote it (None: not folded yet)
    in_store_from: datetime | None = None  # the serving store's commit (None: no store)
    document: str | None = None  # None: neither the lake nor the store holds it now

    @property
    def document_sha256(self) -> str | None:
        return None if self.document is None else _sha256(self.document)


@dataclass(frozen=True)
class AsOf:
    """The answer for `master_id` at `at`."""

    master_id: str
    at: datetime
    shown_by: str  # LAKE or SERVING_STORE: where "shown" was read
    shown: MasterVersion | None  # in force at `at` where readers read (None: nothing yet)
    received: MasterVersion | None  # the latest version whose message was received by `at`
    committed_fold_step: int  # the lake's last committed step when asked

    @property
    def found(self) -> bool:
        return self.shown is not None or self.received is not None


def master_as_of(
    lake: Lake, master_id: str, at: datetime, *, store: ServingReader | None = None
) -> AsOf:
    """`master_id` as shown at `at` (see the module docstring); `at` naive means UTC."""
    at = as_utc(at) or at
    step = committed_step(lake).fold_step if lake.exists(FOLD_STEPS) else 0
    versions = _lake_versions(lake, master_id, step)
    if store is not None:
        versions = _with_store(lake, store, master_id, at, versions)
    shown_by = LAKE if store is None else SERVING_STORE

    def shown_from(v: MasterVersion) -> datetime | None:
        return v.in_lake_from if store is None else v.in_store_from

    shown = _last(v for v in versions.values() if _at_or_before(shown_from(v), at))
    received = _last(v for v in versions.values() if _at_or_before(v.received_at, at))
    if shown is not None and shown.document is None:
        shown = _with_document(lake, store, shown)
    if received is not None and received.document is None:
        received = _with_document(lake, store, received)
    return AsOf(master_id, at, shown_by, shown, received, step)


def _lake_versions(lake: Lake, master_id: str, step: int) -> dict[int, MasterVersion]:
    """Every version the committed steps hold for the master (documents left for later)."""
    if not lake.exists(MASTER_VERSIONS):
        return {}
    rows = (
        lake.read(MASTER_VERSIONS)
        .where((F.col("master_id") == F.lit(master_id)) & (F.col("fold_step") <= F.lit(step)))
        .select("version", "operation", "message_id", "batch_seq", "msg_seq", "fold_step")
        .collect()
    )
    if not rows:
        return {}
    committed_at = {
        int(r["fold_step"]): spark_utc(r["committed_at"])
        for r in lake.read(FOLD_STEPS).select("fold_step", "committed_at").collect()
    }
    received = _received_at(lake, rows)
    versions: dict[int, MasterVersion] = {}
    # A version refolded after a rewind is in force from its latest committed step.
    for r in sorted(rows, key=lambda r: int(r["fold_step"])):
        position = (int(r["batch_seq"]), int(r["msg_seq"]))
        versions[int(r["version"])] = MasterVersion(
            master_id=master_id,
            version=int(r["version"]),
            operation=str(r["operation"]),
            message_id=str(r["message_id"]),
            batch_seq=position[0],
            msg_seq=position[1],
            received_at=received.get(position),
            in_lake_from=committed_at.get(int(r["fold_step"])),
            fold_step=int(r["fold_step"]),
        )
    return versions


def _received_at(lake: Lake, rows: list[Any]) -> dict[tuple[int, int], datetime]:
    """When each version's message was received, read in those messages' batches only."""
    if not lake.exists(RAW_MESSAGES):
        return {}
    seqs = sorted({int(r["batch_seq"]) for r in rows})
    ids = sorted({str(r["message_id"]) for r in rows})
    found = (
        lake.read(RAW_MESSAGES)
        .where(
            F.expr(logged_condition([batch_key(seq) for seq in seqs]))  # blocks, then keys
            & F.col("batch_seq").isin(seqs)
            & F.col("message_id").isin(ids)
        )
        .select("batch_seq", "msg_seq", "received_at")
        .collect()
    )
    return {(int(r["batch_seq"]), int(r["msg_seq"])): spark_utc(r["received_at"]) for r in found}


def _with_store(
    lake: Lake,
    store: ServingReader,
    master_id: str,
    at: datetime,
    versions: dict[int, MasterVersion],
) -> dict[int, MasterVersion]:
    """The lake's versions with the store's commit time of the version it showed at `at`; a
    version only the store has applied so far joins them (received time unknown to the lake)."""
    change = store.change_as_of(master_id, at)
    if change is None:
        return versions
    merged = dict(versions)
    known = merged.get(change.version)
    if known is not None:
        merged[change.version] = replace(known, in_store_from=change.committed_at)
    else:
        merged[change.version] = MasterVersion(
            master_id=master_id,
            version=change.version,
            operation="",  # the store does not say; the lake will once it has folded it
            message_id=change.message_id,
            batch_seq=change.batch_seq,
            msg_seq=change.msg_seq,
            received_at=_received_at(lake, [change._asdict()]).get(
                (change.batch_seq, change.msg_seq)
            ),
            in_lake_from=None,
            in_store_from=change.committed_at,
        )
    return merged


def _with_document(
    lake: Lake, store: ServingReader | None, version: MasterVersion
) -> MasterVersion:
    if version.fold_step is not None:
        row = (
            lake.read(MASTER_VERSIONS)
            .where(
                (F.col("master_id") == F.lit(version.master_id))
                & (F.col("version") == F.lit(version.version))
                & (F.col("fold_step") == F.lit(version.fold_step))
            )
            .select("document")
            .first()
        )
        if row is not None:
            return replace(version, document=str(row["document"]))
    if store is not None:
        current = store.master(version.master_id)
        if current is not None and current.version == version.version:
            return replace(version, document=current.document.decode("utf-8"))
    return version


def _last(versions: Any) -> MasterVersion | None:
    return max(versions, key=lambda v: v.version, default=None)


def _at_or_before(when: datetime | None, at: datetime) -> bool:
    return when is not None and when <= at


def _sha256(document: str) -> str:
    return hashlib.sha256(document.encode("utf-8")).hexdigest()
