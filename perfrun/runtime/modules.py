"""Module-level ranges: each submodule's forward, by qualified name
(`transformer.h.3.attn`), down to a chosen depth, as `record_function`
ranges (nested slices under the phases in the window's trace) and NVTX
ranges (so an nsys timeline names the block, not its class).

Hooks are registered only while needed (the detailed window, or the whole
run under --nsys without a window) and removed afterwards: outside that, the
per-step cost stays the core's. Backward time per module needs no backward
hooks (which can break in-place operations): analysis/modules.py maps each
forward op's autograd sequence number to its backward op in the trace.

A module's forward that runs inside a backward is recomputation (activation
checkpointing): its range is named `perfrun.recompute: NAME`, so the Module
Summary counts it in Backward, never as the module's forward.

Compiled regions are opaque: torch.compile runs them as graphs, a hook
registered inside one is either ignored or a guard that recompiles the
user's code. So perfrun hooks a compiled module (`torch.compile(model)`'s
wrapper) as one leaf, names it by the model it wraps, and never registers
anything inside it or on a module compiled in place (`model.compile()`).
"""

from __future__ import annotations

import sys
import weakref
from typing import Any, Optional

from .annotations import range_api

MODULE_PREFIX = "perfrun.module: "
RECOMPUTE_PREFIX = "perfrun.recompute: "
MAX_AUTO_DEPTH = 6


def compiled_inner(module: Any) -> Any:
    """The model a `torch.compile` wrapper (OptimizedModule) runs, or None
    when `module` is no such wrapper."""
    inner = getattr(module, "_orig_mod", None)
    return inner if inner is not None and type(module).__name__ == "OptimizedModule" else None


def compiled_in_place(module: Any) -> bool:
    """`module.compile()` was called: its own call runs a compiled graph."""
    return getattr(module, "_compiled_call_impl", None) is not None


def auto_depth(root: Any) -> int:
    """A depth that shows the model's main blocks: the smallest one with at
    least 8 modules above it (GPT-2: `transformer.h.N`), or the leaves; one
    deeper when that depth holds a list of blocks (BERT's
    `bert.encoder.layer`), which is never called itself."""
    counts: dict[int, int] = {}
    containers: set[int] = set()
    for name, module in root.named_modules():
        if name:
            d = name.count(".") + 1
            counts[d] = counts.get(d, 0) + 1
            if type(module).__name__ in ("ModuleList", "ModuleDict") and any(
                True for _ in module.children()
            ):
                containers.add(d)
    total = 0
    deepest = max(counts) if counts else 1
    chosen = deepest
    for d in range(1, deepest + 1):
        total += counts.get(d, 0)
        if total >= 8:
            chosen = d
            break
    if chosen in containers and chosen < deepest:
        chosen += 1
    return min(chosen, MAX_AUTO_DEPTH)


def qualified_names(
    roots: list[Any], depth: Optional[int], tree: Optional[dict[str, tuple[int, str, str]]] = None
) -> dict[int, tuple[Any, str]]:
    """id(module) -> (module, qualified name) for every module to hook.

    A single model keeps `named_modules()` names; with several roots (a GAN's
    generator and discriminator) each name is prefixed by its root's class,
    numbered when two roots share one. Roots without submodules (loss
    modules) are left out: their forward is already a phase of its own.
    `tree` gets, per name, (depth below its root, parent's name, class) for
    the table; a compiled region shows as one module whose class reads
    `Model (compiled)`."""
    trees = [r for r in roots if compiled_inner(r) is not None or any(True for _ in r.children())]
    out: dict[int, tuple[Any, str]] = {}
    seen_labels: dict[str, int] = {}
    for root in trees:
        inner = compiled_inner(root)
        label = ""
        if len(trees) > 1:
            base = type(inner if inner is not None else root).__name__
            k = seen_labels.get(base, 0)
            seen_labels[base] = k + 1
            label = base if k == 0 else f"{base}#{k}"
        if inner is not None or compiled_in_place(root):
            # Opaque: the root alone (a hook on the wrapper runs outside the
            # graph; nothing is registered on a module compiled in place).
            if inner is not None:
                qual = label or type(inner).__name__
                out[id(root)] = (root, qual)
                if tree is not None:
                    tree[qual] = (0, "", f"{type(inner).__name__} (compiled)")
            elif tree is not None:
                qual = label or type(root).__name__
                tree[qual] = (0, "", f"{type(root).__name__} (compiled in place)")
            continue
        limit = depth if depth is not None else auto_depth(root)
        opaque: list[str] = []
        root_qual = label or type(root).__name__
        for name, module in root.named_modules():
            d = name.count(".") + 1 if name else 0
            if d > limit or id(module) in out:
                continue
            if any(name.startswith(p + ".") for p in opaque):
                continue  # inside a compiled region
            wrapped = compiled_inner(module)
            if wrapped is not None or compiled_in_place(module):
                opaque.append(name)
            if compiled_in_place(module):
                continue
            qual = root_qual if not name else (f"{label}.{name}" if label else name)
            out[id(module)] = (module, qual)
            if tree is not None:
                # (depth below its root, parent's qualified name, class,
                # the shapes of its parameters: siblings of one class are
                # alike only when these match, analysis/modules.py).
                parent = name.rsplit(".", 1)[0] if "." in name else ""
                parent_qual = (f"{label}.{parent}" if label else parent) if parent else root_qual
                kind = type(wrapped if wrapped is not None else module).__name__
                if wrapped is not None:
                    kind += " (compiled)"
                tree[qual] = (d, parent_qual if name else "", kind, parameter_shapes(module))
    return out


