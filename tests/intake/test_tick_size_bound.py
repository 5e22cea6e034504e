"""A body over the per-message bound is moved aside at intake, never held in a landing batch
(docs/design.md invariant 6), on the real embedded queue and landing zone (no Spark)."""

from __future__ import annotations

import hashlib
import os
import stat

from sis_platform.domain.limits import Limits
from sis_platform.intake.consumer import BatchLimits, consume_batch
from sis_platform.log.chain import verify_messages
from sis_platform.log.landing import GENESIS_LINK, LandingZone
from sis_platform.queues.embedded import EmbeddedQueue

BOUND = 1_000


def _consume(tmp_path, bodies: list[bytes], limits: BatchLimits | None = None):
    queue = EmbeddedQueue(tmp_path / "queue")
    zone = LandingZone(tmp_path / "landing")
    with queue.producer() as producer:
        ids = [producer.put(body) for body in bodies]
    with queue.connect() as session:
        batch = consume_batch(
            session,
            zone.writer,
            limits or BatchLimits(get_wait_seconds=0.05),
            message_limits=Limits(max_message_bytes=BOUND),
        )
    return queue, zone, batch, ids


def test_a_body_over_the_bound_is_moved_aside_and_logged_by_size_digest_and_location(tmp_path):
    big = b"<sportsdata>" + b"x" * 5_000 + b"</sportsdata>"
    at_bound = b"y" * BOUND
    queue, zone, batch, ids = _consume(tmp_path, [b"<a/>", big, at_bound, b"<b/>"])
    assert batch is not None and batch.messages == 4
    assert queue.depth() == 0  # committed: the moved-aside message is landed like any other
    rows = zone.catalog.read(batch.key).to_pylist()
    assert [r["message_id"] for r in rows] == ids
    moved = rows[1]
    assert (moved["body"], moved["body_size"], moved["body_sha256"]) == (
        b"",
        len(big),
        hashlib.sha256(big).hexdigest(),
    )
    path = zone.catalog.root / moved["body_location"]
    assert path.parent == zone.catalog.overflow_dir
    assert path.read_bytes() == big
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    # A body at the bound is not over it: it stays in the batch.
    assert (rows[2]["body"], rows[2]["body_location"]) == (at_bound, None)
    assert batch.bytes == len(b"<a/>") + BOUND + len(b"<b/>")
    report = verify_messages(
        batch.key,
        zone.catalog.stored_messages(batch.key),
        first_prev=GENESIS_LINK.hex(),
        source="landing file",
        anchor=zone.catalog.anchors.read(batch.key),
    )
    assert report.intact, report.problems


def test_moved_aside_bodies_do_not_count_towards_the_batch_byte_bound(tmp_path):
    big = b"z" * (BOUND + 1)
    limits = BatchLimits(max_bytes=2 * BOUND, get_wait_seconds=0.05)
    _, zone, batch, _ = _consume(tmp_path, [big] * 5 + [b"<a/>"], limits)
    assert batch is not None
    assert batch.messages == 6 and batch.bytes == len(b"<a/>")
    # The same bytes redelivered or repeated land on one content-addressed file.
    assert len(list(zone.catalog.overflow_dir.glob("*.body"))) == 1


def test_a_batch_never_holds_more_than_its_byte_bound_plus_one_message(tmp_path):
    limits = BatchLimits(max_bytes=2_500, get_wait_seconds=0.05)
    _, _, batch, _ = _consume(tmp_path, [b"m" * BOUND] * 4, limits)
    assert batch is not None
    assert batch.messages == 3
    assert batch.bytes <= limits.max_bytes + BOUND


def test_a_moved_aside_body_is_restored_only_when_it_fits_and_its_file_is_intact(tmp_path):
    big = b"<sportsdata>" + b"x" * 5_000 + b"</sportsdata>"
    _, zone, batch, _ = _consume(tmp_path, [big])
    (row,) = zone.catalog.read(batch.key).to_pylist()
    where, size, digest = row["body_location"], row["body_size"], row["body_sha256"]
    # A raised bound (a replay after the fix) reads the bytes back; the old one does not.
    assert zone.catalog.restored_body(where, size, digest, max_bytes=size) == big
    assert zone.catalog.restored_body(where, size, digest, max_bytes=size - 1) is None
    # Only the bytes the log vouches for: a changed file, or a path outside overflow/, is refused.
    (zone.catalog.root / where).write_bytes(big.replace(b"x", b"y", 1))
    assert zone.catalog.restored_body(where, size, digest, max_bytes=size) is None
    assert (
        zone.catalog.restored_body("../queue/queue.db", size, digest, max_bytes=10 * size) is None
    )


class _HeldBodies:
    """The embedded queue's session, recording how many bodies over the bound each claim
    handed over at once."""

    def __init__(self, session):
        self.session = session
        self.over_bound_per_claim: list[int] = []

    def get_available(self, max_messages, max_bytes):
        got = self.session.get_available(max_messages, max_bytes)
        self.over_bound_per_claim.append(sum(len(m.body) > BOUND for m in got))
        return got

    def __getattr__(self, name):
        return getattr(self.session, name)


def test_intake_claims_at_most_one_body_over_the_bound_at_a_time(tmp_path):
    queue = EmbeddedQueue(tmp_path / "queue")
    zone = LandingZone(tmp_path / "landing")
    big = b"z" * (BOUND + 1)
    with queue.producer() as producer:
        for body in [b"<a/>", big, big, b"<b/>", big]:
            producer.put(body)
    with queue.connect() as session:
        held = _HeldBodies(session)
        batch = consume_batch(
            held,
            zone.writer,
            BatchLimits(get_wait_seconds=0.05),
            message_limits=Limits(max_message_bytes=BOUND),
        )
    assert batch is not None and batch.messages == 5
    # Several messages a claim (not one get a message), never two bodies over the bound.
    assert len(held.over_bound_per_claim) == 4
    assert max(held.over_bound_per_claim) == 1
