"""Which Delta log store a driver writes a table's log with (tests/lake, tests/cluster)."""

from __future__ import annotations

from typing import Any


def log_store_class(spark: Any, table: str) -> str:
    """The Java class of the log store Delta chose for `table`'s scheme: a DeltaLog's store
    delegates by the scheme of the log's qualified path, to a Java log store in an adaptor."""
    jvm = spark.sparkContext._jvm
    log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, table)
    store = log.store()
    if store.getClass().getSimpleName() == "DelegatingLogStore":
        store = store.getDelegate(log.logPath())
    if store.getClass().getSimpleName() == "LogStoreAdaptor":
        store = store.logStoreImpl()
    return str(store.getClass().getName())
