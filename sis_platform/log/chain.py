"""The message log's hash chain: what a link covers, the anchors that pin it, and how a stored
sequence of messages is checked against both (docs/design.md invariant 5, "Integrity").

A link covers every logged field of a message, in one canonical encoding:

    link = sha256(previous link || encode(record))

`encode` is the chain format's tag followed by each field in a fixed order, each as a presence
byte (0: null, 1: present), an 8-byte big-endian length and the bytes: text as UTF-8, whole
numbers as 8-byte big-endian signed integers, timestamps as microseconds since the Unix epoch
in UTC. No field can bleed into the next, and a null differs from an empty value. The fields:
batch seq, message seq (the message's position), message id, put time, received time,
delivery count, properties (JSON), body size, body sha256 and body location (where a body moved
aside at intake lies). The first batch starts from 32 zero bytes.

Anchors: a chain only shows that rows agree with each other, so its head after every batch is
kept where rewriting the rows does not reach it:
(a) in the landing file's Parquet metadata (head, message count, first previous link, format):
    the file carries its own claim, which a reader sees without the platform;
(b) in one small append-only anchor file per batch, `<landing>/anchors/<key>.json`, written by
    `ZoneWriter.land` right after the batch file is claimed, under the same lease fence, before
    the queue is committed. Written there, not by the sensor later, every landed batch has one
    from the moment it exists; the only gap (a crash between the claim and the anchor) is closed
    by the sensor before it registers the batch. An anchor is claimed with a hard link, so it is
    never overwritten, and it survives a rewrite of the landing file or the Delta table;
(c) in the batch run's tags (`sis/chain_head`, `sis/messages`), so Dagster's own database holds
    a copy the landing zone's owner cannot rewrite.
Truncating the log's last batch leaves its anchor, so the loss is seen; chaining every anchor to
the previous one's head means a whole batch cannot disappear from the middle either.

No Dagster or Spark import: the sensor process uses this.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

CHAIN_FORMAT = 2
GENESIS_LINK = bytes(32)
_FORMAT_TAG = f"sis-message-log-chain/{CHAIN_FORMAT}".encode()
MAX_PROBLEMS = 20  # per batch and source: enough to locate the damage, bounded in memory


@dataclass(frozen=True)
class ChainRecord:
    """Every logged field of one message, as the chain covers it."""

    batch_seq: int
    msg_seq: int
    message_id: str
    put_time_us: int | None  # microseconds since the epoch, UTC
    received_at_us: int
    delivery_count: int
    properties_json: str | None
    body_size: int  # the real body's bytes, also when it was moved aside
    body_sha256: str  # hex, of the real body
    body_location: str | None  # relative to the landing root; None: the body is in the row


def _bytes_field(value: bytes | None) -> bytes:
    if value is None:
        return b"\x00"
    return b"\x01" + len(value).to_bytes(8, "big") + value


def _text(value: str | None) -> bytes:
    return _bytes_field(None if value is None else value.encode("utf-8"))


def _number(value: int | None) -> bytes:
    return _bytes_field(None if value is None else value.to_bytes(8, "big", signed=True))


def encode(record: ChainRecord) -> bytes:
    """The canonical encoding of a record (see the module docstring)."""
    return b"".join(
        (
            _bytes_field(_FORMAT_TAG),
            _number(record.batch_seq),
            _number(record.msg_seq),
            _text(record.message_id),
            _number(record.put_time_us),
            _number(record.received_at_us),
            _number(record.delivery_count),
            _text(record.properties_json),
            _number(record.body_size),
            _bytes_field(bytes.fromhex(record.body_sha256)),
            _text(record.body_location),
        )
    )


def chain_link(previous: bytes, record: ChainRecord) -> bytes:
    return hashlib.sha256(previous + encode(record)).digest()


@dataclass(frozen=True)
class Anchor:
    """A batch's place in the chain: the link before its first message, the link after its
    last one (the head), and how many messages lie between."""

    batch_key: str
    messages: int
    first_prev: str  # hex
    head: str  # hex
    format: int = CHAIN_FORMAT
    # HMAC-SHA256 with the log key (sis_platform/log/seal.py) and that key's id; None: unsigned.
    signature: str | None = None
    key_id: str | None = None

    def unsigned(self) -> Anchor:
        """The chain fields alone: what two copies of one anchor must agree on."""
        return Anchor(self.batch_key, self.messages, self.first_prev, self.head, self.format)

    @classmethod
    def from_json(cls, data: Any) -> Anchor:
        """The anchor an anchor file's JSON object holds (`asdict` of one); KeyError, TypeError
        or ValueError when it is not one."""
        return cls(
            batch_key=str(data["batch_key"]),
            messages=int(data["messages"]),
            first_prev=str(data["first_prev"]),
            head=str(data["head"]),
            format=int(data["format"]),
            signature=data.get("signature"),
            key_id=data.get("key_id"),
        )


class AnchorStore:
    """Append-only anchor files, one per batch, `<dir>/<batch key>.json`, mode 0600."""

    def __init__(self, directory: Path) -> None:
        self.dir = Path(directory)

    def path(self, key: str) -> Path:
        return self.dir / f"{key}.json"

    def keys(self) -> list[str]:
        if not self.dir.is_dir():
            return []
        return sorted(p.stem for p in self.dir.glob("*.json") if p.stem.isdigit())

    def read(self, key: str) -> Anchor | None:
        """The batch's anchor, None when it has none. A file that is not an anchor raises
        ValueError (the verifier reports it as a problem)."""
        try:
            raw = self.path(key).read_bytes()
        except FileNotFoundError:
            return None
        try:
            return Anchor.from_json(json.loads(raw))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"anchor file {self.path(key)} is not an anchor: {exc}") from exc

    def write(self, anchor: Anchor) -> None:
        """Write the anchor durably; FileExistsError when the batch already has one (an anchor
        is never replaced)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        write_durably(self.path(anchor.batch_key), anchor_json(anchor), replace=False)


