"""The hot path: what perfrun's hooks run on each training step.

Structural checks only, never wall-clock times: which perfrun frames a
module call runs (counted with sys.setprofile), when the root search runs
and ends, that the timer-only path calls no Python function of perfrun's
beyond the wrapper of the hooked call, and that torch is left as it was.
The hooks are installed in this process on a stand-in agent (a real step
tracker and clock) and taken out again after each test.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from perfrun.runtime import hooks
from perfrun.runtime.clock import BufferedClock, PhaseClock
from perfrun.runtime.events import OPTIM
from perfrun.runtime.hooks import SEARCH_CALLS, HookState
from perfrun.runtime.modules import RootTracker
from perfrun.runtime.steps import StepTracker

HOOKS_FILE = hooks.__file__
TORCH_MODULE_CALL = nn.Module.__dict__["__call__"]


def make_agent(timer_only: bool) -> SimpleNamespace:
    tracker = StepTracker("auto")
    phase_clock = PhaseClock(tracker)
    faults: list[str] = []
    return SimpleNamespace(
        hooks_state=HookState(),
        tracker=tracker,
        phase_clock=phase_clock,
        clock=BufferedClock(phase_clock) if timer_only else phase_clock,
        faults=faults,
        record_fault=lambda where, exc: faults.append(f"{where}: {exc}"),
        roots=RootTracker(),
        count_samples=True,
        note_dataloader=lambda loader, grad=True: None,
        note_once=lambda note: None,
    )


@pytest.fixture(params=[False, True], ids=["live", "timer-only"])
def agent(request: pytest.FixtureRequest) -> Iterator[SimpleNamespace]:
    agent = make_agent(timer_only=request.param)
    agent.undo = hooks.install(torch, agent)
    try:
        yield agent
    finally:
        hooks.uninstall(agent.undo)
    assert agent.faults == []


class Block(nn.Module):
    def __init__(self, width: int = 4, depth: int = 3) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(width, width) for _ in range(depth)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


class Net(nn.Module):
    def __init__(self, blocks: int = 5, width: int = 4) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(width) for _ in range(blocks)])
        self.head = nn.Linear(width, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def train(model: nn.Module, steps: int, forward: Callable[..., Any] | None = None) -> None:
    """`steps` loop bodies of zero_grad, forward, loss module, backward, step."""
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(3, 4), torch.tensor([0, 1, 0])
    for _ in range(steps):
        optimizer.zero_grad()
        loss = loss_fn((forward or model)(x), y)
        loss.backward()
        optimizer.step()


def perfrun_frames(fn: Callable[[], Any]) -> list[str]:
    """The names of the Python functions of perfrun's hooks that `fn()` runs."""
    seen: list[str] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename == HOOKS_FILE:
            seen.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen


def searching() -> bool:
    return hooks.is_wrapped(nn.Module.__dict__["__call__"])


def forward_calls(agent: SimpleNamespace) -> list[int]:
    agent.clock.drain()
    return [row[8] for row in agent.tracker.rows]


# -- module calls -------------------------------------------------------------------------


