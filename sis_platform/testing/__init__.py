"""The platform run inside one process, for the tests and the benchmarks: `inprocess.py` ticks
the intake sensor and executes the runs it requests through Dagster's public APIs, without a
daemon. Production never imports it."""
