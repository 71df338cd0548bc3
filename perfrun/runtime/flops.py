"""FLOPs of one training step, counted in the rank with torch's own counter.

`torch.utils.flop_counter.FlopCounterMode` is a TorchDispatchMode: while it
is entered, every aten op passes through Python, which is what lets it see
each matmul's shapes, and what makes the step it watches several times
slower. So perfrun counts one step only, decided before the run (see
`counted_step`), records its index, and the analysis leaves that step out
of the statistics as it leaves out the detailed window's.

How it is wired: the phase wrappers of hooks.py read `HookState.flops` (one
attribute, None on every other step) and, when it is set, hand their call to
`FlopCounter.run`, which calls the original exactly once, with its
arguments, and passes its result or exception back untouched. Forward
(the root modules' outermost calls), Backward (`torch.autograd.backward`) and
the optimizer's `step` are counted apart; a phase nested in another (the
forward and backward an LBFGS closure runs inside `optimizer.step`) is
moved from the outer phase to its own.

Where torch's counter is wrong, and what is done here:

* CPU attention: `F.scaled_dot_product_attention` on CPU runs
  `aten._scaled_dot_product_flash_attention_for_cpu` (and its backward),
  which torch's registry does not know, so it counts zero. Formulas for both
  are supplied through `custom_mapping`, built on torch's own
  `sdpa_flop_count` / `sdpa_backward_flop_count`.
* Causal attention: torch counts the full score matrix whatever the mask.
  The fused kernels (flash on CUDA and on CPU, memory-efficient) skip the
  masked blocks, so a causal call here counts the unmasked part only, the
  `causal_fraction` of the full figure (about half). An explicit mask tensor,
  and the math fallback (plain bmm), compute every score and count in full.
  Frameworks quoting MFU with 6N + 12·L·H·Q·T count causal attention in
  full: their figure is higher by that half of the attention FLOPs.
* Double counting: the mode sees the op the dispatcher is asked for and not
  the kernels that op calls inside, so the fused SDPA ops and the
  `_flash_attention_*` ops under them are never both counted (checked on
  CPU in tests/test_flops.py).
* Sparse matmuls: torch's formulas read shapes only, so `torch.spmm(adj,
  x)` with a sparse adjacency counts as the dense product, 100 to 1000
  times the work done. A matmul (mm, addmm, and torch's sparse variants)
  with a sparse operand is counted by its non-zeros here, and a note says
  how many there were.
* Recurrent layers: an LSTM on CPU runs oneDNN's fused layer
  (`aten.mkldnn_rnn_layer`), and on CUDA every LSTM, GRU and RNN runs
  cuDNN's (`aten._cudnn_rnn`); torch's registry knows neither, so a
  recurrent model counted 0. Their formulas are supplied here: 2 FLOPs per
  weight per time step per sequence (4 in backward), what the same layer
  counts run as matmuls (checked on CPU against the unfused layer in
  tests/test_flops.py; the cuDNN op is read by its schema, not yet run on
  a GPU).
* The optimizer: its arithmetic is elementwise (`_foreach_*`, `addcdiv`),
  which the counter does not count, so its figure is usually 0.
* torch.compile: inside a compiled region Dynamo skips (runs eagerly) a
  frame it would compile while a dispatch mode is active, and compiled
  code's fused kernels are invisible to the mode: a count would be a guess,
  and could change what the script runs. A step after anything was compiled
  is not counted, and the reason says so.

What the first use costs, and where it is not paid: torch (2.13:
`TorchDispatchMode.__init_subclass__`) wraps every dispatch mode's
`__torch_dispatch__` in `torch._disable_dynamo`, which imports
`torch._dynamo` at the first op the mode sees: 1.6 to 2.0 s of CPU, inside
the counted step, in a script that never touched Dynamo (a loop with no
`torch.optim` optimizer: making one imports Dynamo already). The wrapper
keeps Dynamo from compiling the mode's own frames; where Dynamo is not
imported nothing is compiled, so for that one step the wrapper is handed
the plain function (`counting_mode`) and nothing is imported. The counted
step then costs what the mode's Python dispatch of each op costs: a few
to tens of milliseconds (docs/costs.md, "The FLOP-counted step").

Nothing here raises into the script: a fault is recorded, the counting
stops, and the script's call goes on as it would without perfrun.
"""

