"""`AnchorSigner`: a landing zone's anchors signed with the log key and witnessed, or, for a
zone opened without a seal, left unsigned (sis_platform/log/seal.py).

One signer per zone: the writer signs and witnesses what it seals, and readers that verify the
log (merge, the chain check, `sis-verify-log`) load the same key from it.
"""

from __future__ import annotations

from sis_platform.log.chain import GENESIS_LINK, Anchor
from sis_platform.log.seal import LogKey, LogSeal


class AnchorSigner:
    """With `seal` (the platform's zones) every anchor and every part's running anchor is
    signed with the log key, and every seal moves the witness forward; without it (a zone
    opened to read bodies, some tests) anchors are written unsigned, and a verifier reports
    them as such."""

    def __init__(self, seal: LogSeal | None = None) -> None:
        self.seal = seal
        self._key: LogKey | None = None

    def sign(self, anchor: Anchor, part: int | None = None) -> Anchor:
        """`anchor` signed with the log key (as part `part`'s running anchor when given); as it
        is without a seal. The default key file is created for a new log's first batch only;
        a key missing for a log that has one raises LogKeyError."""
        if self.seal is None:
            return anchor
        if self._key is None:
            self._key = self.seal.key(new_log=anchor.first_prev == GENESIS_LINK.hex())
        return self._key.sign(anchor) if part is None else self._key.sign_part(anchor, part)

    def log_key(self) -> LogKey | None:
        """The key the zone's anchors are signed with (None without a seal); LogKeyError when
        it cannot be loaded. Never creates one: a verifier must not invent a key."""
        if self.seal is not None and self._key is None:
            self._key = self.seal.key()
        return self._key

    def check_witness(self, anchor: Anchor) -> None:
        """LogTampered when the witness has seen this batch number (or a later one) sealed
        otherwise: sealing it would write over the evidence of a rollback."""
        if self.seal is not None:
            self.seal.witness.check_can_seal(anchor)

    def advance_witness(self, anchor: Anchor) -> None:
        """Make `anchor`, just written, the witness's latest sealed batch (unless it has a
        later one)."""
        if self.seal is not None:
            self.seal.witness.advance(anchor)
