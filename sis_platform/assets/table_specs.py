"""How a Delta table of the lake appears in the asset graph: an asset spec carrying the table's
columns (from its Spark schema in lake/tables.py) as `dagster/column_schema`, and the metadata
every materialization of it carries (where the table lies)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import dagster as dg

from sis_platform.lake.delta import Lake
from sis_platform.lake.tables import Table

KINDS = {"spark", "delta"}
# Who answers for the platform's assets (shown on every asset page; a deployment may rename it).
OWNERS = ["team:sis-platform"]


def column_schema(table: Table) -> dg.TableSchema:
    """The table's columns as Dagster shows them: name, Spark SQL type, nullability."""
    return dg.TableSchema(
        columns=[
            dg.TableColumn(
                name=field.name,
                type=field.dataType.simpleString(),
                constraints=dg.TableColumnConstraints(nullable=field.nullable),
            )
            for field in table.schema().fields
        ]
    )


def table_spec(
    table: Table, description: str, *, deps: Iterable[str] = (), skippable: bool = False
) -> dg.AssetSpec:
    """The asset of one Delta table, named as the table, with its columns. `skippable`: a run
    of its step may leave it unmaterialized (when there was nothing to write), which skips
    what depends on it in that run."""
    return dg.AssetSpec(
        table.name,
        deps=list(deps),
        skippable=skippable,
        description=description,
        kinds=KINDS,
        owners=OWNERS,
        metadata={"dagster/column_schema": column_schema(table)},
    )


def location(lake: Lake, table: Table) -> dict[str, Any]:
    """Where the table lies, for a materialization's metadata: `dagster/uri` (what the UI shows
    as the asset's address) and `table` (the path, as every materialization has carried it)."""
    path = lake.path(table)
    return {"dagster/uri": path, "table": dg.MetadataValue.path(path)}


def identifier(number: int | None) -> dg.MetadataValue | None:
    """A step or batch number as metadata: text, because it names a thing rather than measures
    it, and the UI plots every numeric value over time."""
    return None if number is None else dg.MetadataValue.text(str(number))
