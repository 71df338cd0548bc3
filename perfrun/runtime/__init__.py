"""Everything that runs inside the profiled process.

The boot `sitecustomize` starts lite.py in processes that are ranks; lite.py
loads the agent (agent.py) only when the script imports torch. The launcher
imports nothing here but lifeline.py, the helpers that tie the script's life
to perfrun's. What a rank writes goes through store/; the one analysis it
runs itself is the summary of its own window's trace (analysis/trace.py).

Inside a rank, what only one mode needs (the detailed window, FLOP
counting, CUDA timing, NVTX, NVML) is imported by the function that starts
it: a timer-only run, or a script that never imports torch, loads none of
it.
"""
