"""The one root of the errors perfrun raises on purpose.

A bad command line or setting, a run that cannot start, results or a
trace that cannot be read, a refused comparison: each is a PerfrunError,
so a program that calls perfrun.api catches one class, and tells the kinds
apart by class or by `slug`, a stable name the documentation uses
(README, "perfrun from Python"). The command line prints each as one line
and an exit code (commands.py). An error of the user's script is never
one of these: it stays the script's, traceback and all.

Standard library only, and nothing else of perfrun's: every part of the
package may import it, the store and the rank's bootstrap included.
"""

from __future__ import annotations


class PerfrunError(Exception):
    """An error perfrun raised on purpose; the message is one line for the
    user. Each subclass names its kind in `slug`."""

    slug = "error"
