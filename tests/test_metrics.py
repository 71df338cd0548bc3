"""--metrics-port: each rank's figures served to Prometheus while it runs.

The port scheme and what is refused before the run (Settings, the
launcher's check, the command line in-process); a rank's endpoint for
real, on a real port, fed by a real agent's flush and scraped over HTTP;
a port taken at run time, which costs the run nothing but a note. Then,
end to end: a real Prometheus server (Debian's package; .ci/run installs
it) scraping a two-rank gloo job and answering a PromQL query with each
rank's step time, and a script that holds the port itself.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import socket
import struct
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
from conftest import E2E_TIMEOUT, RunPerfrun, e2e_environment
from prometheus_client.parser import text_string_to_metric_families

from perfrun import cli
from perfrun.config import parse_override
from perfrun.exitcodes import ExitCode
from perfrun.launcher.launch import port_problem
from perfrun.runtime.agent import Agent
from perfrun.runtime.metrics import RankMetrics
from perfrun.runtime.stepmetrics import PHASES, STATES
from perfrun.settings import Settings, SettingsError
from perfrun.store.layout import steps_path
from perfrun.store.rankfile import hostname, read_rank_file
from perfrun.store.stepfile import STEP_COLUMNS, StepWriter
from tests.builders import MS, make_rows, train_agent

SCRIPTS = Path(__file__).parent / "scripts"
PROMETHEUS = shutil.which("prometheus")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_ports(n: int) -> int:
    """The first of `n` consecutive ports free now, as a node's ranks take
    them."""
    for _ in range(100):
        first = free_port()
        if first + n - 1 <= 65535 and all(port_problem(first + i) is None for i in range(n)):
            return first
    raise AssertionError(f"no {n} consecutive free ports found")


@pytest.fixture
def listening() -> Iterator[Callable[[int], socket.socket]]:
    """Listen on a port as another program would; closed after the test."""
    held: list[socket.socket] = []

    def listen(port: int) -> socket.socket:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", port))
        s.listen()
        held.append(s)
        return s

    yield listen
    for s in held:
        s.close()


def scrape(port: int) -> dict[str, Any]:
    """The metric families an endpoint serves, by name."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        assert answer.status == 200
        assert answer.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = answer.read().decode("utf-8")
    return {family.name: family for family in text_string_to_metric_families(text)}


def values(family: Any, suffix: str = "") -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value for s in family.samples
            if s.name == family.name + suffix}


def states(families: dict[str, Any]) -> dict[str, float]:
    """perfrun_rank_status by state."""
    return {dict(k)["status"]: v for k, v in values(families["perfrun_rank_status"]).items()}


# -- the port scheme, and what is refused before the run ---------------------------


def test_each_rank_serves_on_port_plus_its_local_rank() -> None:
    assert Settings(script="t.py").metrics_ports == ()
    assert Settings(script="t.py", metrics_port=9700).metrics_ports == (9700,)
    eight = Settings(script="t.py", metrics_port=9700, nproc_per_node=8)
    assert eight.validate().metrics_ports == tuple(range(9700, 9708))
    assert parse_override("Profiler.metrics_port=9700") == {"metrics_port": 9700}


