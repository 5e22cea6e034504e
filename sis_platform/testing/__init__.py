"""The platform run inside one process, for the tests and the benchmarks: `inprocess.py` ticks
the intake sensor and executes the runs it requests through Dagster's public APIs, without a
daemon; `dashboard.py` queries and draws the shipped Grafana dashboard's panels through a
Prometheus server, without Grafana (tests/deploy and scripts/dashboard_snapshot.py). Production
never imports it."""
