"""The torch patches: DataLoader iterator, module forward, backward,
optimizer step / zero_grad, GradScaler.

Rules every wrapper follows:

* The original is called exactly once, with the arguments it was given, and
  its result or exception is passed back untouched: a hook never changes what
  the script does. A call that raised still counts its time, but tells the
  clock it failed (it closes no step).
* perfrun's own code around the call runs under `try/except`; a fault is
  recorded (and reported after the run), never raised into the script.
* The hot path is a couple of attribute reads and one clock read per edge.
  Forward calls nested in another forward, in a fetch (transform modules) or
  in a backward (activation recomputation) pass straight through after one
  integer test.
* torch.compile never sees perfrun: Dynamo inlines `nn.Module.__call__` (so,
  ours) when it traces a module call, and would guard on whatever the
  wrapper reads. The wrapper's first test is `is_dynamo_compiling()`, which
  Dynamo folds to True without a guard and which is False in eager code, so
  a traced call goes straight to the original and perfrun adds no guard and
  no recompile.
* The one argument a hook changes is an optimizer step's closure
  (`optimizer.step(closure)`): it is passed on wrapped in a callable that
  calls it once with the same arguments and returns its result, so the
  closure's own Python (a Lightning `training_step`, its hooks) is timed
  apart from the optimizer's update and counted where the same code counts
  outside a closure.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable

from .steps import BWD, CLOSURE, DATA, FWD, OPT, ZERO

_MARK = "__perfrun_wrapped__"


class HookState:
    """Shared by every wrapper. `block` > 0 means "forward calls here are not
    outermost": it counts open forwards, fetches and backwards (and is set
    very high to switch every hook off)."""

    __slots__ = ("block", "main_thread", "backward")

    def __init__(self) -> None:
        self.block = 0
        self.main_thread = threading.get_ident()
        # Open backward calls: module forwards run inside one are
        # recomputation (activation checkpointing), not forward.
        self.backward = 0


OFF = 1 << 30


def _mark(wrapper: Callable, original: Callable) -> Callable:
    functools.update_wrapper(wrapper, original)
    setattr(wrapper, _MARK, original)
    return wrapper


def is_wrapped(fn: Any) -> bool:
    return getattr(fn, _MARK, None) is not None


def install(torch: Any, agent: Any) -> list[tuple[Any, str, Any]]:
    """Patch torch for `agent`. Returns (owner, name, original) for each patch:
    what was replaced, for the record."""
    import torch.utils.data.dataloader as dataloader_mod

    state: HookState = agent.hooks_state
    clock = agent.clock
    # Bound once: each attribute lookup saved is saved at every phase edge.
    enter = clock.enter
    leave = clock.exit
    main = state.main_thread
    fault = agent.record_fault
    get_ident = threading.get_ident
    is_grad_enabled = torch.is_grad_enabled
    now = clock.now
    undo: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, name: str, make: Callable[[Any], Callable]) -> None:
        original = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name)
        if original is None or is_wrapped(original):
            return
        setattr(owner, name, _mark(make(original), original))
        undo.append((owner, name, original))

    roots_seen = agent.roots.ids
    see_root = agent.roots.see
    compiling = dynamo_compiling(torch)

    # -- forward: the outermost nn.Module call ----------------------------------
    def make_call(orig_call: Callable) -> Callable:
        def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
            if compiling():
                # Traced by Dynamo: nothing of perfrun's is read, so no guard.
                return orig_call(self, *args, **kwargs)
            if state.block or get_ident() != main:
                return orig_call(self, *args, **kwargs)
            state.block += 1
            key = id(self)
            try:
                if key not in roots_seen:
                    see_root(self)
                enter(FWD, is_grad_enabled(), key)
            except Exception as exc:
                fault("forward", exc)
            try:
                result = orig_call(self, *args, **kwargs)
            except BaseException:
                state.block -= 1
                try:
                    leave(True)
                except Exception as exc:
                    fault("forward", exc)
                raise
            state.block -= 1
            try:
                leave()
            except Exception as exc:
                fault("forward", exc)
            return result

        return __call__

    patch(torch.nn.Module, "__call__", make_call)
    skip_frame(torch.nn.Module.__call__)

    # -- backward ---------------------------------------------------------------
    def make_backward(orig: Callable) -> Callable:
        def backward(*args: Any, **kwargs: Any) -> Any:
            if state.block >= OFF or get_ident() != main:
                return orig(*args, **kwargs)
            state.block += 1
            state.backward += 1
            try:
                enter(BWD)
            except Exception as exc:
                fault("backward", exc)
            try:
                result = orig(*args, **kwargs)
            except BaseException:
                state.block -= 1
                state.backward -= 1
                try:
                    leave(True)
                except Exception as exc:
                    fault("backward", exc)
                raise
            state.block -= 1
            state.backward -= 1
            try:
                leave()
            except Exception as exc:
                fault("backward", exc)
            return result

        return backward

    # Tensor.backward calls torch.autograd.backward through the module
    # attribute, so this one patch sees both spellings.
    patch(torch.autograd, "backward", make_backward)

    # -- optimizer: step, zero_grad, construction --------------------------------
    def make_phase(kind: int, where: str) -> Callable[[Callable], Callable]:
        def make(orig: Callable) -> Callable:
            def phase(*args: Any, **kwargs: Any) -> Any:
                if state.block >= OFF or get_ident() != main:
                    return orig(*args, **kwargs)
                try:
                    enter(kind, True, id(args[0]) if args else None)
                except Exception as exc:
                    fault(where, exc)
                try:
                    result = orig(*args, **kwargs)
                except BaseException:
                    try:
                        leave(True)
                    except Exception as exc:
                        fault(where, exc)
                    raise
                try:
                    leave()
                except Exception as exc:
                    fault(where, exc)
                return result

            return phase

        return make

    def timed_closure(closure: Callable, live: list[bool]) -> Callable:
        """`closure`, timed as a phase of its own inside the step (its own
        time is Others). Calls outside the step it was passed to (an
        optimizer keeping it) pass straight through."""

        def closure_call(*args: Any, **kwargs: Any) -> Any:
            if not live[0] or state.block >= OFF or get_ident() != main:
                return closure(*args, **kwargs)
            try:
                enter(CLOSURE)
            except Exception as exc:
                fault("optimizer.closure", exc)
            try:
                result = closure(*args, **kwargs)
            except BaseException:
                try:
                    leave(True)
                except Exception as exc:
                    fault("optimizer.closure", exc)
                raise
            try:
                leave()
            except Exception as exc:
                fault("optimizer.closure", exc)
            return result

        return closure_call

    def make_step(orig: Callable) -> Callable:
        def step(*args: Any, **kwargs: Any) -> Any:
            if state.block >= OFF or get_ident() != main:
                return orig(*args, **kwargs)
            live = [False]
            try:
                enter(OPT, True, id(args[0]) if args else None)
                if len(args) > 1 and callable(args[1]):
                    live[0] = True
                    args = (args[0], timed_closure(args[1], live), *args[2:])
                elif callable(kwargs.get("closure")):
                    live[0] = True
                    kwargs = {**kwargs, "closure": timed_closure(kwargs["closure"], live)}
            except Exception as exc:
                fault("optimizer.step", exc)
            try:
                result = orig(*args, **kwargs)
            except BaseException:
                live[0] = False
                try:
                    leave(True)
                except Exception as exc:
                    fault("optimizer.step", exc)
                raise
            live[0] = False
            try:
                leave()
            except Exception as exc:
                fault("optimizer.step", exc)
            return result

        return step

    optim = torch.optim.Optimizer

    def patch_step(cls: type) -> None:
        # Each optimizer class defines its own `step`; wrap it the first time
        # an instance is built (as torch itself does for its profiler hook).
        for klass in cls.__mro__:
            if klass is optim or klass is object:
                break
            if "step" in klass.__dict__:
                patch(klass, "step", make_step)

    def make_init(orig_init: Callable) -> Callable:
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            orig_init(self, *args, **kwargs)
            try:
                clock.optimizer_built()
                patch_step(type(self))
            except Exception as exc:
                fault("optimizer.__init__", exc)

        return __init__

    patch(optim, "__init__", make_init)
    patch(optim, "zero_grad", make_phase(ZERO, "optimizer.zero_grad"))
    patch(torch.nn.Module, "zero_grad", make_phase(ZERO, "module.zero_grad"))
    scaler_cls = getattr(getattr(torch, "amp", None), "GradScaler", None)
    if scaler_cls is not None:
        patch(scaler_cls, "step", make_phase(OPT, "GradScaler.step"))
        patch(scaler_cls, "update", make_phase(ZERO, "GradScaler.update"))

    # -- DataLoader ----------------------------------------------------------------
    count_samples = agent.count_samples
    note_loader = agent.note_dataloader

    def make_next(orig_next: Callable) -> Callable:
        def __next__(self: Any) -> Any:
            if state.block >= OFF or get_ident() != main:
                return orig_next(self)
            state.block += 1
            try:
                enter(DATA, is_grad_enabled(), None)
            except Exception as exc:
                fault("dataloader", exc)
            try:
                batch = orig_next(self)
            except StopIteration:
                state.block -= 1
                try:
                    clock.fetch_stopped()
                except Exception as exc:
                    fault("dataloader", exc)
                raise
            except BaseException:
                state.block -= 1
                try:
                    leave(True)
                except Exception as exc:
                    fault("dataloader", exc)
                raise
            state.block -= 1
            try:
                leave()
                if count_samples:
                    clock.fetched(_batch_size(batch))
            except Exception as exc:
                fault("dataloader", exc)
            return batch

        return __next__

    patch(dataloader_mod._BaseDataLoaderIter, "__next__", make_next)

    def make_iter(orig_iter: Callable) -> Callable:
        def __iter__(self: Any) -> Any:
            if state.block >= OFF or get_ident() != main:
                return orig_iter(self)
            try:
                note_loader(self, is_grad_enabled())
            except Exception as exc:
                fault("dataloader.__iter__", exc)
            t0 = now()
            try:
                return orig_iter(self)
            finally:
                try:
                    clock.iterator_made(t0, now())
                except Exception as exc:
                    fault("dataloader.__iter__", exc)

        return __iter__

    patch(dataloader_mod.DataLoader, "__iter__", make_iter)
    return undo


def dynamo_compiling(torch: Any) -> Callable[[], bool]:
    """The check Dynamo folds to a constant (no guard) and eager code pays
    for with one call: `torch.compiler.is_dynamo_compiling` (torch >= 2.3;
    `is_compiling` before it; nothing to check before torch.compile)."""
    compiler = getattr(torch, "compiler", None)
    for name in ("is_dynamo_compiling", "is_compiling"):
        fn = getattr(compiler, name, None)
        if callable(fn):
            return fn
    return _never


def _never() -> bool:
    return False


def skip_frame(fn: Callable) -> None:
    """Tell Dynamo never to compile `fn`'s own frame, only the frames it
    calls, as it treats torch's own `nn.Module.__call__`: otherwise a module
    call Dynamo resumes at (after a graph break, or `model.compile()`) would
    compile perfrun's wrapper as user code, one code object shared by every
    module class, each class a recompile. Inlined into a traced call, the
    wrapper still folds to the original (see `dynamo_compiling`). Private
    API, the same call `torch._dynamo.disable(fn, recursive=False)` makes;
    without it perfrun works as before, and torch._dynamo is not imported."""
    try:
        from torch._C._dynamo import eval_frame  # type: ignore[import-not-found]

        action = eval_frame._FrameAction
        eval_frame.set_code_exec_strategy(
            getattr(fn, "__code__", fn),
            eval_frame._FrameExecStrategy(action.SKIP, action.DEFAULT),
        )
    except Exception:
        pass


def _batch_size(batch: Any, depth: int = 0) -> int:
    """Samples in a batch: the first dimension of the first tensor found."""
    shape = getattr(batch, "shape", None)
    if shape is not None:
        return int(shape[0]) if len(shape) else 0
    if depth > 3:
        return 0
    if isinstance(batch, (list, tuple)):
        for item in batch:
            n = _batch_size(item, depth + 1)
            if n:
                return n
    elif isinstance(batch, dict):
        for item in batch.values():
            n = _batch_size(item, depth + 1)
            if n:
                return n
    return 0


def without_wrapper_frames(tb: Any) -> Any:
    """The traceback `tb` with the frames of perfrun's wrappers removed: each
    hooked call adds one frame to an exception passing through it, and the
    traceback a user sees must be the one `python script.py` prints."""
    import types

    kept = []
    while tb is not None:
        if tb.tb_frame.f_code.co_filename != __file__:
            kept.append(tb)
        tb = tb.tb_next
    rebuilt = None
    for entry in reversed(kept):
        rebuilt = types.TracebackType(rebuilt, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return rebuilt


def install_excepthook(record_fault: Callable[[str, BaseException], None]) -> None:
    """Print uncaught exceptions without perfrun's frames (the exception
    object and its own traceback are left as they are for the script; only
    what is printed changes). Only when sys.excepthook is Python's own."""
    import sys

    if sys.excepthook is not sys.__excepthook__:
        return
    original = sys.__excepthook__

    def excepthook(kind: Any, value: Any, tb: Any) -> None:
        try:
            seen: set[int] = set()
            exc = value
            while exc is not None and id(exc) not in seen:
                # Chained exceptions are printed too: clean each of them.
                seen.add(id(exc))
                exc.__traceback__ = without_wrapper_frames(exc.__traceback__)
                exc = exc.__cause__ or exc.__context__
            tb = value.__traceback__ if value is not None else tb
        except Exception as error:
            record_fault("excepthook", error)
        original(kind, value, tb)

    sys.excepthook = excepthook
