"""Processes a script starts itself: the child's document (store/
childfile.py), the target wrapper that writes it (runtime/children.py),
and what the report makes of them, without subprocesses. The real Hogwild
runs, forked and spawned, are in test_e2e_loop_shapes.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from builders import make_rank, make_rows, make_run

from perfrun.analysis.build import build_report
from perfrun.runtime import children
from perfrun.store import childfile, layout


def _child(pid: int, steps: int, status: str = "finished") -> dict:
    return {"pid": pid, "target": "train", "started": 1.0, "seconds": 2.5,
            "optimizer_steps": steps, "status": status}


def test_documents_are_written_whole_and_read_back_validated(tmp_path: Path) -> None:
    run_dir = str(tmp_path)
    childfile.write(run_dir, "rank0", _child(12, 40))
    childfile.write(run_dir, "rank0", _child(11, 38, "raised"))
    childfile.write(run_dir, "rank1", _child(13, 5))
    folder = tmp_path / layout.CHILDREN_DIR
    (folder / "rank0.pid14.json").write_text("{not json")
    (folder / "rank0.pid15.json").write_text(json.dumps(
        {"format": childfile.FORMAT, "version": 99, **_child(15, 1)}))
    found, bad = childfile.read_children(run_dir, "rank0")
    assert [d["pid"] for d in found] == [11, 12] and bad == 2
    assert not any(name.endswith(".tmp") for name in os.listdir(folder))


def test_a_target_counts_the_optimizer_steps_it_takes(tmp_path: Path) -> None:
    def train(n: int) -> str:
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(n):
            model(torch.ones(1, 2)).sum().backward()
            opt.step()
        return "done"

    wrapped = children.ChildTarget(train, str(tmp_path), "rank0", 0.0)
    assert wrapped(7) == "done"
    [doc], bad = childfile.read_children(str(tmp_path), "rank0")
    assert bad == 0 and doc["optimizer_steps"] == 7 and doc["status"] == "finished"
    assert doc["target"].endswith("train") and doc["pid"] == os.getpid()
    # The hook is removed with the target: steps after it are not counted.
    train(3)
    [doc], _ = childfile.read_children(str(tmp_path), "rank0")
    assert doc["optimizer_steps"] == 7


def test_only_the_scripts_own_targets_are_wrapped() -> None:
    assert not children.is_scripts(torch.utils.data._utils.worker._worker_loop, "/x")
    assert children.is_scripts(test_only_the_scripts_own_targets_are_wrapped,
                               os.path.dirname(os.path.abspath(__file__)))


def test_a_parent_that_only_tests_while_its_children_train_gets_no_advice(
    tmp_path: Path,
) -> None:
    # The parent's steps: no-grad fetches and forwards, most of it loading.
    rows = make_rows([{"dataloader": 0.004, "forward": 0.002, "calls": (1, 1, 0, 0)}] * 8)
    run_dir = str(tmp_path)
    for pid in (101, 102):
        childfile.write(run_dir, "rank0", _child(pid, 40))
    report = build_report(make_run([make_rank(rows)], run_dir=run_dir), warmup=1)
    [row] = [e for e in report.extras if e.name == "Child processes"]
    assert row.calls == 2 and "train: 2 processes (pid 101, 102), 80 optimizer steps" in row.detail
    assert any(n.startswith("this process did not train") for n in report.notes)
    [steps] = [t for label, t in report.title.entries() if label == "Steps"]
    assert steps.endswith("forward passes only (no backward, no optimizer step): an inference "
                          "or evaluation loop")
    assert report.advice == []
    # The same steps without children that trained: the advice stands.
    alone = build_report(make_run([make_rank(rows)], run_dir=str(tmp_path / "none")), warmup=1)
    assert alone.advice and not any("did not train" in n for n in alone.notes)


def test_a_version_1_document_is_read_as_multiprocessings(tmp_path: Path) -> None:
    path = Path(layout.child_path(str(tmp_path), "rank0", 21))
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"format": childfile.FORMAT, "version": 1, **_child(21, 3)}))
    bad = Path(layout.child_path(str(tmp_path), "rank0", 22))
    bad.write_text(json.dumps({"format": childfile.FORMAT, "version": 1,
                               **_child(22, 3, "running")}))
    [doc], unread = childfile.read_children(str(tmp_path), "rank0")
    assert doc["pid"] == 21 and doc["started_by"] == "multiprocessing" and unread == 1


def test_where_only_a_clusters_workers_trained_the_report_says_so(tmp_path: Path) -> None:
    """A Ray Train driver: its own process runs no step; the workers Ray
    started counted theirs (runtime/children.Descendant)."""
    run_dir = str(tmp_path)
    for pid in (301, 302):
        childfile.write(run_dir, "rank0", {**_child(pid, 24, "running"),
                                           "target": "ray::RayTrainWorker",
                                           "started_by": "ray",
                                           "command": ["ray::RayTrainWorker.train_func"]})
    childfile.write(run_dir, "rank0", {**_child(303, 0, "running"), "target": "ray::IDLE",
                                       "started_by": "ray"})
    report = build_report(make_run([make_rank([])], run_dir=run_dir))
    assert report.problem == (
        "no training loop in the script's own process: 48 optimizer steps ran in 2 processes "
        "it started (ray::RayTrainWorker, pid 301, 302), which perfrun counts but does not "
        "profile (Child processes, under Outside the steps)")
    [row] = [e for e in report.extras if e.name == "Child processes"]
    assert "workers of the Ray cluster the script started" in row.detail
    # Without them, the run says what it always said.
    alone = build_report(make_run([make_rank([])], run_dir=str(tmp_path / "none")))
    assert alone.problem is not None and alone.problem.startswith("no PyTorch training loop")


def test_a_cluster_worker_counts_its_steps_and_writes_as_it_goes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(children, "SAVE_EVERY", 0.05)
    counter = children.Descendant({"run_dir": str(tmp_path), "stem": "rank0",
                                   "origin_wall": 0.0, "started_by": "ray"})
    counter.on_torch(torch)
    try:
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(5):
            model(torch.ones(1, 2)).sum().backward()
            opt.step()
        import time

        time.sleep(0.3)
        [doc], _ = childfile.read_children(str(tmp_path), "rank0")
        # Written while it runs, with no exit: what a killed worker leaves.
        assert doc["optimizer_steps"] == 5 and doc["status"] == "running"
        assert doc["started_by"] == "ray" and doc["pid"] == os.getpid()
        counter.at_exit()
        [doc], _ = childfile.read_children(str(tmp_path), "rank0")
        assert doc["status"] == "finished"
    finally:
        counter.done = True
        counter.handle.remove()


def test_a_process_is_named_so_a_clusters_processes_tell_apart() -> None:
    title = children.process_title
    assert title(["ray::RayTrainWorker.train_func                "]) == "ray::RayTrainWorker"
    assert title(["ray::IDLE"]) == "ray::IDLE"
    assert title(["/v/bin/python3", "-u", "/v/ray/_private/log_monitor.py", "--x"]) == \
        "log_monitor.py"
    assert title(["/v/bin/python", "-m", "ray.dashboard.agent"]) == "python -m ray.dashboard.agent"
    assert title(["/v/ray/core/src/ray/raylet/raylet", "--a"]) == "raylet"


def test_ray_init_hands_its_processes_the_boot_and_the_script_keeps_its_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    from perfrun.runtime.lite import wrap_ray_init

    monkeypatch.setenv("PYTHONPATH", "/mine")
    monkeypatch.delenv("PERFRUN_SETTINGS", raising=False)
    seen: list[tuple[str | None, str | None]] = []

    def init(address: str | None = None) -> str:
        # What Ray's processes copy when ray.init starts them.
        seen.append((os.environ.get("PYTHONPATH"), os.environ.get("PERFRUN_SETTINGS")))
        if address == "boom":
            raise ConnectionError("no cluster")
        return "context"

    ray = types.SimpleNamespace(init=init)
    wrap_ray_init(ray, lambda: {"PYTHONPATH": "/boot:/mine", "PERFRUN_SETTINGS": "/run/d.json"})
    wrap_ray_init(ray, lambda: {"PYTHONPATH": "twice"})  # wrapped once only
    assert ray.init() == "context" and ray.init.__name__ == "init"
    assert seen == [("/boot:/mine", "/run/d.json")]
    assert os.environ["PYTHONPATH"] == "/mine" and "PERFRUN_SETTINGS" not in os.environ
    with pytest.raises(ConnectionError):
        ray.init("boom")
    assert os.environ["PYTHONPATH"] == "/mine" and "PERFRUN_SETTINGS" not in os.environ