def anchor_json(anchor: Anchor) -> bytes:
    """An anchor as its file holds it (`Anchor.from_json` reads it back)."""
    return json.dumps(asdict(anchor), sort_keys=True).encode() + b"\n"


def write_durably(path: Path, data: bytes, *, replace: bool) -> None:
    """Put `data` at `path` atomically and durably: written to a private (0600) file beside it
    and fsync'd, then renamed over it (`replace`) or hard-linked to it (FileExistsError when it
    exists), and the folder fsync'd. A crash leaves the old file or the new one whole, and at
    most a `.partial` file beside it."""
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}.partial"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def file_sha256(path: Path) -> str:
    """sha256 (hex) of a file's bytes, read a MiB at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class StoredMessage:
    """One message as a copy of the log stores it: its record, its links, and what its body
    turned out to be when read back."""

    batch_key: str
    record: ChainRecord
    prev_link: str
    chain_link: str
    row_body_size: int  # bytes of the body held in the row itself
    row_body_sha256: str  # sha256 (hex) of the body held in the row
    # For a body moved aside: sha256 (hex) of the file at body_location as found, "" when the
    # file is missing, None when this copy was read without looking at the file.
    aside_body_sha256: str | None = None


@dataclass(frozen=True)
class Problem:
    """One thing wrong in the log; message fields are None when it concerns the whole batch."""

    batch_key: str
    text: str
    msg_seq: int | None = None
    message_id: str | None = None

    def __str__(self) -> str:
        where = f"batch {self.batch_key}"
        if self.msg_seq is not None:
            where += f" message {self.msg_seq} ({self.message_id})"
        return f"{where}: {self.text}"


@dataclass(frozen=True)
class ChainReport:
    """What verifying one copy (landing file or Delta) of one batch found."""

    batch_key: str
    source: str
    messages: int
    head: str | None
    problems: tuple[Problem, ...]

    @property
    def intact(self) -> bool:
        return not self.problems


def verify_messages(
    key: str,
    messages: Iterable[StoredMessage],
    *,
    first_prev: str,
    source: str,
    anchor: Anchor | None,
) -> ChainReport:
    """Check a batch's messages in log order: positions 0, 1, 2, ... in the right batch, each
    body as logged, each link following the previous one (the first follows `first_prev`) and
    matching its record; then the count and the head against the anchor when there is one."""
    problems: list[Problem] = []
    seq = int(key)
    expected_prev = first_prev
    n = 0
    last: StoredMessage | None = None

    def problem(m: StoredMessage, text: str) -> None:
        if len(problems) < MAX_PROBLEMS:
            problems.append(
                Problem(key, f"{text} ({source})", m.record.msg_seq, m.record.message_id)
            )

    for m in messages:
        r = m.record
        if m.batch_key != key or r.batch_seq != seq:
            problem(m, f"belongs to batch {m.batch_key}/{r.batch_seq}, found in batch {key}")
        if r.msg_seq != n:
            problem(m, f"at position {n}: a message was deleted, inserted or moved")
        problem_with_body = _body_problem(m)
        if problem_with_body:
            problem(m, problem_with_body)
        if m.prev_link != expected_prev:
            problem(
                m,
                "does not follow the previous link (a message before it was deleted, "
                "inserted or moved)",
            )
        if not _link_matches(m):
            problem(m, "its link does not match its fields (a logged field was changed)")
        expected_prev = m.chain_link
        last = m
        n += 1
    if anchor is not None:
        if n != anchor.messages:
            problems.append(
                Problem(key, f"{n} message(s) where the anchor says {anchor.messages} ({source})")
            )
        head = last.chain_link if last is not None else first_prev
        if head != anchor.head:
            problems.append(
                Problem(
                    key,
                    f"the last link {head[:16]}... is not the anchored head "
                    f"{anchor.head[:16]}... ({source})",
                    last.record.msg_seq if last is not None else None,
                    last.record.message_id if last is not None else None,
                )
            )
    return ChainReport(key, source, n, last.chain_link if last else None, tuple(problems))


def _link_matches(m: StoredMessage) -> bool:
    try:
        return chain_link(bytes.fromhex(m.prev_link), m.record).hex() == m.chain_link
    except ValueError:  # a link or digest that is not hex was written over the logged one
        return False


def _body_problem(m: StoredMessage) -> str | None:
    r = m.record
    if r.body_location is None:
        if m.row_body_size != r.body_size or m.row_body_sha256 != r.body_sha256:
            return "body changed (its sha256 or size differs from the logged one)"
        return None
    if m.row_body_size != 0:
        return f"holds a body although it was moved aside to {r.body_location}"
    if m.aside_body_sha256 == "":
        return f"the body moved aside to {r.body_location} is missing"
    if m.aside_body_sha256 is not None and m.aside_body_sha256 != r.body_sha256:
        return f"the body moved aside to {r.body_location} changed"
    return None


class AnchorCheck(NamedTuple):
    """What `anchor_problems` found: the link a batch must start from, and its anchors' faults."""

    first_prev: str
    problems: list[Problem]


def anchor_problems(
    key: str,
    anchor: Anchor | None,
    previous: Anchor | None,
    *,
    first: bool,
) -> AnchorCheck:
    """The link the batch must start from, and what is wrong with its anchors: the batch's own
    must exist in the current format and start where the previous batch's anchor ends (the
    genesis link for the first batch)."""
    problems: list[Problem] = []
    if first:
        expected = GENESIS_LINK.hex()
    elif previous is None:
        problems.append(
            Problem(
                key,
                "the previous batch has no anchor: where this batch's "
                "chain must start is not pinned",
            )
        )
        expected = anchor.first_prev if anchor is not None else GENESIS_LINK.hex()
    else:
        expected = previous.head
    if anchor is None:
        problems.append(Problem(key, "no anchor (the batch was inserted, or its anchor deleted)"))
    else:
        if anchor.format != CHAIN_FORMAT:
            problems.append(
                Problem(key, f"anchor in chain format {anchor.format}, expected {CHAIN_FORMAT}")
            )
        if anchor.batch_key != key or anchor.first_prev != expected:
            problems.append(
                Problem(key, "its anchor does not follow the previous batch's anchored head")
            )
    return AnchorCheck(expected, problems)
