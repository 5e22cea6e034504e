"""The lake's file counts as Dagster sees them: one multi-check (`lake_files`), a
`files_within_bound` check per table the fold's and the model's upkeep keeps compact, run by
the check_lake job beside `lake_integrity`, from sis_platform/lake/upkeep.py's counts.

A table past its bound means its upkeep has stopped (SIS_LAKE_OPTIMIZE_EVERY set to 0, or the
steps failing before it), or the bound (SIS_LAKE_MAX_FILES) is too low for the table's size:
docs/operations.md, "The lake's files".
"""

from collections.abc import Iterator
from typing import Any

import dagster as dg
from dagster_pyspark import LazyPySparkResource

from sis_platform.lake.upkeep import UPKEEP_TABLES, FilesFinding, files_within_bound
from sis_platform.resources.platform import DeltaLakeResource

FILES_WITHIN_BOUND = "files_within_bound"

SPECS = [
    dg.AssetCheckSpec(
        FILES_WITHIN_BOUND,
        asset=table.name,
        description=f"{table.name} lists at most SIS_LAKE_MAX_FILES data files: its upkeep "
        "(compaction inside the fold's and the model's steps) keeps up.",
    )
    for table in UPKEEP_TABLES
]


@dg.multi_asset_check(
    specs=SPECS,
    can_subset=True,
    name="lake_files",
    description="Each upkept lake table's data files against SIS_LAKE_MAX_FILES "
    "(lake/upkeep.py), run by the check_lake job.",
)
def lake_files(
    context: dg.AssetCheckExecutionContext, spark: LazyPySparkResource, lake: DeltaLakeResource
) -> Iterator[dg.AssetCheckResult]:
    lk = lake.lake(spark.spark_session)
    wanted = {key.asset_key.path[-1] for key in context.selected_asset_check_keys}
    for table in UPKEEP_TABLES:
        if table.name in wanted:
            yield result(table.name, files_within_bound(lk, table, lake.max_files))


def result(table: str, finding: FilesFinding) -> dg.AssetCheckResult:
    metadata: dict[str, Any] = {"max_files": finding.bound}
    if finding.files is None:
        metadata["note"] = dg.MetadataValue.text("no table yet")
    else:
        metadata["files"] = finding.files.active_files
        metadata["bytes"] = finding.files.active_bytes
        if finding.files.deletion_vector_files is not None:
            metadata["deletion_vector_files"] = finding.files.deletion_vector_files
        if finding.files.log_entries is not None:
            metadata["log_entries"] = finding.files.log_entries
    return dg.AssetCheckResult(
        asset_key=table,
        check_name=FILES_WITHIN_BOUND,
        passed=finding.passed,
        severity=dg.AssetCheckSeverity.WARN,
        metadata=metadata,
    )
