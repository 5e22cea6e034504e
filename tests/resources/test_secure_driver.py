"""The platform's own Spark driver keeps its secrets (invariant 9, secure by default), proven on a
real Dagster instance on disk and a real driver JVM (tests/resources/secure_driver.py, one child
process shared by the tests here): a secret Spark setting (SIS_SPARK_SECRET_CONF) reaches the
session but neither the Dagster database nor the JVM's command line; and every port the driver
listens on, its web UI's included, is on loopback; and no file or folder it writes is open to
other users."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import zlib
from contextlib import closing, suppress
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil
import pytest

from tests.resources.secure_driver import VISIBLE_MARKER

pytestmark = [pytest.mark.spark, pytest.mark.dagster, pytest.mark.cost(110)]

ROOT = Path(__file__).resolve().parents[2]
SECRET = "sis-secret-7c2d9a0b"


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The data folder the child wrote, and its report on the driver JVM."""
    data = tmp_path_factory.mktemp("secure") / "data"
    data.mkdir(mode=0o755)  # as an older data folder may be: the code location shuts it
    data.chmod(0o755)
    env = {
        **os.environ,
        "SIS_DATA_DIR": str(data),
        # As an operator gives an object store's key: the Spark name, to the environment only.
        "SIS_SPARK_SECRET_CONF": f"spark.hadoop.fs.s3a.secret.key={SECRET}",
    }
    done = subprocess.run(
        [sys.executable, "-m", "tests.resources.secure_driver", str(data)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        # What the code location does, whatever umask it inherits.
        preexec_fn=lambda: os.umask(0o022),
    )
    assert done.returncode == 0, f"{done.stdout[-4000:]}\n{done.stderr[-8000:]}"
    line = next(x for x in done.stdout.splitlines() if x.startswith("REPORT "))
    report = json.loads(line.removeprefix("REPORT "))
    # The JVM outlives the child by its shutdown, which deletes the driver's scratch files in
    # the data folder: the tests read that folder once it is gone.
    with suppress(psutil.NoSuchProcess):
        psutil.Process(report["jvm_pid"]).wait(timeout=120)
    return data, report


def _stored(root: Path) -> dict[Path, bytes]:
    """Every file under `root` as stored, and for a SQLite database (Dagster's storage) also
    every value of every row, zlib-inflated where it is compressed (Dagster stores its job and
    execution plan snapshots that way)."""
    stored: dict[Path, bytes] = {}
    for path in (p for p in root.rglob("*") if p.is_file()):
        content = [path.read_bytes()]
        if content[0].startswith(b"SQLite format 3"):
            with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
                tables = [
                    t for (t,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")
                ]
                for table in tables:
                    for row in db.execute(f'SELECT * FROM "{table}"'):
                        content += [_inflated(value) for value in row]
        stored[path] = b"\n".join(content)
    return stored


def _inflated(value: object) -> bytes:
    raw = value if isinstance(value, bytes) else str(value).encode()
    try:
        return raw + zlib.decompress(raw)
    except zlib.error:
        return raw


def _files_holding(root: Path, text: str) -> list[Path]:
    return [path for path, content in _stored(root).items() if text.encode() in content]


def test_a_secret_spark_setting_reaches_the_session_under_its_hadoop_name(driver):
    _, report = driver
    assert report["secret_conf"] == SECRET
    assert report["marker_conf"] == VISIBLE_MARKER


def test_a_secret_spark_setting_is_not_in_the_dagster_database(driver):
    data, _ = driver
    # The run's job snapshot holds the resources' configuration: the visible setting is there.
    assert _files_holding(data / "dagster", VISIBLE_MARKER), "no run snapshot in the instance"
    # Nor anywhere else the platform wrote (landing, lake, serving store).
    assert _files_holding(data, SECRET) == []


def test_a_secret_spark_setting_is_not_on_the_driver_jvms_command_line(driver):
    _, report = driver
    assert f"spark.sis.marker={VISIBLE_MARKER}" in report["jvm_cmdline"]
    assert SECRET not in report["jvm_cmdline"]


def test_every_listener_of_a_local_driver_is_on_loopback_its_web_ui_included(driver):
    _, report = driver
    listening = report["listening"]
    ui_port = urlsplit(report["ui_url"]).port
    assert ui_port in {port for _, port in listening}, (report["ui_url"], listening)
    assert {ip for ip, _ in listening} <= {"127.0.0.1", "::1", "::ffff:127.0.0.1"}, listening


def test_what_the_platform_writes_is_private_to_its_user(driver):
    data, _ = driver
    entries = [data, *data.rglob("*")]
    # What a run and sis-live write, all of it under the data folder.
    written = {p.relative_to(data).parts[0] for p in entries[1:]}
    assert {"landing", "lake", "serving", "dagster", "queue"} <= written, written
    assert any(p.suffix == ".parquet" for p in (data / "lake").rglob("*"))
    assert any(p.name.endswith(".db") for p in (data / "dagster").rglob("*"))
    shared = {str(p): oct(p.lstat().st_mode & 0o777) for p in entries if p.lstat().st_mode & 0o077}
    assert shared == {}
