"""The Dagster assets of the platform: one per Delta table of the lake (docs/operations.md,
"The lake's tables")."""
