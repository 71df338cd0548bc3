"""Everything that runs inside the profiled process.

The launcher imports nothing here but the few helpers in lite.py that tie
the script's life to perfrun's (`parent_death_signal`, `die_with`; lite.py
imports nothing heavy); the boot `sitecustomize` imports `perfrun.runtime.agent` only in
processes that are ranks.
"""