@pytest.mark.parametrize(
    "changes, fragment",
    [
        (dict(metrics_port=0), "--metrics-port must be a port number from 1 to 65535, not 0"),
        (dict(metrics_port=70000), "from 1 to 65535, not 70000"),
        (dict(metrics_port=65530, nproc_per_node=8),
         "8 ranks a node serve on ports 65530 to 65537, past 65535; take a port of 65528"),
        # torchrun's rendezvous binds its port first: its default, 29500...
        (dict(metrics_port=29496, nproc_per_node=8),
         "the ranks' ports 29496-29503 include torchrun's rendezvous port 29500"),
        # ...or the one it is told.
        (dict(metrics_port=9700, nproc_per_node=2, master_port=9701),
         "ports 9700-9701 include torchrun's rendezvous port 9701"),
        (dict(metrics_port=9700, nproc_per_node=2, rdzv_endpoint="head:9700"),
         "include torchrun's rendezvous port 9700"),
    ],
)
def test_ports_that_are_no_ports_or_torchruns_own_are_refused(
    changes: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(SettingsError) as caught:
        Settings(script="t.py", **changes).validate()
    assert fragment in str(caught.value)
    assert "\n" not in str(caught.value)


def test_what_would_keep_the_ranks_from_serving_is_refused_before_the_script_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    listening: Callable[[int], socket.socket],
) -> None:
    """One line and exit 64, with no run folder made and no line of the
    script run: a port out of range, a port of this node's ranks that
    another program holds, prometheus_client missing."""
    script = tmp_path / "train.py"
    script.write_text("open('ran.marker', 'w').close()\n")
    log = tmp_path / "log"
    taken = free_ports(2)
    listening(taken + 1)
    cases = [
        (["--metrics-port", "0"], "--metrics-port must be a port number from 1 to 65535"),
        (["--metrics-port", str(taken), "--nproc-per-node", "2"],
         f"--metrics-port {taken}: port {taken + 1} (local rank 1's) is in use; take another "
         f"(this node's ranks serve on {taken}-{taken + 1})"),
        (["--metrics-port", str(taken + 1)], f"port {taken + 1} is in use"),
    ]
    for options, fragment in cases:
        argv = ["--log-dir", str(log), *options, str(script)]
        assert cli.main(argv) == ExitCode.CONFIG, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("perfrun: error: "), err
        assert fragment in err, err
    # Python's own way of saying a module is not there.
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    assert cli.main(["--log-dir", str(log), "--metrics-port", str(taken), str(script)]) == 64
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs the prometheus_client package" in err, err
    assert "perfrun[metrics]" in err
    assert not (tmp_path / "ran.marker").exists()
    assert not log.exists() or not [p for p in log.iterdir() if not p.is_symlink()]


# -- a rank's endpoint, for real ---------------------------------------------------


@pytest.fixture()
def no_rank_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)


def serving_agent(run_dir: Path, port: int) -> Agent:
    """A rank's agent as the bootstrap makes it, its endpoint started as
    it starts once the script imported torch; the phases are fed by hand
    (builders.train_agent), so no torch is needed."""
    payload = dataclasses.asdict(Settings(script="train.py", nvtx=False, metrics_port=port))
    payload["run_dir"] = str(run_dir)
    agent = Agent(payload)
    agent.step_writer = StepWriter(steps_path(agent.path), STEP_COLUMNS)  # as start() does
    agent._setup_metrics()
    assert agent.metrics is not None and agent.metrics.tried.wait(10)
    return agent


def stop_serving(metrics: Optional[RankMetrics]) -> None:
    server = metrics.server if metrics is not None else None
    if server is not None:
        server.shutdown()
        server.server_close()


