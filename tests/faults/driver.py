"""The process the fault tests kill: sensor ticks or batch runs, as the daemon and run workers do
them, against a persistent Dagster instance and data folder under the test's tmp_path.

    python -m tests.faults.driver tick --home H --data D
    python -m tests.faults.driver run --home H --data D KEY[:FIRST_STEP] ...

`tick` evaluates the real sensor until it skips (queue empty), and after each evaluation does
what the daemon does with the result, in the daemon's order: register the new partitions, then
store the cursor. `run` executes the `process_batch` job for each KEY in turn (in-process
executor, one Spark session); with `:FIRST_STEP` only that step and the ones after it, as a
re-execution from the failed step does. The crash points come from `SIS_CRASH_AT`
(sis_platform.runtime.faults) in the environment the test gives the process.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path

import dagster as dg

from sis_platform.definitions import build_definitions
from sis_platform.resources import config
from sis_platform.testing.inprocess import job_subset
from tests.harness import SUITE_SPARK_CONF

SENSOR = "sportsdata_queue_sensor"
# The job's steps in execution order, with the asset keys each materializes.
STEPS = {
    "raw_messages": ["raw_messages"],
    "message_items": ["message_items", "batch_log", "classify_failures"],
    "fold_masters": [
        "master_documents",
        "master_index",
        "master_versions",
        "dead_letters",
        "message_outcomes",
        "fold_steps",
        "fold_failures",
    ],
    "interpreted_model": ["events", "markets", "selections", "model_steps", "model_failures"],
}


def platform_env(data: Path) -> dict[str, str]:
    return {
        **os.environ,
        "SIS_DATA_DIR": str(data),
        # The driver ticks the queue sensor; a test of live intake's runs sets it to `live`.
        "SIS_INTAKE": os.environ.get("SIS_INTAKE", "sensor"),
        "SIS_SPARK_MASTER": "local[2]",
        "SIS_SPARK_SHUFFLE_PARTITIONS": "2",
        "SIS_GET_WAIT_SECONDS": "0.05",
        "SIS_BATCH_MAX_MESSAGES": os.environ.get("SIS_BATCH_MAX_MESSAGES", "40"),
        "SIS_SPARK_CONF": os.environ.get("SIS_SPARK_CONF", SUITE_SPARK_CONF),
    }


def instance(home: Path) -> dg.DagsterInstance:
    home.mkdir(parents=True, exist_ok=True)
    yaml = home / "dagster.yaml"
    if not yaml.exists():
        yaml.write_text("telemetry:\n  enabled: false\n")
    return dg.DagsterInstance.from_config(str(home))


def cursor_path(home: Path) -> Path:
    return home / "sensor_cursor"


def tick_until_empty(home: Path, env: Mapping[str, str], max_ticks: int = 100) -> int:
    """Tick until the sensor skips; returns the number of ticks that requested runs."""
    defs = build_definitions(env)
    resources = config.resources(env)
    inst = instance(home)
    sensor = defs.resolve_sensor_def(SENSOR)
    for ticks in range(max_ticks):
        stored = cursor_path(home)
        cursor = stored.read_text() if stored.exists() else None
        context = dg.build_sensor_context(instance=inst, cursor=cursor, resources=resources)
        result = sensor(context)
        if isinstance(result, dg.SkipReason):
            if "queue empty" not in (result.skip_message or ""):
                raise AssertionError(f"unexpected skip: {result.skip_message}")
            return ticks
        for request in result.dynamic_partitions_requests or []:
            assert isinstance(request, dg.AddDynamicPartitionsRequest)
            inst.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
        if result.cursor is not None:
            tmp = stored.with_suffix(".tmp")
            tmp.write_text(result.cursor)
            tmp.replace(stored)
    raise AssertionError(f"queue not drained after {max_ticks} ticks")


def run(home: Path, env: Mapping[str, str], spec: str) -> None:
    key, _, first = spec.partition(":")
    defs = build_definitions(env)
    job = defs.resolve_job_def("process_batch")
    names = list(STEPS)
    steps = names[names.index(first) :] if first else names
    selection = [dg.AssetKey(k) for s in steps for k in STEPS[s]]
    result = job_subset(job, selection).execute_in_process(
        partition_key=key, instance=instance(home), tags={"sis/fault-test": spec}
    )
    if not result.success:
        raise AssertionError(f"run of {spec} failed")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["tick", "run"])
    parser.add_argument("--home", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("specs", nargs="*")
    args = parser.parse_args()
    env = platform_env(args.data)
    if args.command == "tick":
        tick_until_empty(args.home, env)
    else:
        for spec in args.specs:
            run(args.home, env, spec)


if __name__ == "__main__":
    main()
