"""Prints what the script sees of its own start as one JSON line, so a test
can compare a run under perfrun with the same run under plain python."""

import json
import os
import sys

seen = {
    "argv": sys.argv,
    "path": sys.path,
    "name": __name__,
    "cwd": os.getcwd(),
    "pythonpath": os.environ.get("PYTHONPATH"),
    "settings_var": "PERFRUN_SETTINGS" in os.environ,
    "file": __file__,
    "executable": sys.executable,
}
print("PROC_ENV " + json.dumps(seen), flush=True)
