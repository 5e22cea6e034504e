"""Spark with Delta Lake, as a lazily built session (the sensor process never starts a JVM).

The session comes from dagster-pyspark's `LazyPySparkResource`; its configuration is
`delta_spark_config` (sis_platform/lake/driver/conf.py), shared with every other driver the
platform starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dagster_pyspark import LazyPySparkResource
from dagster_pyspark.resources import spark_session_from_config
from pydantic import Field, PrivateAttr

from sis_platform.lake.driver.scratch import driver_scratch, is_local_driver, with_scratch
from sis_platform.settings import (
    local_driver_listens_on_loopback,
    python_workers_use_this_interpreter,
    spark_secret_conf,
)


class DeltaSparkResource(LazyPySparkResource):
    """dagster-pyspark's lazily built session, with Python workers on this interpreter and the
    secret settings of SIS_SPARK_SECRET_CONF.

    PySpark starts its Python workers with $PYSPARK_PYTHON, else whatever `python3` is first
    on PATH; in local mode that must be the platform's own interpreter (its virtualenv holds
    pandas, pyarrow, lxml and the platform), so it is set before the session starts unless
    the operator set it (settings.python_workers_use_this_interpreter). For the same reason a
    local driver's web UI is made to listen on loopback (settings.local_driver_listens_on_loopback).

    Secrets (an object store's keys) are not in `spark_config`: that is the resource's
    configuration, which the Dagster UI shows and every run's snapshot stores, and PySpark
    passes every builder setting to spark-submit as `--conf key=value`, on the JVM's command
    line that any local user can read. They come from SIS_SPARK_SECRET_CONF in this process's
    environment and are set on the session once its JVM runs (settings.spark_secret_conf).

    A local driver keeps its scratch files (Spark's local directories, the JVM's temporary
    folder) in `scratch_dir`, one folder per process, and removes those of processes that are
    gone when it starts (lake/driver/scratch.py): a killed driver leaves nothing behind for good.
    """

    scratch_dir: str | None = Field(
        default=None,
        description="Folder for local drivers' scratch files (None: Spark's default, /tmp).",
    )
    _secrets_applied: bool = PrivateAttr(default=False)

    def _init_session(self) -> None:
        # LazyPySparkResource builds its session here, from `spark_config` alone.
        if self._spark_session is None:
            conf = dict(self.spark_config)
            if self.scratch_dir and is_local_driver(conf):
                conf = with_scratch(conf, driver_scratch(Path(self.scratch_dir)))
            self._spark_session = spark_session_from_config(conf)

    @property
    def spark_session(self) -> Any:
        python_workers_use_this_interpreter()
        local_driver_listens_on_loopback(str(self.spark_config.get("spark.master", "")))
        if self._secrets_applied:
            return super().spark_session
        secrets = spark_secret_conf()  # read first: a malformed value fails before a JVM starts
        session = super().spark_session
        for key, value in secrets.items():
            session.conf.set(key, value)
        self._secrets_applied = True
        return session
