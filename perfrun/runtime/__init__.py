"""Everything that runs inside the profiled process.

Nothing here is imported by the launcher; the boot `sitecustomize` imports
`perfrun.runtime.agent` only in processes that are ranks.
"""
