"""Spark's Python workers run the platform's own interpreter (settings.py
`python_workers_use_this_interpreter`), even with another `python3` first on PATH: the fold's
and the model's Arrow functions need its virtualenv (pandas, pyarrow, lxml, the platform)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.cost(40)]

# A fresh process: the suite's own session already has PYSPARK_PYTHON set (tests/conftest.py).
SCRIPT = textwrap.dedent(
    """
    import sys
    from sis_platform.resources.spark import DeltaSparkResource

    resource = DeltaSparkResource(
        spark_config={"spark.master": "local[1]", "spark.ui.enabled": "false"}
    )
    spark = resource.spark_session
    workers = spark.sparkContext.parallelize([0], 1).map(lambda _: sys.executable).collect()
    print("WORKER", workers[0])
    spark.stop()
    """
)


def test_python_workers_run_this_interpreter_unless_the_operator_chose_one(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_PYTHON"}
    # Only the system's folders on PATH: its `python3`, if any, is not this virtualenv's.
    env["PATH"] = os.pathsep.join(["/usr/bin", "/bin"])
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    worker = next(line for line in result.stdout.splitlines() if line.startswith("WORKER"))
    assert worker == f"WORKER {sys.executable}"
