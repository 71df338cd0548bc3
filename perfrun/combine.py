"""`perfrun combine`: the run folders of one multi-node job, copied from its
nodes, merged into one folder that `perfrun report` reads as the whole job.

A job's nodes share one run folder only where `--log-dir` is on a shared
filesystem (perfrun/launcher/job.py). Elsewhere each node keeps its own ranks, and
the folders are gathered afterwards (CI artifacts, `scp`), as coverage.py
users gather `.coverage.*` files and `coverage combine` them.

What a rank left is every file whose name starts with its stem, `rank<R>.`
or `rank<R>.restart<K>.` (`rank0.json`, and whatever sits beside it with
that stem, such as a binary step file), plus its window trace
(`trace/<stem>.pt.trace.json[.gz]`) and its Nsight Systems report
(`nsys/rank<R>.*`). A rank's files are always taken together from one
folder, never half from each.

The same rank and restart in two folders (a shared folder copied from
every node, a folder given twice) is one rank: `choose_copy` keeps one, by
a rule stated in its docstring and printed. Folders of different jobs
(their job ids, scripts or world sizes differ) are refused: a report that
mixes two jobs' ranks would compare ranks that never ran together.

Deciders are pure functions over plain data (`RankCopy`, `FolderFacts`);
reading and copying are at the end.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from .errors import PerfrunError
from .exitcodes import ExitCode
from .store import layout
from .store.files import ResultsError
from .store.layout import RANK_STEM, RANK_SUBFOLDERS
from .store.rankfile import read_rank_file
from .store.results import not_a_run_folder
from .store.runmeta import (
    merge_node_metas,
    read_node_metas,
    read_run_meta,
    write_node_meta,
    write_run_meta,
)


class CombineError(PerfrunError):
    """A one-line reason the folders cannot be combined; `code` is the
    ExitCode to return."""

    slug = "combine"

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def stem_of(name: str) -> Optional[tuple[int, int]]:
    """(rank, restart) of a file named by a rank's stem, or None. Hidden
    files (a trace being written: `.rank0.raw.json`) and temporary files
    (`.tmp-...`) are no rank's."""
    m = RANK_STEM.match(name)
    if m is None:
        return None
    return int(m.group(1)), int(m.group(2) or 0)


@dataclass(frozen=True)
class RankCopy:
    """One folder's copy of one rank's results (one restart)."""

    folder: str
    rank: int
    restart: int
    #: The top-level file names of the stem.
    files: tuple[str, ...]
    #: A hash of those files' content: equal digests are identical copies.
    digest: str
    #: The rank wrote its final results (status other than "running").
    final: bool
    #: Steps in its results file.
    steps: int
    #: Bytes of its stem's other files (a binary step file grows with steps).
    extra_bytes: int
    elapsed: float


def choose_copy(copies: Sequence[RankCopy]) -> tuple[RankCopy, str]:
    """Which of several copies of one rank's results to keep, and why.

    In order: identical copies are one (the first given is kept); else the
    copy with final results over one that was still running when copied;
    else the one with more steps (its results file's rows, then the size of
    its other files); else the one that ran longer; else the first given.
    A later copy of a rank's file only ever adds steps, so the one with the
    most is the most recent."""
    first = copies[0]
    if len(copies) == 1:
        return first, "the only copy"
    if all(c.digest == first.digest for c in copies):
        return first, "identical copies"

    def key(c: RankCopy) -> tuple[bool, int, int, float]:
        return (c.final, c.steps, c.extra_bytes, c.elapsed)

    best = max(copies, key=key)  # max keeps the first of equals
    runner = max((c for c in copies if c is not best), key=key)
    if best.final != runner.final:
        why = "its final results (the other copy was still running)"
    elif best.steps != runner.steps:
        why = f"more steps ({best.steps} against {runner.steps})"
    elif best.extra_bytes != runner.extra_bytes:
        why = f"more step data ({best.extra_bytes} bytes against {runner.extra_bytes})"
    elif best.elapsed != runner.elapsed:
        why = f"ran longer ({best.elapsed:.1f} s against {runner.elapsed:.1f} s)"
    else:
        why = "the first given (the copies differ, but not in status, steps or length)"
    return best, why


