"""Post-import hooks: a callback the moment a module has been imported,
before the importer gets it. The boot waits so for torch (lite.py), and
the agent for the experiment trackers (trackers.py): perfrun loads
nothing, and pays nothing, for a module the script never imports.

Standard library only: the boot imports this module before the script.
"""

from __future__ import annotations

import sys
from typing import Any, Callable


class ImportWatcher:
    """A meta path finder that runs a callback right after the module
    named `name` finishes executing (a post-import hook). Once: it leaves
    sys.meta_path as it hooks the module's loader."""

    def __init__(self, callback: Callable[[Any], None], name: str) -> None:
        self.callback = callback
        self.name = name

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != self.name:
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
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        loader = spec.loader
        original = loader.exec_module
        callback = self.callback

        def exec_module(module: Any) -> None:
            original(module)
            callback(module)

        loader.exec_module = exec_module
        return spec
