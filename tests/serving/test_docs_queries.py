"""The example SQL of docs/serving.md runs on both backends against a store with data."""

from __future__ import annotations

import re
from pathlib import Path

from sis_platform.serving import ServingWriter
from tests.serving.groups import group

DOC = Path(__file__).resolve().parents[2] / "docs" / "serving.md"


def example_queries() -> list[tuple[str, str]]:
    """(the comment above it, the statement) for each statement of the doc's SQL blocks."""
    blocks = re.findall(r"```sql\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    queries = []
    for block in blocks:
        for statement in block.split(";"):
            lines = statement.strip().splitlines()
            comments = " ".join(line for line in lines if line.startswith("--"))
            sql = "\n".join(line for line in lines if not line.startswith("--"))
            if sql.strip():
                queries.append((comments, sql))
    return queries


def test_the_documented_queries_run(store: ServingWriter, backend: str) -> None:
    store.commit(group((1, 1), [("EV-123", 1), ("EV-124", 1)], dead=["ID:4142..."]))
    queries = example_queries()
    assert len(queries) >= 7
    ran = 0
    for comment, sql in queries:
        if "(PostgreSQL)" in comment and backend != "postgresql":
            continue
        rows = store._backend.run(lambda conn, sql=sql: store._backend.fetch_all(conn, sql))
        assert isinstance(rows, list), comment
        ran += 1
    assert ran >= 6
    document = store._backend.run(
        lambda conn: store._backend.fetch_all(
            conn, "SELECT version, document FROM masters WHERE master_id = 'EV-123'"
        )
    )
    assert document and document[0][0] == 1