@dataclass(frozen=True)
class FolderFacts:
    """What tells one job from another, as one folder records it."""

    folder: str
    #: The job's id (`--rdzv-id`, a scheduler's id, or the derived name).
    job_ids: frozenset[str] = field(default_factory=frozenset)
    #: The script's file name, or `-m MODULE`.
    scripts: frozenset[str] = field(default_factory=frozenset)
    world_sizes: frozenset[int] = field(default_factory=frozenset)
    #: For a run of one node (no job): which launch it was. Two copies of
    #: one run folder agree; two separate runs of one script do not.
    runs: frozenset[str] = field(default_factory=frozenset)


def mixed_jobs(folders: Sequence[FolderFacts]) -> Optional[str]:
    """Why these folders are not one job's, in one line, or None. A fact a
    folder does not record (an older perfrun's folder has no job id) is not
    held against it."""
    for what, get in (
        ("job ids", lambda f: f.job_ids),
        ("scripts", lambda f: f.scripts),
        ("world sizes", lambda f: f.world_sizes),
        ("runs of one node", lambda f: f.runs),
    ):
        seen: dict[Any, str] = {}
        for facts in folders:
            for value in sorted(get(facts), key=str):
                seen.setdefault(value, facts.folder)
        if len(seen) > 1:
            shown = ", ".join(f"{v!s} ({where})" for v, where in list(seen.items())[:3])
            return f"the folders are runs of different jobs: different {what}: {shown}"
    return None


def job_id_of(meta: dict[str, Any], settings: Sequence[dict[str, Any]]) -> Optional[str]:
    """A folder's job: run.json's job id, else the ranks' `--rdzv-id`, else
    the name perfrun derived for the job."""
    job = meta.get("job") if isinstance(meta.get("job"), dict) else {}
    if isinstance(job.get("id"), str):
        return job["id"]
    for s in settings:
        rid = s.get("rdzv_id")
        if isinstance(rid, str) and rid and rid != "none":
            return rid
    name = job.get("name")
    return name if isinstance(name, str) else None


def script_of(settings: dict[str, Any]) -> Optional[str]:
    """The script as the job ran it, by file name: nodes may hold the same
    script at different paths."""
    script, module = settings.get("script"), settings.get("module")
    if isinstance(script, str) and script:
        return os.path.basename(os.path.normpath(script))
    if isinstance(module, str) and module:
        return f"-m {module}"
    return None


def default_output(base: str, exists: Any) -> str:
    """`base`, or `base-2`, `base-3`, ...: the first that does not exist.
    A name perfrun picks never replaces a folder."""
    if not exists(base):
        return base
    k = 2
    while exists(f"{base}-{k}"):
        k += 1
    return f"{base}-{k}"


# -- reading the folders ------------------------------------------------------------


@dataclass
class Source:
    """One input folder as read."""

    path: str
    meta: dict[str, Any]
    copies: list[RankCopy]
    settings: list[dict[str, Any]]
    world_sizes: set[int]
    nodes: dict[str, dict[str, Any]]


def read_source(path: str) -> Source:
    """Read what `combine` needs of a run folder. Raises CombineError (66)
    when it holds no results or a rank file cannot be read."""
    if not os.path.isdir(path):
        raise CombineError(not_a_run_folder(path), ExitCode.BAD_RESULTS)
    try:
        meta = read_run_meta(path)
        names = sorted(os.listdir(path))
    except (ResultsError, OSError) as exc:
        raise CombineError(str(exc), ExitCode.BAD_RESULTS) from None
    stems: dict[tuple[int, int], list[str]] = {}
    for name in names:
        stem = stem_of(name)
        if stem is not None and os.path.isfile(os.path.join(path, name)):
            stems.setdefault(stem, []).append(name)
    copies: list[RankCopy] = []
    settings: list[dict[str, Any]] = []
    worlds: set[int] = set()
    for (rank, restart), files in sorted(stems.items()):
        json_name = layout.rank_filename(rank, restart)
        if json_name not in files:
            continue  # no results file: nothing says whose these are
        try:
            result = read_rank_file(os.path.join(path, json_name))
        except ResultsError as exc:
            raise CombineError(str(exc), ExitCode.BAD_RESULTS) from None
        digest = hashlib.sha1()
        extra = 0
        for name in sorted(files):
            file_path = os.path.join(path, name)
            with open(file_path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):  # noqa: B023
                    digest.update(block)
            if name != json_name:
                extra += os.path.getsize(file_path)
        data = result.data
        copies.append(RankCopy(
            folder=path, rank=result.rank, restart=result.restart, files=tuple(sorted(files)),
            digest=digest.hexdigest(), final=result.status != "running", steps=_steps(result),
            extra_bytes=extra, elapsed=float(data.get("elapsed") or 0.0),
        ))
        settings.append(data.get("settings") or {})
        worlds.add(int(data.get("world_size", 1)))
    if not copies and not meta:
        raise CombineError(f"{path} holds no perfrun results (no rank*.json)",
                           ExitCode.BAD_RESULTS)
    nodes = read_node_metas(path)
    for key, node in (meta.get("nodes") or {}).items() if isinstance(meta.get("nodes"),
                                                                      dict) else ():
        if isinstance(node, dict):
            nodes.setdefault(str(key), node)
    return Source(path, meta, copies, settings, worlds, nodes)


