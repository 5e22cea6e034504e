"""A class-data archive (JDK AppCDS) for the Spark driver's JVM: a faster start for every run.

Each Dagster run starts its own local Spark driver, and a fresh JVM spends much of its first
minute loading and verifying the ~20,000 classes of Spark, Delta and Hadoop. A class-data
archive holds them pre-parsed; a JVM started with `-XX:SharedArchiveFile` maps it instead.
`sis-spark-archive` (cli/spark_archive.py, run by scripts/setup.sh) builds one by running a
small Spark and Delta workload (archive_workload.py) in a JVM started with
`-XX:ArchiveClassesAtExit`;
`delta_spark_config` then passes the archive to every local driver. Nothing else changes: a
JVM that cannot use the archive (another JDK, another class path) warns and loads its classes
as usual.

The archive lives in the user's cache, never in the repository (it is ~200 MB and specific to
this machine's JDK, virtualenv and jars). Its file name says which installation it belongs to
(`spark-driver-<place>-<stamp>.jsa`): the place is the versions, the virtualenv, the `java` and
where Delta's jars come from (spark_jars.py); the stamp is the size and modification time of
every jar on the driver's class path and of the `java` binary. The JVM checks exactly those
against the archive and, if any differs, warns "Unable to use shared archive" and starts
without it. So a reinstall at the same path (a fresh clone's virtualenv in CI, a redeploy, a
JDK update) has a new stamp, and setup builds a new archive instead of every driver silently
starting without one. So the old ones do not pile up (~200 MB each), a build removes the
archives of its own place with another stamp (their jars are gone), every driver start that
uses the default archive marks it used (its modification time), and `sis-spark-archive`
removes the others once unused for `UNUSED_DAYS`, and any build a crash left half written.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

from sis_platform.lake.driver.jars import resolved_jars_dir
from sis_platform.settings import cache_home, spark_home

# An archive no driver has started with for this long belongs to a clone, virtualenv or
# version that is gone (or idle: it is rebuilt by the next setup, a few minutes).
UNUSED_DAYS = 14
# A partial archive older than this is a build that died (a build takes minutes).
_PARTIAL_HOURS = 6


def cache_dir() -> Path:
    return cache_home() / "sis-platform" / "jvm"


def _digest(parts: list[str]) -> str:
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def _stamp(files: list[Path]) -> str:
    """What the JVM checks before using an archive: each file's size and modification time."""
    entries = []
    for path in files:
        try:
            stat = path.stat()
        except OSError:
            entries.append(f"{path}:missing")
            continue
        entries.append(f"{path}:{stat.st_size}:{stat.st_mtime_ns}")
    return _digest(entries)


def archive_path() -> Path:
    """The archive for this interpreter's pyspark and delta-spark, the `java` on PATH, and the
    jars and JDK as installed now (`spark-driver-<place>-<stamp>.jsa`, see the module's
    docstring)."""
    found = shutil.which("java")
    java = os.path.realpath(found) if found else ""
    delta_jars = resolved_jars_dir()
    place = _digest(
        [
            version("pyspark"),
            version("delta-spark"),
            sys.prefix,  # the virtualenv: Spark's jars are on the JVM's class path from there
            java,
            # Delta's jars: the folder sis-spark-jars resolved them into, or Spark's resolver.
            delta_jars or "spark.jars.packages",
        ]
    )
    home = spark_home()
    files = sorted((home / "jars").glob("*.jar")) if home else []
    if delta_jars:
        files += sorted(Path(delta_jars).glob("*.jar"))
    if java:
        files.append(Path(java))
    return cache_dir() / f"spark-driver-{place}-{_stamp(files)}.jsa"


def _place(path: Path) -> str | None:
    """The place part of an archive's name: `spark-driver-<place>-<stamp>.jsa`, or an older
    build's `spark-driver-<place>.jsa` (named after its place alone); None for another name."""
    parts = path.name.removesuffix(".jsa").split("-")
    return parts[2] if len(parts) in (3, 4) and parts[:2] == ["spark", "driver"] else None


def configured_archive(setting: str | None) -> str | None:
    """The archive a driver should use: `setting` is SIS_SPARK_CLASS_ARCHIVE (a path, or `off`);
    by default the one `sis-spark-archive` built, if it exists."""
    if setting == "off":
        return None
    if setting:
        if not Path(setting).is_file():
            raise ValueError(f"SIS_SPARK_CLASS_ARCHIVE={setting!r} is not a file")
        return setting
    default = archive_path()
    if not default.is_file():
        return None
    _mark_used(default)
    return str(default)


def _mark_used(path: Path) -> None:
    """The archive's modification time is when a driver last chose it (the JVM checks the
    class path's jars, not the archive's own times); `prune` goes by it."""
    try:
        os.utime(path)
    except OSError:
        pass  # another user's cache or a read-only one: pruning just sees it as older


def superseded(keep: Path, path: Path) -> bool:
    """Whether `path` is an archive of `keep`'s place with another stamp: built for jars (or a
    JDK) that have since been reinstalled, which no JVM can use any more."""
    place = _place(keep)
    return place is not None and path != keep and path.suffix == ".jsa" and _place(path) == place


def prune(keep: Path, now: float | None = None) -> list[Path]:
    """Remove the archives other than `keep` unused for UNUSED_DAYS or superseded by `keep`,
    and the partial builds older than a few hours; the paths removed."""
    now = time.time() if now is None else now
    removed = []
    for path in sorted(keep.parent.glob("*.jsa")) + sorted(keep.parent.glob(".*.partial")):
        limit = _PARTIAL_HOURS * 3600 if path.name.endswith(".partial") else UNUSED_DAYS * 86400
        try:
            if path == keep or (now - path.stat().st_mtime < limit and not superseded(keep, path)):
                continue
            path.unlink()
        except FileNotFoundError:
            continue  # removed by a concurrent prune
        removed.append(path)
    return removed


def build(path: Path | None = None) -> Path:
    """Build the archive (a few minutes) in a child process: the JVM writes it as it exits."""
    path = path or archive_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    subprocess.run(
        [sys.executable, "-m", "sis_platform.lake.driver.archive_workload", str(partial)],
        check=True,
    )
    if not partial.is_file():
        raise RuntimeError(f"the JVM exited without writing its class-data archive {partial}")
    partial.replace(path)  # atomic: a concurrent driver start sees the old archive or the new
    return path
