"""Dagster resources: thin configurable wrappers that hand the platform's Dagster-free objects
(queue source, landing zone, lake, processing limits, Spark session) to assets and sensors."""
