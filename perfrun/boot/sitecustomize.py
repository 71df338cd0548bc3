"""perfrun's bootstrap, injected first on PYTHONPATH of the profiled process.

Kept tiny and defensive: it imports nothing heavy, never raises, and does
nothing in processes that are not ranks (DataLoader workers, compile workers,
the torchrun agent, any other `python` the script starts). In a rank it
restores the environment `python script.py` would have given the script
(PYTHONPATH, sys.path) and starts perfrun's agent. Either way it then runs
the `sitecustomize` it shadows, exactly as `site` would have.
"""

import os
import sys


def _is_rank(payload):
    launcher = payload.get("launcher")
    if launcher == "torchrun":
        # torchrun's own agent process has no LOCAL_RANK; its workers do.
        return "LOCAL_RANK" in os.environ and "TORCHELASTIC_RUN_ID" in os.environ
    if launcher == "command":
        # perfrun in front of a launcher's command: its processes that run
        # the script are the ranks, the launcher's own (accelerate's,
        # deepspeed's, a torch elastic agent) are not.
        return _runs(payload.get("rank_target") or {})
    return True


def _runs(target):
    """Whether this interpreter runs `target` (a script's real path, or a
    module's name). sys.argv is set before site runs: the script as given,
    or ['-m', ...] with the module's name in sys.orig_argv."""
    argv = sys.argv
    if not argv:
        return False
    if "script" in target:
        first = argv[0]
        return first not in ("", "-c", "-m") and os.path.realpath(first) == target["script"]
    orig = getattr(sys, "orig_argv", None) or []
    if argv[0] != "-m" or "-m" not in orig:
        return False
    at = orig.index("-m")
    return orig[at + 1 : at + 2] == [target.get("module")]


def _restore_environment(payload, here):
    # Children of this rank (spawned DataLoader workers, subprocesses) must
    # see neither our variable nor our folder: they are not ranks.
    os.environ.pop("PERFRUN_SETTINGS", None)
    original = payload.get("pythonpath")
    if original is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = original
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]


def _start():
    # The path of the file the launcher wrote the settings to: the settings
    # themselves hold the script's arguments, of any length, and a variable
    # of the environment holds at most 128 KiB.
    path = os.environ.get("PERFRUN_SETTINGS")
    if not path:
        return
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        import json

        with open(path, encoding="utf-8") as f:
            payload = json.load(f)
        if "descendant" in payload:
            # A process of a cluster the script started (a Ray worker): no
            # rank; what it trains is counted for the rank's report.
            sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
            _runtime(payload, "children").watch_descendant(payload["descendant"])
            return
        if not _is_rank(payload):
            return
        _restore_environment(payload, here)
        _runtime(payload, "lite").boot(payload)
    except Exception as exc:  # never break the user's interpreter
        try:
            sys.stderr.write(
                f"perfrun: profiling disabled in this process: {type(exc).__name__}: {exc}\n"
            )
        except Exception:
            pass


def _runtime(payload, name):
    """perfrun.runtime.NAME, from where the launcher's perfrun is when this
    python has none of its own."""
    import importlib

    try:
        return importlib.import_module("perfrun.runtime." + name)
    except ImportError:
        root = payload.get("package_root")
        if not root:
            raise
        sys.path.append(root)
        # The script's children will not find perfrun on their path.
        payload["package_root_used"] = True
        return importlib.import_module("perfrun.runtime." + name)


def _chain():
    """Run the sitecustomize this file shadows, with site's own error rules."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        import importlib.machinery
        import importlib.util

        rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
        if spec is None or spec.loader is None:
            return
        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)
    except ImportError as exc:
        if exc.name == "sitecustomize":
            return
        _site_error(exc)
    except Exception as exc:
        _site_error(exc)


def _site_error(err):
    # What site.execsitecustomize prints for a failing sitecustomize.
    if sys.flags.verbose:
        sys.excepthook(*sys.exc_info())
    else:
        sys.stderr.write(
            "Error in sitecustomize; set PYTHONVERBOSE for traceback:\n"
            f"{err.__class__.__name__}: {err}\n"
        )


_start()
_chain()
