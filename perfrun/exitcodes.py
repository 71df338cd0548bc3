"""The exit codes perfrun itself returns.

`perfrun run` without a gate passes the script's own exit status through
unchanged (a script killed by signal N makes perfrun die by N too), so these
codes only appear when perfrun, not the script, has something to say. They are
chosen above the range scripts commonly use and below the 126+ range shells
reserve, so "perfrun refused the input" can never be mistaken for "the script
exited 1".
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """Every status perfrun can return on its own account."""

    #: Everything worked (or, for `perfrun run`, the script's own status 0).
    OK = 0
    #: Standard output was closed before perfrun had written all it had
    #: (`perfrun report ... | head -1`): the rest is dropped, quietly.
    CLOSED_OUTPUT = 1
    #: The command line could not be parsed (click's own convention).
    USAGE = 2
    #: A configuration problem found before anything ran: bad YAML, unknown
    #: key, bad scheduler window, unwritable log directory, missing nsys, a
    #: script the system refuses to start (an argument list past its limit).
    CONFIG = 64
    #: The script or module to profile does not exist.
    NO_SCRIPT = 65
    #: Results could not be read: missing, truncated or of an unknown version.
    BAD_RESULTS = 66
    #: The run produced no measurement: no rank wrote results, no training
    #: step was seen, the script crashed under a gate, there is no baseline,
    #: or --save-baseline was given a run with no steps (gates, `report` and
    #: a baseline that was not saved; `run` otherwise passes the script's
    #: code).
    NO_MEASUREMENT = 67
    #: The gate found a regression: the current run's steps are slower than
    #: the baseline's by more than --max-regression, beyond noise.
    REGRESSION = 68
    #: The gate could not decide (noise, or too few steps) and
    #: --fail-on-inconclusive was given.
    INCONCLUSIVE = 69
    #: perfrun itself failed unexpectedly (a bug: please report it).
    INTERNAL = 70
    #: `perfrun combine` was given run folders of different jobs (their job
    #: ids, scripts or world sizes differ, or they are separate runs of one
    #: node): one report of them would mix ranks that never ran together.
    MIXED_RUNS = 71
    #: --hang-timeout found the run hung (no rank finished a step for that
    #: long) and --hang-action terminate ended it, after the hang report.
    HANG = 72
    #: The gate gave no verdict because the current run's or the baseline's
    #: measurement was disturbed (a throttled or shared GPU, a CPU taken by
    #: other processes, steal; analysis/disturbed.py), and
    #: --fail-on-inconclusive was given. Without it a disturbed gate exits 0
    #: with a warning, as an inconclusive one does: a disturbed run is never
    #: reported as a regression (68), whatever its step times say.
    DISTURBED = 73
    #: `perfrun run`: the script succeeded, but its results are incomplete:
    #: steps that ran were not saved (a full disk), or a rank ended without
    #: its final save. The report is of the steps that were saved, and the
    #: closing line says how many were not. A script that failed keeps its
    #: own status.
    INCOMPLETE = 74
