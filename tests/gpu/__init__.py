"""GPU checks (see test_gpu.py)."""
