"""Tests of the intake: queue sources, the consumer, the lease and the sensor-mode tick."""
