"""Resolved settings: one frozen dataclass built from the YAML file, `-o`
overrides and the command line (in that order of precedence, lowest first),
and carried to the profiled process in one environment variable.

The YAML format is the `Profiler:` section of Paddle's GPT configs, so the
training config itself can be passed with `--config`: every other section is
ignored.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any

ENV_VAR = "PERFRUN_SETTINGS"

SUMMARY_KEYS = ("overview", "device", "model", "dist", "kernel", "op", "mem", "memcpy")
STEP_ON = ("auto", "optimizer", "forward", "backward", "dataloader")
FORMATS = ("table", "json", "markdown")
SORT_KEYS = ("cpu-total", "cpu-avg", "cpu-max", "cpu-min", "gpu-total", "gpu-avg", "gpu-max",
             "gpu-min", "calls", "name")
TIME_UNITS = ("s", "ms", "us", "ns")

# The `Profiler:` keys we understand and the Settings field each one sets.
PROFILER_KEYS = {
    "enable": "enable",
    "scheduler": "scheduler",
    "profiler_log": "log_dir",
    "detailed": "detailed",
    "record_shapes": "record_shapes",
    "profile_memory": "profile_memory",
    "summary": "summary",
    # perfrun's own additions, same spelling as the command-line options.
    "timer_only": "timer_only",
    "warmup": "warmup",
    "step_on": "step_on",
    "batch_size": "batch_size",
    "stop_after": "stop_after",
    "nvtx": "nvtx",
}


class SettingsError(ValueError):
    """A setting is invalid; the message is one line meant for the user."""


@dataclass(frozen=True)
class Settings:
    """Everything that decides how a run is launched, measured and reported."""

    script: str | None = None
    module: str | None = None
    script_args: tuple[str, ...] = ()
    enable: bool = True
    timer_only: bool = False
    scheduler: tuple[int, int] | None = None
    log_dir: str = "./perfrun_log"
    detailed: bool = False
    record_shapes: bool = False
    profile_memory: bool = False
    summary: dict[str, bool] = field(default_factory=lambda: dict.fromkeys(SUMMARY_KEYS, True))
    nproc_per_node: int | None = None
    nnodes: str | None = None
    node_rank: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    rdzv_backend: str | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    nsys: bool = False
    nsys_args: str = ""
    step_on: str = "auto"
    warmup: int | None = None
    batch_size: int | None = None
    stop_after: int | None = None
    nvtx: bool = True
    format: str = "table"
    output: str | None = None
    flush_interval: float = 2.0
    with_stack: bool = False
    with_flops: bool = False
    stop_after_window: bool = False
    op_detail: bool = False
    sort_by: str = "cpu-total"
    row_limit: int = 20
    time_unit: str | None = None
    module_depth: int | None = None
    nsys_ranks: str | None = None
    save_baseline: str | None = None
    baseline: str | None = None
    max_regression: float | None = None
    fail_on_inconclusive: bool = False
    allow_env_mismatch: bool = False

    @property
    def gated(self) -> bool:
        return self.baseline is not None

    @property
    def distributed(self) -> bool:
        """True when the script runs under torch.distributed.run."""
        return any(
            v is not None
            for v in (
                self.nproc_per_node,
                self.nnodes,
                self.node_rank,
                self.master_addr,
                self.master_port,
                self.rdzv_backend,
                self.rdzv_endpoint,
                self.rdzv_id,
            )
        )

    @property
    def use_nvtx(self) -> bool:
        return self.nvtx and not self.timer_only

    def validate(self) -> Settings:
        """Check cross-field rules; return self so calls can be chained."""
        if self.scheduler is not None:
            start, end = self.scheduler
            if start < 0 or end < 0:
                raise SettingsError(f"scheduler [{start}, {end}): steps cannot be negative")
            if end <= start:
                raise SettingsError(
                    f"scheduler [{start}, {end}): END must be greater than START "
                    "(the window is half-open: [3, 14) records steps 3..13)"
                )
        if self.nproc_per_node is not None and self.nproc_per_node < 1:
            raise SettingsError(f"--nproc-per-node must be at least 1, not {self.nproc_per_node}")
        for name in ("warmup", "stop_after"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise SettingsError(f"--{name.replace('_', '-')} cannot be negative ({value})")
        if self.batch_size is not None and self.batch_size < 1:
            raise SettingsError(f"--batch-size must be at least 1, not {self.batch_size}")
        if self.step_on not in STEP_ON:
            raise SettingsError(
                f"--step-on must be one of {', '.join(STEP_ON)}, not {self.step_on!r}"
            )
        if self.format not in FORMATS:
            raise SettingsError(
                f"--format must be one of {', '.join(FORMATS)}, not {self.format!r}"
            )
        unknown = set(self.summary) - set(SUMMARY_KEYS)
        if unknown:
            raise SettingsError(
                f"unknown Profiler.summary key(s) {', '.join(sorted(unknown))}; "
                f"valid: {', '.join(SUMMARY_KEYS)}"
            )
        if self.sort_by not in SORT_KEYS:
            raise SettingsError(
                f"--sort-by must be one of {', '.join(SORT_KEYS)}, not {self.sort_by!r}"
            )
        if self.time_unit is not None and self.time_unit not in TIME_UNITS:
            raise SettingsError(
                f"--time-unit must be one of {', '.join(TIME_UNITS)}, not {self.time_unit!r}"
            )
        if self.row_limit < 1:
            raise SettingsError(f"--row-limit must be at least 1, not {self.row_limit}")
        if self.stop_after_window and self.scheduler is None:
            raise SettingsError("--stop-after-window needs a window: --scheduler START END")
        if self.module_depth is not None and self.module_depth < 0:
            raise SettingsError(f"--module-depth cannot be negative ({self.module_depth})")
        if self.nsys_ranks is not None:
            if not self.nsys:
                raise SettingsError("--nsys-ranks goes with --nsys")
            parts = [p.strip() for p in self.nsys_ranks.split(",") if p.strip()]
            if not parts or not all(p.isdigit() for p in parts):
                raise SettingsError(
                    f"--nsys-ranks takes rank numbers like 0,3 (not {self.nsys_ranks!r})"
                )
        if self.max_regression is not None and self.baseline is None:
            raise SettingsError("--max-regression needs --baseline FILE (what to compare with)")
        if self.flush_interval <= 0:
            raise SettingsError("flush interval must be positive")
        return self

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)

    # -- transport to the child ------------------------------------------------

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Settings:
        data = json.loads(text)
        names = {f.name for f in dataclasses.fields(cls)}
        data = {k: v for k, v in data.items() if k in names}
        if data.get("scheduler") is not None:
            data["scheduler"] = tuple(data["scheduler"])
        data["script_args"] = tuple(data.get("script_args", ()))
        return cls(**data)


# -- YAML config ---------------------------------------------------------------


def _as_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "on", "off"):
        return value.lower() in ("true", "yes", "on")
    raise SettingsError(f"Profiler.{key} must be true or false, not {value!r}")


def _as_int(key: str, value: Any, *, allow_none: bool = True) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise SettingsError(f"Profiler.{key} must be an integer, not {value!r}")
    try:
        return int(value)
    except ValueError:
        raise SettingsError(f"Profiler.{key} must be an integer, not {value!r}") from None


def _as_window(key: str, value: Any) -> tuple[int, int] | None:
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip().strip("[]()")
        value = [part for part in text.replace(",", " ").split() if part]
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise SettingsError(f"Profiler.{key} must be [START, END], not {value!r}")
    start = _as_int(key, value[0], allow_none=False)
    end = _as_int(key, value[1], allow_none=False)
    assert start is not None and end is not None
    return (start, end)


def profiler_section_to_changes(section: Any, origin: str) -> dict[str, Any]:
    """Turn a `Profiler:` mapping into Settings field changes.

    Unknown keys are an error that lists the valid ones: a misspelt key that
    is silently ignored costs a user a whole profiling run.
    """
    if section is None:
        return {}
    if not isinstance(section, dict):
        raise SettingsError(f"{origin}: the Profiler section must be a mapping")
    unknown = [k for k in section if k not in PROFILER_KEYS]
    if unknown:
        raise SettingsError(
            f"{origin}: unknown Profiler key(s) {', '.join(map(str, unknown))}; "
            f"valid keys: {', '.join(PROFILER_KEYS)}"
        )
    changes: dict[str, Any] = {}
    for key, value in section.items():
        name = PROFILER_KEYS[key]
        if name in ("enable", "detailed", "record_shapes", "profile_memory", "timer_only", "nvtx"):
            changes[name] = _as_bool(key, value)
        elif name == "scheduler":
            changes[name] = _as_window(key, value)
        elif name == "log_dir":
            if not isinstance(value, str) or not value:
                raise SettingsError(f"{origin}: Profiler.{key} must be a path")
            changes[name] = value
        elif name == "summary":
            if value is None:
                continue
            if not isinstance(value, dict):
                raise SettingsError(f"{origin}: Profiler.summary must be a mapping")
            bad = [k for k in value if k not in SUMMARY_KEYS]
            if bad:
                raise SettingsError(
                    f"{origin}: unknown Profiler.summary key(s) {', '.join(map(str, bad))}; "
                    f"valid keys: {', '.join(SUMMARY_KEYS)}"
                )
            summary = dict.fromkeys(SUMMARY_KEYS, True)
            summary.update({k: _as_bool(f"summary.{k}", v) for k, v in value.items()})
            changes[name] = summary
        elif name == "step_on":
            changes[name] = str(value)
        else:
            changes[name] = _as_int(key, value)
    return changes


def load_config(path: str) -> dict[str, Any]:
    """Read a YAML file's `Profiler:` section as Settings changes."""
    import yaml  # local: only needed when --config is given

    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except FileNotFoundError:
        raise SettingsError(f"config file not found: {path}") from None
    except OSError as exc:
        raise SettingsError(f"cannot read config file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SettingsError(f"{path}: malformed YAML{where}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SettingsError(f"{path}: expected a mapping with a Profiler section")
    return profiler_section_to_changes(data.get("Profiler"), path)


def parse_override(text: str) -> dict[str, Any]:
    """`Profiler.scheduler=[100,110]` -> Settings changes."""
    import yaml

    if "=" not in text:
        raise SettingsError(f"override {text!r} must look like Profiler.KEY=VALUE")
    dotted, raw = text.split("=", 1)
    parts = dotted.strip().split(".")
    if parts[0] != "Profiler" or len(parts) < 2:
        raise SettingsError(f"override {text!r}: only Profiler.* keys can be overridden")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        raise SettingsError(f"override {text!r}: cannot parse the value") from None
    section: dict[str, Any] = {}
    node = section
    for part in parts[1:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return profiler_section_to_changes(section, "override")


def child_environment(
    settings: Settings,
    run_dir: str,
    boot_dir: str,
    base: dict[str, str] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, str]:
    """The environment of the profiled process: our boot folder first on
    PYTHONPATH, the settings and the user's original PYTHONPATH in one
    variable so the child can restore exactly what `python` would have seen.
    `extra`: what else the bootstrap needs (launcher kind, command line)."""
    env = dict(os.environ if base is None else base)
    original = env.get("PYTHONPATH")
    payload = dataclasses.asdict(settings)
    payload.update(extra or {})
    payload["run_dir"] = os.path.abspath(run_dir)
    payload["boot_dir"] = boot_dir
    payload["pythonpath"] = original
    env[ENV_VAR] = json.dumps(payload)
    env["PYTHONPATH"] = boot_dir + (os.pathsep + original if original else "")
    return env
