"""A doorbell: wake processes on this host waiting for something to change, without polling.

A doorbell is a folder (mode 0700) of Unix datagram sockets, one per waiter. `Doorbell(folder)
.waiter()` binds one; `Waiter.wait(timeout)` blocks until someone rings or the timeout passes.
`ring(folder)` sends one byte to every socket in the folder without blocking, and removes the
sockets whose owner is gone (a socket file nobody has bound refuses the datagram). A ring says
only "look again": a waiter re-reads whatever it waits for, so a ring that finds a full socket
buffer (the waiter has not yet drained earlier rings) is dropped without loss.

The usual pattern, free of the race between checking and waiting: bind the waiter first, then
loop { `clear()`; check the condition; `wait()` }: a ring after the check wakes the wait.

Nothing here knows what is being waited for: the serving store rings after each commit, a queue
can ring after a put.
"""

from __future__ import annotations

import logging
import os
import secrets
import select
import socket
import stat
from pathlib import Path
from types import TracebackType

from sis_platform.runtime.private import make_private_folder

log = logging.getLogger(__name__)

SUFFIX = ".bell"
# sun_path holds 108 bytes with its terminating NUL; a longer path is reached through the
# folder's descriptor (/proc/self/fd/N/name), which Linux resolves like any path.
_MAX_SOCKET_PATH = 107
# Rings drained per wake: far more than can queue in a socket buffer, so a loop never spins.
_MAX_DRAIN = 65_536
# poll() takes a C int of milliseconds (about 24 days).
_MAX_POLL_MS = 2**31 - 1


class Doorbell:
    """The doorbell in `folder`, created (0700) if missing."""

    def __init__(self, folder: Path | str) -> None:
        self.folder = Path(folder)
        make_private_folder(self.folder)

    def waiter(self) -> Waiter:
        """A new waiter with its own socket in the folder; close it when done."""
        return Waiter(self.folder)

    def ring(self) -> int:
        return ring(self.folder)


class Waiter:
    """One waiter's socket. Rings that arrive while nobody waits are kept until `clear()` or the
    next `wait()`."""

    def __init__(self, folder: Path) -> None:
        self._dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        self.name = f"{os.getpid()}-{secrets.token_hex(6)}{SUFFIX}"
        self._address = _address(folder, self._dir_fd, self.name)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            # The socket file is created with the umask; the folder's 0700 is what guards it.
            self._sock.bind(self._address)
        except OSError:
            self._sock.close()
            os.close(self._dir_fd)
            raise
        self._sock.setblocking(False)
        self._poll = select.poll()
        self._poll.register(self._sock, select.POLLIN)

    def wait(self, timeout: float) -> bool:
        """Block until rung (True) or `timeout` seconds pass (False); consumes the rings."""
        ready = self._poll.poll(min(_MAX_POLL_MS, max(0, int(timeout * 1000 + 0.999))))
        if not ready:
            return False
        self.clear()
        return True

    def clear(self) -> None:
        """Forget rings received so far."""
        for _ in range(_MAX_DRAIN):
            try:
                self._sock.recv(16)
            except BlockingIOError:
                return

    def close(self) -> None:
        if self._sock.fileno() < 0:
            return
        try:
            os.unlink(self.name, dir_fd=self._dir_fd)
        except FileNotFoundError:
            pass
        self._sock.close()
        os.close(self._dir_fd)

    def __enter__(self) -> Waiter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def ring(folder: Path | str) -> int:
    """Wake every waiter of the doorbell in `folder` (without blocking); returns how many were
    rung. Sockets whose owner is gone are removed. A missing folder has no waiters."""
    folder = Path(folder)
    try:
        dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        return 0
    rung = 0
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
            sender.setblocking(False)
            # Bounded by the folder's entries: one socket per live waiter, dead ones removed.
            for entry in os.scandir(dir_fd):
                if entry.name.endswith(SUFFIX):
                    rung += _ring_one(sender, folder, dir_fd, entry.name)
    finally:
        os.close(dir_fd)
    return rung


def _ring_one(sender: socket.socket, folder: Path, dir_fd: int, name: str) -> int:
    try:
        sender.sendto(b"\x01", _address(folder, dir_fd, name))
        return 1
    except BlockingIOError:
        return 1  # its buffer is full of earlier rings: it will look again anyway
    except ConnectionRefusedError:
        _remove_dead(dir_fd, name)
    except (FileNotFoundError, PermissionError) as exc:
        # Gone meanwhile, or another user's socket in a shared folder: not ours to remove.
        log.debug("doorbell %s: not rung (%s)", name, exc)
    return 0


def _remove_dead(dir_fd: int, name: str) -> None:
    try:
        if stat.S_ISSOCK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


def _address(folder: Path, dir_fd: int, name: str) -> str:
    path = str(folder.absolute() / name)
    if len(os.fsencode(path)) <= _MAX_SOCKET_PATH:
        return path
    return f"/proc/self/fd/{dir_fd}/{name}"