from __future__ import annotations

import os
import sys
from time import perf_counter
from typing import Any, Callable, Optional

from .steps import BWD, FWD, OPT

#: The step counted when nothing is in the way: step 0 does one-off work
#: that is no part of the steady step (lazy modules' initialisation, the
#: optimizer's state, a first compile); from step 1 on a step's FLOPs depend
#: only on its shapes. In runs of 20 steps or more step 1 falls inside the
#: default warm-up anyway, so leaving it out costs the statistics nothing.
DEFAULT_STEP = 1

PHASE_NAMES = {FWD: "forward", BWD: "backward", OPT: "optimizer"}

#: How many op names the record keeps, largest first.
TOP_OPS = 12


def counted_step(profiled: Optional[tuple[int, int]], window_start: Optional[int] = None) -> int:
    """The step to count: DEFAULT_STEP, or the first step after the
    profiled span when it falls inside the window (two instruments in one
    step would each slow what the other measures). The profiler's warm-up
    step before the window is profiled but its events are discarded, and it
    is left out of the statistics already: counting there costs nothing,
    where the step after the window would be one more step left out (a
    short run's `--scheduler 2 4` kept 1 counted step of 6 so)."""
    if profiled is not None and profiled[0] <= DEFAULT_STEP < profiled[1]:
        if window_start is not None and DEFAULT_STEP < window_start:
            return DEFAULT_STEP  # the profiler's warm-up step
        return profiled[1]
    return DEFAULT_STEP


def causal_fraction(s_q: int, s_k: int) -> float:
    """The share of the (s_q x s_k) score matrix a causal mask leaves:
    SDPA's `is_causal` keeps key j for query i when j <= i (the mask is
    aligned to the top left), so query i sees min(i + 1, s_k) keys."""
    if s_q <= 0 or s_k <= 0:
        return 1.0
    if s_q <= s_k:
        kept = s_q * (s_q + 1) // 2
    else:
        kept = s_k * (s_k + 1) // 2 + (s_q - s_k) * s_k
    return kept / (s_q * s_k)


def _shape(value: Any) -> Any:
    return tuple(value.shape) if hasattr(value, "shape") else value


class _Flat:
    """Stands in for FlopCounterMode's ModuleTracker: perfrun wants one
    total per phase, not a per-module breakdown, and the tracker would
    register global module hooks for the step (which torch.compile warns
    about on the script's stderr, and which slow every module call)."""

    parents = ("Global",)

    def __enter__(self) -> _Flat:
        return self

    def __exit__(self, *args: Any) -> None:
        return None


