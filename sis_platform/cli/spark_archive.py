"""`sis-spark-archive`: build the Spark driver's class-data archive (see
lake/driver/jvm_archive.py).

sis-spark-archive [--if-missing] [--print-path]

Either way (built or already there) it then removes the cache's stale archives (prune).
"""

from __future__ import annotations

import argparse
import sys
import time

from sis_platform.lake.driver.jvm_archive import (
    UNUSED_DAYS,
    archive_path,
    build,
    prune,
    superseded,
)
from sis_platform.runtime.private import private_files


def main(argv: list[str] | None = None) -> int:
    private_files()
    parser = argparse.ArgumentParser(
        prog="sis-spark-archive",
        description="Build the Spark driver's class-data archive: faster Spark driver starts.",
    )
    parser.add_argument("--if-missing", action="store_true", help="do nothing if it exists")
    parser.add_argument("--print-path", action="store_true", help="only print where it goes")
    args = parser.parse_args(argv)
    path = archive_path()
    if args.print_path:
        print(path)
        return 0
    if not (args.if_missing and path.is_file()):
        print(f"building the Spark driver's class-data archive {path} (a few minutes, once)")
        started = time.monotonic()
        build(path)
        print(
            f"built {path} ({path.stat().st_size / 2**20:.0f} MiB in "
            f"{time.monotonic() - started:.0f} s)"
        )
    for old in prune(path):
        if old.name.endswith(".partial"):
            print(f"removed {old}: a build that did not finish")
        elif superseded(path, old):
            print(f"removed {old}: built for jars or a JDK since reinstalled")
        else:
            print(f"removed {old}: no Spark driver has used it for {UNUSED_DAYS} days")
    return 0


if __name__ == "__main__":
    sys.exit(main())
