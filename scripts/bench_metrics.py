"""What does --metrics-port cost the script's steps?

    python scripts/bench_metrics.py [--pairs N] [--scrape-interval S] [--json OUT]
                                    [--only WORKLOAD...]

Each workload of scripts/workloads/ is run under perfrun twice in a pair,
without and with --metrics-port, the order alternating from pair to pair
(A B, B A, ...) so that a drift of the machine favours neither side. While
the run with the endpoint lasts, a scraper in this process reads it every S
seconds (default 1: fifteen times as often as Prometheus' default), so the
run pays for its scrapes as well as for the flush thread's tallies. The runs
are long enough for several flushes (one every 2 s) to land among the
timed steps.

The step time is the one each workload measures itself (its BENCH line):
the median of its steady steps, and their mean, which is where a cost paid
once a flush or once a scrape shows (a few steps delayed, the median
untouched). Per configuration it prints the medians over pairs of both,
and of the difference per step (with its range over pairs); the scrapes
answered (evidence that the endpoint really served during the run being
timed) and how long each took; and the flush thread's time a save, from
rank 0's own record (`extra.flush`), which with --metrics-port includes
tallying the save's steps.

Needs perfrun, torch and prometheus_client in this interpreter. The figures
are only as quiet as the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_overhead import WORKLOAD_DIR  # noqa: E402

#: (workload, perfrun's mode options, steps, warm-up steps): long enough
#: that each run spans several flushes.
CONFIGS = (
    ("tiny_mlp", ["--timer-only"], 40000, 500),
    ("tiny_mlp", [], 40000, 500),
    ("loader_mlp", ["--timer-only"], 20000, 500),
    ("small_transformer", [], 200, 10),
)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Scraper:
    """GETs an endpoint every `interval` seconds on a thread of its own,
    and counts the answers."""

    def __init__(self, port: int, interval: float) -> None:
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.interval = interval
        self.took: list[float] = []
        self.steps_seen = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            began = time.perf_counter()
            try:
                with urllib.request.urlopen(self.url, timeout=5) as answer:
                    text = answer.read().decode()
            except OSError:
                continue  # not serving yet (torch is being imported), or ended
            self.took.append(time.perf_counter() - began)
            for line in text.splitlines():
                if line.startswith("perfrun_steps_total{"):
                    self.steps_seen = float(line.rsplit(" ", 1)[1])


@dataclass
class Run:
    #: The workload's BENCH line.
    bench: dict[str, Any]
    #: The flush thread's saves as rank 0 recorded them: count and seconds.
    saves: int
    save_s: float
    #: Scrapes answered, and how long each took to answer.
    scrapes: list[float]


def run_one(work: str, script: str, args: list[str], options: list[str], metrics: bool,
            interval: float) -> Run:
    """One run of SCRIPT ARGS under perfrun OPTIONS, with --metrics-port
    and a scraper when `metrics`."""
    log_dir = tempfile.mkdtemp(prefix="log", dir=work)
    command = [sys.executable, "-m", "perfrun", "-q", "--log-dir", log_dir, *options]
    env = {k: v for k, v in os.environ.items() if k != "PERFRUN_SETTINGS"}
    scraper: Optional[Scraper] = None
    if metrics:
        port = free_port()
        command += ["--metrics-port", str(port)]
        scraper = Scraper(port, interval)
    with scraper or contextlib.nullcontext():
        proc = subprocess.run([*command, script, *args], cwd=work, env=env,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"exit status {proc.returncode}: {' '.join(command)}\n{proc.stderr}")
    bench = [json.loads(line[6:]) for line in proc.stdout.splitlines()
             if line.startswith("BENCH ")]
    if not bench:
        raise SystemExit(f"{script} printed no BENCH line")
    [run_dir] = [e.path for e in os.scandir(log_dir) if e.is_dir(follow_symlinks=False)]
    with open(os.path.join(run_dir, "rank0.json")) as f:
        flush = json.load(f)["extra"]["flush"]
    shutil.rmtree(log_dir, ignore_errors=True)
    if scraper is not None and (not scraper.took or not scraper.steps_seen):
        raise SystemExit(f"{script}: the endpoint answered no scrape")
    return Run(bench[0], int(flush["calls"]), float(flush["time"]),
               scraper.took if scraper is not None else [])


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--scrape-interval", type=float, default=1.0)
    parser.add_argument("--json", metavar="OUT")
    parser.add_argument("--only", nargs="*", metavar="WORKLOAD",
                        help="Only these workloads (tiny_mlp, loader_mlp, small_transformer).")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="perfrun-bench-metrics-") as work:
        for name, options, steps, warmup in CONFIGS:
            if args.only and name not in args.only:
                continue
            script = os.path.join(WORKLOAD_DIR, f"{name}.py")
            plain: list[Run] = []
            served: list[Run] = []
            for pair in range(args.pairs):
                order = (False, True) if pair % 2 == 0 else (True, False)
                for metrics in order:
                    run = run_one(work, script, [str(steps), str(warmup)], options, metrics,
                                  args.scrape_interval)
                    (served if metrics else plain).append(run)
            row = summarise(name, options, plain, served)
            rows.append(row)
            print_row(row)
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    print(f"\n{platform.python_version()}, {os.cpu_count()} cores, load {load}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"pairs": args.pairs, "scrape_interval": args.scrape_interval,
                       "rows": rows, "time": time.time()}, f, indent=1)
    return 0


def summarise(name: str, options: list[str], plain: list[Run],
              served: list[Run]) -> dict[str, Any]:
    took = [t for r in served for t in r.scrapes]
    out: dict[str, Any] = {
        "workload": name, "options": options,
        "scrapes": [len(r.scrapes) for r in served],
        "scrape_s_median": statistics.median(took),
        "save_s": {"without": statistics.median(r.save_s / max(1, r.saves) for r in plain),
                   "with": statistics.median(r.save_s / max(1, r.saves) for r in served)},
    }
    for key in ("median_step_s", "mean_step_s"):
        a = [float(r.bench[key]) for r in plain]
        b = [float(r.bench[key]) for r in served]
        diffs = [y - x for x, y in zip(a, b)]
        out[key] = {
            "without": statistics.median(a), "with": statistics.median(b),
            "diff_median": statistics.median(diffs), "diff_min": min(diffs),
            "diff_max": max(diffs),
            "ratio_median": statistics.median(y / x for x, y in zip(a, b)),
        }
    return out


def print_row(row: dict[str, Any]) -> None:
    mode = " ".join(row["options"]) or "default"
    print(f"{row['workload']} ({mode}): scrapes answered per run {row['scrapes']}, each in "
          f"{row['scrape_s_median'] * 1e3:.2f} ms (median); a save of the flush thread "
          f"{row['save_s']['without'] * 1e3:.2f} ms without, {row['save_s']['with'] * 1e3:.2f} "
          "ms with")
    for key, label in (("median_step_s", "median step"), ("mean_step_s", "mean step")):
        s = row[key]
        print(f"  {label}: {s['without'] * 1e6:9.1f} us without, {s['with'] * 1e6:9.1f} us "
              f"with; difference {s['diff_median'] * 1e6:+.2f} us (range "
              f"{s['diff_min'] * 1e6:+.2f} to {s['diff_max'] * 1e6:+.2f}), ratio "
              f"{s['ratio_median']:.4f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
