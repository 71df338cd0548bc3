"""The results format's names: kept apart from results.py so the code that
starts inside every rank imports nothing it does not need."""

from __future__ import annotations

FORMAT = "perfrun-results"
#: 2: steps in an append-only step file beside the rank file (stepfile.py);
#: 1: steps inline, still read (and written inside baselines).
VERSION = 2

# Step columns, in row order. Phase times are exclusive (a phase nested in
# another is subtracted from its parent); `excluded` is time inside the step's
# span that is not part of the step (evaluation passes, DataLoader iterator
# creation and exhaustion), so step time = end - start - excluded.
STEP_COLUMNS = (
    "start",
    "end",
    "dataloader",
    "forward",
    "backward",
    "optimization",
    "excluded",
    "dataloader_calls",
    "forward_calls",
    "backward_calls",
    "optimization_calls",
    "samples",
    "gpu_dataloader",
    "gpu_forward",
    "gpu_backward",
    "gpu_optimization",
    "gpu_step",
)
COL = {name: i for i, name in enumerate(STEP_COLUMNS)}
PHASES = ("dataloader", "forward", "backward", "optimization")
GPU_COLUMNS = tuple("gpu_" + p for p in PHASES) + ("gpu_step",)


def rank_filename(rank: int, restart: int = 0) -> str:
    return f"rank{rank}.json" if restart == 0 else f"rank{rank}.restart{restart}.json"


#: What a run in which no rank imported torch reports (shared by the full
#: report and the launcher's short path for such runs).
NO_TORCH = "no PyTorch training loop was seen: the script never imported torch"

#: Said when perfrun saw no torch at all: the likeliest reason in a script
#: that does train is that it trains in a process perfrun never entered.
BOOTSTRAP_HINT = (
    "perfrun measures only the Python process it starts (under torchrun, its "
    "workers): training in a process the script starts itself (python -E, -I or -S, "
    "subprocess, multiprocessing) or after it re-executes itself (os.exec*) is not measured"
)


# -- a small declarative validator ---------------------------------------------
#
# Results, baselines and configs come from disk, and a file of the right shape
# but the wrong types (`"steps": "x"`, `"rank": null`) would otherwise surface
# as a traceback deep inside the report. Each format is declared below as
# plain data and checked once, on read, so everything downstream may trust the
# types it indexes into. Keys a spec does not name are allowed: a minor
# addition to the format must not make older readers refuse the file.

#: The most characters of a user's value an error message shows: a value can
#: be arbitrarily large (a YAML alias bomb expands to millions of nodes), and
#: a one-line message must stay one short line.
SHOWN_CHARS = 60


def shown(value: object) -> str:
    """`value` as the user wrote it, capped at SHOWN_CHARS. Containers are
    summarised before repr so that an enormous value is never rendered."""
    if isinstance(value, (list, tuple, dict)) and len(value) > SHOWN_CHARS:
        return f"a {'mapping' if isinstance(value, dict) else 'list'} of {len(value)} items"
    text = _bounded_repr(value, SHOWN_CHARS + 1)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


def _bounded_repr(value: object, budget: int) -> str:
    """repr that stops once `budget` characters are written: nested
    containers may be small at the top and huge below."""
    if isinstance(value, (list, tuple)):
        open_, close = ("[", "]") if isinstance(value, list) else ("(", ")")
        parts = []
        used = 1
        for item in value:
            if used > budget:
                break
            part = _bounded_repr(item, budget - used)
            parts.append(part)
            used += len(part) + 2
        return open_ + ", ".join(parts) + close
    if isinstance(value, dict):
        parts = []
        used = 1
        for k, v in value.items():
            if used > budget:
                break
            part = f"{_bounded_repr(k, budget)}: {_bounded_repr(v, budget - used)}"
            parts.append(part)
            used += len(part) + 2
        return "{" + ", ".join(parts) + "}"
    if isinstance(value, str) and len(value) > budget:
        value = value[:budget]
    return repr(value)


def type_name(value: object) -> str:
    """The JSON name of a value's type, for messages about JSON files."""
    if value is None:
        return "null"
    return type(value).__name__


class SchemaError(ValueError):
    """A value does not have its declared type; `where` is the field path
    (`steps.rows`, `ranks[0].env`) and the message is one line."""

    def __init__(self, where: str, expected: str, got: str) -> None:
        self.where = where
        self.expected = expected
        self.got = got
        super().__init__(f"{where}: expected {expected}, got {got}" if where else
                         f"expected {expected}, got {got}")


