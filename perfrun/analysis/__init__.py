"""Pure analysis of a run's results: which steps count, the summaries, the
Report and its advice, the detailed window's tables, comparisons and the CI
gate.

Nothing here imports torch, starts processes or writes files; everything
reads a run as store/ gives it (or plain data built by hand in the tests),
so every number can be checked against hand-written rows. Import the module
you need (`perfrun.analysis.report`, ...): this package's face re-exports
nothing, so importing one analysis (the rank's trace summariser, say) loads
no other.
"""
