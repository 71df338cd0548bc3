"""torch.compile under perfrun: no guard and no recompile of perfrun's own.

Dynamo traces `nn.Module.__call__` (perfrun's wrapper) when it compiles a
module call, and compiles frames where it resumes; anything the wrapper read
would become a guard, and a wrapper frame compiled as user code would be
recompiled for every module class. The tests run a compiled model with
`TORCH_LOGS=recompiles,guards` under plain python and under perfrun (with
and without the detailed window, whose module hooks must not reach inside
the compiled region either) and compare every guard and recompile line, with
addresses and numbers blanked out.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import RunPerfrun, e2e_environment

SCRIPT = str(Path(__file__).parent / "scripts" / "train_compiled.py")

pytestmark = pytest.mark.slow


def dynamo_log(text: str) -> list[str]:
    """Guard and recompile lines: what they check, not where or when."""
    out = []
    for line in text.splitlines():
        for tag in ("[__guards]", "[__recompiles]"):
            if tag in line:
                body = line.split(tag, 1)[1].split("  #")[0].split(" # ")[0]
                body = re.sub(r"0x[0-9a-f]+|\d+", "N", body).rstrip()
                if body.strip():
                    out.append(tag + body)
    return out


def env_with_logs() -> dict[str, str]:
    env = e2e_environment()
    env["TORCH_LOGS"] = "recompiles,guards"
    return env


@pytest.mark.parametrize("mode", ["wrap", "inplace"])
def test_perfrun_adds_no_guard_and_no_recompile(
    mode: str, run_perfrun: RunPerfrun, tmp_path: Path
) -> None:
    import subprocess
    import sys

    plain = subprocess.run(
        [sys.executable, SCRIPT, "--mode", mode], cwd=tmp_path, env=env_with_logs(),
        capture_output=True, text=True, timeout=300,
    )
    assert plain.returncode == 0, plain.stderr
    expected = dynamo_log(plain.stderr)
    assert any("[__guards]" in line for line in expected)
    assert any("[__recompiles]" in line for line in expected)  # the script's own
    for options in ([], ["--scheduler", "3", "8"]):
        run = run_perfrun(*options, SCRIPT, "--mode", mode, env=env_with_logs(),
                          json_report=False, timeout=300)
        assert run.returncode == 0, run.describe()
        assert dynamo_log(run.err) == expected, (options, run.err[-3000:])
        assert "perfrun" not in "\n".join(
            line for line in run.err.splitlines() if "[__guards]" in line or "recompil" in line
        )
        assert run.rank0().data["faults"] == []
        if options:
            summary = run.rank0().data["window_summary"]["modules"]
            if mode == "wrap":
                rows = summary["modules"]
                assert [(r["name"], r["type"]) for r in rows] == [
                    ("Sequential", "Sequential (compiled)")
                ]
                assert "does not look inside" in run.out
            else:
                assert summary["recorded"] is False
                assert summary["opaque"] == ["Sequential"]
                assert "compiled in place" in run.out


STEP_SCRIPT = str(Path(__file__).parent / "scripts" / "train_step_compiled.py")


def dynamo_counts(stdout: str) -> dict:
    """The script's own `DYNAMO {...}` line: Dynamo's counters at its end."""
    import json

    [line] = [x for x in stdout.splitlines() if x.startswith("DYNAMO ")]
    return json.loads(line[len("DYNAMO "):])


def same_dynamo_as_python(run_perfrun: RunPerfrun, tmp_path: Path, script: str, logs: str,
                          option_sets: list[list[str]]) -> tuple[dict, list]:
    """Run `script` under python, then under perfrun with each of
    `option_sets`, all with TORCH_LOGS=`logs`, and check that Dynamo counted
    and logged the same under perfrun (its counters, its guard and recompile
    lines, its graph breaks) and that perfrun recorded no fault. Returns the
    counters of the python run and the perfrun runs, for the caller's own
    checks."""
    import subprocess
    import sys

    env = env_with_logs()
    env["TORCH_LOGS"] = logs
    plain = subprocess.run([sys.executable, script], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0, plain.stderr
    expected = dynamo_log(plain.stderr)
    breaks = plain.stderr.count("Graph break in user code")
    counts = dynamo_counts(plain.stdout)
    runs = []
    for options in option_sets:
        run = run_perfrun(*options, script, env=env, timeout=300)
        assert run.returncode == 0, run.describe()
        assert dynamo_counts(run.out) == counts, options
        assert dynamo_log(run.err) == expected, (options, run.err[-3000:])
        assert run.err.count("Graph break in user code") == breaks, options
        assert run.rank0().data["faults"] == []
        runs.append(run)
    return counts, runs


def test_a_compiled_train_step_gets_no_graph_break_guard_or_recompile(
    run_perfrun: RunPerfrun, tmp_path: Path
) -> None:
    """A whole step compiled: Dynamo traces perfrun's wrappers of
    optimizer.step and zero_grad (they must fold to the original), and runs
    backward and zero_grad eagerly after a graph break (their wrappers' own
    frames must not be compiled). Everything Dynamo counts and logs is the
    same as under plain python; the forward, traced into the graph, is not
    timed, and the report says so instead of blaming the loop for Others."""
    counts, runs = same_dynamo_as_python(
        run_perfrun, tmp_path, STEP_SCRIPT, "recompiles,guards,graph_breaks",
        [[], ["--timer-only"], ["--scheduler", "3", "6"]])
    assert counts["graph_breaks"] >= 2  # the script's own
    for run in runs:
        report = run.report()
        calls = {row["name"]: row["calls"] for row in report["model"]["rows"]}
        assert calls["Forward"] == 0 and calls["Backward"] == calls["ProfileStep"] > 0
        assert any(note.startswith("no forward was timed") for note in report["notes"])
        assert "cpu-bound" not in [a["kind"] for a in report["advice"]]


CALLS_SCRIPT = str(Path(__file__).parent / "scripts" / "calls_compiled.py")


def test_a_timed_model_called_inside_a_compiled_function_compiles_the_same_graphs(
    run_perfrun: RunPerfrun, tmp_path: Path
) -> None:
    """A model perfrun times (its class has perfrun's `__call__`) called
    inside a compiled function, and a compiled optimizer step: Dynamo traces
    through perfrun's `__call__` where it would take its shortcut to
    `forward`, which costs guards (on the wrapper's code and torch's
    `_call_impl` path: documented in hooks.py), but the graphs, graph breaks
    and recompiles are the script's own."""
    counts, runs = same_dynamo_as_python(
        run_perfrun, tmp_path, CALLS_SCRIPT, "recompiles,graph_breaks", [[], ["--timer-only"]])
    assert counts["graphs"] >= 3
    for run in runs:
        calls = {row["name"]: row["calls"] for row in run.report()["model"]["rows"]}
        # The eager model and the compiled loss module each step; zero_grad
        # and the compiled optimizer step.
        assert calls["Forward"] == calls["Optimization"] == 2 * calls["ProfileStep"] > 0


LIGHTNING_SCRIPT = str(Path(__file__).parent / "scripts" / "lightning_compiled.py")


def test_lightning_with_a_compiled_model_is_not_recompiled(
    run_perfrun: RunPerfrun, tmp_path: Path
) -> None:
    """Lightning compiles `training_step` itself, and Dynamo traces
    `nn.Module.__call__` for `self(x)` there, guarding on the one in place.
    perfrun's root search, which swaps `nn.Module.__call__` while it runs,
    ended after a few eager module calls and so failed that guard: one
    recompile of `training_step` the script never had. Once anything is
    compiled, the search's `__call__` stays (RootFinder.pin)."""
    pytest.importorskip("lightning")
    counts, runs = same_dynamo_as_python(
        run_perfrun, tmp_path, LIGHTNING_SCRIPT, "recompiles,graph_breaks", [["--timer-only"]])
    assert counts["graphs"] == 1 and counts["graph_breaks"] == 0
    [run] = runs
    assert "STEPS 40" in run.out
    assert run.rank0().n_steps == 40
