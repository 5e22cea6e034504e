"""The lake, the system of record: its Delta tables (`tables.py`: names, schemas, partitioning),
how they are read and written at explicit paths (`delta.py`), the Spark jobs over them
(`spark/`), a local driver's set-up (`driver/`), and the readers that answer disputes from the
tables alone: one message's trace (`trace.py`) and a master as shown at a past instant
(`asof.py`). Dagster-free: the assets in sis_platform/assets/ call into it."""
