"""torch.distributed.run, with a record of how each failed rank ended.

torchrun exits 1 whatever a rank did, so perfrun cannot tell from its status
that a rank was killed by a signal. perfrun launches `python -m
perfrun.torchrun ARGS` instead of `python -m torch.distributed.run ARGS`: the
same agent, the same output, and when a worker fails, the failures torchrun
itself collected (rank, exit status; negative for a signal) are written to
the file named by PERFRUN_TORCHRUN_STATUS before the error goes on as usual.
This runs in the torchrun agent process, never in perfrun's launcher.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    # Popped, so the workers this agent starts do not inherit it.
    path = os.environ.pop("PERFRUN_TORCHRUN_STATUS", None)
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
                tmp = f"{path}.tmp{os.getpid()}"
                with open(tmp, "w", encoding="utf-8") as out:
                    json.dump({"first": str(first_rank), "failures": failures}, out)
                os.replace(tmp, path)
            except Exception as error:  # the status is a bonus; torchrun's error is not
                sys.stderr.write(f"perfrun: could not record the ranks' status: {error}\n")
        raise


if __name__ == "__main__":
    main()
