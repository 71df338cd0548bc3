"""After the run: the report's summary, and report.html where the tracker
keeps files, into the tracker runs the ranks logged their figures into
(store/trackerfile.py says which).

Only where the tracker takes them once the script's process has ended:

* MLflow: its client logs to a run by id after the run has ended, so the
  run gets the summary figures as metrics (at the step of its last
  perfrun point), the advice's kinds and the results folder as params,
  and report.html as an artifact (`perfrun/report.html`).
* TensorBoard: it reads every event file in a run's folder as one run, so
  the summary goes into an event file of perfrun's own beside the
  script's: the figures as scalars, and a text summary (a Markdown table,
  the advice, where report.html is: TensorBoard keeps no files).
* W&B: an offline run cannot be reopened once its process has ended
  (W&B ignores `resume` offline), so its summary came from the rank as the
  script closed it (runtime/trackers.py), and report.html stays in the
  run folder, whose path the run's summary holds.

The tracker libraries are the user's, imported here only when a run of
theirs was recorded. A tracker that fails or does not answer costs one
line on stderr, never the run's exit status: each delivery runs on a
daemon thread, waited for at most the timeout.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Mapping
from typing import Any, Callable, Optional

from ..store.trackerfile import read_trackers

NAMES = {"wandb": "W&B", "mlflow": "MLflow", "tensorboard": "TensorBoard"}


def deliver(run_dir: str, figures: Mapping[str, float], words: Mapping[str, str],
            text: str, page: Optional[str], timeout: float) -> list[str]:
    """Give every recorded MLflow run and TensorBoard folder the summary;
    return one line for each that did not take it."""
    problems: list[str] = []
    seen: set[tuple[str, str]] = set()
    for record in read_trackers(run_dir):
        for run in record["runs"]:
            kind = run["kind"]
            if kind == "mlflow":
                key = (kind, run["run_id"])
                call = functools.partial(_mlflow, run, figures, words, page)
            elif kind == "tensorboard":
                key = (kind, run["log_dir"])
                call = functools.partial(_tensorboard, run, figures, text)
            else:
                continue
            if key in seen:
                continue
            seen.add(key)
            problem = _bounded(call, timeout)
            if problem is not None:
                problems.append(f"the report's summary did not reach the {NAMES[kind]} run "
                                f"{key[1]}: {problem}")
    return list(dict.fromkeys(problems))


def _bounded(call: Callable[[], None], timeout: float) -> Optional[str]:
    """Run `call` on a daemon thread for at most `timeout` seconds: why it
    failed, or None."""
    outcome: list[Optional[str]] = []

    def run() -> None:
        try:
            call()
            outcome.append(None)
        except Exception as exc:  # noqa: BLE001 - the user's tracker, any failure
            outcome.append(f"{type(exc).__name__}: {exc}".splitlines()[0][:200])

    thread = threading.Thread(target=run, name="perfrun-tracker-summary", daemon=True)
    thread.start()
    thread.join(timeout)
    if not outcome:
        return f"no answer within {timeout:g} s"
    return outcome[0]


def _step(run: Mapping[str, Any]) -> int:
    last = run.get("last_step")
    return last if isinstance(last, int) else 0


def _mlflow(run: Mapping[str, Any], figures: Mapping[str, float], words: Mapping[str, str],
            page: Optional[str]) -> None:
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    client = MlflowClient(run.get("tracking_uri") or None)
    stamp = int(time.time() * 1000)
    step = _step(run)
    client.log_batch(
        run["run_id"],
        metrics=[Metric(k, float(v), stamp, step) for k, v in figures.items()],
        params=[Param(k, str(v)[:6000]) for k, v in words.items()],
    )
    if page is not None and os.path.isfile(page):
        client.log_artifact(run["run_id"], page, artifact_path="perfrun")


def _tensorboard(run: Mapping[str, Any], figures: Mapping[str, float], text: str) -> None:
    from tensorboard.compat.proto import (
        event_pb2,
        summary_pb2,
        tensor_pb2,
        tensor_shape_pb2,
        types_pb2,
    )
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    step = _step(run)
    now = time.time()
    values = [summary_pb2.Summary.Value(tag=k, simple_value=float(v)) for k, v in figures.items()]
    # A text summary as TensorBoard's text plugin stores one.
    values.append(summary_pb2.Summary.Value(
        tag="perfrun/summary",
        metadata=summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="text")),
        tensor=tensor_pb2.TensorProto(
            dtype=types_pb2.DT_STRING, string_val=[text.encode("utf-8")],
            tensor_shape=tensor_shape_pb2.TensorShapeProto(
                dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=1)])),
    ))
    writer = EventFileWriter(run["log_dir"], filename_suffix=".perfrun")
    try:
        writer.add_event(event_pb2.Event(wall_time=now, step=step,
                                         summary=summary_pb2.Summary(value=values)))
    finally:
        writer.close()
