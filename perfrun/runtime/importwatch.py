"""Post-import hooks: a callback the moment a module has been imported,
before the importer gets it. The boot waits so for torch (lite.py), and
the agent for the experiment trackers (trackers.py): perfrun loads
nothing, and pays nothing, for a module the script never imports.

A module is often looked for long before it is imported, and looked for
without being imported at all: Hugging Face's libraries (transformers,
datasets, evaluate, accelerate, huggingface_hub) call
`importlib.util.find_spec("torch")` at their own import to learn whether
torch is there, and import it later, lazily. Each lookup makes a new
spec with a new loader, and only the spec of the real import is ever
executed. So the watcher hooks every spec it is asked for and stays in
`sys.meta_path` until one of them has run the module: leaving at the
first lookup (as it once did) missed the import itself, and with it the
whole run.

Standard library only: the boot imports this module before the script.
"""

from __future__ import annotations

import sys
from typing import Any, Callable


class ImportWatcher:
    """A meta path finder that runs a callback right after the module
    named `name` finishes executing (a post-import hook). Once: it leaves
    sys.meta_path when the module has run, and only then."""

    def __init__(self, callback: Callable[[Any], None], name: str) -> None:
        self.callback = callback
        self.name = name
        #: The module has run and the callback was called.
        self.fired = False

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != self.name or self.fired:
            return None
        spec = None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        own = getattr(loader, "__dict__", None)
        if not isinstance(own, dict) or "exec_module" in own:
            # Hooked already (a finder that hands out one loader for every
            # lookup), or a loader that is a class or has no instance
            # attributes: its method is not ours to set.
            return spec
        original = loader.exec_module

        def exec_module(module: Any) -> None:
            try:
                original(module)
            finally:
                # The loader is the module's __loader__ from now on: its
                # own method back, whatever the import did.
                try:
                    del loader.exec_module
                except AttributeError:
                    pass
            self._ran(module)

        loader.exec_module = exec_module
        return spec

    def _ran(self, module: Any) -> None:
        """The module has executed: leave the import system, then call
        back. Never twice, should two specs of it both run."""
        if self.fired:
            return
        self.fired = True
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        self.callback(module)
