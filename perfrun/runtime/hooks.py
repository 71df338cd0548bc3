"""The torch patches: DataLoader iterator, module forward, backward (and
autograd.grad), optimizer step / zero_grad, GradScaler.

Rules every wrapper follows:

* The original is called exactly once, with the arguments it was given, and
  its result or exception is passed back untouched: a hook never changes what
  the script does. A call that raised still counts its time, but tells the
  clock it failed (it closes no step).
* perfrun's own code around the call runs under `try/except`; a fault is
  recorded (and reported after the run), never raised into the script.
* The hot path is a few attribute reads, one clock read and one event per
  edge (a tuple; for an exit that did not raise, the clock reading itself:
  events.py), handed to the clock's `record` (see clock.py): in timer-only
  mode a list's append, so an edge runs no Python function of perfrun's
  beyond the wrapper itself.
* Module calls: only the outermost call of a step's models counts (Forward),
  so only those pay for a wrapper. perfrun finds them on the first calls
  (see RootFinder): while it looks, `nn.Module.__call__` itself is wrapped
  and a call made at depth 0 names a root; the root's class then gets a
  timing `__call__` of its own and the global wrapper goes, so a submodule
  call runs torch's own `nn.Module.__call__` with no perfrun frame at all. A
  submodule of a root's very class (a Sequential inside a Sequential) passes
  through that class's wrapper after one test. Calls nested in another
  forward, in a fetch (transform modules) or in a backward (activation
  recomputation) pass straight through.
* torch.compile never sees perfrun: Dynamo inlines a module's `__call__` (so,
  ours) when it traces a module call, and any other hooked call a compiled
  function makes (`zero_grad`, `backward`, `optimizer.step` in a compiled
  train step); it would guard on whatever a wrapper reads, and break the
  graph at the thread check (a builtin it cannot trace). Every wrapper's
  first test is `is_dynamo_compiling()`, which Dynamo folds to True without
  a guard and which is False in eager code, so a traced call goes straight
  to the original. And no wrapper's own frame is ever compiled
  (`skip_frame`): a hooked call that runs eagerly inside a compiled region
  (after a graph break) would otherwise be compiled as user code, one more
  frame and graph break than the script has. So perfrun adds no guard, no
  recompile and no graph break; a call traced into a graph is not timed.
  One case still costs guards: a model whose class perfrun times (it was
  called eagerly first) called inside a compiled function that is not its
  own compilation. Dynamo goes straight to `forward` only for a class whose
  `__call__` is torch's; here it traces perfrun's `__call__` and torch's
  `_call_impl`, which compiles the same graph with the same graph breaks
  and recompiles, plus about seven identity guards (on the wrapper's code
  and that path; tests/test_e2e_compile.py).
* FLOPs (flops.py): on the one step perfrun counts, `state.flops` is set
  and forward, backward and `optimizer.step` hand their call to it; on every
  other step that read, and a test for None, is all it costs.
* The one argument a hook changes is an optimizer step's closure
  (`optimizer.step(closure)`): it is passed on wrapped in a callable that
  calls it once with the same arguments and returns its result, so the
  closure's own Python (a Lightning `training_step`, its hooks) is timed
  apart from the optimizer's update and counted where the same code counts
  outside a closure.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import threading
import types
import weakref
from collections.abc import Mapping
from typing import Any, Callable, Optional

from perfrun.store.layout import rank_stem

from . import children
from .events import ENTER, EVAL_MODE, EXIT, FETCHED, ITER, OPTIM, STOP
from .steps import BWD, CLOSURE, DATA, FWD, OPT, ZERO

_MARK = "__perfrun_wrapped__"

#: Outermost module calls watched for new roots each time the search runs:
#: a few steps of a loop that calls a model and a loss module.
SEARCH_CALLS = 8
#: Seconds after a search before the next one, doubled each time: a root
#: first called late in the run (a model evaluated now and then) is found
#: at a cost that vanishes over a long run.
SEARCH_BACKOFF = 1.0
_NEVER = float("inf")
_ALWAYS = float("-inf")


class HookState:
    """Shared by every wrapper. `block` > 0 means "forward calls here are not
    outermost": it counts open forwards, fetches and backwards (and is set
    very high to switch every hook off). `due`: the time at which an
    outermost module call next asks the RootFinder whether to search (every
    call while a search runs)."""

    __slots__ = ("block", "main_thread", "backward", "due", "flops", "steps_off")

    def __init__(self) -> None:
        self.block = 0
        # The FLOP counter (flops.py), set only during the one step it
        # counts: forward, backward and optimizer.step hand it their call.
        self.flops: Any = None
        # The thread whose calls are timed: the one that runs the script,
        # until another trains first (install's `train_here`).
        self.main_thread = threading.get_ident()
        # Optimizer steps the script made with every hook switched off:
        # after --stop-after's stop, steps a script that caught it made.
        self.steps_off = 0
        # Open backward calls: module forwards run inside one are
        # recomputation (activation checkpointing), not forward.
        self.backward = 0
        self.due = _ALWAYS


OFF = 1 << 30


def _no_grad_mode(module: Any) -> Optional[bool]:
    """A forward with gradients off, as its event records it (events.py):
    None where the module is in training mode (a DQN's action, a target
    network: the step's own work, steps.py), False where it is in eval
    mode (validation)."""
    return None if getattr(module, "training", False) is True else False


def _mark(wrapper: Callable, original: Callable) -> Callable:
    functools.update_wrapper(wrapper, original)
    setattr(wrapper, _MARK, original)
    return wrapper


def is_wrapped(fn: Any) -> bool:
    return getattr(fn, _MARK, None) is not None


def uninstall(undo: list[tuple[Any, str, Any]]) -> None:
    """Put back what `install` (and the root search since) replaced, last
    first (for tests and benchmarks: a run never needs it). An original of
    None: the class had no attribute of its own."""
    for owner, name, original in reversed(undo):
        try:
            if original is None:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
        except (AttributeError, TypeError):
            pass
    undo.clear()
    # Dynamo, told of the search's `nn.Module.__call__`, gets torch's back.
    for kept in map(sys.modules.get, RootFinder._DYNAMO):
        held = getattr(kept, "unpatched_nn_module_call", None)
        if is_wrapped(held):
            kept.unpatched_nn_module_call = getattr(held, _MARK)


def install(torch: Any, agent: Any) -> list[tuple[Any, str, Any]]:
    """Patch torch for `agent`. Returns (owner, name, original) for each patch:
    what was replaced, for the record (and `uninstall`); the root search adds
    to the same list as it patches module classes."""
    import torch.utils.data.dataloader as dataloader_mod

    state: HookState = agent.hooks_state
    # Each edge is `clock.record(event)` (clock.py): the BufferedClock's list
    # append, or the PhaseClock's state machine itself; read at each edge, as
    # a BufferedClock may go live during the run. After an enter edge the
    # hook drains the buffer once `clock.last` is past (never, when live).
    clock = agent.clock
    # Bound once: each attribute lookup saved is saved at every phase edge.
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
        wrapper = make(original)
        skip_frame(wrapper)
        setattr(owner, name, _mark(wrapper, original))
        undo.append((owner, name, original))

    note_once = agent.note_once
    roots_seen = agent.roots.ids
    see_root = agent.roots.see
    compiling = dynamo_compiling(torch)

    # -- forward: the outermost call of a root module ------------------------------
    module_cls = torch.nn.Module
    module_call = module_cls.__dict__["__call__"]  # torch's own

    def make_call(orig_call: Optional[Callable]) -> Callable:
        """A root class's timing `__call__`. `orig_call`: the class's own
        `__call__`, or None for one that inherits nn.Module's, which is then
        looked up at each call, so that whatever wraps it meanwhile (the root
        search, torch.fx's tracer) still sees the call."""
        static = orig_call or module_call

        # (*args, **kwargs), the module first: forwarded as they came, with
        # no list or dict built on the way when there are no keywords.
        def __call__(*args: Any, **kwargs: Any) -> Any:
            if compiling():
                # Traced by Dynamo: nothing of perfrun's is read, so no guard.
                return static(*args, **kwargs)
            call = orig_call or module_cls.__call__
            if state.block or get_ident() != main:
                return call(*args, **kwargs) if kwargs else call(*args)
            state.block += 1
            try:
                module = args[0]
                key = id(module)
                if key not in roots_seen:
                    see_root(module)
                t = now()
                if t > state.due:
                    finder.watch(t)
                # The module's mode with the gradients' state (events.py).
                clock.record((ENTER, FWD, (module.training or EVAL_MODE)
                              if is_grad_enabled() else _no_grad_mode(module), key, t))
                if t > clock.last:
                    clock.drain()
            except Exception as exc:
                fault("forward", exc)
            counter = state.flops
            try:
                if counter is None:
                    result = call(*args, **kwargs) if kwargs else call(*args)
                else:
                    result = counter.run(FWD, call, args, kwargs)
            except BaseException:
                state.block -= 1
                try:
                    clock.record((EXIT, True, now()))
                except Exception as exc:
                    fault("forward", exc)
                raise
            state.block -= 1
            try:
                clock.record(now())
            except Exception as exc:
                fault("forward", exc)
            return result

        return __call__

    finder = RootFinder(torch, state, make_call, compiling, fault, undo)
    finder.search()

    # -- backward ---------------------------------------------------------------
    def make_backward(orig: Callable) -> Callable:
        def backward(*args: Any, **kwargs: Any) -> Any:
            if compiling() or state.block >= OFF or get_ident() != main:
                return orig(*args, **kwargs)
            state.block += 1
            state.backward += 1
            try:
                t = now()
                clock.record((ENTER, BWD, True, None, t))
                if t > clock.last:
                    clock.drain()
            except Exception as exc:
                fault("backward", exc)
            counter = state.flops
            try:
                if counter is None:
                    result = orig(*args, **kwargs) if kwargs else orig(*args)
                else:
                    result = counter.run(BWD, orig, args, kwargs)
            except BaseException:
                state.block -= 1
                state.backward -= 1
                try:
                    clock.record((EXIT, True, now()))
                except Exception as exc:
                    fault("backward", exc)
                raise
            state.block -= 1
            state.backward -= 1
            try:
                clock.record(now())
            except Exception as exc:
                fault("backward", exc)
            return result

        return backward

    # Tensor.backward calls torch.autograd.backward through the module
    # attribute, so this one patch sees both spellings. torch.autograd.grad
    # is the same engine run for gradients returned rather than stored
    # (functional training, gradient penalties, meta-learning): Backward
    # too, not Others.
    patch(torch.autograd, "backward", make_backward)
    patch(torch.autograd, "grad", make_backward)

    # -- optimizer: step, zero_grad, construction --------------------------------
    def make_phase(kind: int, where: str) -> Callable[[Callable], Callable]:
        def make(orig: Callable) -> Callable:
            def phase(*args: Any, **kwargs: Any) -> Any:
                if compiling() or state.block >= OFF or get_ident() != main:
                    return orig(*args, **kwargs)
                try:
                    t = now()
                    clock.record((ENTER, kind, True, id(args[0]) if args else None, t))
                    if t > clock.last:
                        clock.drain()
                except Exception as exc:
                    fault(where, exc)
                try:
                    result = orig(*args, **kwargs) if kwargs else orig(*args)
                except BaseException:
                    try:
                        clock.record((EXIT, True, now()))
                    except Exception as exc:
                        fault(where, exc)
                    raise
                try:
                    clock.record(now())
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
            if compiling() or not live[0] or state.block >= OFF or get_ident() != main:
                return closure(*args, **kwargs)
            try:
                t = now()
                clock.record((ENTER, CLOSURE, True, None, t))
                if t > clock.last:
                    clock.drain()
            except Exception as exc:
                fault("optimizer.closure", exc)
            try:
                result = closure(*args, **kwargs) if kwargs else closure(*args)
            except BaseException:
                try:
                    clock.record((EXIT, True, now()))
                except Exception as exc:
                    fault("optimizer.closure", exc)
                raise
            try:
                clock.record(now())
            except Exception as exc:
                fault("optimizer.closure", exc)
            return result

        return closure_call

    skip_frame(timed_closure(_never, [False]))

    # The thread timed, once one other than the script's main thread
    # trained first (the last such thread); whether the main thread had
    # trained when another first stepped; the first other thread whose
    # steps were not timed.
    timed: list[threading.Thread] = []
    main_trained: list[bool] = []
    other_threads: list[str] = []
    # Each other thread's last DataLoader iterator, (loader, iterator,
    # gradients on), weakly: timed from the moment its thread turns out to
    # be the one that trains.
    made_elsewhere: dict[int, tuple[Any, Any, bool]] = {}

    def elsewhere() -> None:
        """An optimizer step on a thread whose calls are not timed. While no
        thread is training (the script's main thread has trained nothing:
        no backward or optimizer step; or the thread timed since has
        ended), the loop runs on this thread (a script that trains on a
        thread of its own, the main one only waiting for it): from now on
        this thread's calls are timed, and no other's. No timed call pays
        for the test: every wrapper reads `main` as it did, only its value
        changes. Otherwise these steps are not timed (two threads' calls
        would interleave in one step), and that is said, for the first
        such thread only (a script may start many)."""
        nonlocal main
        current = threading.current_thread()
        if timed:
            free = not timed[0].is_alive()
        elif main_trained:
            free = False
        else:
            clock.drain()
            free = not clock.tracker.training_seen
            if not free:
                main_trained.append(True)
        if free:
            first = not timed
            timed[:] = [current]
            main = state.main_thread = get_ident()
            finder.train_here(main)
            finder.search()
            if first:
                note_once(thread_trained_note(current.name))
            made = made_elsewhere.pop(main, None)
            if made is not None:
                loader, it = made[0](), made[1]()
                if loader is not None and it is not None:
                    iterated.add(loader)
                    stages = note_loader(loader, made[2])
                    if stages is not None and attach_iterator is not None:
                        attach_iterator(stages, it)
            return
        if not other_threads:
            other_threads.append(current.name)
            note_once(thread_note(current.name, timed[0].name if timed else None))

    def make_step(orig: Callable) -> Callable:
        def step(*args: Any, **kwargs: Any) -> Any:
            if compiling():
                return orig(*args, **kwargs)
            if state.block >= OFF:
                # Every hook off: the run's end, or --stop-after's stop, which
                # a script that catches SystemExit may have trained on past.
                state.steps_off += 1
                return orig(*args, **kwargs)
            if get_ident() != main:
                try:
                    elsewhere()
                except Exception as exc:
                    fault("optimizer.step", exc)
                return orig(*args, **kwargs)
            live = None
            try:
                t = now()
                clock.record((ENTER, OPT, True, id(args[0]) if args else None, t))
                if t > clock.last:
                    clock.drain()
                if len(args) > 1 or kwargs:
                    # A closure (LBFGS, Lightning): the one list made per
                    # step, and only then.
                    if len(args) > 1 and callable(args[1]):
                        live = [True]
                        args = (args[0], timed_closure(args[1], live), *args[2:])
                    elif callable(kwargs.get("closure")):
                        live = [True]
                        kwargs = {**kwargs, "closure": timed_closure(kwargs["closure"], live)}
            except Exception as exc:
                fault("optimizer.step", exc)
            counter = state.flops
            try:
                if counter is None:
                    result = orig(*args, **kwargs) if kwargs else orig(*args)
                else:
                    result = counter.run(OPT, orig, args, kwargs)
            except BaseException:
                if live is not None:
                    live[0] = False
                try:
                    clock.record((EXIT, True, now()))
                except Exception as exc:
                    fault("optimizer.step", exc)
                raise
            if live is not None:
                live[0] = False
            try:
                clock.record(now())
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
                clock.record((OPTIM,))
                patch_step(type(self))
                # A new optimizer: perhaps a new model to train.
                finder.search()
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
    # What times an iterator stage by stage (pipeline.py); an agent may have
    # none (timer-only hands back no stages anyway).
    attach_iterator = getattr(agent, "attach_iterator", None)
    # An iterator timed stage by stage is told the fetch's edges as the
    # step clock reads them (pipeline.py, `_perfrun_done`): not in
    # timer-only, which times no stages.
    staged = attach_iterator is not None and not getattr(
        getattr(agent, "settings", None), "timer_only", True)

    def make_next(orig_next: Callable) -> Callable:
        def __next__(self: Any) -> Any:
            if compiling() or state.block >= OFF or get_ident() != main:
                return orig_next(self)
            state.block += 1
            try:
                t = t_enter = now()
                clock.record((ENTER, DATA, is_grad_enabled(), id(self), t))
                if t > clock.last:
                    clock.drain()
            except Exception as exc:
                fault("dataloader", exc)
            try:
                batch = orig_next(self)
            except StopIteration:
                state.block -= 1
                try:
                    clock.record((STOP, now()))
                except Exception as exc:
                    fault("dataloader", exc)
                raise
            except BaseException:
                state.block -= 1
                try:
                    clock.record((EXIT, True, now()))
                except Exception as exc:
                    fault("dataloader", exc)
                raise
            state.block -= 1
            t = now()
            n = 0
            if count_samples:
                try:
                    # The usual batch, a tuple or list led by a tensor, is
                    # read here without a call; anything else the long way.
                    cls = type(batch)
                    if (cls is tuple or cls is list) and batch:
                        shape = getattr(batch[0], "shape", None)
                        if shape:
                            n = shape[0]
                    if not n:
                        n = _batch_size(batch)
                except Exception as exc:
                    n = 0
                    fault("dataloader.samples", exc)
            try:
                clock.record((FETCHED, n, t))
                if staged:
                    done = self.__dict__.get("_perfrun_done")
                    if done is not None:
                        done(t_enter, t)
            except Exception as exc:
                fault("dataloader", exc)
            return batch

        return __next__

    patch(dataloader_mod._BaseDataLoaderIter, "__next__", make_next)

    iterated: Any = weakref.WeakSet()

    def make_iter(orig_iter: Callable) -> Callable:
        def __iter__(self: Any) -> Any:
            if compiling() or state.block >= OFF:
                return orig_iter(self)
            if get_ident() != main:
                it = orig_iter(self)
                try:
                    made_elsewhere[get_ident()] = (weakref.ref(self), weakref.ref(it),
                                                   is_grad_enabled())
                except Exception as exc:
                    fault("dataloader.__iter__", exc)
                return it
            stages = None
            try:
                stages = note_loader(self, is_grad_enabled())
                if self not in iterated:
                    # A loader's first pass (an evaluation loader, a new
                    # dataset) may call a model not seen so far.
                    iterated.add(self)
                    finder.search()
            except Exception as exc:
                fault("dataloader.__iter__", exc)
            t0 = now()
            try:
                it = orig_iter(self)
            finally:
                try:
                    clock.record((ITER, t0, now()))
                except Exception as exc:
                    fault("dataloader.__iter__", exc)
            if stages is not None and attach_iterator is not None:
                try:
                    attach_iterator(stages, it)
                except Exception as exc:
                    fault("pipeline", exc)
            return it

        return __iter__

    patch(dataloader_mod.DataLoader, "__iter__", make_iter)

    # -- torch.compile ---------------------------------------------------------------
    def make_compile(orig_compile: Callable) -> Callable:
        def compile(*args: Any, **kwargs: Any) -> Any:
            try:
                if args and isinstance(args[0], module_cls):
                    finder.compiled(args[0])
                finder.pin()
            except Exception as exc:
                fault("compile", exc)
            return orig_compile(*args, **kwargs)

        return compile

    patch(torch, "compile", make_compile)

    # -- processes the script starts itself (mp.spawn) -----------------------------
    def make_start(orig_start: Callable) -> Callable:
        def start_processes(fn: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                nprocs = kwargs.get("nprocs", args[1] if len(args) > 1 else 1)
                note_once(children.spawn_note(fn, nprocs, sys.argv[0] if sys.argv else ""))
            except Exception as exc:
                fault("multiprocessing.start_processes", exc)
            return orig_start(fn, *args, **kwargs)

        return start_processes

    # -- processes the script starts itself (multiprocessing.Process) --------------
    import multiprocessing.process as mp_process

    script_dir = os.path.dirname(os.path.abspath(sys.argv[0])) if sys.argv and sys.argv[0] else ""

    def make_process_start(orig_start: Callable) -> Callable:
        def start(self: Any) -> Any:
            try:
                target = getattr(self, "_target", None)
                if target is not None and children.is_scripts(target, script_dir):
                    method = self._start_method or children.start_method()
                    # A spawned child unpickles the wrapper: only where it
                    # can import perfrun as this process did.
                    if method == "fork" or not agent.payload.get("package_root_used"):
                        self._target = children.ChildTarget(
                            target, agent.run_dir, rank_stem(agent.rank, agent.restart),
                            agent.t0_unix)
                    note_once(children.process_note(children.target_name(target)))
                elif target is None and type(self).run is not mp_process.BaseProcess.run:
                    note_once(children.process_note(type(self).__qualname__ + ".run"))
            except Exception as exc:
                fault("multiprocessing.Process", exc)
            return orig_start(self)

        return start

    patch(mp_process.BaseProcess, "start", make_process_start)

    # `spawn` calls the `start_processes` of its own module; the package
    # re-exports the function for direct callers.
    spawn_module = sys.modules.get("torch.multiprocessing.spawn")
    if spawn_module is not None:
        patch(spawn_module, "start_processes", make_start)
        wrapped = spawn_module.__dict__.get("start_processes")
        package = getattr(torch, "multiprocessing", None)
        if is_wrapped(wrapped) and getattr(package, "start_processes", None) is getattr(
                wrapped, _MARK):
            package.start_processes = wrapped
            undo.append((package, "start_processes", getattr(wrapped, _MARK)))
    return undo


class RootFinder:
    """Finds the root modules (those the script calls at depth 0) and gives
    each root's class a timing `__call__`, so that no other module call runs
    perfrun's code.

    While it searches, `nn.Module.__call__` is perfrun's `discover` wrapper,
    which passes every nested call straight on and hands a call made at
    depth 0 to its class's timing wrapper, made there and then. A search
    lasts SEARCH_CALLS outermost calls; it runs at start, when a DataLoader
    is iterated for the first time or an optimizer is built, and again
    SEARCH_BACKOFF seconds after the last one ended, that delay doubling
    each time. Outside a search torch's own `nn.Module.__call__` is back:
    a module class never called at depth 0 during a search is not timed
    (its calls count in Others).

    Dynamo keeps, from the moment it is imported, the `nn.Module.__call__` it
    treats as torch's own (`unpatched_nn_module_call`, which lets it skip
    tracing `__call__` and go straight to `forward`): when it holds the one
    being replaced, it is given the new one, so that a model compiled while
    perfrun searches, or after, is traced as it is without perfrun. Where
    someone else has replaced `nn.Module.__call__` since, it is left alone
    (and so is the search).

    Once the script calls `torch.compile`, `nn.Module.__call__` stays the
    search's for the rest of the run (`pin`). Where Dynamo cannot go
    straight to `forward` (a module with hooks, or with a `forward` of its
    own instance, as Lightning sets when it compiles `training_step` and
    `forward`), it traces `nn.Module.__call__` itself and guards on the one
    it traced: a search that ended after that, putting torch's back, failed
    the guard and recompiled the script's function (measured on Lightning
    with `torch.compile(model)` and one eager module call a step). Pinned,
    no such guard ever fails. The price: in a script that compiles
    anything, each eager nested module call passes through the search's
    wrapper (one test), as during a search.
    """

    _DYNAMO = ("torch._dynamo.utils", "torch._dynamo.variables.nn_module")

    def __init__(self, torch: Any, state: HookState,
                 make_call: Callable[[Optional[Callable]], Callable],
                 compiling: Callable[[], bool], fault: Callable[[str, BaseException], None],
                 undo: list[tuple[Any, str, Any]]) -> None:
        self.module = torch.nn.Module
        self.state = state
        self.make_call = make_call
        self.fault = fault
        self.undo = undo
        self.module_call = self.module.__dict__["__call__"]
        # A depth-0 call of a class that cannot be given a wrapper is timed
        # by this one.
        self.fallback = make_call(None)
        self.left = 0  # outermost calls still to watch; 0: not searching
        self.backoff = SEARCH_BACKOFF
        self.searches = 0
        self.pinned = False  # torch.compile was called: no search ends
        self.discover = _mark(self._make_discover(compiling), self.module_call)
        skip_frame(self.discover)
        skip_frame(self.fallback)

    def _make_discover(self, compiling: Callable[[], bool]) -> Callable:
        state = self.state
        main = state.main_thread
        get_ident = threading.get_ident
        module_call = self.module_call
        adopt = self.adopt

        def train_here(ident: int) -> None:
            nonlocal main
            main = ident

        #: The thread whose depth-0 calls name roots, from now on (install's
        #: `elsewhere`): read as the wrapper reads it, at no cost per call.
        self.train_here = train_here

        def __call__(*args: Any, **kwargs: Any) -> Any:
            if compiling():
                return module_call(*args, **kwargs)
            if state.block or get_ident() != main:
                if state.block >= OFF:
                    # Switched off (the run ended, or this is a forked
                    # DataLoader worker): no outermost call will end this
                    # search, so end it here, or every module call from
                    # now on would pass through this wrapper.
                    self.end()
                return module_call(*args, **kwargs) if kwargs else module_call(*args)
            return adopt(args[0])(*args, **kwargs)

        return __call__

    def adopt(self, module: Any) -> Callable:
        """What times this depth-0 call of `module`, whose class becomes a
        root's class: the timing `__call__` made for the class and set on it.
        A class with a `__call__` of its own (which reached this one through
        `super().__call__`) gets it too, for its next calls, but this call,
        already inside that `__call__`, is timed from here (`fallback`), so
        the class's own `__call__` still runs once."""
        try:
            cls = type(module)
            if cls is self.module:
                return self.fallback  # (a bare nn.Module: nothing to call)
            found: Any = None
            for klass in cls.__mro__:
                found = klass.__dict__.get("__call__")
                if found is not None:
                    break
            if is_wrapped(found) and found is not self.discover:
                return self.fallback  # (unreachable: that wrapper counted)
            inherited = found is self.discover
            wrapper = _mark(self.make_call(None if inherited else found),
                            self.module_call if inherited else found)
            own = cls.__dict__.get("__call__")
            cls.__call__ = wrapper
            self.undo.append((cls, "__call__", own))
            return wrapper if inherited else self.fallback
        except Exception as exc:
            self.fault("forward.root", exc)
            return self.fallback

    def compiled(self, module: Any) -> None:
        """`torch.compile(module)`: Dynamo will trace `module`'s own call
        inside the compiled region, and takes torch's shortcut (straight to
        `forward`, the guards of a plain run) only for a class whose
        `__call__` is torch's. So a timing `__call__` of the module's class
        goes: the compiled wrapper, called at depth 0, is the root to time
        now, and the search `pin` starts next (every `torch.compile` pins)
        finds it."""
        cls = type(module)
        own = cls.__dict__.get("__call__")
        if own is not None and own is not self.discover and is_wrapped(own):
            original = getattr(own, _MARK)
            if original is self.module_call:
                delattr(cls, "__call__")
            else:
                cls.__call__ = original

    def search(self) -> None:
        """Watch the next SEARCH_CALLS outermost module calls for new roots."""
        if self.module.__dict__.get("__call__") is not self.discover:
            if not self._set_module_call(self.module_call, self.discover):
                return  # someone else's `nn.Module.__call__` is in place
            self.searches += 1
        self.left = SEARCH_CALLS
        self.state.due = _ALWAYS

    def end(self) -> None:
        """End the running search: torch's `nn.Module.__call__` is back
        (unless pinned)."""
        self.left = 0
        if not self.pinned:
            self._set_module_call(self.discover, self.module_call)

    def pin(self) -> None:
        """The script called `torch.compile`: the search's `nn.Module.__call__`
        goes in, if it is not in already, and stays (see the class's
        docstring), so that what Dynamo traces from now on stays valid."""
        self.search()
        self.pinned = self.module.__dict__.get("__call__") is self.discover

    def watch(self, t: float) -> None:
        """An outermost module call at `t`, past `state.due`: count it against
        the running search, or start the next one."""
        if self.left == 0:
            self.search()
            if self.left == 0:
                self.state.due = t + self.backoff
            return
        self.left -= 1
        if self.left == 0:
            self.end()
            self.state.due = t + self.backoff
            self.backoff *= 2

    def _set_module_call(self, old: Callable, new: Callable) -> bool:
        module = self.module
        if module.__dict__.get("__call__") is not old:
            return False
        module.__call__ = new
        if not any(entry[0] is module and entry[1] == "__call__" for entry in self.undo):
            self.undo.append((module, "__call__", self.module_call))
        for name in self._DYNAMO:
            kept = sys.modules.get(name)
            if kept is not None and getattr(kept, "unpatched_nn_module_call", None) is old:
                kept.unpatched_nn_module_call = new
        return True


def thread_note(thread: str, timed: Optional[str] = None) -> str:
    """What the report says when optimizer steps run on a thread other than
    the one whose steps perfrun times (`timed`: that thread, when it is not
    the script's main thread): perfrun times one thread (another thread's
    calls would interleave with its steps), so these steps are not in the
    results, and the report says where they ran rather than leave them
    unmentioned."""
    if timed is None:
        return (
            f"optimizer steps ran on a thread other than the script's main thread ({thread}): "
            "perfrun times the steps of the main thread only, so those are not in these "
            "results"
        )
    return (
        f"optimizer steps ran on a thread other than the one whose steps perfrun times "
        f"({timed}): {thread}; perfrun times one thread's steps, so those are not in these "
        "results"
    )


def thread_trained_note(thread: str) -> str:
    """What the report says when the script trains on a thread of its own:
    that thread's steps are the ones timed, from the step after its first
    optimizer step (the one that showed which thread trains, whose forward
    and backward had already run untimed)."""
    return (
        f"the training loop ran on a thread of the script's ({thread}), not its main thread: "
        "perfrun times that thread's steps, from its second optimizer step on (the first "
        "showed which thread trains)"
    )


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
    """Samples in a batch: what the batch says it holds where it says so
    (a graph batch's `batch_size`, PyG's and DGL's: its first tensor counts
    nodes, not graphs), else the first dimension of the first tensor found,
    in a list or tuple, a mapping (a dict, or Hugging Face's BatchEncoding,
    which every tokenizer-backed data collator returns and which is not a
    dict) or a dataclass's fields, in order."""
    shape = getattr(batch, "shape", None)
    if shape is not None:
        return int(shape[0]) if len(shape) else 0
    if depth > 3:
        return 0
    if isinstance(batch, (list, tuple)):
        items: Any = batch
    elif isinstance(batch, Mapping):
        items = batch.values()
    else:
        size = getattr(batch, "batch_size", None)
        if isinstance(size, int) and not isinstance(size, bool) and size > 0:
            return size
        if not dataclasses.is_dataclass(batch) or isinstance(batch, type):
            return 0
        items = (getattr(batch, f.name, None) for f in dataclasses.fields(batch))
    for item in items:
        n = _batch_size(item, depth + 1)
        if n:
            return n
    return 0


#: Files whose frames a hooked call adds: the wrappers, the FLOP counter's
#: `run` on the one step it counts, the fetch's stages, and the boot's
#: wrapper of `ray.init`.
_OWN_FILES = (__file__, os.path.join(os.path.dirname(__file__), "flops.py"),
              os.path.join(os.path.dirname(__file__), "pipeline.py"),
              os.path.join(os.path.dirname(__file__), "lite.py"))


def without_wrapper_frames(tb: Any) -> Any:
    """The traceback `tb` with the frames of perfrun's wrappers removed: each
    hooked call adds one frame to an exception passing through it, and the
    traceback a user sees must be the one `python script.py` prints."""
    kept = []
    while tb is not None:
        if tb.tb_frame.f_code.co_filename not in _OWN_FILES:
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
