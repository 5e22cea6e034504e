"""What the platform writes is its user's alone (invariant 9, secure by default): feed bodies in
the queue, the landing zone and the lake, the serving store, Dagster's databases and logs.

Every entry point calls `private_files` first: each console script's `main`, and the code
location's loader (sis_platform/definitions.py), which the webserver's and the daemon's code
servers and every run worker call. With umask 077 the files and folders a process creates, and
those of the children it starts (Spark's JVM, the run workers), have no group or other access,
whatever umask the process inherited. The data folder itself is made 0700 as well, so that what
a tool outside the platform leaves in it (or a data folder made before this) is shut too.
"""

from __future__ import annotations

import os
from pathlib import Path

PRIVATE_UMASK = 0o077


def private_files() -> None:
    """Files and folders this process (and every child it starts from now) creates are
    accessible to its user only."""
    os.umask(PRIVATE_UMASK)


def private_folder(path: Path, *, create: bool) -> None:
    """Make the folder `path` accessible to its user only: created mode 0700 if missing (when
    `create`), and group and other access taken off if it exists and is this user's."""
    if create:
        make_private_folder(path)
    try:
        status = path.stat()
    except FileNotFoundError:
        return
    if status.st_uid == os.getuid() and status.st_mode & 0o077:
        path.chmod(status.st_mode & 0o700)


def make_private_folder(path: Path) -> None:
    """Create the folder `path` mode 0700 (its missing parents with the umask's mode); an
    existing folder is left as it is (it may be an operator's, shared on purpose).
    FileExistsError if `path` is something else."""
    try:
        path.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        if not path.is_dir():
            raise
        return
    os.chmod(path, 0o700)  # mkdir's mode is masked by the umask