def parameter_shapes(module: Any) -> str:
    """A module's parameters' shapes, `64x256,256`: what tells a Linear
    64->256 from a Linear 256->10."""
    try:
        return ",".join("x".join(str(n) for n in p.shape) for p in module.parameters())
    except Exception:
        return ""


class ModuleRanges:
    def __init__(self, torch: Any, depth: Optional[int], nvtx_domain: Any = None,
                 record: bool = True, state: Any = None) -> None:
        self.depth = depth
        self.record = record
        # The hooks' state: `backward` > 0 while a backward runs.
        self._state = state
        self._enter, self._exit = range_api(torch)
        self._domain = nvtx_domain
        self._handles: list[Any] = []
        self._names: dict[int, str] = {}
        self._attrs: dict[int, Any] = {}
        self._recompute_attrs: dict[int, Any] = {}
        self._open: list[tuple[Any, bool]] = []
        self.calls = 0  # hook calls, for the test that no hook runs outside
        self.tree: dict[str, tuple[int, str, str]] = {}

    @property
    def attached(self) -> bool:
        return bool(self._handles)

    def attach(self, roots: list[Any]) -> int:
        targets = qualified_names(roots, self.depth, self.tree)
        for key, (module, name) in targets.items():
            self._names[key] = name
            if self._domain is not None:
                self._attrs[key] = self._domain.get_event_attributes(message=name)
                self._recompute_attrs[key] = self._domain.get_event_attributes(
                    message="recompute: " + name)
            self._handles.append(module.register_forward_pre_hook(self._pre))
            self._handles.append(module.register_forward_hook(self._post, always_call=True))
        return len(targets)

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        while self._open:
            self._close()

    def _pre(self, module: Any, args: Any) -> None:
        self.calls += 1
        key = id(module)
        name = self._names.get(key)
        if name is None:
            return
        recompute = self._state is not None and self._state.backward > 0
        prefix = RECOMPUTE_PREFIX if recompute else MODULE_PREFIX
        handle = self._enter(prefix + name) if self.record else None
        pushed = False
        if self._domain is not None:
            self._domain.push_range((self._recompute_attrs if recompute else self._attrs)[key])
            pushed = True
        self._open.append((handle, pushed))

    def _post(self, module: Any, args: Any, output: Any) -> None:
        self.calls += 1
        if id(module) in self._names and self._open:
            self._close()

    def _close(self) -> None:
        handle, pushed = self._open.pop()
        if handle is not None:
            self._exit(handle)
        if pushed:
            self._domain.pop_range()


#: torch's data-parallel wrappers, by class name: each runs collectives
#: inside the phases perfrun times (DistributedDataParallel all-reduces the
#: gradients in Backward; FSDP gathers the parameters in Forward and
#: reduces the gradients in Backward).
PARALLEL_WRAPPERS = ("DistributedDataParallel", "FullyShardedDataParallel", "FSDPModule")


def parallel_wrappers(module: Any) -> list[str]:
    """The torch data-parallel wrappers `module` is (its class or a base of
    it: a subclass of DDP all-reduces as DDP does), also through a
    `torch.compile` wrapper, by name. Read from the classes' names, so that
    nothing of torch.distributed is imported for it."""
    found = []
    for each in (module, compiled_inner(module)):
        if each is None:
            continue
        for klass in type(each).__mro__:
            if (klass.__name__ in PARALLEL_WRAPPERS
                    and str(getattr(klass, "__module__", "")).startswith("torch.")):
                found.append(klass.__name__)
    return found


def process_group() -> tuple[Optional[int], Optional[str]]:
    """The default process group's size and backend, or (None, None) when
    none is initialised (or the script never imported torch.distributed)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None, None
    return int(dist.get_world_size()), str(dist.get_backend())


class RootTracker:
    """The outermost modules the script calls (weakly held), in order, and
    what torch.distributed was when each was first called (`distributed`,
    the rank file's section): the analysis must know whether a rank's
    Backward holds collectives (DDP's all-reduce) to read its phases. A
    root is first called after the script has set its process group up
    (DDP cannot be built before), and looked at once, off the steps' hot
    path."""

    def __init__(self) -> None:
        # Read directly by the forward hook: one membership test per call.
        self.ids: dict[int, Any] = {}
        self.distributed: Optional[dict[str, Any]] = None

    def see(self, module: Any) -> None:
        key = id(module)
        if key not in self.ids:
            try:
                self.ids[key] = weakref.ref(module)
            except TypeError:
                self.ids[key] = lambda: None
            self._see_distributed(module)

    def _see_distributed(self, module: Any) -> None:
        """Add what `module` and the process group say now: wrappers add
        up, and a process group once seen stays (the script may destroy it
        before its last call). A new record each time: the flush thread may
        be writing the last one."""
        last = self.distributed or {"world_size": None, "backend": None, "wrappers": []}
        world_size, backend = process_group()
        if world_size is None:
            world_size, backend = last["world_size"], last["backend"]
        self.distributed = {
            "world_size": world_size,
            "backend": backend,
            "wrappers": sorted(set(last["wrappers"]) | set(parallel_wrappers(module))),
        }

    def alive(self) -> list[Any]:
        out = []
        for ref in self.ids.values():
            module = ref()
            if module is not None:
                out.append(module)
        return out
