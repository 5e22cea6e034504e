"""Retry policy for transient failures (storage, Spark, queue unavailable): exponential backoff
with jitter. Content errors never reach it: they are dead letters, not exceptions."""

from __future__ import annotations

import dagster as dg

TRANSIENT_RETRY = dg.RetryPolicy(
    max_retries=3, delay=2.0, backoff=dg.Backoff.EXPONENTIAL, jitter=dg.Jitter.PLUS_MINUS
)
