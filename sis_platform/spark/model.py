"""events / markets / selections: the interpreted model, refreshed for masters that changed.

The model follows the fold's committed steps: each refresh rebuilds the rows of every master the
fold touched since the model's last step, replacing them in one Delta commit per table
(replaceWhere on the master ids), then records the step in model_steps. Re-running a refresh
after a crash rebuilds the same rows, so it is idempotent.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from sis_platform.lake.delta import sql_string
from sis_platform.lake.tables import EVENTS, MARKETS, MASTER_DOCUMENTS, MODEL_STEPS, SELECTIONS
from sis_platform.spark.fold import FOLD_WRITER, committed_step

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

    from sis_platform.lake.delta import Lake


@dataclass(frozen=True)
class ModelRefresh:
    fold_step: int | None
    masters: int = 0
    events: int = 0
    markets: int = 0
    selections: int = 0


MODEL_TABLES = {"events": EVENTS, "markets": MARKETS, "selections": SELECTIONS}


def _combined_schema() -> StructType:
    """One row shape for all three tables: `kind` names the table, the other columns are the
    union of the three tables' columns (same name, same type), nullable."""
    from pyspark.sql import types as T

    fields: dict[str, T.StructField] = {}
    for table in MODEL_TABLES.values():
        for f in table.schema().fields:
            fields.setdefault(f.name, T.StructField(f.name, f.dataType, True))
    return T.StructType([T.StructField("kind", T.StringType(), False), *fields.values()])


def _rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    from sis_platform.domain.interpret import interpret

    # Arrow batches built against the exact schema: no pandas type inference, which failed
    # on columns that are null in every row of a batch (e.g. a batch of events only).
    schema = to_arrow_schema(_combined_schema())
    for batch in batches:
        out: list[dict[str, object]] = []
        for rec in batch.to_pylist():
            # Each document is parsed once for all three tables.
            model = interpret(rec["master_id"], rec["document"].encode("utf-8"))
            extra = {"fold_step": int(rec["fold_step"])}
            out.append(
                {"kind": "events", **asdict(model.event), "version": int(rec["version"]),
                 "stale": bool(rec["stale"]), **extra}
            )
            out.extend({"kind": "markets", **asdict(m), **extra} for m in model.markets)
            out.extend({"kind": "selections", **asdict(s), **extra} for s in model.selections)
        yield pa.RecordBatch.from_pylist(out, schema=schema)


def refresh_model(lake: Lake) -> ModelRefresh:
    from pyspark.sql import functions as F

    lake.claim_writer(FOLD_WRITER)
    lake.ensure(EVENTS, MARKETS, SELECTIONS, MODEL_STEPS)
    done_row = lake.read(MODEL_STEPS).agg(F.max("fold_step").alias("s")).first()
    done = int(done_row["s"]) if done_row and done_row["s"] is not None else 0
    target = committed_step(lake)
    if target.fold_step <= done:
        return ModelRefresh(None)
    changed = (
        lake.read(MASTER_DOCUMENTS, version=target.master_documents_version)
        .where(F.col("fold_step") > done)
        .persist()
    )
    ids = [r["master_id"] for r in changed.select("master_id").collect()]
    live = changed.where("document IS NOT NULL AND NOT filtered")
    counts: dict[str, int] = {}
    if ids:
        condition = "master_id IN ({})".format(", ".join(sql_string(i) for i in ids))
        # Built once (one pass of the interpreter over the changed masters), counted and
        # written from the same materialized rows.
        rows = (
            live.select("master_id", "document", "version", "stale", "fold_step")
            .mapInArrow(_rows, schema=_combined_schema())
            .localCheckpoint()
        )
        counts = {
            str(r["kind"]): int(r["n"])
            for r in rows.groupBy("kind").agg(F.count("*").alias("n")).collect()
        }
        # Three tables, three independent commits: written concurrently (Spark runs jobs from
        # several threads), so each commit's driver-side work overlaps the others' tasks.
        with ThreadPoolExecutor(len(MODEL_TABLES), thread_name_prefix="model-write") as pool:
            writes = [
                pool.submit(
                    lake.replace_where, table, rows.where(F.col("kind") == which), condition
                )
                for which, table in MODEL_TABLES.items()
            ]
            for write in writes:
                write.result()  # the first failure is raised; the others still finish
    changed.unpersist()
    lake.append(
        MODEL_STEPS,
        lake.spark.createDataFrame(
            [(target.fold_step, len(ids), datetime.now(UTC))], MODEL_STEPS.schema()
        ),
    )
    return ModelRefresh(target.fold_step, len(ids), counts.get("events", 0),
                        counts.get("markets", 0), counts.get("selections", 0))
