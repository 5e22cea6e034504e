"""A local Spark driver's set-up, shared by every process that starts one: Delta's jars
resolved once (`jars.py`), the JVM class-data archive (`jvm_archive.py`, filled by
`archive_workload.py`) and the driver's scratch folder (`scratch.py`). No Dagster import."""
