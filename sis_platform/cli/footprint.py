"""`sis-footprint`: what the platform keeps on disk, counted, for sizing volumes and watching
growth over a season (docs/operations.md, "Running for a season").

    sis-footprint [--json]

Counts, from the platform's own configuration (SIS_DATA_DIR, SIS_LANDING_DIR, SIS_LAKE_PATH,
SIS_SERVING_URL, DAGSTER_HOME), without starting Spark or touching the queue:
- the landing zone: sealed batch files, batch folders and their part files, anchors, overflow
  bodies, and their bytes;
- each Delta table under a local lake path: data files, deletion-vector files, log entries
  (commits and checkpoints) and bytes, as they lie on the volume (files a later VACUUM removes
  are counted until it does);
- the serving store on SQLite: its files' bytes and the rows of its growing tables;
- Dagster's instance folder: its bytes, the `batches` partitions and the runs it holds.
Each figure is a snapshot; run it once a day (or after each simulated day of a benchmark) to
see what grows. Exit status 0, or 2 for bad configuration.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sis_platform.runtime.private import private_files
from sis_platform.serving.location import SqliteLocation, parse_location
from sis_platform.settings import ConfigurationError, Settings, dagster_home, load_settings

EXIT_USAGE = 2
# The serving store's tables that grow with the feed (its others hold one row per master).
GROWING_TABLES = ("changes", "message_outcomes", "dead_letters")


@dataclass(frozen=True)
class Files:
    """A number of files and their bytes."""

    files: int = 0
    bytes: int = 0

    def __add__(self, other: Files) -> Files:
        return Files(self.files + other.files, self.bytes + other.bytes)


@dataclass(frozen=True)
class LandingFootprint:
    batch_files: Files
    batch_folders: int
    part_files: Files
    anchors: Files
    overflow: Files


@dataclass(frozen=True)
class TableFootprint:
    data_files: Files
    deletion_vectors: Files
    log_entries: Files


@dataclass(frozen=True)
class DagsterFootprint:
    home_bytes: int
    partitions: int
    runs: int


@dataclass(frozen=True)
class Footprint:
    landing: LandingFootprint
    lake: dict[str, TableFootprint] = field(default_factory=dict)
    serving_bytes: int | None = None
    serving_rows: dict[str, int] = field(default_factory=dict)
    dagster: DagsterFootprint | None = None


def _files(paths: Sequence[Path]) -> Files:
    return Files(len(paths), sum(p.stat().st_size for p in paths))


def _listed(folder: Path, pattern: str) -> list[Path]:
    return [p for p in folder.glob(pattern) if p.is_file()] if folder.is_dir() else []


def landing_footprint(root: Path) -> LandingFootprint:
    """The landing zone under `root` (sis_platform/log/landing/: batches/, anchors/,
    overflow/)."""
    batches = root / "batches"
    folders = [p for p in batches.iterdir() if p.is_dir()] if batches.is_dir() else []
    return LandingFootprint(
        batch_files=_files(_listed(batches, "*.parquet")),
        batch_folders=len(folders),
        part_files=_files([p for folder in folders for p in _listed(folder, "part-*.parquet")]),
        anchors=_files(_listed(root / "anchors", "*.json")),
        overflow=_files(_listed(root / "overflow", "*")),
    )


def table_footprint(table: Path) -> TableFootprint:
    """One Delta table's folder: its Parquet data files (in partition folders too), its
    deletion-vector files and its transaction log's entries."""
    data = [p for p in table.rglob("*.parquet") if "_delta_log" not in p.parts]
    return TableFootprint(
        data_files=_files(data),
        deletion_vectors=_files([p for p in table.rglob("deletion_vector_*.bin")]),
        log_entries=_files(_listed(table / "_delta_log", "*")),
    )


def lake_footprint(lake_path: str) -> dict[str, TableFootprint]:
    """Every Delta table under a local lake path (a folder with a `_delta_log`); nothing for
    an object store's path, which its own tools count."""
    root = Path(lake_path.removeprefix("file://"))
    if "://" in lake_path.removeprefix("file://") or not root.is_dir():
        return {}
    return {
        table.name: table_footprint(table)
        for table in sorted(root.iterdir())
        if (table / "_delta_log").is_dir()
    }


def serving_footprint(url: str) -> tuple[int | None, dict[str, int]]:
    """An SQLite store's bytes (with its WAL) and its growing tables' rows, read only; nothing
    for PostgreSQL, whose own statistics say it (docs/operations.md)."""
    location = parse_location(url)
    if not isinstance(location, SqliteLocation) or not location.path.is_file():
        return None, {}
    files = [location.path, *(Path(f"{location.path}{s}") for s in ("-wal", "-shm"))]
    size = sum(f.stat().st_size for f in files if f.is_file())
    with sqlite3.connect(f"file:{location.path}?mode=ro", uri=True) as conn:
        present = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        rows = {
            t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
            for t in GROWING_TABLES
            if t in present
        }
    return size, rows


def dagster_footprint(home: str) -> DagsterFootprint:
    """The Dagster instance at `home`: its folder's bytes, `batches` partitions and runs."""
    import dagster as dg

    from sis_platform.assets.partitions import BATCHES

    size = sum(p.stat().st_size for p in Path(home).rglob("*") if p.is_file())
    with dg.DagsterInstance.from_config(home) as instance:
        partitions = len(instance.get_dynamic_partitions(BATCHES))
        runs = instance.get_runs_count()
    return DagsterFootprint(size, partitions, runs)


def footprint(settings: Settings, home: str | None) -> Footprint:
    size, rows = serving_footprint(settings.serving.url)
    return Footprint(
        landing=landing_footprint(Path(settings.landing_dir)),
        lake=lake_footprint(settings.lake_path),
        serving_bytes=size,
        serving_rows=rows,
        dagster=dagster_footprint(home) if home and Path(home).is_dir() else None,
    )


def _text(found: Footprint) -> str:
    land = found.landing
    lines = [
        f"landing: {land.batch_files.files} batch files ({land.batch_files.bytes} B),"
        f" {land.batch_folders} batch folders with {land.part_files.files} part files"
        f" ({land.part_files.bytes} B), {land.anchors.files} anchors,"
        f" {land.overflow.files} overflow bodies ({land.overflow.bytes} B)"
    ]
    for name, table in found.lake.items():
        lines.append(
            f"lake {name}: {table.data_files.files} data files ({table.data_files.bytes} B),"
            f" {table.deletion_vectors.files} deletion vectors,"
            f" {table.log_entries.files} log entries ({table.log_entries.bytes} B)"
        )
    if found.serving_bytes is not None:
        rows = ", ".join(f"{n} {t}" for t, n in found.serving_rows.items())
        lines.append(f"serving store: {found.serving_bytes} B; rows: {rows}")
    if found.dagster is not None:
        d = found.dagster
        lines.append(f"dagster: {d.home_bytes} B, {d.partitions} batches partitions, {d.runs} runs")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    private_files()
    parser = argparse.ArgumentParser(prog="sis-footprint", description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="one JSON object instead of text")
    args = parser.parse_args(argv)
    try:
        settings = load_settings()
    except ConfigurationError as error:
        print(f"sis-footprint: {error}", file=sys.stderr)
        return EXIT_USAGE
    found = footprint(settings, dagster_home())
    print(json.dumps(asdict(found), sort_keys=True) if args.json else _text(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
