"""A local Spark driver's scratch space: in the platform's data folder, one folder per driver
process, removed once that process is gone.

A local driver writes scratch files while it runs: Spark's local directories (its copy of every
jar on `spark.jars`, about 86 MB with Delta's; the shuffle blocks, which hold feed data; PySpark's
files) and, in the JVM's temporary folder, the native libraries it unpacks (lz4, snappy). By
default all of it goes to /tmp, and Spark deletes it in a shutdown hook: a driver that is killed
(SIGKILL, the kernel's OOM killer, a run worker terminated with its process group) leaves it
behind for good. On a host where /tmp is a RAM-backed tmpfs that is memory, and every killed run
adds to it.

So the resource gives a local driver the folder `<root>/<host>-<pid>` (0700, its parent too) as
both, `<pid>` being the process that starts the driver, and before doing so removes the folders
of this host's processes that no longer exist. The host is in the name because the data folder
may be a volume shared by several containers, whose process ids are not this one's to judge.
A clean shutdown leaves its (emptied) folder for the next start to remove.

An operator's own choice wins: `spark.local.dir` (or SPARK_LOCAL_DIRS, which Spark prefers to
it) for the local directories, `-Djava.io.tmpdir` in `spark.driver.extraJavaOptions` for the
JVM's folder. A cluster's executors are not affected: their scratch is their worker's.
"""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Mapping
from pathlib import Path

from sis_platform.runtime.private import make_private_folder
from sis_platform.runtime.processes import ended_here
from sis_platform.settings import is_local_master

LOCAL_DIR_KEY = "spark.local.dir"
JAVA_OPTIONS_KEY = "spark.driver.extraJavaOptions"
JAVA_TMPDIR_OPTION = "-Djava.io.tmpdir="


def driver_scratch(root: Path) -> Path:
    """This process's scratch folder under `root`, created 0700, after removing the folders of
    this host's processes that are gone."""
    make_private_folder(root)
    sweep(root)
    folder = root / _folder_name(os.getpid())
    make_private_folder(folder)
    return folder


def sweep(root: Path) -> list[Path]:
    """Remove the scratch folders under `root` of this host's processes that no longer exist;
    return them. Folders of other hosts, and anything not named like a scratch folder, stay."""
    removed: list[Path] = []
    try:
        entries = list(root.iterdir())
    except FileNotFoundError:
        return removed
    for entry in entries:
        host, _, pid = entry.name.rpartition("-")
        if not ended_here(host, pid) or not entry.is_dir() or entry.is_symlink():
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    return removed


def with_scratch(conf: Mapping[str, str], folder: Path) -> dict[str, str]:
    """`conf` with a local driver's scratch in `folder`, where the operator chose none; a
    configuration for another master is returned as it is."""
    result = dict(conf)
    if not is_local_driver(result):
        return result
    if LOCAL_DIR_KEY not in result:
        result[LOCAL_DIR_KEY] = str(folder)
    options = result.get(JAVA_OPTIONS_KEY, "")
    if JAVA_TMPDIR_OPTION not in options:
        # Spark splits these options as a shell would: a folder with blanks is quoted.
        value = f"{JAVA_TMPDIR_OPTION}{folder}"
        if any(c.isspace() for c in str(folder)):
            value = f'"{value}"'
        result[JAVA_OPTIONS_KEY] = f"{options} {value}".strip()
    return result


def is_local_driver(conf: Mapping[str, str]) -> bool:
    """The configuration starts a local driver (`local[...]`), whose executors are in it."""
    return is_local_master(str(conf.get("spark.master", "")))


def _folder_name(pid: int) -> str:
    return f"{socket.gethostname()}-{pid}"
