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
    if payload.get("launcher") == "torchrun":
        # torchrun's own agent process has no LOCAL_RANK; its workers do.
        return "LOCAL_RANK" in os.environ and "TORCHELASTIC_RUN_ID" in os.environ
    return True


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
        if not _is_rank(payload):
            return
        _restore_environment(payload, here)
        try:
            from perfrun.runtime import lite
        except ImportError:
            root = payload.get("package_root")
            if not root:
                raise
            sys.path.append(root)
            # The script's children will not find perfrun on their path.
            payload["package_root_used"] = True
            from perfrun.runtime import lite
        lite.boot(payload)
    except Exception as exc:  # never break the user's interpreter
        try:
            sys.stderr.write(
                f"perfrun: profiling disabled in this process: {type(exc).__name__}: {exc}\n"
            )
        except Exception:
            pass


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