def test_nested_module_calls_run_no_perfrun_frame(agent: SimpleNamespace) -> None:
    model = Net(blocks=20)  # 20 blocks of 3 layers: 81 module calls below the root
    x = torch.randn(3, 4)
    assert searching()
    # Each step calls two roots (the model, the loss module): the search
    # ends after SEARCH_CALLS of them.
    train(model, SEARCH_CALLS // 2 + 1)
    assert not searching()
    assert nn.Module.__dict__["__call__"] is TORCH_MODULE_CALL
    # The root's call runs its class's wrapper, once; its 81 submodule calls
    # run torch's own nn.Module.__call__ and nothing of perfrun's.
    assert perfrun_frames(lambda: model(x)) == ["__call__"]
    # A block called on its own once the search is over is no root: no
    # frame either.
    assert perfrun_frames(lambda: model.blocks[0](x)) == []
    # Still timed: one Forward for the model, one for the loss module, per step.
    assert set(forward_calls(agent)) == {2}


def test_while_searching_a_nested_call_passes_straight_through(agent: SimpleNamespace) -> None:
    model = Net(blocks=2)  # 2 blocks of 3 layers, a head: 9 calls below the root
    x = torch.randn(3, 4)
    model(x)  # the root found: its class gets its wrapper
    assert searching()
    frames = perfrun_frames(lambda: model(x))
    # The root's wrapper (which counts the call against the search), then
    # the search's wrapper, once for the root's own nn.Module.__call__ and
    # once for each nested call, each passing straight on.
    assert frames == ["__call__", "watch"] + ["__call__"] * (1 + 9)


def test_roots_are_what_the_script_calls_at_depth_zero(agent: SimpleNamespace) -> None:
    model = Net(blocks=3)
    # model.forward(x) called directly: the blocks and the head are the
    # outermost module calls, so they are the roots (three of one class).
    train(model, 2, forward=model.forward)
    roots = agent.roots.alive()
    assert sum(isinstance(r, Block) for r in roots) == 3
    assert any(r is model.head for r in roots)
    assert not any(r is model for r in roots)
    # 3 blocks, the head and the loss module: 5 Forward calls a step.
    assert set(forward_calls(agent)) == {5}


def test_a_root_class_nested_in_itself_is_timed_once(agent: SimpleNamespace) -> None:
    inner = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    model = nn.Sequential(inner, nn.Linear(4, 2))
    train(model, SEARCH_CALLS)
    assert not searching()
    # The inner Sequential shares the root's class, so its call passes
    # through that class's wrapper (one frame), untimed.
    assert perfrun_frames(lambda: model(torch.randn(3, 4))) == ["__call__", "__call__"]
    assert set(forward_calls(agent)) == {2}


def test_a_root_found_late_is_found_by_the_next_search(agent: SimpleNamespace) -> None:
    model, probe = Net(blocks=1), nn.Linear(2, 2)
    train(model, SEARCH_CALLS)
    assert not searching()
    state = agent.hooks_state
    assert state.due > 0  # the next search: SEARCH_BACKOFF seconds on
    probe(torch.randn(1, 2))  # not seen: no search runs
    assert not any(r is probe for r in agent.roots.alive())
    state.due = float("-inf")  # as if that time had come
    train(model, 1)  # the model's next call starts the search
    assert searching()
    probe(torch.randn(1, 2))
    assert any(r is probe for r in agent.roots.alive())


def test_a_new_loader_or_optimizer_starts_a_search(agent: SimpleNamespace) -> None:
    model = Net(blocks=1)
    train(model, SEARCH_CALLS)
    assert not searching()
    loader = DataLoader(TensorDataset(torch.randn(4, 4)), batch_size=2)
    for _ in loader:
        pass
    assert searching()
    train(model, SEARCH_CALLS)
    assert not searching()
    for _ in loader:  # the same loader again: nothing new to look for
        pass
    assert not searching()
    torch.optim.SGD(model.parameters(), lr=0.1)
    assert searching()


def test_hooks_switched_off_mid_search_give_torch_its_module_call_back(
        agent: SimpleNamespace) -> None:
    """A search ends at an outermost call that the timing wrapper sees; once
    the hooks are switched off (the run ended, or a DataLoader worker was
    forked mid-search) none will, so the next module call ends it instead:
    otherwise every module call from then on would pass through perfrun."""
    model = Net(blocks=1)
    x = torch.randn(3, 4)
    model(x)
    assert searching()
    agent.hooks_state.block = hooks.OFF
    model(x)
    assert not searching()
    assert nn.Module.__dict__["__call__"] is TORCH_MODULE_CALL
    # The root's class keeps its wrapper, which passes the call through.
    assert perfrun_frames(lambda: model(x)) == ["__call__"]


def test_install_and_uninstall_leave_torch_as_it_was() -> None:
    agent = make_agent(timer_only=True)
    undo = hooks.install(torch, agent)
    try:
        train(Net(blocks=1), SEARCH_CALLS)
        assert hooks.is_wrapped(Net.__dict__["__call__"])
    finally:
        hooks.uninstall(undo)
    assert nn.Module.__dict__["__call__"] is TORCH_MODULE_CALL
    assert "__call__" not in Net.__dict__
    assert "__call__" not in nn.CrossEntropyLoss.__dict__
    assert not hooks.is_wrapped(torch.autograd.backward)
    assert not hooks.is_wrapped(torch.autograd.grad)
    assert not hooks.is_wrapped(torch.optim.Optimizer.zero_grad)
    assert not hooks.is_wrapped(torch.compile)
    spawn_module = sys.modules["torch.multiprocessing.spawn"]
    assert not hooks.is_wrapped(spawn_module.start_processes)
    assert torch.multiprocessing.start_processes is spawn_module.start_processes


def _train_on_thread(name: str, steps: int) -> None:
    thread = threading.Thread(target=train, args=(Net(blocks=1), steps), name=name)
    thread.start()
    thread.join()


def test_a_loop_on_a_thread_of_its_own_is_timed_from_its_second_step() -> None:
    """A script whose main thread only starts and joins the thread that
    trains: that thread's steps are timed, from its second optimizer step
    (the first shows which thread trains). Another thread's, while it
    lives, are not, and the first such thread is named; once it has
    ended, the thread that trains next is timed (here the main thread)."""
    agent = make_agent(timer_only=False)
    notes: list[str] = []
    agent.note_once = lambda note: notes.append(note) if note not in notes else None
    undo = hooks.install(torch, agent)
    trained, release = threading.Event(), threading.Event()

    def trainer() -> None:
        train(Net(blocks=1), 5)
        trained.set()
        release.wait(60)

    thread = threading.Thread(target=trainer, name="trainer")
    try:
        thread.start()
        assert trained.wait(60)
        assert notes == [hooks.thread_trained_note("trainer")] and agent.faults == []
        agent.tracker.finish(agent.clock.now())
        assert agent.tracker.committed == 4
        # While the trainer lives, another thread's steps and the main
        # thread's are not timed.
        _train_on_thread("another", 3)
        train(Net(blocks=1), 2)
        agent.tracker.finish(agent.clock.now())
        assert agent.tracker.committed == 4 and agent.faults == []
        assert notes == [hooks.thread_trained_note("trainer"),
                         hooks.thread_note("another", "trainer")]
        assert "(trainer)" in notes[0] and "(trainer): another;" in notes[1]
        release.set()
        thread.join()
        # The trainer has ended: the main thread's loop is timed, from its
        # second step.
        train(Net(blocks=1), 3)
        agent.tracker.finish(agent.clock.now())
        assert agent.tracker.committed == 6 and agent.faults == []
        assert len(notes) == 2
    finally:
        release.set()
        thread.join()
        hooks.uninstall(undo)


def test_steps_on_another_thread_after_the_main_one_trained_are_said() -> None:
    """The script's main thread trains first: it is the one timed, and a
    thread of the script's that trains after adds no event, only a note,
    once."""
    agent = make_agent(timer_only=True)
    notes: list[str] = []
    agent.note_once = lambda note: notes.append(note) if note not in notes else None
    undo = hooks.install(torch, agent)
    try:
        train(Net(blocks=1), 2)
        agent.clock.drain()
        done = agent.tracker.committed
        for name in ("trainer", "another"):
            _train_on_thread(name, 3)
        # No edge: only the optimizers' construction, which any thread's
        # counts (the first thread's step replayed what was buffered, to
        # see that the main thread had trained).
        assert set(agent.clock.buf) == {(OPTIM,)} and agent.faults == []
        agent.clock.drain()
        assert agent.tracker.committed == done
        # One note, for the first such thread: a script may start many.
        assert notes == [hooks.thread_note("trainer")]
        assert "(trainer)" in notes[0]
        # The main thread's own steps are still timed.
        train(Net(blocks=1), 2)
        agent.clock.drain()
        assert agent.tracker.committed > done and notes == [hooks.thread_note("trainer")]
    finally:
        hooks.uninstall(undo)


# -- the timer-only path ------------------------------------------------------------------


def test_timer_only_runs_only_the_wrappers_of_the_hooked_calls() -> None:
    agent = make_agent(timer_only=True)
    undo = hooks.install(torch, agent)
    try:
        model = Net(blocks=4)
        loader = DataLoader(TensorDataset(torch.randn(40, 4), torch.tensor([0, 1] * 20)),
                            batch_size=2)
        loss_fn = nn.CrossEntropyLoss()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        batches = iter(loader)

        def step() -> None:
            x, y = next(batches)
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()

        for _ in range(SEARCH_CALLS // 2 + 1):
            step()
        agent.clock.last = float("inf")  # no replay inside the counted step
        frames = perfrun_frames(step)
    finally:
        hooks.uninstall(undo)
    # One wrapper per hooked call: the fetch, zero_grad, the model, the loss
    # module, backward, the optimizer step. No clock method, no helper.
    assert sorted(frames) == sorted(
        ["__next__", "phase", "__call__", "__call__", "backward", "step"]
    )
    assert agent.faults == []


def test_timer_only_steps_match_the_live_clock() -> None:
    rows = []
    for timer_only in (False, True):
        agent = make_agent(timer_only)
        undo = hooks.install(torch, agent)
        try:
            train(Net(blocks=2), 6)
            agent.clock.drain()
            agent.tracker.finish(agent.phase_clock.now())
        finally:
            hooks.uninstall(undo)
        # Calls per phase, per step (times differ between the two runs).
        rows.append([row[7:11] for row in agent.tracker.rows])
    assert rows[0] == rows[1]
    assert len(rows[0]) == 6


def test_gradients_taken_with_autograd_grad_are_backward(agent: SimpleNamespace) -> None:
    """Functional training: `torch.autograd.grad` instead of `backward`,
    gradients set by hand. Its time is Backward, once a step, not Others."""
    model = Net(blocks=1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(3, 4), torch.tensor([0, 1, 0])
    for _ in range(4):
        loss = nn.functional.cross_entropy(model(x), y)
        grads = torch.autograd.grad(loss, list(model.parameters()))
        for param, grad in zip(model.parameters(), grads):
            param.grad = grad
        optimizer.step()
    agent.clock.drain()
    agent.tracker.finish(agent.phase_clock.now())
    rows = agent.tracker.rows
    assert len(rows) == 4
    # Calls per step: no fetch; forward, backward, optimization once each.
    assert [row[7:11] for row in rows] == [[0, 1, 1, 1]] * 4
    assert all(row[4] > 0 for row in rows)  # Backward time


# -- torch.compile ------------------------------------------------------------------------

COMPILE_CHECK = """
import sys
import torch
from torch import nn
from perfrun.runtime import hooks
sys.path.insert(0, {tests!r})
from test_hotpath import SEARCH_CALLS, make_agent, train

agent = make_agent(timer_only=False)
undo = hooks.install(torch, agent)
model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
import torch._dynamo.utils as utils  # Dynamo keeps the nn.Module.__call__ it sees
import torch._dynamo.variables.nn_module as nn_module
# While perfrun searches, Dynamo's "torch's own __call__" is the search's.
assert utils.unpatched_nn_module_call is nn.Module.__dict__["__call__"]
assert hooks.is_wrapped(nn_module.unpatched_nn_module_call)
train(model, SEARCH_CALLS)
# The search over: torch's own again, for both.
torch_call = nn.Module.__dict__["__call__"]
assert not hooks.is_wrapped(torch_call)
assert utils.unpatched_nn_module_call is torch_call
assert nn_module.unpatched_nn_module_call is torch_call
assert hooks.is_wrapped(nn.Sequential.__dict__["__call__"])
# torch.compile(model): Dynamo traces the model's own call, so its class
# gives back its wrapper, and a search starts to find the compiled wrapper.
compiled = torch.compile(model, backend="eager")
assert "__call__" not in nn.Sequential.__dict__
assert hooks.is_wrapped(nn.Module.__dict__["__call__"])
train(model, 3, forward=compiled)
assert any(type(r).__name__ == "OptimizedModule" for r in agent.roots.alive())
# Something was compiled: the search's nn.Module.__call__ stays, however
# many outermost calls go by, so nothing Dynamo guarded on changes.
train(model, 2 * SEARCH_CALLS, forward=compiled)
assert hooks.is_wrapped(nn.Module.__dict__["__call__"])
assert utils.unpatched_nn_module_call is nn.Module.__dict__["__call__"]
assert agent.faults == [], agent.faults
hooks.uninstall(undo)
assert nn.Module.__dict__["__call__"] is utils.unpatched_nn_module_call
print("ok")
"""


@pytest.mark.slow
def test_dynamo_sees_torchs_own_module_call_and_compiled_models_are_roots() -> None:
    # In a subprocess: importing Dynamo here would change this process for
    # the tests that follow.
    code = textwrap.dedent(COMPILE_CHECK.format(tests=str(Path(__file__).parent)))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("ok")


@pytest.mark.slow
def test_the_bytecodes_a_step_costs_are_counted_and_bounded() -> None:
    """scripts/bench_hotpath.py counts what perfrun adds to a step of
    workload (d): a count, not a time, so it can guard the hot path here.
    Six hooked calls run under 600 bytecodes of perfrun's wrappers today,
    and the replay of their edges under 200."""
    script = Path(__file__).resolve().parent.parent / "scripts" / "bench_hotpath.py"
    out = subprocess.run([sys.executable, str(script), "--steps", "60"], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    wrappers = next(int(line.split()[-1]) for line in lines if "in perfrun's wrappers" in line)
    replay = next(int(line.split()[-1]) for line in lines if "in the replay of edges" in line)
    assert 0 < wrappers < 800, out.stdout
    # The steady loop's steps are replayed in bulk (steady.py): a few
    # hundred bytecodes a step, where the state machine ran some 1,600.
    assert 0 < replay < 500, out.stdout
    assert "hooks.py:__next__" in out.stdout and "edges buffered a step: 12.0" in out.stdout
    # 1,000 submodule calls a forward run none of perfrun's bytecodes.
    assert "(difference +0.0)" in out.stdout, out.stdout


@pytest.mark.slow
def test_the_in_process_benchmark_runs_every_kind_of_block(tmp_path: Path) -> None:
    """scripts/bench_inprocess.py times the hooks in and out of one process:
    checked here for what it runs and reports, never for its times."""
    script = Path(__file__).resolve().parent.parent / "scripts" / "bench_inprocess.py"
    out_json = tmp_path / "inprocess.json"
    out = subprocess.run([sys.executable, str(script), "--rounds", "1", "--block", "45",
                          "--json", str(out_json)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out_json.read_text())
    assert set(doc["workloads"]) == {"(d) loader_mlp", "(e) many_modules", "(f) no_submodules"}
    loader = doc["workloads"]["(d) loader_mlp"]
    assert loader["plain_step_us"] > 0
    assert {"perfrun", "batch-size", "off", "floor", "perfrun_less_floor",
            "sample_count"} <= set(loader)
    assert set(loader["calls"]) == {"fetch", "zero_grad", "model", "loss+backward",
                                    "optimizer.step"}
    assert "median" in doc["submodules_1000"]
    assert "1,000 submodule calls" in out.stdout


@pytest.mark.slow
def test_the_in_process_benchmark_pairs_ordinary_steps(tmp_path: Path) -> None:
    """Its ordinary loops (--workloads mlp): pairs of blocks, hooks in and out,
    each step's wall and thread CPU time kept; checked for what it runs and
    reports, never for its times."""
    script = Path(__file__).resolve().parent.parent / "scripts" / "bench_inprocess.py"
    out_json = tmp_path / "inprocess.json"
    out = subprocess.run([sys.executable, str(script), "--workloads", "mlp", "--pairs", "3",
                          "--json", str(out_json)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    mlp = json.loads(out_json.read_text())["workloads"]["(g) mlp"]
    assert mlp["pairs"] == 3 and len(mlp["blocks"]) == 3
    # The hooks were in place: perfrun's tracker saw the hooked blocks' steps.
    assert mlp["steps_seen"] >= 3 * mlp["block"]
    for pair in mlp["blocks"]:
        for kind in ("hooked", "plain"):
            assert len(pair[kind]["wall"]) == len(pair[kind]["cpu"]) == mlp["block"]
    for fig in (mlp, mlp["cpu"]):
        assert fig["pct_lo"] <= fig["added_pct"] <= fig["pct_hi"]
    assert "in thread CPU time, perfrun's hooks add" in out.stdout
