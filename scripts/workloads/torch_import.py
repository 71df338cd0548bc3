"""Benchmark workload: imports torch and exits, to time what perfrun adds
when torch is imported (installing its hooks, starting its flush thread)."""

import torch  # noqa: F401
