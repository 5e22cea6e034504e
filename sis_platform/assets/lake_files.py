"""The lake's file counts as Dagster sees them: one multi-check (`lake_files`), a
`files_within_bound` check per table the fold's and the model's upkeep keeps compact and per
message log table compacted by block of batches, run by the check_lake job beside
`lake_integrity`, from sis_platform/lake/upkeep.py's counts.

A table past its bound means its upkeep has stopped (SIS_LAKE_OPTIMIZE_EVERY set to 0, or the
steps failing before it), or the bound (SIS_LAKE_MAX_FILES) is too low for the table's size;
a message log table's bound is per settled block: docs/operations.md, "The lake's files".
"""

from collections.abc import Iterator
from typing import Any

import dagster as dg
from dagster_pyspark import LazyPySparkResource

from sis_platform.lake.upkeep import (
    BLOCK_TABLES,
    UPKEEP_TABLES,
    BlocksFinding,
    FilesFinding,
    TableFiles,
    blocks_compact,
    files_within_bound,
)
from sis_platform.resources.platform import DeltaLakeResource

FILES_WITHIN_BOUND = "files_within_bound"

SPECS = [
    dg.AssetCheckSpec(
        FILES_WITHIN_BOUND,
        asset=table.name,
        description=f"{table.name} lists at most SIS_LAKE_MAX_FILES data files"
        + (" beyond those of its compacted partitions" if table.partition_by else "")
        + ": its upkeep (compaction inside the fold's and the model's steps) keeps up.",
    )
    for table in UPKEEP_TABLES
] + [
    dg.AssetCheckSpec(
        FILES_WITHIN_BOUND,
        asset=table.name,
        description=f"Each block of batches of {table.name} that later batches have settled "
        "lists a few files (about two per 128 MiB): the batch runs' block compaction keeps up.",
    )
    for table in BLOCK_TABLES
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
    for table in BLOCK_TABLES:
        if table.name in wanted:
            yield blocks_result(table.name, blocks_compact(lk, table))


def result(table: str, finding: FilesFinding) -> dg.AssetCheckResult:
    metadata: dict[str, Any] = {
        "max_files": finding.bound,
        "files_counted": finding.counted,
        **_file_metadata(finding.files),
    }
    return _check_result(table, finding.passed, metadata)


def blocks_result(table: str, finding: BlocksFinding) -> dg.AssetCheckResult:
    """A block table's finding: its blocks, how many are settled, and the first settled blocks
    over their bound with their files, their bytes and the bound."""
    metadata: dict[str, Any] = {
        "blocks": finding.blocks,
        "settled_blocks": finding.settled,
        "blocks_over_bound": len(finding.over),
        **_file_metadata(finding.files),
    }
    if finding.over:
        metadata["over_bound"] = dg.MetadataValue.text(
            "; ".join(
                f"block {b.block}: {b.files} files, {b.bytes} bytes, bound {b.bound}"
                for b in finding.over[:10]
            )
        )
    return _check_result(table, finding.passed, metadata)


def _file_metadata(files: TableFiles | None) -> dict[str, Any]:
    if files is None:
        return {"note": dg.MetadataValue.text("no table yet")}
    metadata: dict[str, Any] = {"files": files.active_files, "bytes": files.active_bytes}
    if files.deletion_vector_files is not None:
        metadata["deletion_vector_files"] = files.deletion_vector_files
    if files.log_entries is not None:
        metadata["log_entries"] = files.log_entries
    return metadata


def _check_result(table: str, passed: bool, metadata: dict[str, Any]) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(
        asset_key=table,
        check_name=FILES_WITHIN_BOUND,
        passed=passed,
        severity=dg.AssetCheckSeverity.WARN,
        metadata=metadata,
    )
