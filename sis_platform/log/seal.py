"""What keeps the message log's anchors out of the data folder's reach (docs/design.md
invariant 5): the log key that signs them, and the witness of the latest signed head.

A hash chain and anchors kept beside it only show that the files agree with each other: whoever
can write the data folder can recompute SHA-256 over a rewritten tail and write matching anchors,
delete the last batches with their anchors, or put back an earlier copy of the whole folder.
Two things the folder does not hold close these:

- the log key: HMAC-SHA256 over every anchor (batch key, message count, so the last position,
  the first previous link, the head, the chain format) and over every part's running anchor (the
  same with the part's number, tagged apart, so a part's signature never passes for a sealed
  batch's). A rewrite without the key cannot be signed. The key comes from `SIS_LOG_KEY` (the
  environment only) or the key file `SIS_LOG_KEY_FILE`, which must lie outside the data folder;
  the default file (under the user's config folder) is created, mode 0600, for a new log only.
  The key id (a digest of the key, never the key) says which key signed an anchor;
- the witness (`SIS_LOG_WITNESS`, outside the data folder): the latest sealed batch's signed
  anchor, replaced atomically at every seal and only ever moved forward. The folder must reach
  it and agree with it, so a truncated tail or a folder rolled back to an earlier copy is seen;
  and a writer refuses to seal a batch number the witness has already seen sealed, so it never
  writes over the evidence of a rollback.

No Dagster or Spark import: the landing zone signs with it in sis-live and the sensor.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import os
import secrets
import stat
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from sis_platform.log.chain import Anchor, anchor_json, fsync_dir, write_durably

KEY_BYTES = 32  # a new key file's random bytes; a key from SIS_LOG_KEY needs at least as many
_ANCHOR_TAG = "sis-log-anchor/1"
_PART_TAG = "sis-log-part/1"
_KEY_ID_TAG = b"sis-log-key-id/1"


class LogKeyError(ValueError):
    """The log key is missing, unreadable, too short or not private: nothing can be signed or
    verified (the message says where the key was looked for, never the key)."""


class LogTampered(RuntimeError):
    """Landing found the log tampered with and refused to anchor it (an edited open batch, or a
    folder behind its witness); the message names the batch and what was found."""


@dataclass(frozen=True)
class LogKey:
    """The secret that signs the log's anchors."""

    secret: bytes = field(repr=False)

    @property
    def key_id(self) -> str:
        """Names the key in the anchors it signs (a digest: it reveals nothing of the key)."""
        return hashlib.sha256(_KEY_ID_TAG + self.secret).hexdigest()[:16]

    def _mac(self, payload: bytes) -> str:
        return hmac.new(self.secret, payload, hashlib.sha256).hexdigest()

    def sign(self, anchor: Anchor) -> Anchor:
        """`anchor` signed as a sealed batch's anchor."""
        return dataclasses.replace(
            anchor, signature=self._mac(_payload(_ANCHOR_TAG, anchor)), key_id=self.key_id
        )

    def sign_part(self, anchor: Anchor, part: int) -> Anchor:
        """`anchor`, a batch's running anchor after part `part`, signed as that part's."""
        payload = _payload(_PART_TAG, anchor, part)
        return dataclasses.replace(anchor, signature=self._mac(payload), key_id=self.key_id)

    def problem(self, anchor: Anchor, part: int | None = None) -> str | None:
        """What is wrong with `anchor`'s signature (a part's running anchor when `part` is
        given); None when this key signed exactly it."""
        if anchor.signature is None:
            return "its anchor is unsigned (written without the log key: a rewrite)"
        if anchor.key_id != self.key_id:
            return (
                f"its anchor is signed with key {anchor.key_id}, not with the log key "
                f"{self.key_id} (a wrong key, or a rewrite)"
            )
        tag = _ANCHOR_TAG if part is None else _PART_TAG
        if not hmac.compare_digest(anchor.signature, self._mac(_payload(tag, anchor, part))):
            return (
                "its anchor's signature does not verify (a consistent rewrite without the log key)"
            )
        return None


def _payload(tag: str, anchor: Anchor, part: int | None = None) -> bytes:
    """What a signature covers, in one unambiguous encoding (a JSON list of plain values)."""
    fields = [tag, anchor.batch_key, anchor.messages, anchor.first_prev, anchor.head]
    return json.dumps([*fields, anchor.format, part], separators=(",", ":")).encode()


