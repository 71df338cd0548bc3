"""`perfrun report` while the run is still going: a rank whose file says
`running` and whose process is alive on this machine is in progress, not
dead."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.slow


def test_a_report_of_a_run_in_progress_says_so(tmp_path: Any, capsys: Any) -> None:
    """A `running` rank whose process is alive on this machine is a run in
    progress (`perfrun report` during the run), not a rank that died."""
    import json as _json
    import socket
    import subprocess
    import sys

    from builders import make_rank, make_rows

    from perfrun import cli

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        rank = make_rank(make_rows([{"forward": 0.01}] * 5), status="running",
                         hostname=socket.gethostname())
        data = dict(rank.data)
        data["env"] = {**data["env"], "pid": sleeper.pid}
        data["steps"] = {"columns": list(rank.data.get("columns") or []), "rows": rank.rows}
        from perfrun.store.stepfile import STEP_COLUMNS

        data["steps"]["columns"] = list(STEP_COLUMNS)
        (tmp_path / "rank0.json").write_text(_json.dumps(data))
        cli.main(["report", str(tmp_path)])
        out = capsys.readouterr().out
        # Wrapped at 80 columns in a pipe: read as the words it says.
        assert ("Running: rank 0 is still running (5 steps so far): this report is of its "
                "last save") in " ".join(out.split()), out
        assert "Ranks with problems" not in out and "died" not in out
    finally:
        sleeper.kill()
        sleeper.wait()
    cli.main(["report", str(tmp_path)])
    out = capsys.readouterr().out
    assert "rank 0: died after 5 steps" in out, out
