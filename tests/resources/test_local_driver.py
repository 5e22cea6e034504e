"""A local driver started by the platform's Spark resource (resources/spark.py), in a fresh
process: the suite's own session already has PYSPARK_PYTHON set (tests/conftest.py).

- Spark's Python workers run the platform's own interpreter (settings.py
  `python_workers_use_this_interpreter`), even with another `python3` first on PATH: the fold's
  and the model's Arrow functions need its virtualenv (pandas, pyarrow, lxml, the platform).
- Its scratch files are in the resource's scratch folder, not /tmp; when the driver is killed
  they stay there, and the next driver's start removes them (lake/driver/scratch.py).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sis_platform.lake.driver.scratch import sweep

pytestmark = [pytest.mark.spark, pytest.mark.cost(40)]

# Runs a job with a shuffle (shuffle blocks, lz4), then SIGKILLs its JVM: Spark's shutdown hook,
# which deletes its scratch after a clean stop, never runs, as when a run worker is killed.
SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    from sis_platform.resources.spark import DeltaSparkResource

    resource = DeltaSparkResource(
        spark_config={"spark.master": "local[1]", "spark.ui.enabled": "false"},
        scratch_dir=sys.argv[1],
    )
    spark = resource.spark_session
    rows = spark.sparkContext.parallelize(range(100), 2).map(lambda n: (n % 3, sys.executable))
    workers = rows.groupByKey().mapValues(lambda values: sorted(set(values))).collect()
    print("WORKER", workers[0][1][0])
    print("PID", os.getpid(), flush=True)
    os.kill(spark.sparkContext._gateway.proc.pid, signal.SIGKILL)
    spark.sparkContext._gateway.proc.wait()
    os._exit(0)
    """
)


@pytest.fixture(scope="module")
def killed_driver(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, str], Path]:
    """The lines the driver's process printed, by their first word; and its scratch root."""
    tmp_path = tmp_path_factory.mktemp("driver")
    scratch = tmp_path / "scratch"
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "SPARK_LOCAL_DIRS")}
    # Only the system's folders on PATH: its `python3`, if any, is not this virtualenv's.
    env["PATH"] = os.pathsep.join(["/usr/bin", "/bin"])
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(scratch)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
    return lines, scratch


def test_python_workers_run_this_interpreter_unless_the_operator_chose_one(killed_driver):
    lines, _ = killed_driver
    assert lines["WORKER"] == sys.executable


def test_a_killed_drivers_scratch_is_in_the_data_folder_and_the_next_start_removes_it(
    killed_driver,
):
    lines, scratch = killed_driver
    folder = scratch / f"{socket.gethostname()}-{lines['PID']}"
    left = sorted(path.name.split("-")[0] for path in folder.iterdir())
    # Spark's local folder (its jar copies, PySpark's files), the shuffle blocks, and the
    # native library the JVM unpacked to compress them: all of it here, none in /tmp.
    assert {"spark", "blockmgr", "liblz4"} <= set(left), left
    assert (folder.stat().st_mode & 0o777) == 0o700
    assert sweep(scratch) == [folder]
    assert list(scratch.iterdir()) == []
