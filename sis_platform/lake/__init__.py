"""The lake: its Delta tables (tables.py: names, schemas, partitioning) and how they are read and
written at explicit paths (delta.py)."""
