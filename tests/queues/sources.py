"""The queue sources the conformance suite runs against: one `SourceKind` entry per source.

To add a source, write an `open_...(spec, queue, backout_threshold)` function (module level,
so a child process can call it too), a `spec_...(ctx)` that returns the picklable settings it
needs (ctx gives `tmp_path` and any fixture by name), and append a `SourceKind` to SOURCES.
Capabilities say where a source legitimately differs; the suite then asserts the documented
alternative behaviour instead of skipping.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sis_platform.queues.base import QueueSession, QueueSource, ReceivedMessage
from sis_platform.queues.embedded import EmbeddedQueue
from sis_platform.queues.stomp import StompQueue

Spec = dict[str, Any]


@dataclass(frozen=True)
class Context:
    """What a spec or an outage may use from the running test."""

    tmp_path: Path
    request: pytest.FixtureRequest

    def fixture(self, name: str) -> Any:
        return self.request.getfixturevalue(name)


@dataclass(frozen=True)
class SourceKind:
    name: str
    # Picklable settings for `open` (a child process receives them).
    spec: Callable[[Context], Spec]
    # A source on queue `queue` (fresh per test); module-level function.
    open: Callable[[Spec, str, int], QueueSource]
    # The messages on the source's backout queue (or the broker's dead-letter queue).
    read_backout: Callable[[QueueSource], list[ReceivedMessage]]
    marks: tuple[pytest.MarkDecorator, ...] = ()
    # True: a new source object (another process, a restart) sees the exact delivery count.
    # False: it sees only "redelivered", i.e. delivery_count 2 (a lower bound).
    exact_delivery_count_after_reopen: bool = True
    # True: messages the broker pushed to a consumer ahead of its gets (prefetch) come back
    # flagged redelivered when that consumer dies, although nobody got them.
    prefetch_may_mark_redelivered: bool = False
    # Takes the source's server away inside the block and brings it back after (None: the
    # source has no server; the suite then checks the queue survives closing and reopening).
    outage: Callable[[Context], AbstractContextManager[None]] | None = None
    # None: a crashed consumer is a child process killed with SIGKILL. A source that cannot be
    # shared with a child process (an in-memory fake) gives a function that makes a session
    # in this process vanish the way a killed consumer would (no backout, no close).
    simulate_crash: Callable[[QueueSession], None] | None = None
    # How long the suite waits for a message it knows is there (push-based sources need a
    # moment after subscribing before the first message arrives).
    wait_seconds: float = 10.0

    def param(self) -> Any:
        return pytest.param(self, id=self.name, marks=self.marks)


# -- embedded -------------------------------------------------------------------------------


def spec_embedded(ctx: Context) -> Spec:
    return {"path": str(ctx.tmp_path / "embedded")}


def open_embedded(spec: Spec, queue: str, backout_threshold: int) -> QueueSource:
    return EmbeddedQueue(Path(spec["path"]), queue=queue, backout_threshold=backout_threshold)


def read_backout_embedded(source: QueueSource) -> list[ReceivedMessage]:
    assert isinstance(source, EmbeddedQueue)
    return source.browse_backout()


# -- stomp (ActiveMQ) -----------------------------------------------------------------------


def spec_stomp(ctx: Context) -> Spec:
    broker = ctx.fixture("activemq")
    return {"host": broker.host, "port": broker.stomp_port}


def open_stomp(spec: Spec, queue: str, backout_threshold: int) -> QueueSource:
    return StompQueue(
        spec["host"],
        spec["port"],
        f"/queue/{queue}",
        backout_threshold=backout_threshold,
        backout_queue=f"{queue}.BACKOUT",
        # Small prefetch: the suite's units are larger than it, which must still work.
        prefetch=4,
        # Fail fast in outage tests: the backoff itself is not under test here.
        connect_attempts=2,
        retry_initial_seconds=0.2,
        connect_timeout=5.0,
        receipt_timeout=10.0,
    )


def read_backout_stomp(source: QueueSource) -> list[ReceivedMessage]:
    assert isinstance(source, StompQueue)
    return source.browse_backout()


@contextmanager
def outage_stomp(ctx: Context) -> Iterator[None]:
    broker = ctx.fixture("activemq_outage")
    with broker.down():
        yield


# -- child processes (spawned, so they import this module by name) --------------------------


def hold_unit_until_killed(kind_name: str, spec: Spec, queue: str, count: int, pipe: Any) -> None:
    """Get `count` messages in one unit of work, report their ids, then wait to be killed."""
    kind = BY_NAME[kind_name]
    session = kind.open(spec, queue, 0).connect()
    ids = []
    for _ in range(count):
        message = session.get(kind.wait_seconds)
        if message is None:
            break
        ids.append(message.message_id)
    pipe.send(ids)
    pipe.recv()  # never answered: the parent SIGKILLs this process while the unit is open


SOURCES: list[SourceKind] = [
    SourceKind(
        name="embedded",
        spec=spec_embedded,
        open=open_embedded,
        read_backout=read_backout_embedded,
        wait_seconds=5.0,
    ),
    SourceKind(
        name="stomp",
        spec=spec_stomp,
        open=open_stomp,
        read_backout=read_backout_stomp,
        marks=(pytest.mark.broker,),
        # ActiveMQ's STOMP frames carry `redelivered:true` but no count (see
        # sis_platform/queues/stomp.py); counts above 2 are known only to the source object
        # that saw the backouts.
        exact_delivery_count_after_reopen=False,
        prefetch_may_mark_redelivered=True,
        outage=outage_stomp,
    ),
]

BY_NAME = {kind.name: kind for kind in SOURCES}
