"""Dagster sensors: the queue sensor, a thin adapter over sis_platform.intake."""