def _steps(result: Any) -> int:
    n = getattr(result, "n_steps", None)  # without building the rows, where known
    return int(n) if isinstance(n, int) else len(result.rows)


def facts_of(source: Source) -> FolderFacts:
    job = source.meta.get("job") if isinstance(source.meta.get("job"), dict) else {}
    ident = job_id_of(source.meta, source.settings)
    scripts = {s for s in map(script_of, source.settings) if s}
    if not scripts and isinstance(job.get("script"), str):
        scripts = {os.path.basename(os.path.normpath(job["script"]))}
    worlds = set(source.world_sizes)
    if isinstance(job.get("world_size"), int):
        worlds.add(job["world_size"])
    return FolderFacts(
        source.path,
        frozenset([ident] if ident else []),
        frozenset(scripts),
        frozenset(worlds),
        frozenset([launch] if (launch := _launch(source, job)) else []),
    )


def _launch(source: Source, job: dict[str, Any]) -> Optional[str]:
    """Which launch a one-node run folder is, from run.json: its launcher's
    host, pid and start. None for a job's folder (its nodes are launched
    apart) or where run.json does not say."""
    meta = source.meta
    if job or any(layout.is_multinode(s.get("nnodes")) for s in source.settings):
        return None
    started, pid = meta.get("started"), meta.get("pid")
    if not isinstance(started, (int, float)) or not isinstance(pid, int):
        return None
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started))
    return f"the run started {when} by pid {pid} on {meta.get('host')}"


@dataclass
class Plan:
    """What `combine` will write: for each destination path (relative to
    the output folder), the file it is copied from; the decisions taken on
    duplicates; run.json."""

    files: dict[str, str]
    kept: list[tuple[RankCopy, str, int]]
    meta: dict[str, Any]
    ranks: list[int]
    world: Optional[int]


def plan(sources: Sequence[Source]) -> Plan:
    """Decide every file of the combined folder (no writes)."""
    by_stem: dict[tuple[int, int], list[RankCopy]] = {}
    for source in sources:
        for copy in source.copies:
            by_stem.setdefault((copy.rank, copy.restart), []).append(copy)
    files: dict[str, str] = {}
    kept: list[tuple[RankCopy, str, int]] = []
    chosen: dict[tuple[int, int], str] = {}
    for stem, copies in sorted(by_stem.items()):
        best, why = choose_copy(copies)
        chosen[stem] = best.folder
        if len(copies) > 1:
            kept.append((best, why, len(copies) - 1))
        for name in best.files:
            files[name] = os.path.join(best.folder, name)
    # Trace and nsys files: from the folder whose copy of the rank was
    # kept where it has them, else from the first folder that has them.
    last_restart = {r: max(k for rr, k in chosen if rr == r) for r, _ in chosen}
    for sub in RANK_SUBFOLDERS:
        offers: dict[str, list[str]] = {}
        for source in sources:
            folder = os.path.join(source.path, sub)
            try:
                names = sorted(os.listdir(folder))
            except OSError:
                continue
            for name in names:
                if stem_of(name) is not None and os.path.isfile(os.path.join(folder, name)):
                    offers.setdefault(name, []).append(source.path)
        for name, where in sorted(offers.items()):
            rank, restart = stem_of(name)  # type: ignore[misc]
            if sub == layout.NSYS_DIR:
                restart = last_restart.get(rank, restart)
            prefer = chosen.get((rank, restart))
            origin = prefer if prefer in where else where[0]
            files[f"{sub}/{name}"] = os.path.join(origin, sub, name)
    nodes: dict[str, dict[str, Any]] = {}
    for i, source in enumerate(sources):
        records = dict(source.nodes)
        if not records and source.meta:
            # A folder of one node's own (no node records): its run.json is it.
            node_rank = source.meta.get("node_rank")
            if node_rank is None:
                ranks = {s.get("node_rank") for s in source.settings} - {None}
                node_rank = ranks.pop() if len(ranks) == 1 else None
            records = {str(node_rank) if node_rank is not None else f"folder{i}": source.meta}
        for key, record in records.items():
            have = nodes.get(key)
            if have is None or (
                not isinstance(have.get("returncode"), int)
                and isinstance(record.get("returncode"), int)
            ):
                nodes[key] = record
        for name in _status_files(source.path):
            files.setdefault(f"{layout.NODES_DIR}/{name}",
                             os.path.join(source.path, layout.NODES_DIR, name))
    job = _job(sources)
    meta = merge_node_metas(nodes, job) if nodes else {"job": job, "nnodes": job.get("nnodes")}
    meta["combined_from"] = [s.path for s in sources]
    world = job.get("world_size")
    if isinstance(world, int):
        meta["expected_ranks"] = world
    return Plan(files, kept, meta, sorted({r for r, _ in chosen}),
                world if isinstance(world, int) else None)


