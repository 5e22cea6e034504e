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
this machine's JDK, virtualenv and jars); its file name carries a key of all three (the jars:
where Delta's come from, see spark_jars.py), so an upgrade builds a new one instead of using a
stale one.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

from sis_platform.resources.spark_jars import resolved_jars_dir
from sis_platform.settings import cache_home


def cache_dir() -> Path:
    return cache_home() / "sis-platform" / "jvm"


def archive_path() -> Path:
    """The archive for this interpreter's pyspark and delta-spark and the `java` on PATH."""
    java = shutil.which("java") or ""
    key = "|".join(
        [
            version("pyspark"),
            version("delta-spark"),
            sys.prefix,  # the virtualenv: Spark's jars are on the JVM's class path from there
            os.path.realpath(java) if java else "",
            # Delta's jars: the folder sis-spark-jars resolved them into, or Spark's resolver.
            resolved_jars_dir() or "spark.jars.packages",
        ]
    )
    return cache_dir() / f"spark-driver-{hashlib.sha256(key.encode()).hexdigest()[:16]}.jsa"


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
    return str(default) if default.is_file() else None


def build(path: Path | None = None) -> Path:
    """Build the archive (a few minutes) in a child process: the JVM writes it as it exits."""
    path = path or archive_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    subprocess.run(
        [sys.executable, "-m", "sis_platform.resources.archive_workload", str(partial)],
        check=True,
    )
    if not partial.is_file():
        raise RuntimeError(f"the JVM exited without writing its class-data archive {partial}")
    partial.replace(path)  # atomic: a concurrent driver start sees the old archive or the new
    return path
