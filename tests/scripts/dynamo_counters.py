"""The last line the compile test scripts print: Dynamo's own counters at
the end of the run, `DYNAMO {...}`, which tests/test_e2e_compile.py compares
with and without perfrun. Imported from the scripts' folder (a script's
folder is first on sys.path)."""

import json


def print_counters() -> None:
    from torch._dynamo.utils import counters

    print("DYNAMO " + json.dumps({
        "graphs": counters["stats"]["unique_graphs"],
        "calls_captured": counters["stats"]["calls_captured"],
        "graph_breaks": sum(counters["graph_break"].values()),
    }, sort_keys=True))
