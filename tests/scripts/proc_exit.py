"""No torch: write a marker file (proof that the script ran), print a line
to each stream, and exit with the given status.

    proc_exit.py MARKER [STATUS]
"""

import sys

with open(sys.argv[1], "w") as f:
    f.write("ran\n")
print("proc_exit: to stdout", flush=True)
print("proc_exit: to stderr", file=sys.stderr, flush=True)
sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