class Spec:
    """One declared type; `what` is how a message names it ("an integer")."""

    what = "a value"

    def check(self, value: object, where: str) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def fail(self, value: object, where: str) -> SchemaError:
        return SchemaError(where, self.what, type_name(value))


class Kind(Spec):
    """A JSON scalar or container of given Python types (bool is never an
    integer here, although Python says it is)."""

    def __init__(self, what: str, *types: type) -> None:
        self.what = what
        self.types = types

    def check(self, value: object, where: str) -> None:
        if isinstance(value, bool) and bool not in self.types:
            raise self.fail(value, where)
        if not isinstance(value, self.types):
            raise self.fail(value, where)


class Opt(Spec):
    """`spec`, or null."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.what = f"{spec.what} or null"

    def check(self, value: object, where: str) -> None:
        if value is not None:
            try:
                self.spec.check(value, where)
            except SchemaError as exc:
                if exc.where == where:  # the value itself: say null was allowed
                    raise self.fail(value, where) from None
                raise


class ListOf(Spec):
    """A list whose every item is `item`; `length` fixes its length."""

    def __init__(self, item: Spec, length: int | None = None, what: str | None = None) -> None:
        self.item = item
        self.length = length
        self.what = what or (
            "a list" if length is None else f"a list of {length}"
        )

    def check(self, value: object, where: str) -> None:
        if not isinstance(value, list) or (self.length is not None and len(value) != self.length):
            raise self.fail(value, where)
        if self.item is not ANY:
            for i, item in enumerate(value):
                self.item.check(item, f"{where}[{i}]")


class Obj(Spec):
    """A mapping whose named keys, when present, have their declared types."""

    what = "an object"

    def __init__(self, fields: dict[str, Spec] | None = None, values: Spec | None = None) -> None:
        self.fields = fields or {}
        self.values = values

    def check(self, value: object, where: str) -> None:
        if not isinstance(value, dict):
            raise self.fail(value, where)
        for key, spec in self.fields.items():
            if key in value:
                spec.check(value[key], f"{where}.{key}" if where else key)
        if self.values is not None:
            for key, item in value.items():
                if key not in self.fields:
                    self.values.check(item, f"{where}.{key}" if where else str(key))


class _Any(Spec):
    def check(self, value: object, where: str) -> None:
        return None


ANY = _Any()
INT = Kind("an integer", int)
NUMBER = Kind("a number", int, float)
STR = Kind("a string", str)
BOOL = Kind("true or false", bool)
LIST = ListOf(ANY)
OBJ = Obj()


def check(value: object, spec: Spec, where: str = "") -> None:
    """Raise SchemaError at the first field of `value` not matching `spec`."""
    spec.check(value, where)


# -- the results format (rank<R>.json), version 1 --------------------------------

#: Timing statistics of a named thing (an operator, a kernel, a copy).
_STATS = Obj({
    "name": STR,
    "calls": INT,
    "total": NUMBER,
    "avg": Opt(NUMBER),
    "max": Opt(NUMBER),
    "min": Opt(NUMBER),
    "ratio": Opt(NUMBER),
})
_DIST_SIDE = Obj({
    name: Opt(NUMBER)
    for name in ("communication", "computation", "overlap", "communication_ratio",
                 "computation_ratio", "overlap_ratio")
})
_WINDOW_SUMMARY = Obj({
    "steps": INT,
    "window_time": NUMBER,
    # The trace file's size, its size before --max-trace-mb cut it, and
    # the steps it kept then.
    "trace_bytes": Opt(INT),
    "trace_full_bytes": Opt(INT),
    "trace_steps": Opt(ListOf(INT, 2)),
    "overview": ListOf(Obj({
        "type": STR, "side": STR, "calls": INT, "time": NUMBER, "ratio": Opt(NUMBER),
    })),
    "operators": ListOf(Obj({
        **_STATS.fields,
        "gpu_total": Opt(NUMBER),
        "gpu_avg": Opt(NUMBER),
        "gpu_max": Opt(NUMBER),
        "gpu_min": Opt(NUMBER),
        "flops": Opt(NUMBER),
        "kernels": ListOf(_STATS),
    })),
    "kernels": ListOf(_STATS),
    "kernel_total": Obj({"calls": INT, "total": NUMBER, "ratio": Opt(NUMBER)}),
    "user_defined": ListOf(_STATS),
    "memory_manipulation": Obj({
        "copies": ListOf(_STATS),
        "sync_calls": INT,
        "sync_per_step": Opt(NUMBER),
        "sync_by_op": Obj(values=NUMBER),
    }),
    "distributed": Obj({"basis": STR, "cpu": _DIST_SIDE, "gpu": _DIST_SIDE}),
    "memory": OBJ,
    "modules": Obj({
        "recorded": BOOL,
        "modules": ListOf(Obj({
            "name": STR,
            "depth": INT,
            "parent": Opt(STR),
            "type": STR,
            "calls": INT,
            "forward": Opt(NUMBER),
            "backward": Opt(NUMBER),
            "recompute": Opt(NUMBER),
            "gpu_forward": Opt(NUMBER),
            "gpu_backward": Opt(NUMBER),
            "total": NUMBER,
            "share": Opt(NUMBER),
        })),
        "groups": ListOf(Obj({
            "pattern": STR,
            "type": STR,
            "members": INT,
            "total": NUMBER,
            "median": Opt(NUMBER),
            "slowest": Opt(STR),
            "slowest_total": Opt(NUMBER),
            "slowest_vs_median": Opt(NUMBER),
        })),
    }),
    "trace": Opt(STR),
    "range": Opt(ListOf(INT, 2)),
    "export_seconds": NUMBER,
})
_PERCENT = Obj({"avg": Opt(NUMBER), "max": Opt(NUMBER)})
_COUNTED = Obj({"calls": INT, "time": NUMBER})

#: The FLOPs of the one step the rank counted (runtime/flops.py): per phase,
#: the step (left out of the statistics), what it ran in, and why not when
#: it was not counted.
_FLOPS = Obj({
    "counted": BOOL,
    "step": Opt(INT),
    "reason": Opt(STR),
    "forward": INT,
    "backward": INT,
    "optimizer": INT,
    "calls": Obj(values=INT),
    "ops": Obj(values=INT),
    "dtype": Opt(STR),
    "autocast": BOOL,
    "tf32": Opt(BOOL),
    "device": Opt(STR),
    "device_name": Opt(STR),
    "seconds": NUMBER,
    "notes": ListOf(STR),
})

#: What a rank's NVML samples say about disturbance (runtime/device.py;
#: decided on in analysis/disturbed.py). Optional: older files have none.
GPU_EVIDENCE = Obj({
    "samples": INT,
    "busy_samples": INT,
    "reasons_samples": Opt(INT),
    "reasons": Obj(values=NUMBER),
    "sm_clock_min": Opt(INT),
    "sm_clock_median": Opt(INT),
    "sm_clock_max": Opt(INT),
    "process_reads": Opt(INT),
    "own_pid_seen": Opt(BOOL),
    "other_processes": ListOf(Obj({"pid": INT, "name": Opt(STR), "kind": Opt(STR),
                                   "used_memory_max": Opt(INT), "samples": INT})),
    "unresolved_processes": Opt(LIST),
    "ecc_uncorrected_new": Opt(INT),
    "xid_available": Opt(BOOL),
    "xid_errors": ListOf(INT),
    "unavailable": Obj(values=STR),
})
#: What a launcher sampled of its host (hostload.py), in run.json or a
#: node's record. Optional: older files have none.
HOST_LOAD = Obj({
    "version": INT,
    "host": Opt(STR),
    "cpu_count": Opt(INT),
    "samples": INT,
    **{name: Opt(NUMBER) for name in (
        "seconds", "machine_busy_cores", "job_cores", "launcher_cores", "other_cores",
        "other_cores_max", "steal_fraction")},
    "cpu_freq": Opt(Obj(values=NUMBER)),
    "top_others": ListOf(Obj({"pid": INT, "name": Opt(STR), "cores": NUMBER})),
    "unavailable": ListOf(STR),
    "sample_cost": Opt(OBJ),
})

#: The top-level keys of a rank file. Only the rows' container is declared
#: here: they are the one part that grows with the run's length, and
#: results.py checks them with bulk operations rather than per value.
RANK_FILE = Obj({
    "format": STR,
    "version": INT,
    "perfrun": STR,
    "rank": INT,
    "local_rank": INT,
    "world_size": INT,
    "restart": INT,
    "status": STR,
    "exit": Obj({"exception": Opt(STR), "signal": Opt(INT)}),
    "started_unix": NUMBER,
    "elapsed": NUMBER,
    "env": Obj({
        "hostname": Opt(STR),
        "pid": Opt(INT),
        "python": Opt(STR),
        "platform": Opt(STR),
        "torch": Opt(STR),
        "argv": Opt(ListOf(STR)),
        "command": Opt(Kind("a string or a list", str, list)),
        "cwd": Opt(STR),
    }),
    # The run's Settings as the rank saw them; only what readers use is
    # declared (a reader of an older file sees fewer fields).
    "settings": Obj({
        "script": Opt(STR),
        "module": Opt(STR),
        "script_args": Opt(ListOf(STR)),
        "scheduler": Opt(ListOf(INT, 2)),
        "warmup": Opt(INT),
        "summary": Opt(OBJ),
    }),
    "window": Opt(ListOf(INT, 2)),
    "profiled": Opt(ListOf(INT, 2)),
    "window_summary": Opt(_WINDOW_SUMMARY),
    "nsys_capture": Opt(ListOf(OBJ)),
    "module_hook_calls": Opt(INT),
    "torch_imported": BOOL,
    "gpu": BOOL,
    "cuda": Opt(OBJ),
    "extra": Obj({
        "dataloader_init": _COUNTED,
        "stop_iteration": _COUNTED,
        "eval": _COUNTED,
        "profiler": _COUNTED,
        # perfrun's own saves before this one (format 2): count, seconds in
        # all, the longest one, and the bytes of the step file.
        "flush": Obj({"calls": INT, "time": NUMBER, "max": NUMBER, "bytes": INT}),
    }),
    "dataloaders": ListOf(OBJ),
    # FLOPs of one step (runtime/flops.py); absent in older files, null
    # when not asked for.
    "flops": Opt(_FLOPS),
    "device": Opt(Obj({
        "samples": INT,
        "cpu_process_percent": _PERCENT,
        "cpu_system_percent": _PERCENT,
        "cpu_count": Opt(INT),
        "rss_peak_bytes": Opt(INT),
        "gpus": ListOf(Obj({"index": Opt(INT), "name": Opt(STR), "evidence": Opt(GPU_EVIDENCE)})),
        "driver": Opt(STR),
    })),
    "faults": ListOf(Obj({"where": STR, "count": INT, "error": Opt(STR)})),
    "notes": ListOf(STR),
    # Where the rank was at this save (runtime/position.py): step index,
    # phase, since when (seconds since the epoch, the rank's clock), and
    # whether edges reach the state machine in batches (timer-only mode).
    "position": Opt(Obj({
        "step": INT,
        "phase": STR,
        "since_unix": Opt(NUMBER),
        "step_since_unix": Opt(NUMBER),
        "written_unix": NUMBER,
        "buffered": BOOL,
    })),
    # Format 1: the rows inline. Format 2: `file` names the step file
    # beside the rank file (stepfile.py) and `count` the rows written to it
    # by this save (a reader takes every whole row the file holds).
    "steps": Obj({"columns": ListOf(STR), "rows": LIST, "file": STR, "count": INT}),
})

#: run.json, written by the launcher beside the rank files.
RUN_META = Obj({
    "git": Opt(OBJ),
    "command": Opt(ListOf(STR)),
    "child": Opt(ListOf(STR)),
    "expected_ranks": Opt(INT),
    "nnodes": Opt(Kind("a string or an integer", str, int)),
    "launcher": Opt(STR),
    "started": Opt(NUMBER),
    "returncode": Opt(INT),
    "elapsed": Opt(NUMBER),
    "host": Opt(STR),
    "pid": Opt(INT),
    "node_rank": Opt(INT),
    "signals": Opt(ListOf(STR)),
    "combined_from": Opt(ListOf(STR)),
    "host_load": Opt(HOST_LOAD),
    # A multi-node job's folder (job.py): the job, and each node's record.
    "job": Opt(Obj({
        "id": Opt(STR),
        "name": Opt(STR),
        "source": Opt(STR),
        "nnodes": Opt(Kind("a string or an integer", str, int)),
        "nproc_per_node": Opt(INT),
        "world_size": Opt(INT),
        "script": Opt(STR),
    })),
    "nodes": Opt(Obj(values=OBJ)),
})

#: A baseline file's top level (perfrun/baseline.py); each of `ranks` is a
#: rank file, checked with RANK_FILE.
BASELINE_FILE = Obj({
    "format": STR,
    "version": INT,
    "fingerprint": OBJ,
    # Whether the baseline run was disturbed, as decided when it was saved.
    "disturbed": Opt(ListOf(Obj({"kind": STR, "message": STR}))),
    "meta": Opt(RUN_META),
    "ranks": ListOf(OBJ),
    "missing": ListOf(INT),
    "history": ListOf(Obj({
        "fingerprint": Opt(OBJ),
        "meta": Opt(RUN_META),
        "ranks": Opt(ListOf(OBJ)),
        "missing": Opt(ListOf(INT)),
    })),
})