class FlopCounter:
    """Counts one step. Listens to step begin and end (the agent's
    listeners) and arms the hooks (`state.flops = self`) for that step."""

    def __init__(self, torch: Any, state: Any, tracker: Any,
                 fault: Callable[[str, BaseException], None], target: int) -> None:
        self.torch = torch
        self.state = state
        self.tracker = tracker
        self.fault = fault
        self.target = target
        self.counts = {"forward": 0, "backward": 0, "optimizer": 0}
        self.calls = {"forward": 0, "backward": 0, "optimizer": 0}
        self.ops: dict[str, int] = {}
        self.seconds = 0.0
        self.step: Optional[int] = None
        self.done = False
        self.reason: Optional[str] = None
        self.notes: list[str] = []
        self.dtype: Optional[str] = None
        self.autocast = False
        self.tf32: Optional[bool] = None
        self.device: Optional[str] = None
        self.device_name: Optional[str] = None
        self.causal_removed = 0
        self.formula_faults = 0
        self.sparse_ops = 0
        # Phases open under the mode (outermost first), each with the
        # mode's total when it began: a nested phase's FLOPs move to it.
        self._open: list[tuple[str, int]] = []
        self._mode: Any = None
        self._undo: Optional[Callable[[], None]] = None
        self._t0 = 0.0
        self._mapping: Optional[dict[Any, Any]] = None

    # -- step callbacks ------------------------------------------------------

    def step_begin(self, index: int, t: float) -> None:
        if self.done or index != self.target:
            return
        try:
            reason = compiled_reason(self.torch)
            if reason is not None:
                self._give_up(reason)
                return
            if self._mapping is None:
                self._mapping = custom_mapping(self.torch, self)
            self.step = index
            self.state.flops = self
        except Exception as exc:
            self.fault("flops", exc)
            self._give_up(f"perfrun's counter failed ({type(exc).__name__})")

    def step_end(self, index: int, t: float, committed: bool) -> None:
        if self.state.flops is not self:
            return
        self.state.flops = None
        if committed:
            self.done = True
            return
        # The step was cancelled (its leading fetch ended the data): the
        # next step takes its index; count that one instead.
        self.counts = dict.fromkeys(self.counts, 0)
        self.calls = dict.fromkeys(self.calls, 0)
        self.ops.clear()
        self.seconds = 0.0
        self.step = None

    def _give_up(self, reason: str) -> None:
        self.reason = reason
        self.done = True
        if self.state.flops is self:
            self.state.flops = None

    # -- the counted calls -----------------------------------------------------

    def run(self, kind: int, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """Call `fn(*args, **kwargs)` once, counting its FLOPs as phase
        `kind`; its result or exception is the caller's."""
        name = None
        try:
            name = PHASE_NAMES.get(kind)
            if name is not None and kind == FWD:
                grad = self.torch.is_grad_enabled()
                if self.tracker.is_eval(FWD, grad):
                    name = None  # an evaluation pass: no part of the step
                elif self.dtype is None and args:
                    self._note_dtype(args[0])
            if name is not None:
                name = self._enter(name)
        except Exception as exc:
            self._fail(exc)
            name = None
        if name is None:
            return fn(*args, **kwargs) if kwargs else fn(*args)
        try:
            result = fn(*args, **kwargs) if kwargs else fn(*args)
        except BaseException:
            self._exit(name)
            raise
        self._exit(name)
        return result

    def _enter(self, name: str) -> Optional[str]:
        if self.state.flops is not self:
            return None
        if self._open:
            self._open.append((name, self._total()))
            return name
        mode, self._undo = counting_mode(self._mapping)
        self._mode = mode
        self._open.append((name, 0))
        self._t0 = perf_counter()
        return name

    def _exit(self, name: str) -> None:
        try:
            if not self._open:
                return
            _, began = self._open.pop()
            total = self._total()
            if self._open:
                # Nested: its FLOPs are its own, not the outer phase's.
                done = total - began
                self.counts[name] += done
                self.counts[self._open[-1][0]] -= done
                self.calls[name] += 1
                return
            mode, self._mode = self._mode, None
            self.seconds += perf_counter() - self._t0
            try:
                mode.__exit__(None, None, None)
            finally:
                self._restore()
            self.counts[name] += total
            self.calls[name] += 1
            for op, flops in (mode.get_flop_counts().get("Global") or {}).items():
                key = str(op)
                self.ops[key] = self.ops.get(key, 0) + int(flops)
        except Exception as exc:
            self._fail(exc)

    def _total(self) -> int:
        mode = self._mode
        return int(mode.get_total_flops()) if mode is not None else 0

    def _fail(self, exc: BaseException) -> None:
        self.fault("flops", exc)
        mode, self._mode = self._mode, None
        self._open.clear()
        if mode is not None:
            try:
                mode.__exit__(None, None, None)
            except Exception:
                pass
        self._restore()
        self._give_up(f"perfrun's counter failed ({type(exc).__name__})")

    def _restore(self) -> None:
        undo, self._undo = self._undo, None
        if undo is not None:
            undo()

    def _note_dtype(self, module: Any) -> None:
        """The dtype the step computes in: autocast's where it is on for the
        parameters' device during the forward, else the dtype holding most
        of the root module's parameters."""
        torch = self.torch
        sizes: dict[Any, int] = {}
        device = None
        for p in module.parameters() if hasattr(module, "parameters") else ():
            sizes[p.dtype] = sizes.get(p.dtype, 0) + p.numel()
            if device is None:
                device = p.device
        kind = device.type if device is not None else "cpu"
        self.device = kind
        dtype = max(sizes, key=sizes.get) if sizes else None
        try:
            if torch.is_autocast_enabled(kind):
                dtype = torch.get_autocast_dtype(kind)
                self.autocast = True
        except Exception:
            pass
        self.dtype = str(dtype).replace("torch.", "") if dtype is not None else None
        if kind == "cuda":
            try:
                self.device_name = str(torch.cuda.get_device_name(device))
            except Exception:
                pass
            if self.dtype == "float32":
                self.tf32 = tf32_allowed(torch)

    # -- the record --------------------------------------------------------------

    def finish(self) -> None:
        """At the end of the run: a step never reached says why."""
        if self.state.flops is self:
            self.state.flops = None
            self.done = True
        if self.reason is None and self.step is None:
            self.reason = f"the run ended before step {self.target}"

    def result(self) -> dict[str, Any]:
        counted = self.step is not None and self.reason is None and self.done
        notes = list(self.notes)
        if counted and self.counts["optimizer"] == 0 and self.calls["optimizer"]:
            notes.append("optimizer: its elementwise arithmetic is not counted (0 FLOPs)")
        if self.causal_removed:
            notes.append(
                "causal attention counted as the unmasked part of the score matrix "
                f"(torch's counter counts it full: {self.causal_removed} FLOPs more)"
            )
        if self.formula_faults:
            notes.append(f"{self.formula_faults} op(s) whose formula failed counted as 0")
        if self.sparse_ops:
            notes.append(
                f"{self.sparse_ops} matmul(s) with a sparse operand counted by its non-zeros "
                "(2 x nnz x columns); torch's counter counts them as dense"
            )
        ops = sorted(self.ops.items(), key=lambda kv: -kv[1])[:TOP_OPS]
        return {
            "counted": counted,
            # The step that ran under the counter (slower; left out of the
            # statistics), even when the count itself failed.
            "step": self.step,
            "reason": None if counted else (self.reason or "not counted"),
            "forward": self.counts["forward"],
            "backward": self.counts["backward"],
            "optimizer": self.counts["optimizer"],
            "calls": dict(self.calls),
            "ops": dict(ops),
            "dtype": self.dtype,
            "autocast": self.autocast,
            "tf32": self.tf32,
            "device": self.device,
            "device_name": self.device_name,
            "seconds": round(self.seconds, 6),
            "notes": notes,
        }


#: The attribute on a function that `torch._disable_dynamo`'s wrapper
#: calls instead, once it has made it (torch/_compile.py).
_DISABLED = "__dynamo_disable"


def counting_mode(mapping: Optional[dict[Any, Any]]) -> tuple[Any, Optional[Callable[[], None]]]:
    """A FlopCounterMode with `mapping`, entered, and what undoes the one
    change made for it (None if none): where Dynamo is not imported, its
    dispatch wrapper handed the plain function, so that the first op does
    not import Dynamo (see the module's docstring). Raises what torch
    raises."""
    from torch.utils import flop_counter as fc

    undo = None
    if "torch._dynamo" not in sys.modules:
        undo = _skip_dynamo_import(getattr(fc, "_FlopCounterMode", None) or fc.FlopCounterMode)
    try:
        mode = fc.FlopCounterMode(display=False, custom_mapping=mapping)
        if hasattr(mode, "mod_tracker"):
            mode.mod_tracker = _Flat()
        mode.__enter__()
    except BaseException:
        if undo is not None:
            undo()
        raise
    return mode, undo


def _skip_dynamo_import(cls: Any) -> Optional[Callable[[], None]]:
    """Give `cls.__torch_dispatch__`'s `torch._disable_dynamo` wrapper its
    plain function as the one to call, so its first call imports nothing;
    returns what takes that back, or None where the wrapper is not there
    (an older torch) or was made already."""
    wrapper = cls.__dict__.get("__torch_dispatch__")
    plain = getattr(wrapper, "__wrapped__", None)
    if plain is None or plain is wrapper or not hasattr(plain, "__dict__"):
        return None
    if getattr(plain, _DISABLED, None) is not None:
        return None
    setattr(plain, _DISABLED, plain)

    def undo() -> None:
        if plain.__dict__.get(_DISABLED) is plain:
            delattr(plain, _DISABLED)

    return undo


def tf32_allowed(torch: Any) -> Optional[bool]:
    """Whether float32 matmuls on CUDA may run in TF32. torch >= 2.9 has a
    per-backend setting (`fp32_precision`: "tf32", "ieee", or "none" for
    "as the legacy flags say"); where a script set it, asking the legacy
    `get_float32_matmul_precision()` raises, so it is read first. Warnings
    are silenced: the script's stderr must not change."""
    import warnings

    matmul = torch.backends.cuda.matmul
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            precision = getattr(matmul, "fp32_precision", None)
            if precision in ("tf32", "ieee"):
                return precision == "tf32"
        except Exception:
            pass
        try:
            return bool(matmul.allow_tf32 or torch.get_float32_matmul_precision() != "highest")
        except Exception:
            return None


def compiled_reason(torch: Any) -> Optional[str]:
    """Why a step cannot be counted because of torch.compile, or None.
    Reads Dynamo's counters only where Dynamo was imported (it is never
    imported for this)."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    if counters is None:
        return None
    try:
        graphs = int(counters["stats"]["unique_graphs"])
    except Exception:
        graphs = 0
    if graphs > 0:
        return ("compiled module (torch.compile): the counter would see only the compiled "
                "code's library calls, not its generated kernels")
    return None


def custom_mapping(torch: Any, counter: Optional[FlopCounter] = None) -> dict[Any, Any]:
    """Formulas for FlopCounterMode: every formula of torch's registry made
    safe (a formula that raises would raise inside the script's own op: it
    counts 0 instead, and the record says so), the CPU SDPA ops torch lacks,
    and the fused SDPA ops with the causal correction."""
    from torch.utils import flop_counter as fc

    aten = torch.ops.aten
    mapping: dict[Any, Any] = {}

    def failed(exc: BaseException) -> int:
        if counter is not None:
            counter.formula_faults += 1
            counter.fault("flops.formula", exc)
        return 0

    def safe(formula: Callable[..., int]) -> Callable[..., int]:
        def count(*args: Any, **kwargs: Any) -> int:
            try:
                return int(formula(*args, **kwargs))
            except Exception as exc:
                return failed(exc)

        count._get_raw = True  # type: ignore[attr-defined]
        return count

    for packet, formula in fc.flop_registry.items():
        # The registry's entries already take raw arguments.
        mapping[packet] = safe(formula)

    def sparse_aware(formula: Callable[..., int], operands: tuple[int, int]) -> Callable[..., int]:
        """A matmul formula that counts a sparse operand by its non-zeros:
        torch's takes shapes only, so `torch.spmm(adj, x)` counts as the
        dense product, 100 to 1000 times the work done. A sparse (n x k)
        times a dense (k x m) is 2 x nnz x m multiply-adds; a dense (n x k)
        times a sparse (k x m), 2 x n x nnz."""
        i, j = operands

        def count(*args: Any, **kwargs: Any) -> int:
            try:
                a, b = args[i], args[j]
                a_sparse = getattr(a, "layout", None) not in (None, torch.strided)
                b_sparse = getattr(b, "layout", None) not in (None, torch.strided)
                if not (a_sparse or b_sparse):
                    return int(formula(*args, **kwargs))
                if counter is not None:
                    counter.sparse_ops += 1
                if a_sparse and b_sparse:
                    return 2 * int(a._nnz()) * int(b.shape[-1])  # an upper bound
                if a_sparse:
                    return 2 * int(a._nnz()) * int(b.shape[-1])
                return 2 * int(a.shape[-2]) * int(b._nnz())
            except Exception as exc:
                return failed(exc)

        count._get_raw = True  # type: ignore[attr-defined]
        return count

    # Dense matmuls whose operands may be sparse: (self, mat2) for mm,
    # (input, mat1, mat2) for addmm and torch's sparse addmm.
    for name, operands in (("mm", (0, 1)), ("addmm", (1, 2)), ("_sparse_addmm", (1, 2)),
                           ("_sparse_mm", (0, 1))):
        packet = getattr(aten, name, None)
        if packet is None:
            continue
        # torch's sparse variants have no formula: the dense one's shapes.
        dense = aten.addmm if "addmm" in name else aten.mm
        formula = fc.flop_registry.get(packet) or fc.flop_registry.get(dense)
        if formula is not None:
            mapping[packet] = sparse_aware(formula, operands)

    def causal_at(packet: Any) -> Optional[int]:
        try:
            names = [a.name for a in packet.default._schema.arguments]
            return names.index("is_causal")
        except Exception:
            return None

    def sdpa(packet: Any, backward: bool) -> Callable[..., int]:
        at = causal_at(packet)
        first = 1 if backward else 0  # backward ops lead with grad_out

        def count(*args: Any, out_val: Any = None, **kwargs: Any) -> int:
            try:
                q, k, v = (_shape(a) for a in args[first:first + 3])
                if backward:
                    full = fc.sdpa_backward_flop_count(_shape(args[0]), q, k, v)
                else:
                    full = fc.sdpa_flop_count(q, k, v)
                causal = kwargs.get("is_causal")
                if causal is None and at is not None and len(args) > at:
                    causal = args[at]
                if not causal or kwargs.get("attn_mask") is not None:
                    return int(full)
                kept = int(round(full * causal_fraction(q[-2], k[-2])))
                if counter is not None:
                    counter.causal_removed += int(full) - kept
                return kept
            except Exception as exc:
                return failed(exc)

        count._get_raw = True  # type: ignore[attr-defined]
        return count

    def recurrent(first_weight: int, backward: bool) -> Callable[..., int]:
        """A fused recurrent layer (LSTM, GRU, RNN): at each time step of
        each sequence, a matmul with each of its weight matrices (input to
        gates, hidden to gates, the projection), 2 FLOPs a weight; its
        backward two such (the input's and the weights' gradients), as for
        a matmul. The gates' elementwise arithmetic is not counted, as
        torch counts none. Rows: time steps x batch, or the packed
        sequence's rows (the input's leading dimensions either way)."""

        def count(*args: Any, out_val: Any = None, **kwargs: Any) -> int:
            try:
                x = args[0]
                rows = x.numel() // max(1, int(x.shape[-1]))
                given = args[first_weight]
                weights = given if isinstance(given, (list, tuple)) else \
                    args[first_weight:first_weight + 2]
                per_row = sum(int(w.numel()) for w in weights if w is not None and w.dim() == 2)
                return (4 if backward else 2) * rows * per_row
            except Exception as exc:
                return failed(exc)

        count._get_raw = True  # type: ignore[attr-defined]
        return count

    # LSTM on CPU runs oneDNN's fused layer (GRU and RNN run matmuls torch
    # counts); every recurrent layer on CUDA runs cuDNN's. torch's registry
    # has neither: an LSTM's step counted 0 (a recurrent model, 280 times
    # too low). (mkldnn: input, w_ih, w_hh, ...; its backward the same
    # order; cuDNN: input, then the list of every layer's weights.)
    for name, first, backward in (("mkldnn_rnn_layer", 1, False),
                                  ("mkldnn_rnn_layer_backward", 1, True),
                                  ("_cudnn_rnn", 1, False), ("_cudnn_rnn_backward", 1, True)):
        packet = getattr(aten, name, None)
        if packet is not None and packet not in fc.flop_registry:
            mapping[packet] = recurrent(first, backward)

    forward_ops = ("_scaled_dot_product_flash_attention_for_cpu",
                   "_scaled_dot_product_flash_attention",
                   "_scaled_dot_product_efficient_attention",
                   "_scaled_dot_product_cudnn_attention")
    for name in forward_ops:
        packet = getattr(aten, name, None)
        if packet is not None:
            mapping[packet] = sdpa(packet, backward=False)
        packet = getattr(aten, name + "_backward", None)
        if packet is not None:
            mapping[packet] = sdpa(packet, backward=True)
    return mapping


#: This file, for hooks.without_wrapper_frames: a counted call adds a frame
#: of `FlopCounter.run` to an exception passing through it.
FILE = os.path.abspath(__file__)
