"""sis-trace's account of duplicates (sis_platform/lake/trace.py): each duplicate copy names the
copy that counted for it, the latest earlier copy the fold did not record as a duplicate; a copy
beyond the dedup window counts anew, and the duplicates after it name it."""

from __future__ import annotations

from datetime import UTC, datetime

from sis_platform.domain.reasons import Outcome
from sis_platform.lake.trace import MessageCopy, TracedOutcome, _link_duplicates

AT = datetime(2026, 11, 21, 12, tzinfo=UTC)


def _copy(batch_seq: int, outcome: str | None) -> MessageCopy:
    return MessageCopy(
        batch_key=f"{batch_seq:010d}",
        batch_seq=batch_seq,
        msg_seq=0,
        received_at=AT,
        put_time=None,
        delivery_count=1,
        body_sha256="0" * 64,
        body_bytes=1,
        body_intact=True,
        prev_link="0" * 64,
        chain_link="0" * 64,
        link_consistent=True,
        parsed="items",
        invalid_reason=None,
        invalid_detail=None,
        items=(),
        folded=True,
        outcome=TracedOutcome(outcome) if outcome else None,
    )


def test_each_duplicate_names_the_latest_counted_copy_before_it():
    duplicate = str(Outcome.DUPLICATE)
    copies = [
        _copy(1, None),  # applied item by item
        _copy(2, duplicate),
        _copy(40_000, None),  # beyond the window: counted anew
        _copy(40_001, duplicate),
    ]
    linked = _link_duplicates(copies)
    assert linked[1].outcome is not None and linked[1].outcome.duplicate_of == copies[0].ref
    assert linked[3].outcome is not None and linked[3].outcome.duplicate_of == copies[2].ref
    assert linked[0].outcome is None and linked[2].outcome is None