@pytest.mark.usefixtures("no_rank_env")
def test_a_scrape_has_each_figure_by_its_conventional_name_with_the_ranks_labels(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "20261126-101010-4242"
    run_dir.mkdir()
    port = free_port()
    agent = serving_agent(run_dir, port)
    try:
        assert agent.metrics.server is not None
        before = scrape(port)
        assert values(before["perfrun_steps"], "_total") == {
            (("job", run_dir.name), ("node", hostname()), ("rank", "0")): 0.0}
        train_agent(agent, 300)
        agent.write()  # a flush: the steps final by now reach the endpoint
        families = scrape(port)
        labels = (("job", run_dir.name), ("node", hostname()), ("rank", "0"))
        written = read_rank_file(agent.path).n_steps
        assert written == 299  # the last step ends when the next begins
        assert values(families["perfrun_steps"], "_total") == {labels: written}
        step = families["perfrun_step_seconds"]
        assert step.type == "histogram"
        assert values(step, "_count") == {labels: written}
        buckets = {dict(s.labels)["le"]: s.value for s in step.samples
                   if s.name == "perfrun_step_seconds_bucket"}
        assert buckets["+Inf"] == written and len(buckets) == 21
        phase = families["perfrun_phase_seconds"]
        assert phase.type == "histogram"
        by_phase = {dict(k)["phase"]: v for k, v in values(phase, "_sum").items()}
        assert sorted(by_phase) == sorted(PHASES)
        assert sum(by_phase.values()) == pytest.approx(values(step, "_sum")[labels], rel=1e-9)
        assert states(families) == {s: float(s == "running") for s in STATES}
        # No batch size known for hand-fed phases: nothing said of samples.
        assert "perfrun_samples" not in families and "perfrun_samples_per_second" not in families
        agent.finish()
        status = states(scrape(port))
        assert status["finished"] == 1.0 and sum(status.values()) == 1.0
        assert values(scrape(port)["perfrun_steps"], "_total")[labels] == 300
        doc = read_rank_file(agent.path).data
        assert doc["faults"] == [] and not [n for n in doc["notes"] if "metrics" in n]
        assert doc["settings"]["metrics_port"] == port
    finally:
        stop_serving(agent.metrics)


def test_the_rows_a_flush_hands_over_are_tallied_a_block_at_a_time() -> None:
    """The tracker's packed buffer as the flush thread hands it over, more
    rows than a block: every row counted once, and the buffer left free to
    grow (numpy never holds a view of it)."""
    metrics = RankMetrics({"rank": "3", "node": "n", "job": "j"}, dict)
    rows = make_rows([dict(forward=2 * MS, others=MS, samples=8)] * 1300)
    buf = array("d", [float("nan") if v is None else v for row in rows for v in row])
    metrics.rows(buf, 1300, 0)
    buf.extend([0.0] * len(STEP_COLUMNS))  # the script's thread appends on
    assert metrics.tally.steps == 1300 and metrics.tally.samples == 1300 * 8
    assert metrics.tally.phases["forward"].sum == 1300 * 2 * MS


@pytest.mark.usefixtures("no_rank_env")
def test_a_port_taken_when_the_rank_starts_is_a_note_and_the_rank_goes_on(
    tmp_path: Path, listening: Callable[[int], socket.socket]
) -> None:
    port = free_port()
    listening(port)
    agent = serving_agent(tmp_path, port)
    assert agent.metrics.server is None and agent.metrics.off
    train_agent(agent, 50)
    agent.tracker.finish(agent.phase_clock.now())
    agent.write(final=True)
    doc = read_rank_file(agent.path).data
    assert doc["notes"] == [
        f"--metrics-port: rank 0 served no metrics: port {port} is in use; the run went on "
        "without them"]
    assert doc["faults"] == [] and read_rank_file(agent.path).n_steps == 50
    assert agent.metrics.tally.steps == 0  # nothing tallied for nobody


def test_the_endpoint_says_nothing_on_stderr_whatever_a_scraper_does(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """A scraper that sends nonsense, or hangs up before the answer, gets
    no line on the script's stderr (socketserver and wsgiref would print a
    traceback or a log line there)."""
    metrics = RankMetrics({"rank": "0", "node": "n", "job": "j"}, dict)
    port = free_port()
    metrics.serve(port, lambda exc: pytest.fail(str(exc)))
    assert metrics.tried.wait(10) and metrics.server is not None
    try:
        for request in (b"NONSENSE\r\n\r\n", b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
                        b"GET /metrics HTTP/1.1\r\n"):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                # Hang up with a reset, before the answer is read.
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                s.sendall(request)
        assert "perfrun_rank_status" in scrape(port)
        time.sleep(0.2)  # the handler threads of the hung-up requests finish
    finally:
        stop_serving(metrics)
    assert capfd.readouterr() == ("", "")


# -- end to end ----------------------------------------------------------------------


class Prometheus:
    """A real Prometheus server scraping `targets` every second, with its
    own storage in a temporary folder, on 127.0.0.1."""

    def __init__(self, folder: Path, targets: list[str]) -> None:
        self.port = free_port()
        config = folder / "prometheus.yml"
        # honor_labels: the endpoint's own `job` (the run) is kept as `job`,
        # rather than renamed `exported_job` beside the scrape job's.
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: perfrun\n    honor_labels: true\n"
            f"    static_configs:\n      - targets: {json.dumps(targets)}\n"
        )
        self.log = folder / "prometheus.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [str(PROMETHEUS), f"--config.file={config}",
                 f"--storage.tsdb.path={folder / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{self.port}"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=folder,
            )
        self.wait_for(self.ready, 30, "Prometheus never became ready")

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready",
                                        timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False

    def query(self, promql: str) -> list[dict[str, Any]]:
        url = (f"http://127.0.0.1:{self.port}/api/v1/query?"
               + urllib.parse.urlencode({"query": promql}))
        with urllib.request.urlopen(url, timeout=10) as answer:
            body = json.loads(answer.read())
        assert body["status"] == "success", body
        return body["data"]["result"]  # type: ignore[no-any-return]

    def wait_for(self, done: Callable[[], Any], timeout: float, why: str) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited {self.proc.returncode}:\n"
                                     + self.log.read_text(errors="replace")[-3000:])
            got = done()
            if got:
                return got
            time.sleep(0.5)
        raise AssertionError(why + "\n" + self.log.read_text(errors="replace")[-3000:])

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


