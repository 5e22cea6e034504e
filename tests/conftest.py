"""Fixtures shared across the suite (one real Spark session with Delta per test session), and
how the suite's files are spread over pytest-xdist workers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session", autouse=True)
def private_config_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The user's config folder ($XDG_CONFIG_HOME) for the whole session, in a temporary
    folder: the default log key and witnesses (sis_platform/log/seal.py) go there, not into the
    real home; child processes inherit it."""
    import os

    folder = tmp_path_factory.mktemp("config-home")
    before = os.environ.get("XDG_CONFIG_HOME")
    os.environ["XDG_CONFIG_HOME"] = str(folder)
    yield folder
    if before is None:
        os.environ.pop("XDG_CONFIG_HOME", None)
    else:
        os.environ["XDG_CONFIG_HOME"] = before


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """A local Spark session with Delta, configured as the platform configures a run's driver
    (its JVM that of a long-lived one: see below), with the suite's expressions interpreted
    (tests/harness.py, SUITE_SPARK_SQL).

    The platform's LazyPySparkResource calls getOrCreate() with the same configuration, so
    every Dagster run inside the test process reuses this session instead of starting a JVM.
    """
    import os
    import sys

    from pyspark.sql import SparkSession

    from sis_platform.lake.driver.conf import SHORT_LIVED_SQL, delta_spark_config
    from sis_platform.lake.driver.jars import resolved_jars_dir
    from sis_platform.lake.driver.jvm_archive import configured_archive
    from tests.harness import SUITE_SPARK_SQL

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder
    # This JVM serves every Spark test of its worker, for the whole suite: a long-lived
    # driver's JVM, which keeps the C2 JIT (measured: tests/assets/test_process_batch.py in
    # 131 s against 158 s with C1 only, test_log_integrity.py 87 s against 98 s). Its SQL
    # settings are a run's (SHORT_LIVED_SQL) with the suite's (SUITE_SPARK_SQL), which every
    # in-process run sets again anyway.
    for key, value in delta_spark_config(
        master="local[2]",
        app_name="sis-platform-tests",
        shuffle_partitions=2,
        ui_enabled=False,
        jars_dir=os.environ.get("SIS_SPARK_JARS_DIR") or resolved_jars_dir(),
        class_archive=configured_archive(os.environ.get("SIS_SPARK_CLASS_ARCHIVE") or None),
        long_lived=True,
        extra={**SHORT_LIVED_SQL, **SUITE_SPARK_SQL},
    ).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def no_retry_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dagster retries a step at once instead of after the retry policy's backoff.

    The platform's TRANSIENT_RETRY waits 2, 6 and 14 s (exponential, with jitter) before its
    three retries, and the in-process executor sleeps through that wait: 22 s of idle wall time
    per step retried three times. The tests that make steps fail on purpose assert which steps
    were retried and how often, never how long they waited, so they skip the wait; the number
    of retries (max_retries) is still the policy's own."""
    import dagster as dg

    monkeypatch.setattr(dg.RetryPolicy, "calculate_delay", lambda self, attempt_num: 0)


# The files that SIGKILL a cold Spark driver at each crash point: minutes of CPU-bound JVM
# starts each. They form one xdist unit (one worker, one after another), as when they were one
# file. Measured on a fresh clone: the suite took 44 min with the files spread over both workers
# (a kill chain beside the other worker's heavy tests ran up to 1.8x slower), 40 min with the
# chains in one file on one worker.
PROCESS_KILL_FILES = (
    "tests/faults/test_materializer_crashes.py",
    "tests/faults/test_materializer_crashes_first_batch.py",
    "tests/faults/test_rewind_crashes.py",
)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, the suite's dev dependency
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile`, with PROCESS_KILL_FILES as one unit."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    root = Path(str(config.rootpath))
    missing = [f for f in PROCESS_KILL_FILES if not (root / f).is_file()]
    if missing:
        raise pytest.UsageError(f"PROCESS_KILL_FILES in tests/conftest.py: no such {missing}")

    class KillFilesTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "process kill files" if path in PROCESS_KILL_FILES else path

    return KillFilesTogether(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Heaviest files first, by their `cost` mark; the rest keep their order.

    scripts/test.sh hands each pytest-xdist worker a file at a time (`--dist loadfile
    --no-loadscope-reorder`), in this order: the process kill files (one unit, see above) to
    one worker, the other files of several minutes to the other, and the many short files fill
    in behind them, instead of a long file starting last on one worker.
    """

    def cost(item: pytest.Item) -> float:
        mark = item.get_closest_marker("cost")
        return float(mark.args[0]) if mark is not None else 0.0

    first_seen: dict[str, int] = {}
    file_cost: dict[str, float] = {}
    for index, item in enumerate(items):
        path = item.nodeid.split("::", 1)[0]
        first_seen.setdefault(path, index)
        file_cost[path] = max(file_cost.get(path, 0.0), cost(item))
    items.sort(key=lambda item: (-file_cost[p := item.nodeid.split("::", 1)[0]], first_seen[p]))
