"""Reading and writing perfrun's files safely: whole or not at all.

A rank rewrites its document every few seconds while `perfrun watch` and
`perfrun status` read it, and a run can be killed at any moment, so every
document is written to a temporary file and renamed into place. Every way a
file can fail to be read (missing, a folder, not UTF-8, not JSON, nested too
deeply) ends here as one `ResultsError` line, so no reader has to know them.

Standard library only: the rank imports this module at start.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from typing import Any, Optional

from ..errors import PerfrunError
from .schema import shown

#: ResultsError kinds: what the command line turns into an exit code.
MISSING = "missing"
DAMAGED = "damaged"


class ResultsError(PerfrunError):
    """Results cannot be read; the message is one line for the user.

    `kind` says why, for callers that act on it: MISSING (no such file or
    folder: for a CI gate, no measurement was ever made) or DAMAGED (it
    exists but is not perfrun's, is of an unknown version, or is broken)."""

    slug = "results"

    def __init__(self, message: str, kind: str = DAMAGED) -> None:
        super().__init__(message)
        self.kind = kind


_COUNTER = 0


def atomic_write_text(path: str, text: str, *, durable: bool = False,
                      mode: Optional[int] = None) -> None:
    """Write via a temporary file and `os.replace`, so a reader (or a crash)
    never sees half a file. `durable` adds an fsync, kept for the final write:
    periodic flushes only need to survive the process, not the machine.
    `mode`: the permissions the file gets (those of the file it replaces).
    For perfrun's own files; a path the user named goes through
    write_named_file, which never renames over what is not a file."""
    directory = os.path.dirname(os.path.abspath(path))
    global _COUNTER
    _COUNTER += 1
    tmp = os.path.join(directory, f".tmp-{os.getpid()}-{_COUNTER}-{os.path.basename(path)}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            if durable:
                f.flush()
                os.fsync(f.fileno())
            if mode is not None:
                os.fchmod(f.fileno(), mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


#: Paths that name one of this process's open descriptors: written to that
#: descriptor, as a shell's `> /dev/stdout` does, never opened anew (which
#: would truncate the file a redirected stdout was writing) nor replaced.
_DESCRIPTOR_PATHS = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}


def _descriptor(path: str) -> Optional[int]:
    """The descriptor a path like /dev/stdout, /dev/fd/3 or
    /proc/self/fd/3 names, or None."""
    if path in _DESCRIPTOR_PATHS:
        return _DESCRIPTOR_PATHS[path]
    for prefix in ("/dev/fd/", "/proc/self/fd/", f"/proc/{os.getpid()}/fd/"):
        if path.startswith(prefix) and path[len(prefix):].isdigit():
            return int(path[len(prefix):])
    return None


def write_named_file(path: str, text: str) -> None:
    """Write a file the user named (`--output`, `--save-baseline`) without
    ever putting something else in place of what is there:

    * /dev/stdout, /dev/stderr, /dev/fd/N: written to that descriptor;
    * a path that exists and is no regular file (a device such as
      /dev/null, a FIFO, a socket): opened and written, as `> path` would;
    * a symlink: written through, the file it points to replaced in its
      own folder (atomically) and the link left as it is;
    * a file with other names (hard links): written in place;
    * a regular file or a new path: atomically (atomic_write_text), the
      file's permissions kept.

    Never a rename over anything but a regular file. Raises OSError."""
    fd = _descriptor(os.path.abspath(path))
    if fd is not None:
        data = text.encode("utf-8")
        while data:
            data = data[os.write(fd, data):]
        return
    try:
        st: Optional[os.stat_result] = os.stat(path)  # through any link
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
    if st is not None and (not stat.S_ISREG(st.st_mode) or st.st_nlink > 1):
        # Not a file to replace: a device or a FIFO, or a file with other
        # names (hard links) that a rename would leave with the old text.
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return
    atomic_write_text(os.path.realpath(path), text,
                      mode=stat.S_IMODE(st.st_mode) if st is not None else None)


#: Errors that say the disk, or the space this process may use of it, is
#: full: a reserve is no help against these at the start, and a reader of
#: a save that failed with one is told the disk was full.
FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def full_reason(code: Optional[int], strerror: Optional[str] = None) -> str:
    """A failed save's reason in a few words: "disk full" and the like for
    FULL, else the system's own words."""
    if code == errno.ENOSPC:
        return "disk full"
    if code == errno.EDQUOT:
        return "disk quota exceeded"
    if code == errno.EFBIG:
        return "file size limit reached"
    return strerror or (os.strerror(code) if code else "could not write")


class Reserve:
    """Disk space held back for one writer's last save.

    A disk that fills during the run (a checkpoint, another job, perfrun's
    own traces) must not cost the record of how the run ended and how far
    its results got: the writer holds a file of `size` bytes from its
    start and deletes it just before its final save, which then has that
    room. Best effort: where the space cannot be set aside (a disk full
    already, a file system that does not allocate), there is no reserve
    and nothing else changes. A disk too full for `size` bytes may still
    have `least` (a disk nearly full from the start): enough for a last
    record without its steps, which says how many steps were not saved."""

    def __init__(self, path: str, size: int, least: Optional[int] = None) -> None:
        self.path: Optional[str] = None
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        except OSError:
            return
        sizes = [size] + ([least] if least is not None and 0 < least < size else [])
        try:
            for n in sizes:
                try:
                    _hold(fd, n)
                    self.path = path
                    break
                except OSError as exc:
                    if exc.errno not in FULL:
                        break
                    os.ftruncate(fd, 0)
        except OSError:
            pass
        finally:
            os.close(fd)
        if self.path is None:
            _unlink(path)

    def release(self) -> None:
        """Give the space back (before the final save, or at the end)."""
        path, self.path = self.path, None
        if path is not None:
            _unlink(path)


def _hold(fd: int, size: int) -> None:
    """Allocate `size` bytes to the file (zeros written where the file
    system has no fallocate)."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in FULL:
            raise
        _write_zeros(fd, size)  # no fallocate on this file system
    except AttributeError:
        _write_zeros(fd, size)


def _write_zeros(fd: int, size: int) -> None:
    block = bytes(min(size, 1 << 16))
    left = size
    while left > 0:
        left -= os.write(fd, block[:left])


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def load_json(path: str, missing: str = "cannot read {path}: no such file") -> Any:
    """A JSON file's content, or a one-line ResultsError (results files and
    baselines are read the same way). `missing` is the message for a file
    that does not exist (kind MISSING)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise ResultsError(missing.format(path=path), MISSING) from None
    except IsADirectoryError:
        raise ResultsError(f"cannot read {path}: it is a folder") from None
    except OSError as exc:
        raise ResultsError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ResultsError(
            f"cannot read {path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} "
            f"at offset {exc.start}); perfrun writes its results as UTF-8 JSON"
        ) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ResultsError(
            f"{path} is not valid JSON (truncated or corrupt at line {exc.lineno}, "
            f"column {exc.colno})"
        ) from None
    except RecursionError:
        raise ResultsError(f"cannot read {path}: JSON nested too deeply") from None
    except ValueError as exc:  # e.g. an integer past Python's digit limit
        raise ResultsError(f"cannot read {path}: {shown(str(exc))}") from None
