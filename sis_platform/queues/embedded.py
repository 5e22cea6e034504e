"""A durable local queue with IBM MQ syncpoint semantics, in one SQLite database.

The feed simulator puts from one process while the sensor gets from another, so everything
that matters lives in the database (WAL mode, `synchronous=FULL` for every put, commit and
backout) and every state change is one SQLite transaction:

- FIFO by put order: `seq` is assigned inside the writer lock, so it is commit order.
- A get under syncpoint marks the row with the session's token (invisible to other sessions);
  commit deletes it; backout clears the mark and raises `backout_count`, which leaves the row
  at its original position. `get_available` marks the next messages available, up to a count
  and a byte bound, in one transaction (a group's gets in one statement, not one each).
- Crashed consumers: a session holds a `flock` on its own lock file for its whole life. The
  kernel drops the lock when the process dies (SIGKILL included), so "owner dead" is an event
  we can test for, not a timeout we guess. Opening a session and the first get of every unit
  of work (a waiting get also when half a second passes without a ring) reinstate a dead
  session's messages with backout count + 1, as the queue manager does when a connection
  breaks with a unit of work open.
- Backout threshold (MQ BOTHRESH; DEFAULT_BACKOUT_THRESHOLD, 10, unless configured; 0 turns
  it off) and backout queue (BOQNAME, `<queue>.BACKOUT` unless configured): a get that meets a
  message whose backout count has reached the threshold moves it to the backout queue inside
  the unit of work, as the IBM MQ JMS client does, instead of returning it. A consumer that
  dies with a message in its unit counts as a backout, so a message that kills its consumer
  stops coming back after the threshold.

Waiting: SQLite has no cross-process notification, so the queue's folder has a doorbell
(sis_platform.runtime.doorbell, a folder of Unix datagram sockets): every change that makes messages
gettable (a put, a commit moving messages to a backout queue, a backout, reinstating a dead
session's messages) rings it after its transaction commits, and a waiting `get` sleeps on its
own socket until rung, looking again then. It also looks again every half second without a
ring, to reinstate dead sessions' messages (a crashed consumer rings nothing) and in case a
ring was missed (a producer of an older version, a full socket buffer).

Checkpoints: a consumer's commits nudge a checkpoint thread of its session
(sis_platform.runtime.walcheckpoint), so the log is copied into the database off the get and commit
path instead of inside whichever put or get reaches SQLite's automatic threshold.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from sis_platform.queues.base import (
    QueueProducer,
    QueueSession,
    QueueSource,
    ReceivedMessage,
    SourceUnavailable,
    new_message_id,
)
from sis_platform.runtime.doorbell import Doorbell, Waiter, ring
from sis_platform.runtime.logs import concerning
from sis_platform.runtime.walcheckpoint import WalCheckpointer
from sis_platform.settings.variables import DEFAULT_BACKOUT_THRESHOLD

log = logging.getLogger(__name__)

DATABASE_NAME = "queues.db"
OPENING_LOCK_NAME = "opening.lock"  # held while a connection sets the database up
_SESSIONS_DIR = "sessions"
DOORBELL_DIR = "doorbell"  # rung when messages become gettable (see the module docstring)
# How often a waiting get looks again without a ring: for dead owners (a crashed consumer rings
# nothing) and for a missed ring.
_REAP_INTERVAL_SECONDS = 0.5
# Without a doorbell (its socket could not be made), a waiting get looks again this often.
_POLL_SECONDS = 0.02
_BUSY_TIMEOUT_SECONDS = 30.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,
    queue         TEXT    NOT NULL,
    message_id    TEXT    NOT NULL,
    body          BLOB    NOT NULL,
    put_time_us   INTEGER NOT NULL,
    backout_count INTEGER NOT NULL DEFAULT 0,
    owner         TEXT,
    move_to       TEXT
);
CREATE INDEX IF NOT EXISTS messages_by_queue ON messages (queue, owner, seq);
CREATE INDEX IF NOT EXISTS messages_by_owner ON messages (owner);
CREATE TABLE IF NOT EXISTS sessions (
    token     TEXT    PRIMARY KEY,
    pid       INTEGER NOT NULL,
    opened_us INTEGER NOT NULL
);
"""


def _now_us() -> int:
    return time.time_ns() // 1000


def _utc(us: int) -> datetime:
    return datetime.fromtimestamp(us / 1_000_000, tz=UTC)