def _status_files(path: str) -> list[str]:
    try:
        return sorted(n for n in os.listdir(os.path.join(path, layout.NODES_DIR))
                      if layout.is_node_torchrun_status(n))
    except OSError:
        return []


def _job(sources: Sequence[Source]) -> dict[str, Any]:
    """The job entry of the combined run.json: the first folder's, with the
    world size the ranks agree on where it had none."""
    job: dict[str, Any] = {}
    for source in sources:
        if isinstance(source.meta.get("job"), dict):
            job = dict(source.meta["job"])
            break
    worlds = set().union(*(s.world_sizes for s in sources)) if sources else set()
    if job.get("world_size") is None and len(worlds) == 1:
        job["world_size"] = next(iter(worlds))
    if job.get("id") is None:
        job["id"] = job_id_of(sources[0].meta, [x for s in sources for x in s.settings])
    if job.get("nnodes") is None:
        nnodes = {str(x.get("nnodes")) for s in sources for x in s.settings
                  if x.get("nnodes") is not None}
        job["nnodes"] = nnodes.pop() if len(nnodes) == 1 else None
    return job


def write(plan_: Plan, output: str) -> None:
    """Copy into a temporary folder beside `output`, then rename it into
    place: `output` never holds half a combination, and a folder that
    appeared there meanwhile is not replaced (the rename fails)."""
    parent = os.path.dirname(os.path.abspath(output))
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(output)}.tmp-{os.getpid()}")
    os.makedirs(tmp)
    try:
        for rel, src in sorted(plan_.files.items()):
            dst = os.path.join(tmp, rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copy2(src, dst)
        nodes = plan_.meta.get("nodes") or {}
        for key, record in nodes.items():
            os.makedirs(os.path.join(tmp, layout.NODES_DIR), exist_ok=True)
            write_node_meta(tmp, key, record)
        write_run_meta(tmp, plan_.meta)
        os.rename(tmp, output)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def outcome_lines(plan_: Plan, folders: int, output: str) -> list[str]:
    """What `combine` says it did: which copy of a rank it kept where the
    copies differed, and why; what it wrote; ranks in none of the folders."""
    lines = []
    identical = different = 0
    for copy, why, dropped in plan_.kept:
        if why == "identical copies":
            identical += dropped
            continue
        different += dropped
        stem = f"rank {copy.rank}" + (f" restart {copy.restart}" if copy.restart else "")
        lines.append(f"{stem}: kept the copy in {copy.folder}: {why}")
    parts = [f"{n} {what}" for n, what in ((identical, "identical"), (different, "other"))
             if n]
    dropped_text = ""
    if parts:
        plural = "copy" if identical + different == 1 else "copies"
        dropped_text = f"; dropped {' and '.join(parts)} duplicate {plural}"
    lines.append(
        f"combined ranks {ranges(plan_.ranks) or 'none'} from {folders} folder"
        f"{'' if folders == 1 else 's'} into {output}{dropped_text}"
    )
    if plan_.world:
        absent = [r for r in range(plan_.world) if r not in set(plan_.ranks)]
        if absent:
            lines.append(f"note: ranks {ranges(absent)} of {plan_.world} are in none of the "
                         "folders")
    return lines


def ranges(numbers: Sequence[int]) -> str:
    """`0-3, 5, 7-8`: a rank list for a line of text."""
    out: list[str] = []
    nums = sorted(set(numbers))
    i = 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        out.append(str(nums[i]) if i == j else f"{nums[i]}-{nums[j]}")
        i = j + 1
    return ", ".join(out)
