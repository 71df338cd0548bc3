"""torch.distributed.run, with a record of how each failed rank ended.

torchrun exits 1 whatever a rank did, so perfrun cannot tell from its status
that a rank was killed by a signal. perfrun launches `python -m
perfrun.launcher.torchrun ARGS` instead of `python -m torch.distributed.run ARGS`: the
same agent, the same output, and when a worker fails, the failures torchrun
itself collected (rank, exit status; negative for a signal) are written to
the file named by PERFRUN_TORCHRUN_STATUS before the error goes on as usual.
This runs in the torchrun agent process, never in perfrun's launcher.

It also leaves the agent's pid for the workers (their bootstrap ties each
worker's life to the agent's, as perfrun ties the agent's to its own), and
checks torchrun's node arguments for perfrun's launcher before anything
starts (`argument_problem`).
"""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

from perfrun.runtime.lifeline import AGENT_PID_VAR
from perfrun.store.runmeta import write_torchrun_status

#: The variable naming where the failures are recorded, set by the launcher.
TORCHRUN_STATUS_VAR = "PERFRUN_TORCHRUN_STATUS"


def _positive(text: str) -> Optional[int]:
    text = text.strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


def argument_problem(
    nproc_per_node: Any = None,
    nnodes: Any = None,
    node_rank: Any = None,
    master_port: Any = None,
) -> Optional[str]:
    """What is wrong with torchrun's node arguments, in one line, or None.
    torchrun itself finds these only after it started, with a traceback."""
    if nproc_per_node is not None and (not isinstance(nproc_per_node, int) or nproc_per_node < 1):
        return f"--nproc-per-node must be at least 1, not {nproc_per_node}"
    if master_port is not None and (
        not isinstance(master_port, int) or not 1 <= master_port <= 65535
    ):
        return f"--master-port must be a port number from 1 to 65535, not {master_port}"
    fixed: Optional[int] = None
    if nnodes is not None:
        text = str(nnodes)
        parts = text.split(":")
        numbers = [_positive(p) for p in parts]
        if len(parts) > 2 or None in numbers:
            return (f"--nnodes takes N or MIN:MAX, positive whole numbers, "
                    f"not {text!r}")
        if len(numbers) == 2 and numbers[0] > numbers[1]:  # type: ignore[operator]
            return f"--nnodes {text}: MIN must not be greater than MAX"
        if len(numbers) == 1 or numbers[0] == numbers[1]:
            fixed = numbers[0]
    if node_rank is not None:
        if not isinstance(node_rank, int) or node_rank < 0:
            return f"--node-rank cannot be negative ({node_rank})"
        if fixed is not None and node_rank >= fixed:
            return (f"--node-rank {node_rank} is not a node of --nnodes {nnodes} "
                    f"(node ranks run from 0 to {fixed - 1})")
    return None


def main() -> None:
    # Popped, so the workers this agent starts do not inherit it.
    path = os.environ.pop(TORCHRUN_STATUS_VAR, None)
    os.environ[AGENT_PID_VAR] = str(os.getpid())
    # torch only here: the launcher imports this module for argument_problem.
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    try:
        torchrun_main()
    except ChildFailedError as exc:
        if path:
            try:
                first_rank, _ = exc.get_first_failure()
                failures = {
                    str(rank): {"exitcode": f.exitcode, "local_rank": f.local_rank, "pid": f.pid}
                    for rank, f in exc.failures.items()
                }
                write_torchrun_status(path, str(first_rank), failures)
            except Exception as error:  # the status is a bonus; torchrun's error is not
                sys.stderr.write(f"perfrun: could not record the ranks' status: {error}\n")
        raise


if __name__ == "__main__":
    main()
