"""Benchmark workload: does nothing and imports nothing, to time the
launcher's own start-up and exit."""
