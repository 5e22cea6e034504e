"""Delta's jars, resolved once into the user's cache and reused by every local Spark driver.

Given only `spark.jars.packages`, every driver runs Spark's Ivy resolver at start: it checks
Maven Central (or its cache) for Delta and its dependencies and prints a resolution report of
some hundred lines, in every run's log. `sis-spark-jars` (cli/spark_jars.py, run by
scripts/setup.sh) resolves them once: it starts one small driver with the package, reads the
jars Ivy resolved from that driver's `spark.jars`, and copies them into a folder of the user's
cache named after the package. The platform's settings then pass that folder's jars as
`spark.jars` (config.spark_config), the way an operator's `SIS_SPARK_JARS_DIR` is passed, and
no driver resolves anything. Without the folder (setup not run), drivers resolve as before.

The folder is complete only with its `COMPLETE` marker, written last: an interrupted copy is
never used, and the next run of `sis-spark-jars` starts it again.

An object store's connector is resolved the same way, beside Delta, into a folder of its own
that an operator names with SIS_SPARK_JARS_DIR: `sis-spark-jars --s3a` adds hadoop-aws at the
version of the Hadoop that pyspark ships (the two must match), and with it the AWS SDK bundle.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path
from urllib.parse import unquote, urlparse

from sis_platform.lake.driver.conf import delta_package
from sis_platform.settings import cache_home, spark_home

COMPLETE = "COMPLETE"


def jars_dir(package: str | None = None) -> Path:
    """Where the jars of `package` (Maven coordinates, comma-separated; default: the installed
    delta-spark's) are kept."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", package or delta_package())
    return cache_home() / "sis-platform" / "spark-jars" / name


def hadoop_version() -> str:
    """The version of the Hadoop client in the Spark distribution a local driver runs from
    ($SPARK_HOME, else the installed pyspark: its jars folder holds
    hadoop-client-api-<version>.jar). A connector (hadoop-aws, hadoop-azure) must match it."""
    home = spark_home()
    if home is None:
        raise RuntimeError("no Spark distribution: SPARK_HOME is not set, pyspark not installed")
    found = sorted(home.glob("jars/hadoop-client-api-*.jar"))
    if not found:
        raise RuntimeError(f"no hadoop-client-api jar in Spark's jars folder ({home}/jars)")
    return found[-1].name.removeprefix("hadoop-client-api-").removesuffix(".jar")


def s3a_package() -> str:
    """The S3A connector's coordinates for the installed pyspark: hadoop-aws at its Hadoop's
    version (which brings the AWS SDK bundle it was built with)."""
    return f"org.apache.hadoop:hadoop-aws:{hadoop_version()}"


def packages(extra: list[str] | tuple[str, ...] = ()) -> str:
    """Delta's package and `extra` ones, as one `spark.jars.packages` value."""
    return ",".join([delta_package(), *extra])


def resolved_jars_dir() -> str | None:
    """The folder of resolved jars for the installed delta-spark, if `sis-spark-jars` made it."""
    folder = jars_dir()
    return str(folder) if (folder / COMPLETE).is_file() else None


def jar_paths(spark_jars: str) -> list[Path]:
    """The local files a driver's `spark.jars` value names (`file:` URLs or plain paths)."""
    paths = []
    for entry in filter(None, (part.strip() for part in spark_jars.split(","))):
        url = urlparse(entry)
        if url.scheme not in ("", "file"):
            raise ValueError(f"spark.jars names {entry!r}, not a local file")
        paths.append(Path(unquote(url.path) if url.scheme else entry))
    return paths


def keep(jars: list[Path], folder: Path) -> Path:
    """Copy `jars` into `folder`, replacing what it held, marked complete only at the end."""
    if not jars:
        raise ValueError("no jars to keep")
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        # Numbered in the resolver's order, which the folder's sorted listing then keeps: the
        # order of the class path decides which copy of a class loads.
        names = [f"{index:03d}-{jar.name}" for index, jar in enumerate(jars)]
        for jar, name in zip(jars, names, strict=True):
            shutil.copy2(jar, staging / name)
        (staging / COMPLETE).write_text("\n".join(names) + "\n")
        if folder.exists():
            shutil.rmtree(folder)
        staging.rename(folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return folder


def resolve(folder: Path | None = None, package: str | None = None) -> Path:
    """Resolve `package` (default: the installed delta-spark's; several comma-separated) with
    Spark's own resolver (one small local driver, started and stopped here) and keep its jars
    in `folder` (default `jars_dir(package)`)."""
    from pyspark.sql import SparkSession

    package = package or delta_package()
    spark = (
        SparkSession.builder.master("local[1]")
        .appName("sis-spark-jars")
        .config("spark.jars.packages", package)
        .config("spark.ui.enabled", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    try:
        resolved = spark.sparkContext.getConf().get("spark.jars", "")
    finally:
        spark.stop()
    return keep(jar_paths(resolved), folder or jars_dir(package))