def _open_database(directory: Path) -> sqlite3.Connection:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(
            directory / DATABASE_NAME,
            timeout=_BUSY_TIMEOUT_SECONDS,
            isolation_level=None,  # transactions are explicit: BEGIN IMMEDIATE ... COMMIT
            check_same_thread=False,  # a session may be used from a sensor's worker thread
        )
    except (OSError, sqlite3.Error) as e:
        raise SourceUnavailable(f"cannot open embedded queue database in {directory}: {e}") from e
    try:
        with _opening(directory):
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            with _transaction(conn):
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        conn.execute(statement)
    except (OSError, sqlite3.Error) as e:
        conn.close()
        raise SourceUnavailable(f"embedded queue database in {directory} is unusable: {e}") from e
    return conn


@contextmanager
def _opening(directory: Path) -> Iterator[None]:
    """One connection at a time sets up the database. Switching a new database to WAL needs
    an exclusive lock; two connections doing it at once can both hold a shared lock and want
    to upgrade, and SQLite then fails one at once with "database is locked" instead of waiting
    (its busy timeout does not apply to a deadlock), so a consumer starting beside another on a
    new queue would fail (1 open in 90 with 6 processes at once, unguarded). A kernel lock,
    freed when the file is closed, even by a crash."""
    with open(directory / OPENING_LOCK_NAME, "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        yield


@contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    # IMMEDIATE takes the write lock up front, so two consumers never both read the same head
    # row and then race to claim it.
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


@contextmanager
def _db_errors(directory: Path) -> Iterator[None]:
    # A locked-out or failing database (disk full, I/O error, busy beyond the timeout) is an
    # outage of this source, not a bug in the caller: report it the way a broker outage is.
    try:
        yield
    except sqlite3.OperationalError as e:
        raise SourceUnavailable(f"embedded queue in {directory}: {e}") from e


def _ring(directory: Path) -> None:
    """Wake the queue's waiting gets. Called after a commit: a failure here must not fail the
    change, which is done; a waiter missing it looks again within _REAP_INTERVAL_SECONDS."""
    try:
        ring(directory / DOORBELL_DIR)
    except OSError as e:
        log.debug("embedded queue in %s: doorbell not rung: %s", directory, e)


def _row_to_message(row: tuple[str, bytes, int, int]) -> ReceivedMessage:
    message_id, body, put_time_us, backout_count = row
    return ReceivedMessage(
        message_id=message_id,
        body=bytes(body),
        put_time=_utc(put_time_us),
        delivery_count=backout_count + 1,
    )


class _OwnerLock:
    """The lock file a session holds for its life; its absence of a holder means death."""

    def __init__(self, directory: Path, token: str) -> None:
        self.path = directory / f"{token}.lock"
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            # flock, not fcntl/lockf: flock locks belong to the open file description, so a
            # probe from another session in the same process conflicts with it too (POSIX
            # record locks are per process and would make same-process sessions look dead).
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        finally:
            os.close(self._fd)
            self._fd = None

    @staticmethod
    def holder_alive(path: Path) -> bool:
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            # Lock files are created and locked before the session row is inserted and removed
            # only after it is deleted, so a row without a file belongs to a dead session.
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return True
            raise
        finally:
            os.close(fd)  # also drops the probe's lock if it got one
        return False


def _reap_dead_sessions(
    conn: sqlite3.Connection, sessions_dir: Path, own_token: str, orphans: bool = True
) -> int:
    """Reinstate the in-flight messages of sessions whose process died; returns how many."""
    # Looked at without a transaction first: this runs before every get, and should not take
    # the write lock when (as almost always) nobody has died. A token is never reused, so a
    # session found dead here is still dead inside the transaction below.
    tokens = [t for (t,) in conn.execute("SELECT token FROM sessions") if t != own_token]
    dead = [t for t in tokens if not _OwnerLock.holder_alive(sessions_dir / f"{t}.lock")]
    orphaned = None
    if orphans:
        orphaned = conn.execute(
            "SELECT 1 FROM messages WHERE owner IS NOT NULL AND owner != ?"
            " AND owner NOT IN (SELECT token FROM sessions) LIMIT 1",
            (own_token,),
        ).fetchone()
    if not dead and orphaned is None:
        return 0
    reinstated = 0
    with _transaction(conn):
        for token in dead:
            cur = conn.execute(
                "UPDATE messages SET owner = NULL, move_to = NULL,"
                " backout_count = backout_count + 1 WHERE owner = ?",
                (token,),
            )
            reinstated += cur.rowcount
            conn.execute("DELETE FROM sessions WHERE token = ?", (token,))
        # Defensive: a mark whose session row is gone can only be left by a dead owner.
        cur = conn.execute(
            "UPDATE messages SET owner = NULL, move_to = NULL, backout_count = backout_count + 1"
            " WHERE owner IS NOT NULL AND owner != ? AND owner NOT IN (SELECT token FROM sessions)",
            (own_token,),
        )
        reinstated += cur.rowcount
    for token in dead:
        (sessions_dir / f"{token}.lock").unlink(missing_ok=True)
    if reinstated:
        _ring(sessions_dir.parent)
    log.warning(
        "embedded queue: reinstated %d in-flight message(s) of %d dead consumer session(s)",
        reinstated,
        len(dead),
    )
    return reinstated


class EmbeddedQueue(QueueSource):
    """A durable local queue in `path` (one SQLite file shared by all queues in the folder)."""

    def __init__(
        self,
        path: Path,
        queue: str = "SPORTSDATA",
        backout_threshold: int = DEFAULT_BACKOUT_THRESHOLD,
        backout_queue: str | None = None,
    ) -> None:
        if not queue:
            raise ValueError("queue name must not be empty")
        if backout_threshold < 0:
            raise ValueError(f"backout_threshold must be >= 0, got {backout_threshold}")
        self.path = Path(path)
        self.queue = queue
        self.backout_threshold = backout_threshold
        # MQ leaves BOQNAME blank by default; a blank one would leave poison messages cycling,
        # so the embedded queue always has somewhere to put them.
        self.backout_queue = backout_queue or f"{queue}.BACKOUT"
        if self.backout_queue == queue:
            raise ValueError("backout_queue must differ from queue")

    @property
    def description(self) -> str:
        threshold = (
            f"backout threshold {self.backout_threshold} -> {self.backout_queue}"
            if self.backout_threshold
            else "no backout threshold"
        )
        return f"embedded queue {self.queue} in {self.path}, {threshold}"

    def connect(self) -> EmbeddedSession:
        return EmbeddedSession(self)

    def producer(self) -> EmbeddedProducer:
        return EmbeddedProducer(self.path, self.queue)

    def backout_source(self) -> EmbeddedQueue:
        """The backout queue as a source of its own (to drain or inspect it); it has no
        backout threshold of its own."""
        return EmbeddedQueue(self.path, queue=self.backout_queue, backout_threshold=0)

    def depth(self, include_in_flight: bool = True) -> int:
        """Messages on the queue. Like MQ CURDEPTH, messages got in an uncommitted unit of work
        are still on the queue; `include_in_flight=False` counts only the gettable ones."""
        with self._reader() as conn:
            sql = "SELECT COUNT(*) FROM messages WHERE queue = ?"
            if not include_in_flight:
                sql += " AND owner IS NULL"
            (n,) = conn.execute(sql, (self.queue,)).fetchone()
        return int(n)

    def browse(self) -> list[ReceivedMessage]:
        """The gettable messages in get order, without consuming them (an MQ browse, which
        does not see messages got in someone's open unit of work)."""
        return self._browse(self.queue)

    def browse_backout(self) -> list[ReceivedMessage]:
        """The backout queue's messages in order, without consuming them."""
        return self._browse(self.backout_queue)

    def _browse(self, queue: str) -> list[ReceivedMessage]:
        with self._reader() as conn:
            rows = conn.execute(
                "SELECT message_id, body, put_time_us, backout_count FROM messages"
                " WHERE queue = ? AND owner IS NULL ORDER BY seq",
                (queue,),
            ).fetchall()
        return [_row_to_message(r) for r in rows]

    @contextmanager
    def _reader(self) -> Iterator[sqlite3.Connection]:
        conn = _open_database(self.path)
        try:
            yield conn
        finally:
            conn.close()


class EmbeddedSession(QueueSession):
    """One consumer connection: at most one unit of work at a time."""

    knows_available = True  # a look at the database is the queue itself

    def __init__(self, source: EmbeddedQueue) -> None:
        self._source = source
        self._queue = source.queue
        self._threshold = source.backout_threshold
        self._backout_queue = source.backout_queue
        self._lock = threading.Lock()
        self._token = uuid.uuid4().hex
        self._sessions_dir = source.path / _SESSIONS_DIR
        self._conn = _open_database(source.path)
        try:
            self._sessions_dir.mkdir(exist_ok=True)
            self._owner_lock = _OwnerLock(self._sessions_dir, self._token)
        except OSError as e:
            self._conn.close()
            raise SourceUnavailable(
                f"cannot create a session lock in {self._sessions_dir}: {e}"
            ) from e
        try:
            with _db_errors(source.path):
                _reap_dead_sessions(self._conn, self._sessions_dir, self._token)
                self._register()
        except BaseException:
            self._owner_lock.release()
            self._conn.close()
            raise
        self._in_unit = 0
        self._closed = False
        self._waiter: Waiter | None = None  # bound at the first get that waits
        # Started at the first commit: checkpoints off the get and commit path (see
        # sis_platform/runtime/walcheckpoint.py).
        self._checkpointer: WalCheckpointer | None = None

    def _register(self) -> None:
        with _transaction(self._conn):
            self._conn.execute(
                "INSERT INTO sessions (token, pid, opened_us) VALUES (?, ?, ?)",
                (self._token, os.getpid(), _now_us()),
            )

    def get(self, wait_seconds: float = 0.0) -> ReceivedMessage | None:
        deadline = time.monotonic() + max(0.0, wait_seconds)
        with self._lock, _db_errors(self._source.path):
            self._require_open()
            waiter = self._bound_waiter() if wait_seconds > 0 else None
            reap = not self._in_unit
            while True:
                # Rings before this look are forgotten: the look sees what they announced. One
                # after it stays queued on the socket and ends the wait below at once.
                if waiter is not None:
                    waiter.clear()
                if reap:
                    self._reap()
                claimed = self._claim(1, 1)
                if claimed:
                    return claimed[0]
                now = time.monotonic()
                if now >= deadline:
                    return None
                # Until rung (a put, a backout), the wait is over, or it is time to look for
                # dead owners again.
                pause = min(deadline - now, _REAP_INTERVAL_SECONDS)
                if waiter is not None:
                    # A ring announces messages; a dead owner rings nothing, so its messages
                    # are looked for when a pause ends without one.
                    reap = not waiter.wait(pause)
                else:
                    time.sleep(min(pause, _POLL_SECONDS))
                    reap = True

    def get_available(self, max_messages: int, max_bytes: int) -> list[ReceivedMessage]:
        """The messages gettable now, claimed in one transaction (see QueueSession)."""
        if max_messages < 1 or max_bytes < 1:
            return []
        with self._lock, _db_errors(self._source.path):
            self._require_open()
            if not self._in_unit:
                self._reap()
            return self._claim(max_messages, max_bytes)

    def _reap(self) -> None:
        # As a queue manager backs out a broken connection's unit at once, a consumer that died
        # is noticed (a probe of each other session's lock file) before a unit of work's first
        # get, so its messages are back in their places before the unit chooses; within a unit
        # it is noticed by the next unit (or by a waiting get's periodic look), which is when a
        # get under syncpoint could tell anyway.
        _reap_dead_sessions(self._conn, self._sessions_dir, self._token, orphans=False)

    def _bound_waiter(self) -> Waiter | None:
        """This session's doorbell socket, bound once; None if it cannot be (the get then
        looks again every _POLL_SECONDS, as it did before the doorbell)."""
        if self._waiter is None:
            try:
                self._waiter = Doorbell(self._source.path / DOORBELL_DIR).waiter()
            except OSError as e:
                log.warning("embedded queue in %s: no doorbell (%s); polling", self._source.path, e)
                return None
        return self._waiter

    def commit(self) -> None:
        with self._lock, _db_errors(self._source.path):
            self._require_open()
            if not self._in_unit:
                return
            with _transaction(self._conn):
                moved = self._conn.execute(
                    "INSERT INTO messages (queue, message_id, body, put_time_us, backout_count)"
                    " SELECT move_to, message_id, body, put_time_us, backout_count FROM messages"
                    " WHERE owner = ? AND move_to IS NOT NULL ORDER BY seq",
                    (self._token,),
                ).rowcount
                self._conn.execute("DELETE FROM messages WHERE owner = ?", (self._token,))
            self._in_unit = 0
            if moved:
                _ring(self._source.path)  # gettable now on the backout queue
            if self._checkpointer is None:
                self._checkpointer = WalCheckpointer(
                    self._source.path / DATABASE_NAME, name="embedded-queue-checkpoint"
                )
            self._checkpointer.nudge()

    def backout(self) -> None:
        with self._lock, _db_errors(self._source.path):
            self._require_open()
            self._backout_locked()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._backout_locked()
                with _transaction(self._conn):
                    self._conn.execute("DELETE FROM sessions WHERE token = ?", (self._token,))
            finally:
                self._conn.close()
                # Released only after the session row is gone, so no reaper ever sees a live
                # row without a held lock.
                self._owner_lock.release()
                if self._waiter is not None:
                    self._waiter.close()
                    self._waiter = None
                if self._checkpointer is not None:
                    self._checkpointer.close()
                    self._checkpointer = None

    def _backout_locked(self) -> None:
        if not self._in_unit:
            return
        with _transaction(self._conn):
            self._conn.execute(
                "UPDATE messages SET owner = NULL, move_to = NULL,"
                " backout_count = backout_count + 1 WHERE owner = ?",
                (self._token,),
            )
        self._in_unit = 0
        _ring(self._source.path)  # reinstated: gettable again

    def _claim(self, max_messages: int, max_bytes: int) -> list[ReceivedMessage]:
        """Claim the next gettable messages in queue order, in one transaction: up to
        `max_messages`, ending after the one whose body brings them to `max_bytes`. A message
        whose backout count has reached the threshold is marked to move to the backout queue at
        commit instead (not returned, not counted)."""
        # A claim needs no fsync of its own: if it is lost in a power cut, the messages are
        # simply still available (or reinstated from this now-dead session). The commit that
        # deletes them runs with synchronous=FULL and makes everything before it durable too.
        self._conn.execute("PRAGMA synchronous=NORMAL")
        try:
            with _transaction(self._conn):
                claimed: list[ReceivedMessage] = []
                claims: list[tuple[str, int]] = []
                moves: list[tuple[str, str, int]] = []
                size = 0
                after = 0
                while len(claimed) < max_messages and size < max_bytes:
                    # Rows are read one at a time (bodies only of what is claimed, plus at most
                    # the moved ones); marks are written after the read, never while its cursor
                    # walks the index they change.
                    wanted = max_messages - len(claimed)
                    cursor = self._conn.execute(
                        "SELECT seq, message_id, body, put_time_us, backout_count FROM messages"
                        " WHERE queue = ? AND owner IS NULL AND seq > ? ORDER BY seq LIMIT ?",
                        (self._queue, after, wanted),
                    )
                    read = 0
                    for seq, message_id, body, put_time_us, backout_count in cursor:
                        read += 1
                        after = seq
                        if self._threshold and backout_count >= self._threshold:
                            moves.append((self._token, self._backout_queue, seq))
                            log.warning(
                                "embedded queue %s: message %s reached backout count %d,"
                                " moving it to %s",
                                self._queue,
                                message_id,
                                backout_count,
                                self._backout_queue,
                                extra=concerning(message_id=message_id),
                            )
                            continue
                        claims.append((self._token, seq))
                        claimed.append(
                            _row_to_message((message_id, body, put_time_us, backout_count))
                        )
                        size += len(body)
                        if size >= max_bytes:
                            break
                    cursor.close()
                    if read < wanted:
                        break  # nothing more is gettable (or the byte bound ended the read)
                if moves:
                    self._conn.executemany(
                        "UPDATE messages SET owner = ?, move_to = ? WHERE seq = ?", moves
                    )
                if claims:
                    self._conn.executemany("UPDATE messages SET owner = ? WHERE seq = ?", claims)
                self._in_unit += len(moves) + len(claims)
                return claimed
        finally:
            self._conn.execute("PRAGMA synchronous=FULL")

    def _require_open(self) -> None:
        if self._closed:
            raise RuntimeError("session is closed")


class EmbeddedProducer(QueueProducer):
    def __init__(self, path: Path, queue: str) -> None:
        self._path = path
        self._queue = queue
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = _open_database(path)

    def put(self, body: bytes, message_id: str | None = None) -> str:
        message_id = message_id or new_message_id()
        with self._lock, _db_errors(self._path):
            if self._conn is None:
                raise RuntimeError("producer is closed")
            with _transaction(self._conn):
                self._conn.execute(
                    "INSERT INTO messages (queue, message_id, body, put_time_us)"
                    " VALUES (?, ?, ?, ?)",
                    (self._queue, message_id, bytes(body), _now_us()),
                )
        _ring(self._path)
        return message_id

    def put_many(self, messages: Iterable[tuple[bytes, str | None]]) -> int:
        """Put (body, message id) pairs in one transaction: all or none. For loading a backlog
        (benchmarks); the feed itself is put one message at a time."""
        rows = [
            (self._queue, message_id or new_message_id(), bytes(body), _now_us())
            for body, message_id in messages
        ]
        with self._lock, _db_errors(self._path):
            if self._conn is None:
                raise RuntimeError("producer is closed")
            with _transaction(self._conn):
                self._conn.executemany(
                    "INSERT INTO messages (queue, message_id, body, put_time_us)"
                    " VALUES (?, ?, ?, ?)",
                    rows,
                )
        _ring(self._path)
        return len(rows)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
