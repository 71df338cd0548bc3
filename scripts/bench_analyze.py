"""How long does perfrun take to summarise a large torch.profiler trace, and
how much memory does it use?

    python scripts/bench_analyze.py [--size-mb 50] [--runs 5] [--source TRACE]

The trace is made from a real one (by default tests/data/traces/
sync_copies.json.gz, 26 MB of a GPU training run of 5 steps): it is
repeated, shifted in time and with its ids renumbered, the last copy cut
short in time, until the JSON is about --size-mb megabytes. It is written
uncompressed, as torch.profiler writes it, to a temporary folder.

Each run is a fresh interpreter that imports perfrun, then reads and
summarises the trace (perfrun.analysis.tracefile.load_trace and
perfrun.analysis.trace.summarize: the code `perfrun analyze` and the
window both run), and reports the time of that and its peak resident
memory above what the interpreter held before reading (VmHWM from
/proc/self/status, which starts afresh at exec; ru_maxrss, elsewhere,
inherits the parent's peak). The
whole `perfrun analyze TRACE` command is timed too, start-up included.
Targets: under 2 s, and under 3x the file's size in memory.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_SOURCE = os.path.join(HERE, "..", "tests", "data", "traces", "sync_copies.json.gz")

_MEASURE = r"""
import json, resource, sys, time
import perfrun.analysis.trace, perfrun.analysis.tracefile
def peak_kib():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
base = peak_kib()
t0 = time.perf_counter()
trace = perfrun.analysis.tracefile.load_trace(sys.argv[1])
t1 = time.perf_counter()
summary = perfrun.analysis.trace.summarize(trace.events)
t2 = time.perf_counter()
peak = peak_kib()
print(json.dumps({"load": t1 - t0, "summarize": t2 - t1, "total": t2 - t0,
                  "peak_extra_bytes": (peak - base) * 1024,
                  "events": len(trace.events), "kernels": len(summary["kernels"])}))
"""


def build_trace(source: str, size_mb: float, out: str) -> int:
    """Write a trace of at least `size_mb` MB made of `source`'s events,
    repeated after themselves in time; returns its size in bytes."""
    opener = gzip.open if source.endswith(".gz") else open
    with opener(source, "rt", encoding="utf-8") as f:
        doc = json.load(f)
    events = doc["traceEvents"]
    spans = [e for e in events if isinstance(e.get("ts"), (int, float))]
    start = min(e["ts"] for e in spans)
    end = max(e["ts"] + (e.get("dur") or 0) for e in spans)
    one = len(json.dumps(events))
    # Whole copies, then the first part (in time) of one more.
    need = size_mb * 1e6 / one
    copies = max(1, int(-(-need // 1)))
    part = need - (copies - 1)
    out_events: list[Any] = []
    id_step = 10_000_000
    for k in range(copies):
        shift = k * (end - start + 1000)
        until = start + (end - start) * (part if k == copies - 1 else 1.0)
        for e in events:
            if k and e.get("ph") == "M":
                continue
            if isinstance(e.get("ts"), (int, float)) and e["ts"] > until:
                continue
            c = dict(e)
            if isinstance(c.get("ts"), (int, float)):
                c["ts"] = c["ts"] + shift
            args = c.get("args")
            if k and isinstance(args, dict):
                args = dict(args)
                for key in ("External id", "correlation"):
                    if isinstance(args.get(key), int):
                        args[key] += k * id_step
                c["args"] = args
            if k and isinstance(c.get("id"), int):
                c["id"] += k * id_step
            if k and str(c.get("name", "")).startswith("ProfilerStep#"):
                head, _, n = c["name"].partition("#")
                c["name"] = f"{head}#{int(n) + 100 * k}" if n.isdigit() else c["name"]
            out_events.append(c)
    doc["traceEvents"] = out_events
    text = json.dumps(doc)
    with open(out, "w", encoding="utf-8") as f:
        f.write(text)
    return len(text.encode())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=float, default=50.0)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--source", default=DEFAULT_SOURCE)
    parser.add_argument("--json", metavar="OUT", default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    if not os.path.exists(args.source):
        print(f"bench_analyze: no trace at {args.source} (give --source)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "big.pt.trace.json")
        size = build_trace(args.source, args.size_mb, path)
        print(f"trace: {size / 1e6:.1f} MB ({os.path.basename(args.source)} repeated)")
        runs = []
        walls = []
        for _ in range(args.runs):
            out = subprocess.run(
                [sys.executable, "-c", _MEASURE, path], capture_output=True, text=True, check=True
            )
            runs.append(json.loads(out.stdout))
            t0 = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "perfrun", "analyze", path, "--format", "json"],
                stdout=subprocess.DEVNULL, check=True,
            )
            walls.append(time.perf_counter() - t0)
    med = {k: statistics.median(r[k] for r in runs) for k in ("load", "summarize", "total")}
    mem = statistics.median(r["peak_extra_bytes"] for r in runs)
    result = {
        "trace_bytes": size,
        "events": runs[0]["events"],
        "runs": args.runs,
        "median_seconds": med,
        "max_total_seconds": max(r["total"] for r in runs),
        "median_command_seconds": statistics.median(walls),
        "median_peak_extra_bytes": mem,
        "memory_over_file": mem / size,
    }
    print(
        f"read + summarise: median {med['total']:.2f} s (read {med['load']:.2f} s, summarise "
        f"{med['summarize']:.2f} s), slowest {result['max_total_seconds']:.2f} s "
        f"over {args.runs} runs"
    )
    print("`perfrun analyze --format json`, start-up included: median "
          f"{result['median_command_seconds']:.2f} s")
    print(f"peak memory above the interpreter's: {mem / 1e6:.0f} MB = {mem / size:.2f}x the file")
    ok = med["total"] < 2.0 and mem < 3 * size
    print("targets (under 2 s, under 3x the file):", "met" if ok else "NOT met")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
