"""`ZoneLayout`: where a landing zone keeps what: its folders, where each batch's files are, the
listing of `batches/`, and the expiry record that says which batches are gone.

Under the zone's root: `batches/` (a batch is one file `batches/<key>.parquet`, or a folder
`batches/<key>/` of parts `part-<nnnnn>.parquet`), `anchors/` (`<key>.json`, one per sealed
batch), `overflow/` (bodies moved aside), `tmp/` (files being written) and `expired.json`.
The zone's parts (writer, catalog, upkeep) are each a `ZoneLayout`: this is what they share,
and all that any of them knows about paths.
"""

from __future__ import annotations

import os
from pathlib import Path

from sis_platform.log.chain import AnchorStore
from sis_platform.log.landing.expiry import Expiry, read_expiry
from sis_platform.log.landing.rows import BATCH_KEY_RE, PART_RE


class ZoneLayout:
    """The folders of the landing zone at `root`, and where each batch's files are."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.batches_dir = self.root / "batches"
        self.tmp_dir = self.root / "tmp"
        self.overflow_dir = self.root / "overflow"
        self.anchors = AnchorStore(self.root / "anchors")

    def ensure(self) -> None:
        self.batches_dir.mkdir(parents=True, exist_ok=True)
        self.tmp_dir.mkdir(parents=True, exist_ok=True)

    def batch_path(self, key: str) -> Path:
        """The file of a batch landed as one file (it may not exist: see `batch_files`)."""
        return self.batches_dir / f"{key}.parquet"

    def batch_dir(self, key: str) -> Path:
        """The folder of a batch landed in parts (it may not exist)."""
        return self.batches_dir / key

    def batch_files(self, key: str) -> list[Path]:
        """The batch's landing file, or its parts in order; [] when it has neither."""
        if self.batch_path(key).is_file():
            return [self.batch_path(key)]
        return self.parts(key)

    def parts(self, key: str) -> list[Path]:
        """The parts of a batch landed in parts, in order ([] for any other batch)."""
        try:
            names = os.listdir(self.batch_dir(key))
        except (FileNotFoundError, NotADirectoryError):
            return []
        numbered = [(int(m.group(1)), n) for n in names if (m := PART_RE.match(n))]
        return [self.batch_dir(key) / n for _, n in sorted(numbered)]

    def is_segmented(self, key: str) -> bool:
        """Whether the batch is (still) a folder of parts with no merged file."""
        return not self.batch_path(key).is_file() and self.batch_dir(key).is_dir()

    def listing(self) -> tuple[set[str], set[str]]:
        """The keys of one-file batches and of batch folders under `batches/` (none when the
        folder does not exist)."""
        files: set[str] = set()
        folders: set[str] = set()
        if not self.batches_dir.is_dir():
            return files, folders
        with os.scandir(self.batches_dir) as entries:
            for entry in entries:
                stem = entry.name.removesuffix(".parquet")
                if not BATCH_KEY_RE.match(stem):
                    continue
                if entry.name.endswith(".parquet") and entry.is_file():
                    files.add(stem)
                elif entry.name == stem and entry.is_dir():
                    folders.add(stem)
        return files, folders

    def expiry(self) -> Expiry | None:
        """The expiry record: which batches were expired from the zone (None: none)."""
        return read_expiry(self.root)

    def overflow_path(self, location: str) -> Path | None:
        """The file a logged body location names, when it lies inside overflow/ (a location is
        data read back from the log: it must not lead anywhere else)."""
        path = (self.root / location).resolve()
        return path if path.is_relative_to(self.overflow_dir.resolve()) else None
