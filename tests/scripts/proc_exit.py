"""No torch: touch the file named by PROC_EXIT_MARKER, if set (proof that
the script ran), print a line to each stream, exit with status argv[1].

    proc_exit.py [STATUS]
"""

import os
import sys

marker = os.environ.get("PROC_EXIT_MARKER")
if marker:
    with open(marker, "w") as f:
        f.write("ran\n")
print("proc_exit: to stdout", flush=True)
print("proc_exit: to stderr", file=sys.stderr, flush=True)
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
