"""Files the user names (`--output`, `--save-baseline`) are written without
putting anything else in place of what is there (store/files.py,
write_named_file): a device node, a FIFO and /dev/stdout are written to,
a symlink is written through, a file keeps its permissions and its other
names. Real device nodes (mknod, in a temporary folder: never the
system's), FIFOs, symlinks and hard links; `perfrun report --output`
through the command line in-process."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from test_stepfile import ROWS, write_v2

from perfrun import cli
from perfrun.exitcodes import ExitCode
from perfrun.store.files import write_named_file


def _null_device(path: Path) -> None:
    """A character device like /dev/null (1, 3), made in `path`."""
    if os.geteuid() != 0:
        pytest.skip("mknod needs root")
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))


def test_a_device_node_is_written_to_and_stays_a_device(tmp_path: Path) -> None:
    device = tmp_path / "null"
    _null_device(device)
    write_named_file(str(device), "the report\n")
    assert stat.S_ISCHR(os.stat(device).st_mode)
    assert os.major(os.stat(device).st_rdev) == 1 and device.read_text() == ""
    assert sorted(os.listdir(tmp_path)) == ["null"]  # no temporary file left


def test_a_fifo_gets_the_text_and_stays_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    write_named_file(str(fifo), "through the pipe\n")
    reader.join(10)
    assert got == ["through the pipe\n"] and stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_a_symlink_is_written_through(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "baseline.json").write_text("old")
    here = tmp_path / "here"
    here.mkdir()
    link = here / "baseline.json"
    link.symlink_to(shared / "baseline.json")
    write_named_file(str(link), "new")
    assert link.is_symlink() and (shared / "baseline.json").read_text() == "new"
    assert os.listdir(here) == ["baseline.json"]
    # A link to a file not there yet: the file is made where it points.
    dangling = here / "later.json"
    dangling.symlink_to(shared / "later.json")
    write_named_file(str(dangling), "made")
    assert dangling.is_symlink() and (shared / "later.json").read_text() == "made"


def test_a_file_keeps_its_permissions_and_its_other_names(tmp_path: Path) -> None:
    private = tmp_path / "report.txt"
    private.write_text("old")
    private.chmod(0o600)
    write_named_file(str(private), "new")
    assert private.read_text() == "new" and stat.S_IMODE(private.stat().st_mode) == 0o600
    other = tmp_path / "other-name.txt"
    os.link(private, other)
    write_named_file(str(private), "both")
    assert other.read_text() == "both"
    with pytest.raises(IsADirectoryError):
        write_named_file(str(tmp_path), "no")


def test_dev_stdout_is_this_process_standard_output(tmp_path: Path) -> None:
    """Redirected to a file, or a pipe: the text lands there, after what
    the process wrote before, and the file is not replaced."""
    code = ("import sys; print('before', flush=True); "
            "from perfrun.store.files import write_named_file; "
            "write_named_file('/dev/stdout', 'the report\\n'); print('after')")
    piped = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True)
    assert piped.stdout == "before\nthe report\nafter\n"
    out = tmp_path / "out.txt"
    with open(out, "w") as f:
        inode = os.fstat(f.fileno()).st_ino
        subprocess.run([sys.executable, "-c", code], stdout=f, check=True)
    assert out.read_text() == "before\nthe report\nafter\n" and out.stat().st_ino == inode


def test_report_output_to_a_device_or_through_a_link(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    run.mkdir()
    write_v2(run, ROWS)
    device = tmp_path / "null"
    _null_device(device)
    assert cli.main(["report", str(run), "--output", str(device)]) == ExitCode.OK
    assert stat.S_ISCHR(os.stat(device).st_mode)
    target = tmp_path / "elsewhere" / "report.md"
    target.parent.mkdir()
    link = tmp_path / "report.md"
    link.symlink_to(target)
    assert cli.main(["report", str(run), "--format", "markdown", "--output",
                     str(link)]) == ExitCode.OK
    assert link.is_symlink() and "Perf Summary" in target.read_text()
    capsys.readouterr()
