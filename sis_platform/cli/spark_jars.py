"""`sis-spark-jars`: resolve Delta's jars once into the user's cache (resources/spark_jars.py).

sis-spark-jars [--if-missing] [--print-path]
"""

from __future__ import annotations

import argparse
import sys

from sis_platform.private import private_files
from sis_platform.resources.spark_jars import jars_dir, resolve, resolved_jars_dir


def main(argv: list[str] | None = None) -> int:
    private_files()
    parser = argparse.ArgumentParser(
        prog="sis-spark-jars",
        description="Resolve Delta's jars once into the user's cache: Spark drivers then start "
        "without resolving them (no Ivy report in every run's log).",
    )
    parser.add_argument("--if-missing", action="store_true", help="do nothing if resolved")
    parser.add_argument("--print-path", action="store_true", help="only print where they go")
    args = parser.parse_args(argv)
    if args.print_path:
        print(jars_dir())
        return 0
    if args.if_missing and resolved_jars_dir() is not None:
        return 0
    print(f"resolving Delta's jars into {jars_dir()} (once)")
    folder = resolve()
    print(f"kept {len(list(folder.glob('*.jar')))} jars in {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
