"""--metrics-port: each rank serves its figures in Prometheus' text format
while it runs, on port PORT + its local rank.

One endpoint a rank, not one a node: each rank serves what its own flush
thread measured, with nothing read back from files or passed between
processes, under any launcher; and a rank that dies takes only its own
target down, which Prometheus says itself (`up` is 0 for it) where an
endpoint for the node would go on answering for it with figures that no
longer change. The cost is a port for each rank: eight ranks on a node
take PORT to PORT+7, every one checked free before the run starts
(launcher/launch.py).

Where the work is done, so that the script's thread pays nothing a step:
the flush thread hands over each batch of steps once they are final and
saved (Agent.add_row_consumer), and tallies them in a few numpy operations
(stepmetrics.py); the HTTP server runs on a daemon thread of its own, which
binds its port (a port taken is a note in the report, and the run goes on)
and answers each scrape from the tallies. Daemon threads never keep the
process alive or change how it exits, and the server says nothing on the
script's stderr, whatever a scraper does.

Imported only when --metrics-port is given: prometheus_client and numpy
are loaded then, at the import of torch, never for other runs.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Iterator
from socketserver import TCPServer, ThreadingMixIn
from typing import Any, Callable, Optional
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

import numpy as np
from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from .stepmetrics import PHASES, STATES, Histogram, StepTally
from .steps import WIDTH

#: Rows copied and tallied at a time: each copy and each tally holds the
#: GIL for tens of microseconds, as the step file's blocks do
#: (stepfile.BLOCK), however many steps a flush carries.
BLOCK = 512
#: The address the endpoint listens on: every interface, as exporters do,
#: so a Prometheus on another machine of the cluster can scrape it.
ADDRESS = "0.0.0.0"
#: The labels of every series: the rank (global), the node (its host name,
#: as the rank file records it) and the job (the run folder's name, shared
#: by every node of a multi-node job).
LABELS = ("rank", "node", "job")


class RankMetrics:
    """A rank's figures for Prometheus: tallied by the flush thread
    (`rows`), read by the server thread at each scrape (`collect`)."""

    def __init__(self, labels: dict[str, str], readings: Callable[[], dict[str, Any]]) -> None:
        #: The values of LABELS.
        self.labels = [labels[name] for name in LABELS]
        #: What is read at each scrape besides the steps: `state` (one of
        #: stepmetrics.STATES), `memory` (bytes or None), `flops` (a step's,
        #: or None).
        self.readings = readings
        self.tally = StepTally()
        self.lock = threading.Lock()
        self.server: Optional[WSGIServer] = None
        #: Set when the port could not be had: the rows are no longer tallied.
        self.off = False
        #: Set once the port is bound, or could not be.
        self.tried = threading.Event()

    # -- the flush thread -------------------------------------------------------

    def rows(self, buf: Any, count: int, first: int) -> None:
        """Agent.add_row_consumer: tally the first `count` rows of the
        tracker's packed array. A slice of an array is a copy, so numpy
        never holds a view of the tracker's buffer, which the script's
        thread goes on appending to."""
        if self.off:
            return
        for lo in range(0, count, BLOCK):
            hi = min(count, lo + BLOCK)
            block = np.frombuffer(buf[lo * WIDTH:hi * WIDTH], dtype=np.float64)
            with self.lock:
                self.tally.add(block.reshape(hi - lo, WIDTH))

    # -- the server thread ------------------------------------------------------

    def serve(self, port: int, failed: Callable[[OSError], None]) -> threading.Thread:
        """Bind `port` and answer scrapes, on a daemon thread: binding
        (and the host name lookup a plain HTTPServer makes) never delays
        the script. `failed(exc)` is called there when the port cannot be
        had."""
        thread = threading.Thread(target=self._serve, args=(port, failed),
                                  name="perfrun-metrics", daemon=True)
        thread.start()
        return thread

    def _serve(self, port: int, failed: Callable[[OSError], None]) -> None:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)  # type: ignore[arg-type]
        try:
            server = _Server((ADDRESS, port), _QuietHandler)
        except OSError as exc:
            self.off = True
            failed(exc)
            self.tried.set()
            return
        server.set_app(make_wsgi_app(registry))
        self.server = server
        self.tried.set()
        # A process the rank forks (a DataLoader worker) inherits the
        # listening socket, and would hold the port after the rank ended.
        os.register_at_fork(after_in_child=server.socket.close)
        server.serve_forever()

    def collect(self) -> Iterator[Metric]:
        """The series of one scrape (prometheus_client's collector
        protocol)."""
        with self.lock:
            tally = self.tally
            steps, samples, rate = tally.steps, tally.samples, tally.samples_per_second
            step = _copy(tally.step)
            phases = {name: _copy(h) for name, h in tally.phases.items()}
        try:
            readings = self.readings()
        except Exception:  # a scrape still gets the steps
            readings = {}
        labels = self.labels
        names = list(LABELS)

        family = HistogramMetricFamily(
            "perfrun_step_seconds",
            "Time of each training step (end - start, less evaluation passes and DataLoader "
            "start-up), as the Perf Summary's batch_cost counts it.",
            labels=names,
        )
        family.add_metric(labels, _buckets(step), step.sum)
        yield family

        family = HistogramMetricFamily(
            "perfrun_phase_seconds",
            "Time of each step spent in each phase (exclusive; others: the rest of the step), "
            "as the Model Summary counts it.",
            labels=[*names, "phase"],
        )
        for name in PHASES:
            family.add_metric([*labels, name], _buckets(phases[name]), phases[name].sum)
        yield family

        counter = CounterMetricFamily("perfrun_steps", "Training steps the rank has finished.",
                                      labels=names)
        counter.add_metric(labels, steps)
        yield counter

        if samples > 0:  # a rank that knows no batch size says nothing of samples
            counter = CounterMetricFamily(
                "perfrun_samples", "Samples of the training steps the rank has finished.",
                labels=names,
            )
            counter.add_metric(labels, samples)
            yield counter
        if rate is not None:
            gauge = GaugeMetricFamily(
                "perfrun_samples_per_second",
                "Samples a second of step time, over the steps of the latest flush "
                "(the Perf Summary's ips in samples/s).",
                labels=names,
            )
            gauge.add_metric(labels, rate)
            yield gauge

        gauge = GaugeMetricFamily(
            "perfrun_rank_status",
            "The rank's state: 1 for the state it is in (running, finished, failed, stopped, "
            "signalled), 0 for the others.",
            labels=[*names, "status"],
        )
        state = readings.get("state")
        for name in STATES:
            gauge.add_metric([*labels, name], 1.0 if name == state else 0.0)
        yield gauge

        memory = readings.get("memory")
        if memory is not None:
            gauge = GaugeMetricFamily(
                "perfrun_memory_bytes",
                "The rank's resident set size at perfrun's latest reading (every flush).",
                labels=names,
            )
            gauge.add_metric(labels, memory)
            yield gauge

        gpu = readings.get("gpu_memory")
        if gpu is not None:
            gauge = GaugeMetricFamily(
                "perfrun_gpu_memory_bytes",
                "The CUDA allocator's memory at the end of the rank's last sampled step "
                "(allocated, reserved) and that step's peak allocated.",
                labels=[*names, "kind"],
            )
            for kind in ("allocated", "reserved", "peak_allocated"):
                gauge.add_metric([*labels, kind], gpu[kind])
            yield gauge

        flops = readings.get("flops")
        if flops is not None:
            gauge = GaugeMetricFamily(
                "perfrun_step_flops",
                "FLOPs of one training step, counted once on an early step (forward, "
                "backward and optimizer).",
                labels=names,
            )
            gauge.add_metric(labels, flops)
            yield gauge


def _copy(histogram: Histogram) -> Histogram:
    out = Histogram()
    out.counts = histogram.counts.copy()
    out.sum, out.count = histogram.sum, histogram.count
    return out


def _buckets(histogram: Histogram) -> list[tuple[str, float]]:
    return [(floatToGoString(bound), count) for bound, count in histogram.buckets()]


class _Discard:
    """Where the WSGI handler's error reports go: not the script's stderr."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


class _QuietHandler(WSGIRequestHandler):
    """Says nothing on stderr: neither a line per request nor a scraper
    that hung up mid-answer."""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def get_stderr(self) -> Any:
        return _Discard()


class _Server(ThreadingMixIn, WSGIServer):
    #: A scrape answered on a thread of its own that never holds the
    #: process at exit.
    daemon_threads = True

    def server_bind(self) -> None:
        # HTTPServer's own asks the resolver for the host's full name, which
        # can take seconds where DNS is slow; the name is never used.
        TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = port
        self.setup_environ()

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # socketserver would print a traceback on the script's stderr


def failure_note(rank: int, port: int, exc: OSError) -> str:
    """The report's note for a rank that could not serve its metrics."""
    why = ("is in use" if exc.errno == errno.EADDRINUSE
           else f"could not be bound ({exc.strerror or exc})")
    return (f"--metrics-port: rank {rank} served no metrics: port {port} {why}; "
            "the run went on without them")
