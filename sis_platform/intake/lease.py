"""The consumer lease: production and disaster recovery never consume at once (docs/design.md,
invariant 8).

Both deployments point at the same queue and the same landing zone (shared storage, e.g. NFS).
The lease is a small JSON file in the landing zone's root, `lease.json`:

    {"holder": "prod@host-a:4711", "token": 7, "expires_at": "...Z", "acquired_at": "...Z",
     "renewed_at": "...Z", "previous_holder": "dr@host-b:99", "seconds": 60.0}

- Every read-modify-write happens under an exclusive lock on `lease.lock` (POSIX `lockf`, which
  NFS v4, and v3 with lockd, honour across hosts) plus a per-process thread lock (POSIX locks
  belong to the process, so two threads or two lease objects in one process would not exclude
  each other through `lockf` alone). The file is replaced atomically: temp file, fsync, rename,
  fsync of the folder.
- `acquire()` renews the lease when this holder has it (same token, new expiry), takes it when
  there is none or it has expired (token + 1: the fencing token), and otherwise leaves it alone
  and returns the other holder's lease. Intake (sis_platform/intake/tick.py) calls it at the start
  of every tick.
- Fencing: the holder passes `fence(lease)` to `ZoneWriter.land`, which claims the batch file
  inside `Fence.held()`: under the lease lock, immediately before the claim, the token must
  still be the current one. So a holder paused past its expiry (GC, SIGSTOP, a hung NFS
  mount) whose lease was taken over lands nothing (`FencedOff`), and the consumer backs its unit
  of work out, leaving the messages on the queue for the new holder.

Assumptions, stated because the guarantees rest on them:
- Safety (no batch landed by two holders, no stale holder landing) rests on the lock and the
  token only, not on clocks: exactly one token is current at any moment and landing needs it.
- Liveness and "never *consume* at once" rest on wall clocks: expiry is absolute UTC time,
  written by the holder and judged by the standby. Clocks must agree (NTP) to well within the
  margin `seconds - (tick interval + longest tick)`; with the defaults (60 s lease, ticks every
  5 s lasting at most 10 s) that is tens of seconds. A standby whose clock runs ahead by more
  takes over early: both then get messages for a while, the fence still stops the old holder
  from landing, and its backed-out messages return to the queue (possibly behind messages the
  new holder already landed, which is the one thing that costs feed order).
- The holder id names deployment, host and process. Another process of the same deployment on
  the same host (a restarted or replaced Dagster code server) takes over at once with token + 1,
  fencing off its predecessor; so does any process on this host whose predecessor's pid is gone.
  A different deployment waits for the lease to expire. Host
  names must therefore be unique among deployments (two containers sharing a host name but not
  a pid namespace could take over early; the fence still keeps a live old holder from landing).
- `lease.json` is never deleted by hand: tokens would restart at 1.

No Dagster import: intake uses this, and tests drive it directly with an injected clock.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sis_platform.queues.base import FencedOff
from sis_platform.runtime.processes import ended_here
from sis_platform.settings.variables import DEFAULT_LEASE_SECONDS

LEASE_FILE = "lease.json"
LOCK_FILE = "lease.lock"
# The lock is held for a read and a small write (or one link()); waiting longer than this means
# a holder is stuck inside it (paused process, hung mount): fail the tick loudly, do not hang.
DEFAULT_LOCK_TIMEOUT_SECONDS = 30.0
_LOCK_POLL_SECONDS = 0.01

Clock = Callable[[], datetime]

# POSIX record locks are per process: threads of one process serialise here first.
_THREAD_LOCKS: dict[Path, threading.Lock] = {}
_THREAD_LOCKS_GUARD = threading.Lock()


def utc_now() -> datetime:
    return datetime.now(UTC)


def holder_id(deployment: str | None = None) -> str:
    """`deployment@host:pid`; the deployment defaults to the host name."""
    host = socket.gethostname()
    return f"{deployment or host}@{host}:{os.getpid()}"


class LeaseError(Exception):
    """The lease file cannot be read as a lease (it is never guessed at or overwritten)."""


@dataclass(frozen=True)
class Lease:
    """The consumer lease as stored."""

    holder: str
    token: int
    expires_at: datetime
    acquired_at: datetime
    renewed_at: datetime
    previous_holder: str | None
    seconds: float

    def expired(self, now: datetime) -> bool:
        return now >= self.expires_at

    def to_json(self) -> str:
        fields = asdict(self)
        for name in ("expires_at", "acquired_at", "renewed_at"):
            fields[name] = _iso(fields[name])
        return json.dumps(fields, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Lease:
        raw = json.loads(text)
        return cls(
            holder=str(raw["holder"]),
            token=int(raw["token"]),
            expires_at=_parse(raw["expires_at"]),
            acquired_at=_parse(raw["acquired_at"]),
            renewed_at=_parse(raw["renewed_at"]),
            previous_holder=raw.get("previous_holder"),
            seconds=float(raw["seconds"]),
        )


@dataclass(frozen=True)
class Fence:
    """Proof of holding the lease with `token`, checked again where it matters (`held`)."""

    lease: ConsumerLease
    token: int

    @property
    def holder(self) -> str:
        return self.lease.holder

    @contextmanager
    def held(self) -> Iterator[None]:
        """Run the block under the lease lock, only if `token` is still the current token.
        Expiry alone does not fence: until someone takes over, no newer token exists, so the
        holder landing late cannot conflict with anyone."""
        with self.lease.locked():
            current = self.lease.read()
            if current is None or current.token != self.token:
                now = "nobody" if current is None else f"{current.holder} (token {current.token})"
                raise FencedOff(
                    f"{self.holder} holds fencing token {self.token}, but the consumer lease "
                    f"in {self.lease.root} is now held by {now}: landing refused"
                )
            yield


class ConsumerLease:
    """The lease in `root` (the landing zone's root) as seen by `holder`."""

    def __init__(
        self,
        root: Path,
        holder: str,
        seconds: float = DEFAULT_LEASE_SECONDS,
        clock: Clock | None = None,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT_SECONDS,
    ) -> None:
        if seconds <= 0:
            raise ValueError(f"lease seconds must be positive, got {seconds}")
        self.root = Path(root)
        self.holder = holder
        self.seconds = seconds
        self.lock_timeout = lock_timeout
        self._clock = clock
        self.path = self.root / LEASE_FILE
        self.lock_path = self.root / LOCK_FILE
        self._own_thread_lock: threading.Lock | None = None

    def now(self) -> datetime:
        # Looked up at call time, so tests can replace the module's clock for a whole sensor.
        return (self._clock or utc_now)()

    def read(self) -> Lease | None:
        """The stored lease (None before anyone acquired one). A rename is atomic, so this
        needs no lock."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        try:
            return Lease.from_json(text)
        except (ValueError, KeyError, TypeError) as e:
            raise LeaseError(f"{self.path} is not a consumer lease: {e}") from e

    def holds(self, lease: Lease | None) -> bool:
        return lease is not None and lease.holder == self.holder

    def acquire(self) -> Lease:
        """Renew or take the lease if possible; the lease as it now stands either way (check
        `holds()` on the result)."""
        with self.locked():
            current = self.read()
            now = self.now()
            if current is not None and current.holder == self.holder:
                lease = Lease(
                    holder=self.holder,
                    token=current.token,
                    expires_at=now + timedelta(seconds=self.seconds),
                    acquired_at=current.acquired_at,
                    renewed_at=now,
                    previous_holder=current.previous_holder,
                    seconds=self.seconds,
                )
            elif (
                current is None
                or current.expired(now)
                or _same_deployment_here(current.holder, self.holder)
                or _died_here(current.holder)
            ):
                lease = Lease(
                    holder=self.holder,
                    token=(current.token if current is not None else 0) + 1,
                    expires_at=now + timedelta(seconds=self.seconds),
                    acquired_at=now,
                    renewed_at=now,
                    previous_holder=current.holder if current is not None else None,
                    seconds=self.seconds,
                )
            else:
                return current
            self._write(lease)
            return lease

    def release(self) -> None:
        """End this holder's lease now (a planned switchover), so a standby need not wait for
        the expiry. The token stays: the next holder takes token + 1 as usual."""
        with self.locked():
            current = self.read()
            if current is None or current.holder != self.holder:
                return
            now = self.now()
            ended = Lease(
                holder=current.holder,
                token=current.token,
                expires_at=min(now, current.expires_at),
                acquired_at=current.acquired_at,
                renewed_at=current.renewed_at,
                previous_holder=current.previous_holder,
                seconds=current.seconds,
            )
            self._write(ended)

    def fence(self, lease: Lease) -> Fence:
        if not self.holds(lease):
            raise FencedOff(f"{self.holder} does not hold the consumer lease ({lease.holder} does)")
        return Fence(self, lease.token)

    @contextmanager
    def locked(self) -> Iterator[None]:
        """The lease lock: this process's threads first, then other processes and hosts."""
        thread_lock = self._thread_lock()
        if not thread_lock.acquire(timeout=self.lock_timeout):
            raise LeaseError(f"{self.lock_path} busy in this process for {self.lock_timeout}s")
        try:
            try:
                fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            except FileNotFoundError:
                self.root.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                self._lock_file(fd)
                yield
            finally:
                # Closing the only descriptor drops the POSIX lock (and there is only one per
                # process at a time, thanks to the thread lock).
                os.close(fd)
        finally:
            thread_lock.release()

    def _thread_lock(self) -> threading.Lock:
        """This process's lock for the lock file, shared by every ConsumerLease on it (found
        once per instance: the live path takes the lock for every group it lands)."""
        if self._own_thread_lock is None:
            self.root.mkdir(parents=True, exist_ok=True)
            key = self.lock_path.resolve()
            with _THREAD_LOCKS_GUARD:
                self._own_thread_lock = _THREAD_LOCKS.setdefault(key, threading.Lock())
        return self._own_thread_lock

    def _lock_file(self, fd: int) -> None:
        # Non-blocking attempts with a deadline: a blocking lockf() would hang the sensor for
        # as long as a paused holder sits inside the lock.
        deadline = time.monotonic() + self.lock_timeout
        while True:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except (BlockingIOError, PermissionError):
                if time.monotonic() >= deadline:
                    raise LeaseError(
                        f"{self.lock_path} locked by another process for {self.lock_timeout}s "
                        "(a holder paused inside it, or the shared storage hangs)"
                    ) from None
                time.sleep(_LOCK_POLL_SECONDS)

    def _write(self, lease: Lease) -> None:
        tmp = self.path.with_name(f"{LEASE_FILE}.tmp")  # one writer at a time: under the lock
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(lease.to_json())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _same_deployment_here(holder: str, me: str) -> bool:
    """True when `holder` is another process of this very deployment on this host (e.g. the
    code server Dagster restarted, or replaced while the old one shuts down). Dagster runs one
    evaluation of a sensor at a time, so the newer process is the successor: it takes over at
    once with token + 1, which also fences off the old process should it still be mid-tick."""
    return holder.rpartition(":")[0] == me.rpartition(":")[0] and holder != me


def _died_here(holder: str) -> bool:
    """True only when `holder` ran on this host and its process is gone: then nobody can land
    with its token, and waiting for its expiry would only delay a restarted deployment."""
    _, _, where = holder.rpartition("@")
    host, _, pid = where.rpartition(":")
    return ended_here(host, pid)


def _iso(value: datetime) -> str:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _parse(raw: str) -> datetime:
    value = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    if value.tzinfo is None:
        raise ValueError(f"timestamp without a time zone: {raw!r}")
    return value.astimezone(UTC)
