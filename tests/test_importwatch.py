"""The post-import hook (runtime/importwatch.py) however a module is
imported: looked up first and imported later (what Hugging Face's
libraries do to torch, and transformers to the trackers), by
`importlib.import_module`, from a thread, inside a function, or looked up
and never imported. In-process, on a module written to a temporary folder."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from perfrun.runtime.importwatch import ImportWatcher


@pytest.fixture
def watched(tmp_path: Path) -> Iterator[tuple[str, list[Any], ImportWatcher]]:
    """A fresh module `perfrun_watched_N` on sys.path, a watcher for it at
    the front of sys.meta_path, and the list its callback fills."""
    name = f"perfrun_watched_{abs(hash(tmp_path)) % 10**8}"
    (tmp_path / f"{name}.py").write_text("VALUE = 42\n")
    sys.path.insert(0, str(tmp_path))
    seen: list[Any] = []
    watcher = ImportWatcher(seen.append, name)
    sys.meta_path.insert(0, watcher)
    try:
        yield name, seen, watcher
    finally:
        sys.path.remove(str(tmp_path))
        if watcher in sys.meta_path:
            sys.meta_path.remove(watcher)
        sys.modules.pop(name, None)


def test_a_lookup_before_the_import_does_not_lose_the_import(watched: Any) -> None:
    name, seen, watcher = watched
    # What datasets, evaluate and transformers do at their own import.
    assert importlib.util.find_spec(name) is not None
    assert seen == [] and watcher in sys.meta_path
    module = importlib.import_module(name)
    assert seen == [module] and module.VALUE == 42
    assert watcher not in sys.meta_path


def test_a_lookup_alone_calls_nothing_and_changes_nothing(watched: Any) -> None:
    name, seen, watcher = watched
    for _ in range(3):
        assert importlib.util.find_spec(name) is not None
    assert seen == [] and watcher in sys.meta_path and name not in sys.modules


def test_an_import_in_a_thread_or_a_function_is_seen_once(watched: Any) -> None:
    name, seen, _ = watched

    def load() -> None:
        importlib.import_module(name)

    thread = threading.Thread(target=load)
    thread.start()
    thread.join()
    load()
    assert seen == [sys.modules[name]]


def test_the_loader_is_its_own_again_after_the_import(watched: Any) -> None:
    name, _, _ = watched
    module = importlib.import_module(name)
    loader = module.__spec__.loader
    assert "exec_module" not in vars(loader)
    # A reload runs the module again through its own loader, not the hook.
    importlib.reload(module)


def test_an_import_that_fails_is_watched_again(watched: Any, tmp_path: Path) -> None:
    name, seen, watcher = watched
    path = tmp_path / f"{name}.py"
    path.write_text("raise RuntimeError('not yet')\n")
    importlib.invalidate_caches()
    with pytest.raises(RuntimeError):
        importlib.import_module(name)
    assert seen == [] and watcher in sys.meta_path
    path.write_text("VALUE = 7\n")
    importlib.invalidate_caches()
    sys.modules.pop(name, None)
    assert importlib.import_module(name).VALUE == 7
    assert len(seen) == 1
