"""What the log key and the witness say about a landed log (sis_platform/log/seal.py): whether a
batch's anchor is signed with the log key, and whether the log's tail reaches, and agrees with,
the latest sealed batch the witness recorded outside the data folder. The blocking check on
raw_messages and `sis-verify-log` call these beside the chain's own verification; each costs a
few small file reads, never a scan of the log. `retire_witness` starts a new log where one was
removed whole (`sis-live new-log`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sis_platform.log.chain import Anchor, Problem
from sis_platform.log.landing.rows import batch_key
from sis_platform.log.seal import LogKey, LogKeyError

if TYPE_CHECKING:
    from datetime import datetime
    from pathlib import Path

    from sis_platform.log.landing.catalog import Catalog

WITNESS = "witness"  # the batch key of a problem with the witness file itself


def signature_problems(zone: Catalog, key: str, anchor: Anchor | None) -> list[Problem]:
    """What is wrong with batch `key`'s anchor's signature (nothing to say without an anchor:
    the chain's verification reports that). A zone without a seal, or a key that cannot be
    loaded, is a problem: the anchors cannot be trusted without it."""
    log_key, problems = _key(zone, key)
    if log_key is not None and anchor is not None:
        text = log_key.problem(anchor)
        if text is not None:
            problems.append(Problem(key, text))
    return problems


def tail_problems(zone: Catalog) -> list[Problem]:
    """The log's tail against the witness: the witnessed batch must have an anchor, the same
    one, signed with the log key. A witness missing while the folder holds anchors, or one the
    key did not sign, is a problem too. Later batches than the witness's are allowed (a crash
    between an anchor and the witness's update)."""
    if zone.signer.seal is None:
        return []
    witness = zone.signer.seal.witness
    try:
        seen = witness.read()
    except ValueError as exc:
        return [Problem(WITNESS, str(exc))]
    if seen is None:
        _start_witness(zone)
        return []
    log_key, problems = _key(zone, seen.batch_key)
    if log_key is not None and (text := log_key.problem(seen)) is not None:
        problems.append(Problem(seen.batch_key, f"the witness {witness.path}: {text}"))
    said = (
        f"the witness {witness.path} says batch {seen.batch_key} was sealed with "
        f"{seen.messages} message(s) ending on {seen.head[:16]}..."
    )
    try:
        anchor = zone.anchors.read(seen.batch_key)
    except ValueError as exc:
        return [*problems, Problem(seen.batch_key, str(exc))]
    if anchor is None:
        keys = zone.anchors.keys()
        last = keys[-1] if keys else "none"
        problems.append(
            Problem(
                seen.batch_key,
                f"truncated or rolled back: {said}; the data folder has no anchor for it "
                f"(its last anchored batch: {last})",
            )
        )
    elif anchor.unsigned() != seen.unsigned():
        problems.append(
            Problem(
                seen.batch_key,
                f"rolled back or rewritten: {said}; its anchor says {anchor.messages} "
                f"message(s) ending on {anchor.head[:16]}...",
            )
        )
    return problems


def _start_witness(zone: Catalog) -> None:
    """Start the witness from the folder's last anchor when that anchor is signed with the log
    key: the first verification of a log older than its witness, or of a data folder copied or
    moved to a new path (the default witness is named after the folder). The witness is out of
    the folder writer's reach, so a missing one is never a tamper; from here on it only moves
    forward. Lists the anchors: this happens once per witness."""
    keys = zone.anchors.keys()
    if not keys or zone.signer.seal is None:
        return
    try:
        anchor = zone.anchors.read(keys[-1])
        log_key = zone.signer.log_key()
    except (ValueError, LogKeyError):  # reported by the batch's own verification
        return
    if anchor is not None and log_key is not None and log_key.problem(anchor) is None:
        zone.signer.seal.witness.advance(anchor)


def _key(zone: Catalog, key: str) -> tuple[LogKey | None, list[Problem]]:
    if zone.signer.seal is None:
        return None, [
            Problem(
                key,
                "no log key configured (SIS_LOG_KEY or SIS_LOG_KEY_FILE): the anchors' "
                "signatures cannot be verified",
            )
        ]
    try:
        return zone.signer.log_key(), []
    except LogKeyError as exc:
        return None, [Problem(key, f"the log key cannot be loaded: {exc}")]


class LogNotNew(RuntimeError):
    """The landing zone still holds a log: its witness is the evidence against a rollback and
    stays where it is."""


@dataclass(frozen=True)
class RetiredWitness:
    witnessed: Anchor | None  # the earlier log's last sealed batch (None: the file was unreadable)
    path: Path  # where the witness file now lies


def retire_witness(zone: Catalog, when: datetime) -> RetiredWitness | None:
    """A new log at the path of one removed whole (the data folder deleted on purpose): the
    earlier log's witness moved aside (`Witness.retire`), so that the new log's first batches
    can be sealed. Only for a zone that holds nothing, no batch, part, anchor or expiry record
    (`Catalog.tail`): anything else raises LogNotNew, since a zone behind its witness is what a
    rollback or a truncated tail looks like. None when there is no witness to retire."""
    seal = zone.signer.seal
    if seal is None:
        return None
    tail = zone.tail()
    if tail.seq:
        raise LogNotNew(
            f"the landing zone {zone.root} holds a log through batch {batch_key(tail.seq)}: its "
            f"witness {seal.witness.path} stays. A new log starts only in an empty landing zone "
            "(restore missing batches from a backup instead)"
        )
    if not seal.witness.path.exists():
        return None
    try:
        witnessed = seal.witness.read()
    except ValueError:  # not a witness: moved aside all the same, for whoever looks into it
        witnessed = None
    return RetiredWitness(witnessed, seal.witness.retire(when))