@dataclass(frozen=True)
class KeySource:
    """Where the log key comes from: `text` (SIS_LOG_KEY's value) or else the key `file`.
    `create`: the file may be created, for a new log only (the default file)."""

    file: Path
    text: str | None = field(default=None, repr=False)
    create: bool = False

    def load(self, *, new_log: bool = False) -> LogKey:
        """The key. A missing default file is created (0600) when `new_log`; anything else
        missing, unreadable, short or readable by others raises LogKeyError."""
        if self.text is not None:
            return _key_of(self.text.encode(), "SIS_LOG_KEY")
        where = f"the log key file {self.file} (SIS_LOG_KEY_FILE)"
        if self.create and new_log and not self.file.exists():
            _create_key_file(self.file)
        try:
            mode = os.stat(self.file).st_mode
            raw = self.file.read_bytes()
        except FileNotFoundError:
            raise LogKeyError(
                f"{where} does not exist: without the key that signed this log nothing can be "
                "signed or verified"
            ) from None
        except OSError as exc:
            raise LogKeyError(f"{where} cannot be read: {exc.strerror}") from None
        if stat.S_IMODE(mode) & 0o077:
            raise LogKeyError(f"{where} is readable by other users: make it mode 0600")
        return _key_of(raw.strip(), where)


def _key_of(raw: bytes, where: str) -> LogKey:
    if len(raw) < KEY_BYTES:
        raise LogKeyError(f"{where} holds {len(raw)} byte(s); a log key needs {KEY_BYTES} or more")
    return LogKey(raw)


def _create_key_file(path: Path) -> None:
    """A new random key (hex) in `path`, mode 0600, its folder 0700; never replaces a file."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        write_durably(path, secrets.token_hex(KEY_BYTES).encode() + b"\n", replace=False)
    except FileExistsError:  # another process created it meanwhile: theirs is the key
        pass


class Witness:
    """The witness file: the latest sealed batch's signed anchor, outside the data folder."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def read(self) -> Anchor | None:
        """The witnessed anchor; None when there is no witness yet. A file that is not one
        raises ValueError."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            return Anchor(**json.loads(raw))
        except (ValueError, TypeError) as exc:
            raise ValueError(f"the log witness {self.path} is not a witness: {exc}") from exc

    def check_can_seal(self, anchor: Anchor) -> None:
        """Raise LogTampered when the witness has already seen batch `anchor.batch_key` (or a
        later one) sealed otherwise: the folder was rolled back or its tail truncated."""
        seen = self.read()
        if seen is None or seen.batch_key < anchor.batch_key:
            return
        if seen.batch_key == anchor.batch_key and seen.unsigned() == anchor.unsigned():
            return
        raise LogTampered(
            f"batch {anchor.batch_key}: not sealed: the log witness {self.path} has seen batch "
            f"{seen.batch_key} sealed with {seen.messages} message(s) ending on "
            f"{seen.head[:16]}...; the data folder was rolled back or its tail truncated. "
            "Restore the missing batches from a backup; if the data folder was removed on "
            "purpose to start a new log, `sis-live new-log` retires this witness"
        )

    def advance(self, anchor: Anchor) -> None:
        """Make `anchor` the witness, atomically and durably, unless it witnesses a later one."""
        seen = self.read()
        if seen is not None and seen.batch_key >= anchor.batch_key:
            return
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_durably(self.path, anchor_json(anchor), replace=True)

    def retire(self, when: datetime) -> Path:
        """Move the witness aside, beside itself, named for `when` (UTC): kept as the record of
        the log it witnessed, no longer checked. The caller has made sure that log is gone."""
        stamp = f"{self.path.stem}.retired-{when.astimezone(UTC):%Y%m%dT%H%M%SZ}"
        retired = self.path.with_name(f"{stamp}{self.path.suffix}")
        n = 1
        while retired.exists():  # never over an earlier retired witness
            n += 1
            retired = self.path.with_name(f"{stamp}-{n}{self.path.suffix}")
        os.replace(self.path, retired)
        fsync_dir(self.path.parent)
        return retired


@dataclass(frozen=True)
class LogSeal:
    """What a landing zone signs and witnesses its anchors with."""

    keys: KeySource
    witness: Witness

    def key(self, *, new_log: bool = False) -> LogKey:
        return self.keys.load(new_log=new_log)


def log_seal(
    key_file: str | Path, witness: str | Path, key_text: str | None, *, create_key: bool
) -> LogSeal:
    """The seal of a zone: the key `key_text` (SIS_LOG_KEY's value) or else from `key_file`
    (created for a new log when `create_key`), and the witness file `witness`."""
    return LogSeal(KeySource(Path(key_file), key_text, create_key), Witness(Path(witness)))
