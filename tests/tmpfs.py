"""A small tmpfs mounted for one test, to fill a file system for real (the tests run as root),
and a ballast file that takes its free space and gives it back."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

BLOCK = 4096


@contextmanager
def mounted_tmpfs(path: Path, size_bytes: int) -> Iterator[Path]:
    """A tmpfs of `size_bytes` mounted at `path` (created), unmounted on leaving."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0700", "tmpfs", str(path)],
        check=True,
    )
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def fill(folder: Path) -> Path:
    """A ballast file in `folder` taking every free block of its file system; its path."""
    ballast = folder / "ballast"
    chunk = b"\0" * BLOCK
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        while True:
            try:
                os.write(fd, chunk)
            except OSError:
                break
    finally:
        os.close(fd)
    return ballast
