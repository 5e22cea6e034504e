"""Dagster resources: thin configurable wrappers that hand the platform's Dagster-free objects
to assets and sensors: the queue source (`sources.py`), the landing zone, the lake and processing
limits (`platform.py`), the serving store (`serving.py`) and the lazy Spark session
(`spark.py`); `config.py` builds them all from the settings."""
