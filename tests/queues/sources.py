"""The queue sources the conformance suite runs against: one `SourceKind` entry per source.

To add a source, write an `open_...(spec, queue, backout_threshold)` function (module level,
so a child process can call it too), a `spec_...(ctx)` that returns the picklable settings it
needs (ctx gives `tmp_path` and any fixture by name), and append a `SourceKind` to SOURCES.
Capabilities say where a source legitimately differs; the suite then asserts the documented
alternative behaviour instead of skipping.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest

from sis_platform.queues.base import QueueSession, QueueSource, ReceivedMessage
from sis_platform.queues.embedded import EmbeddedQueue
from sis_platform.queues.factory import open_source_from_environment
from sis_platform.queues.ibmmq import IbmMqQueue
from sis_platform.queues.stomp import StompQueue
from tests.queues.fake_pymqi import FakePymqi, FakeQueueManagerServer

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
    # True: a message that was out with a consumer when the server went away comes back flagged
    # redelivered. False: it may come back unflagged (ActiveMQ keeps the flag in memory unless
    # its destination policy persists it, which scripts/activemq.sh leaves off for throughput).
    redelivered_survives_outage: bool = True
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
    return {
        "host": broker.host,
        "port": broker.stomp_port,
        # As the platform runs it: redeliveries counted in a file every process shares.
        "redelivery_counts": str(ctx.tmp_path / "stomp" / "redeliveries.db"),
    }


def open_stomp(spec: Spec, queue: str, backout_threshold: int) -> QueueSource:
    return StompQueue(
        spec["host"],
        spec["port"],
        f"/queue/{queue}",
        backout_threshold=backout_threshold,
        backout_queue=f"{queue}.BACKOUT",
        redelivery_counts=Path(spec["redelivery_counts"]),
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


# -- ibmmq-fake: the IBM MQ source over the in-memory fake of pymqi
# (tests/queues/fake_pymqi) -
#
# BOTHRESH/BOQNAME are attributes of an MQ queue, not of the client: opening with a threshold
# sets the test queue's BOTHRESH and its BOQNAME ("<queue>.BACKOUT"); opening with 0 leaves
# them as they are. Both ibmmq entries do the same.

_FAKE_QUEUE_MANAGERS: dict[str, FakeQueueManagerServer] = {}
_FAKE_PASSWORD = "conformance-secret"


def spec_ibmmq_fake(ctx: Context) -> Spec:
    key = str(ctx.tmp_path)
    _FAKE_QUEUE_MANAGERS[key] = FakeQueueManagerServer(
        listeners=("127.0.0.1(1414)",),
        users={"app": _FAKE_PASSWORD},
        dead_letter_queue="SYSTEM.DEAD.LETTER.QUEUE",
        blocking_waits=True,  # the suite measures waits and gets from another thread
        now=lambda: datetime.now(UTC),
    )
    ctx.request.addfinalizer(lambda: _FAKE_QUEUE_MANAGERS.pop(key, None))
    return {"server": key}


def _no_sleep(seconds: float) -> None:
    """Reconnect backoff is tested in test_ibmmq.py; here it would only slow the suite."""


def open_ibmmq_fake(spec: Spec, queue: str, backout_threshold: int) -> QueueSource:
    server = _FAKE_QUEUE_MANAGERS[spec["server"]]
    backout_queue = f"{queue}.BACKOUT"
    if queue not in server.queues:
        server.define_queue(queue)
        server.define_queue(backout_queue)
    if backout_threshold:
        defined = server.queues[queue]
        defined.backout_threshold, defined.backout_queue = backout_threshold, backout_queue
    return IbmMqQueue(
        "QM1",
        "DEV.APP.SVRCONN",
        "127.0.0.1(1414)",
        queue,
        user="app",
        password=_FAKE_PASSWORD,
        reconnect_attempts=2,
        sleep=_no_sleep,
        pymqi_module=FakePymqi(server),
    )


def read_backout_ibmmq(source: QueueSource) -> list[ReceivedMessage]:
    """BOQNAME's messages, got under syncpoint and backed out again, so they stay there."""
    assert isinstance(source, IbmMqQueue)
    messages = []
    with source.with_queue(f"{source.queue}.BACKOUT").connect() as session:
        while (message := session.get(0.0)) is not None:
            messages.append(message)
        session.backout()
    return messages


@contextmanager
def outage_ibmmq_fake(ctx: Context) -> Iterator[None]:
    server = _FAKE_QUEUE_MANAGERS[str(ctx.tmp_path)]
    server.available = False
    server.break_connections()
    try:
        yield
    finally:
        server.available = True


def crash_ibmmq_fake(session: QueueSession) -> None:
    # No process to kill: end the session's connection the way the queue manager sees a
    # killed client (no MQBACK, no MQDISC). Reaches into the session for its QueueManager.
    qmgr = cast(Any, session)._conn.qmgr
    qmgr._server.kill(qmgr)


