"""The type checker over the package: strict on the store, the errors, the
exit codes and the API (what a program that imports perfrun meets, and the
formats every part reads), and a ratchet on the rest.

`py.typed` ships, so a user's type checker reads these annotations. The
strict set must have no error at all; every other file may have at most
the errors tests/typing_ratchet.json records for it, so the count only
falls. After fixing some, write the record again:
PERFRUN_UPDATE_EXPECTED=1 pytest tests/test_typing.py
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
RATCHET = Path(__file__).parent / "typing_ratchet.json"
UPDATE_EXPECTED = os.environ.get("PERFRUN_UPDATE_EXPECTED") == "1"
#: Checked with --strict: no error allowed.
STRICT = ["perfrun/store", "perfrun/errors.py", "perfrun/exitcodes.py", "perfrun/api.py"]


def mypy(*args: str, cache: Path) -> list[str]:
    """mypy's error lines over `args`, run from the repository root."""
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--ignore-missing-imports", "--no-error-summary",
         "--cache-dir", str(cache), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    return [line for line in proc.stdout.splitlines() if ": error: " in line]


def test_the_strict_set_has_no_type_error(tmp_path: Path) -> None:
    errors = mypy("--strict", "--follow-imports=silent", *STRICT, cache=tmp_path / "cache")
    assert errors == []


def test_no_file_has_more_type_errors_than_recorded(tmp_path: Path) -> None:
    errors = mypy("perfrun", cache=tmp_path / "cache")
    counts = Counter(re.match(r"([^:]+):", line).group(1) for line in errors)  # type: ignore[union-attr]
    if UPDATE_EXPECTED:
        RATCHET.write_text(json.dumps(dict(sorted(counts.items())), indent=2) + "\n")
    recorded = json.loads(RATCHET.read_text())
    grown = {path: (n, recorded.get(path, 0)) for path, n in counts.items()
             if n > recorded.get(path, 0)}
    shown = "\n".join(line for line in errors if line.split(":", 1)[0] in grown)
    assert not grown, f"more type errors than recorded (now, recorded): {grown}\n{shown}"
