"""Intake: taking the feed off a queue (sis_platform/queues/) into the landing zone
(sis_platform/log/). `consumer.py` get under syncpoint, land, commit: the only code that moves
messages off a queue; `lease.py` the consumer lease that keeps production and disaster recovery
from consuming at once; `tick.py` one intake tick of the sensor mode, without Dagster."""
