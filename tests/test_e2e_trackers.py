"""perfrun's figures in the script's own tracker run, read back from the
tracker itself after real runs: a W&B run in offline mode (its run file),
an MLflow run in a local file store (through MLflow's client), TensorBoard
event files (through TensorBoard's event reader). The scripts log their
loss as the trackers' quickstarts do (tests/scripts/track_*.py); perfrun
adds its series under `perfrun/` and leaves the script's own alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import E2E_TIMEOUT, RunPerfrun, e2e_environment, script_stderr

from tests.wandbfile import read_run as read_wandb_run

SCRIPTS = Path(__file__).parent / "scripts"
PHASES = ("step_time_ms", "dataloader_ms", "forward_ms", "backward_ms", "optimization_ms",
          "reader_ratio_pct", "ips", "samples_per_s")
#: Steps the scripts train: 640 samples in batches of 16, 3 epochs.
STEPS = 120

pytestmark = pytest.mark.slow


def tracker_record(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "trackers" / "rank0.json").read_text())


# -- TensorBoard --------------------------------------------------------------------------


def scalars(log_dir: Path) -> Any:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


@pytest.mark.parametrize("library", ["torch", "tensorboardX"])
@pytest.mark.parametrize("close", [True, False], ids=["closed", "left-open"])
def test_tensorboard_run_shows_perfruns_series_beside_the_loss(
        run_perfrun: RunPerfrun, tmp_path: Path, library: str, close: bool) -> None:
    pytest.importorskip(library if library != "torch" else "tensorboard")
    log_dir = tmp_path / "runs" / "exp"
    args = ["--tracker-every", "20", str(SCRIPTS / "track_tensorboard.py"),
            "--logdir", str(log_dir), "--library", library]
    run = run_perfrun(*args, *([] if close else ["--no-close"]))
    assert run.returncode == 0, run.describe()
    acc = scalars(log_dir)
    # The script's own series, as it logged it.
    assert [e.step for e in acc.Scalars("train/loss")] == list(range(STEPS))
    for name in PHASES:
        points = acc.Scalars(f"perfrun/{name}")
        assert [e.step for e in points][:5] == [19, 39, 59, 79, 99], name
        assert len(points) == 6 and points[-1].step >= STEPS - 2, name
    step = [e.value for e in acc.Scalars("perfrun/step_time_ms")]
    parts = [sum(acc.Scalars(f"perfrun/{p}_ms")[i].value for p in
                 ("dataloader", "forward", "backward", "optimization", "other"))
             for i in range(len(step))]
    assert parts == pytest.approx(step, rel=1e-4)
    # The report's summary, in an event file of perfrun's own beside the
    # script's, at the step of the last point.
    assert len(list(log_dir.glob("*.perfrun"))) == 1
    [summary] = acc.Scalars("perfrun/summary/step_time_ms")
    report = run.report()
    assert summary.value == pytest.approx(report["perf"]["batch_cost"]["median"] * 1000)
    text = acc.Tensors("perfrun/summary")[0].tensor_proto.string_val[0].decode()
    assert "reader_ratio_pct" in text and str(run.run_dir) in text
    assert f"report: {run.run_dir / 'report.html'}" in text
    record = tracker_record(run.run_dir)
    assert record["every"] == 20 and not record["every_auto"]
    [entry] = record["runs"]
    assert entry["kind"] == "tensorboard" and entry["library"] == library
    assert entry["log_dir"] == str(log_dir) and entry["points"] == 6


def test_no_tracker_logs_nothing_into_the_scripts_run(run_perfrun: RunPerfrun,
                                                      tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    log_dir = tmp_path / "runs" / "exp"
    run = run_perfrun("--no-tracker", "--tracker-every", "20",
                      str(SCRIPTS / "track_tensorboard.py"), "--logdir", str(log_dir))
    assert run.returncode == 0, run.describe()
    assert scalars(log_dir).Tags()["scalars"] == ["train/loss"]
    assert list(log_dir.glob("*.perfrun")) == []
    assert not (run.run_dir / "trackers").exists()


# -- MLflow ----------------------------------------------------------------------------------


@pytest.mark.parametrize("end", [True, False], ids=["with-block", "ended-at-exit"])
def test_mlflow_run_shows_perfruns_series_summary_and_report(
        run_perfrun: RunPerfrun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        end: bool) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    store = f"file://{tmp_path / 'mlruns'}"
    # A local file store: MLflow 3 asks for this to use one (here too, to
    # read it back).
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    env = e2e_environment()
    env.update(MLFLOW_TRACKING_URI=store)
    run = run_perfrun("--tracker-every", "20", str(SCRIPTS / "track_mlflow.py"),
                      *([] if end else ["--no-end"]), env=env)
    assert run.returncode == 0, run.describe()
    [entry] = tracker_record(run.run_dir)["runs"]
    assert entry["kind"] == "mlflow" and entry["tracking_uri"] == store
    assert f"run {entry['run_id']}" in run.out  # the script's own run
    client = MlflowClient(store)
    mlrun = client.get_run(entry["run_id"])
    assert mlrun.info.status == "FINISHED"
    assert len(client.get_metric_history(entry["run_id"], "loss")) == STEPS
    for name in PHASES:
        history = client.get_metric_history(entry["run_id"], f"perfrun/{name}")
        steps = sorted(m.step for m in history)
        assert steps[:5] == [19, 39, 59, 79, 99] and len(steps) == 6, (name, steps)
    # The report's summary as metrics and params, report.html as an artifact.
    report = run.report()
    metrics = mlrun.data.metrics
    assert metrics["perfrun/summary/step_time_ms"] == pytest.approx(
        report["perf"]["batch_cost"]["median"] * 1000)
    assert metrics["perfrun/summary/reader_ratio_pct"] == pytest.approx(
        report["perf"]["reader_ratio"] * 100)
    assert metrics["perfrun/summary/steps"] == report["title"]["steps_counted"]
    params = mlrun.data.params
    kinds = [a["kind"] for a in report["advice"]]
    assert params["perfrun/advice"] == (",".join(dict.fromkeys(kinds)) or "none")
    assert params["perfrun/results"] == str(run.run_dir)
    assert params["lr"] == "0.001"  # the script's own, untouched
    artifacts = [a.path for a in client.list_artifacts(entry["run_id"], "perfrun")]
    assert artifacts == ["perfrun/report.html"]


# -- W&B ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("finish", [True, False], ids=["finished", "closed-at-exit"])
def test_wandb_offline_run_shows_perfruns_series_at_the_scripts_steps(
        run_perfrun: RunPerfrun, tmp_path: Path, finish: bool) -> None:
    pytest.importorskip("wandb")
    env = e2e_environment()
    env.update(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DISABLE_GIT="true")
    # 1,200 steps (about 1.7 s here): a save every 0.1 s gets points to W&B
    # during the run, each into a row the script then commits. 400 steps
    # (0.55 s) left one point in CI once, beside a Ray cluster's start-up.
    epochs = 30
    run = run_perfrun("--tracker-every", "20", "--flush-interval", "0.1",
                      str(SCRIPTS / "track_wandb.py"), "--dir", str(tmp_path),
                      "--epochs", str(epochs), *([] if finish else ["--no-finish"]), env=env)
    assert run.returncode == 0, run.describe()
    [entry] = tracker_record(run.run_dir)["runs"]
    assert entry["kind"] == "wandb" and entry["offline"] and entry["summary"]
    assert f"run {entry['id']}" in run.out
    [folder] = (tmp_path / "wandb").glob(f"offline-run-*-{entry['id']}")
    history, summary = read_wandb_run(folder)
    steps = epochs * 40
    # The script's step counter is its own: a row per wandb.log, 0..N-1, each
    # with its loss; perfrun's figures joined those rows (and the one W&B
    # keeps open after the script's last, which the close commits).
    scripts = [row for row in history if "loss" in row]
    assert [row["_step"] for row in scripts] == list(range(steps))
    ours = [row for row in history if "perfrun/step_time_ms" in row]
    assert len(ours) >= 2
    assert all(row["_step"] <= steps for row in ours)
    assert [row for row in history if "loss" not in row] == [r for r in ours
                                                            if r["_step"] == steps]
    for row in ours:
        assert all(f"perfrun/{name}" in row for name in PHASES), row
        assert row["perfrun/step"] % 20 == 19 or row is ours[-1]
    # The rank's own summary, written as the run closed.
    assert summary["perfrun/summary/steps"] > steps - 10
    assert summary["perfrun/summary/step_time_ms"] > 0
    assert summary["perfrun/results"] == str(run.run_dir)


def test_a_trackers_own_error_reaches_the_script_as_python_gives_it(
        run_perfrun: RunPerfrun, tmp_path: Path) -> None:
    """wandb.init raising (a mode W&B does not know) passes through
    perfrun's hook on it: the script gets the same exception and prints
    the same traceback, with no frame of perfrun's."""
    pytest.importorskip("wandb")
    env = e2e_environment()
    env.update(WANDB_MODE="nonsense", WANDB_SILENT="true")
    script = [str(SCRIPTS / "track_wandb.py"), "--dir", str(tmp_path)]
    plain = subprocess.run([sys.executable, *script], cwd=tmp_path, env=env,
                           stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=E2E_TIMEOUT)
    run = run_perfrun(*script, env=env)
    assert plain.returncode == run.returncode == 1, run.describe()
    assert "Traceback" in plain.stderr
    assert script_stderr(run.err) == plain.stderr.splitlines()
