"""A serving store taken back to an older schema version, as a store written by older code is:
the tables that version lacked dropped and its number recorded (the upgrade tests' premise)."""

from __future__ import annotations

from typing import Any

from sis_platform.serving import ServingWriter


def downgrade(store: ServingWriter, *, to: int, without: str) -> None:
    """Make `store` a version-`to` store, which had no table `without`, and close it."""

    def change(conn: Any) -> None:
        with store._backend.transaction(conn, write=True):
            conn.execute(f"DROP TABLE {without}")
            conn.execute(f"UPDATE position SET schema_version = {int(to)}")

    store._backend.run(change)
    store.close()