# -- ibmmq: a real queue manager, only when SIS_IBMMQ_* name one (docs/ibmmq.md) ------------
#
# Each test gets its own queue "T<hex>" and "T<hex>.BACKOUT", defined through PCF and deleted
# (with their messages) afterwards; SIS_IBMMQ_QUEUE is never touched.

IBMMQ_ENV_NEEDED = ("SIS_IBMMQ_QMGR", "SIS_IBMMQ_CHANNEL", "SIS_IBMMQ_CONN")
_REAL_QUEUES: dict[str, set[str]] = {}


def real_ibmmq_configured() -> bool:
    return all(os.environ.get(name) for name in IBMMQ_ENV_NEEDED)


def spec_ibmmq(ctx: Context) -> Spec:
    env = {k: v for k, v in os.environ.items() if k.startswith("SIS_IBMMQ_")}
    key = str(ctx.tmp_path)
    _REAL_QUEUES[key] = set()
    ctx.request.addfinalizer(lambda: _delete_real_queues(env, _REAL_QUEUES.pop(key, set())))
    return {"env": env, "key": key}


def _real_source(env: dict[str, str], queue: str) -> IbmMqQueue:
    source = open_source_from_environment(
        "ibmmq:", {**env, "SIS_IBMMQ_QUEUE": queue}, reconnect_attempts=2
    )
    assert isinstance(source, IbmMqQueue)
    return source


def _pcf(source: IbmMqQueue, commands: list[tuple[str, dict[int, Any], int | None]]) -> None:
    """Run PCF commands on one connection; a command may tolerate one reason code."""
    pymqi = source.pymqi
    with source.connected_queue_manager() as qmgr:
        pcf = pymqi.PCFExecute(qmgr)
        try:
            for command, args, tolerated in commands:
                try:
                    getattr(pcf, command)(args)
                except pymqi.MQMIError as exc:
                    if exc.reason != tolerated:
                        raise
        finally:
            pcf.disconnect()


def open_ibmmq(spec: Spec, queue: str, backout_threshold: int) -> QueueSource:
    source = _real_source(spec["env"], queue)
    cmqc, cmqcfc = source.pymqi.CMQC, source.pymqi.CMQCFC
    backout_queue = f"{queue}.BACKOUT"
    commands: list[tuple[str, dict[int, Any], int | None]] = [
        (
            "MQCMD_CREATE_Q",
            {cmqc.MQCA_Q_NAME: name.encode("ascii"), cmqc.MQIA_Q_TYPE: cmqc.MQQT_LOCAL},
            cmqcfc.MQRCCF_OBJECT_ALREADY_EXISTS,  # opened before (or by the parent process)
        )
        for name in (backout_queue, queue)
    ]
    if backout_threshold:
        commands.append(
            (
                "MQCMD_CHANGE_Q",
                {
                    cmqc.MQCA_Q_NAME: queue.encode("ascii"),
                    cmqc.MQIA_Q_TYPE: cmqc.MQQT_LOCAL,
                    cmqc.MQIA_BACKOUT_THRESHOLD: backout_threshold,
                    cmqc.MQCA_BACKOUT_REQ_Q_NAME: backout_queue.encode("ascii"),
                },
                None,
            )
        )
    _pcf(source, commands)
    _REAL_QUEUES.setdefault(spec["key"], set()).add(queue)
    return source


def _delete_real_queues(env: dict[str, str], queues: set[str]) -> None:
    for queue in queues:
        source = _real_source(env, queue)
        cmqc, cmqcfc = source.pymqi.CMQC, source.pymqi.CMQCFC
        _pcf(
            source,
            [
                (
                    "MQCMD_DELETE_Q",
                    {cmqc.MQCA_Q_NAME: name.encode("ascii"), cmqcfc.MQIACF_PURGE: cmqcfc.MQPO_YES},
                    cmqc.MQRC_UNKNOWN_OBJECT_NAME,
                )
                for name in (queue, f"{queue}.BACKOUT")
            ],
        )


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
        # sis_platform/queues/stomp/source.py): the source counts redeliveries in a file, so a new
        # source object (another process) knows them too.
        exact_delivery_count_after_reopen=True,
        prefetch_may_mark_redelivered=True,
        redelivered_survives_outage=False,
        outage=outage_stomp,
    ),
    SourceKind(
        name="ibmmq-fake",
        spec=spec_ibmmq_fake,
        open=open_ibmmq_fake,
        read_backout=read_backout_ibmmq,
        outage=outage_ibmmq_fake,
        # In-memory: a child process could not share the fake queue manager.
        simulate_crash=crash_ibmmq_fake,
        wait_seconds=5.0,
    ),
    # A real queue manager: listed only when SIS_IBMMQ_* name one (never a skipped test).
    *(
        [
            SourceKind(
                name="ibmmq",
                spec=spec_ibmmq,
                open=open_ibmmq,
                read_backout=read_backout_ibmmq,
                # Nothing here can stop a real queue manager: the suite checks the documented
                # alternative (the queue survives closing and reopening everything).
                outage=None,
            )
        ]
        if real_ibmmq_configured()
        else []
    ),
]

BY_NAME = {kind.name: kind for kind in SOURCES}
