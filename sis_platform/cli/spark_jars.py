"""`sis-spark-jars`: resolve Delta's jars once into the user's cache (lake/driver/jars.py).

sis-spark-jars [--if-missing] [--print-path] [--s3a] [--package COORDINATES ...]

With --s3a or --package the jars go to a folder of their own (Delta's and the others), printed
at the end: point SIS_SPARK_JARS_DIR at it.
"""

from __future__ import annotations

import argparse
import sys

from sis_platform.lake.driver.jars import COMPLETE, jars_dir, packages, resolve, s3a_package
from sis_platform.runtime.private import private_files


def main(argv: list[str] | None = None) -> int:
    private_files()
    parser = argparse.ArgumentParser(
        prog="sis-spark-jars",
        description="Resolve Delta's jars once into the user's cache: Spark drivers then start "
        "without resolving them (no Ivy report in every run's log).",
    )
    parser.add_argument("--if-missing", action="store_true", help="do nothing if resolved")
    parser.add_argument("--print-path", action="store_true", help="only print where they go")
    parser.add_argument(
        "--s3a",
        action="store_true",
        help="add the S3A connector (hadoop-aws at pyspark's Hadoop version) for a lake on s3a://",
    )
    parser.add_argument(
        "--package",
        action="append",
        default=[],
        metavar="GROUP:ARTIFACT:VERSION",
        help="add another package (Maven coordinates); repeatable",
    )
    args = parser.parse_args(argv)
    extra = ([s3a_package()] if args.s3a else []) + args.package
    package = packages(extra)
    folder = jars_dir(package)
    if args.print_path:
        print(folder)
        return 0
    if args.if_missing and (folder / COMPLETE).is_file():
        return 0
    print(f"resolving {package} into {folder} (once)")
    folder = resolve(folder, package)
    print(f"kept {len(list(folder.glob('*.jar')))} jars in {folder}")
    if extra:
        print(f"use them with SIS_SPARK_JARS_DIR={folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