#: Each rank's mean step time over the last 10 s, as docs/prometheus.md
#: gives it.
STEP_TIME = ("rate(perfrun_step_seconds_sum[10s]) / rate(perfrun_step_seconds_count[10s])")


@pytest.mark.slow
@pytest.mark.skipif(PROMETHEUS is None, reason="the prometheus server is not installed "
                    "(Debian's prometheus package; .ci/run installs it)")
def test_a_real_prometheus_scrapes_a_two_rank_job_and_answers_each_ranks_step_time(
    tmp_path: Path,
) -> None:
    first = free_ports(2)
    prometheus = Prometheus(tmp_path, [f"127.0.0.1:{first}", f"127.0.0.1:{first + 1}"])
    stop = tmp_path / "stop"
    log = tmp_path / "log"
    run = subprocess.Popen(
        [sys.executable, "-m", "perfrun", "--log-dir", str(log), "--metrics-port", str(first),
         "--nproc-per-node", "2", "--master-port", str(free_port()),
         str(SCRIPTS / "watch_ddp.py"), "--stop-file", str(stop), "--max-seconds", "90"],
        cwd=tmp_path, env=e2e_environment(), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        def both_ranks() -> list[dict[str, Any]]:
            result = prometheus.query(STEP_TIME)
            ranks = {r["metric"].get("rank"): float(r["value"][1]) for r in result}
            return result if sorted(ranks) == ["0", "1"] and all(
                0 < v < 10 for v in ranks.values()) else []

        result = prometheus.wait_for(both_ranks, 90, "no step time for both ranks")
        [job] = {r["metric"]["job"] for r in result}
        assert {r["metric"]["node"] for r in result} == {hostname()}
        # The step-time distribution too: each rank's median from its buckets.
        median = prometheus.query(
            "histogram_quantile(0.5, sum by (rank, le) (rate(perfrun_step_seconds_bucket[10s])))")
        assert sorted(r["metric"]["rank"] for r in median) == ["0", "1"]
        running = prometheus.query('perfrun_rank_status{status="running"} == 1')
        assert sorted(r["metric"]["rank"] for r in running) == ["0", "1"]
        scraped = {r["metric"]["rank"]: float(r["value"][1])
                   for r in prometheus.query("perfrun_steps_total")}
        stop.touch()
        out, err = run.communicate(timeout=E2E_TIMEOUT)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
        prometheus.stop()
    text = err.decode(errors="replace")
    assert run.returncode == 0, text
    assert "Traceback" not in text
    assert (f"perfrun: metrics for Prometheus on ports {first}-{first + 1} of this machine "
            f"(local rank L on {first}+L)") in text
    [run_dir] = [p for p in log.iterdir() if not p.is_symlink()]
    assert job == run_dir.name
    for rank in (0, 1):
        # What Prometheus saw is what the rank had saved by then.
        assert 0 < scraped[str(rank)] <= read_rank_file(str(run_dir / f"rank{rank}.json")).n_steps
    assert b"stopped after" in out


@pytest.mark.slow
def test_a_port_the_script_holds_itself_is_a_note_and_the_run_is_the_scripts_own(
    run_perfrun: RunPerfrun, run_python: Callable[..., bytes]
) -> None:
    """The launcher found the port free; the script took it before it
    imported torch. The rank serves nothing, says so in the report, and
    the script's output and exit status are its own."""
    port = free_port()
    script = str(SCRIPTS / "metrics_port_taken.py")
    done = run_perfrun("--metrics-port", str(port), script, "--port", str(port), "--exit", "3")
    assert done.returncode == 3, done.describe()
    assert "Traceback" not in done.err
    assert f"trained 30 steps beside my own server on port {port}" in done.out
    notes = done.report()["notes"]
    assert (f"--metrics-port: rank 0 served no metrics: port {port} is in use; the run went on "
            "without them") in notes
    assert done.results().ranks[0].n_steps >= 29
    other = free_port()
    plain = run_python(script, "--port", str(other)).decode()
    assert plain.replace(str(other), "P") == done.out.replace(str(port), "P")

