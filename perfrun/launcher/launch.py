"""Build the child command (plain python, torchrun, nsys), start it, forward
signals, and return its exit status.

perfrun stays the parent: the script runs in a child started with Popen and
inherits stdin, stdout and stderr, so what it prints and its tracebacks are
exactly those of `python script.py`. perfrun itself never imports torch.

perfrun and its run live and die together. Every signal that would end
perfrun and can be caught is passed on to the child, and perfrun then ends
as the child did. A signal that cannot be caught (SIGKILL) ends the child
too: on Linux the kernel kills it when perfrun dies (PR_SET_PDEATHSIG), and
each torchrun worker in turn when the torchrun agent dies. The child stays
in perfrun's process group: a process group of its own would take it out
of the terminal's foreground (Ctrl-C would no longer reach it, and reading
the terminal would stop it).

Everything here runs before the script's first line, so what only some runs
need (multi-node job folders, the hang watch, host sampling, retention,
torchrun's argument checks) is imported inside the function that needs it.
"""

from __future__ import annotations

import errno
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from ..errors import PerfrunError
from ..exitcodes import ExitCode
from ..prose import note_for_stream, terminal_width, wrap
from ..runtime.lifeline import parent_death_signal
from ..runtime.memory import oom_kills
from ..settings import Settings, child_environment, child_settings, port_span
from ..store import layout
from ..store.files import Reserve, atomic_write_text, full_reason
from ..store.rankfile import hostname, launch_identity
from ..store.runmeta import write_job_meta, write_run_meta

if TYPE_CHECKING:
    from .external import ExternalTask, Waited

#: The package's folder, and the boot folder put first on the child's
#: PYTHONPATH (boot/sitecustomize.py).
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BOOT_DIR = os.path.join(PACKAGE_DIR, "boot")
#: Where `import perfrun` comes from, for the child.
PACKAGE_ROOT = os.path.dirname(PACKAGE_DIR)
#: Signals whose default action ends a process and that a handler can catch,
#: so that perfrun passes them on rather than dying alone. Not those Python
#: already ignores (SIGPIPE, SIGXFSZ) nor those a fault raises in perfrun
#: itself (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTRAP, SIGSYS).
FORWARDED = tuple(
    getattr(signal, name)
    for name in (
        "SIGTERM", "SIGHUP", "SIGINT", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM",
        "SIGVTALRM", "SIGPROF", "SIGXCPU", "SIGPWR", "SIGIO", "SIGSTKFLT", "SIGEMT",
        "SIGLOST",
    )
    if hasattr(signal, name)
)
#: Disk space the launcher holds back for its last record of the run
#: (store.files.Reserve): run.json is a few kilobytes.
RESERVE = 64 * 1024
#: Signals a terminal sends to its whole foreground process group (Ctrl-C,
#: Ctrl-\): the child has them already.
TERMINAL_SIGNALS = (signal.SIGINT, getattr(signal, "SIGQUIT", signal.SIGINT))


class LaunchError(PerfrunError):
    """A problem found before the script starts. `code` is an ExitCode."""

    slug = "launch"

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class Outcome:
    run_dir: str
    returncode: int
    command: list[str]
    elapsed: float
    #: Where torchrun.py records how failed workers ended (torchrun only).
    status_path: Optional[str] = None
    #: --hang-timeout found the run hung (and reported it).
    hung: bool = False
    #: The launcher's record of the run, as written to run.json.
    meta: Optional[dict[str, Any]] = None
    #: Why run.json could not be updated at the end (a full disk), or None:
    #: then `meta` is the only record of how the run ended.
    meta_unsaved: Optional[str] = None
    #: This perfrun as one task of a job that srun or mpirun started
    #: (external.py), or None.
    task: Optional[ExternalTask] = None
    #: The task of rank 0: the other tasks it did not wait for.
    waited: Optional[Waited] = None


def check_target(settings: Settings) -> None:
    if settings.script is not None:
        if not os.path.exists(settings.script):
            raise LaunchError(f"script not found: {settings.script}", ExitCode.NO_SCRIPT)
        if os.path.isdir(settings.script) and not os.path.exists(
            os.path.join(settings.script, "__main__.py")
        ):
            raise LaunchError(
                f"{settings.script} is a folder with no __main__.py", ExitCode.NO_SCRIPT
            )
    elif settings.module is not None:
        # Look the top-level package up without importing anything.
        import importlib.machinery

        top = settings.module.split(".")[0]
        search = [os.getcwd()] + [p for p in sys.path if p]
        if (
            top not in sys.builtin_module_names
            and importlib.machinery.PathFinder.find_spec(top, search) is None
        ):
            raise LaunchError(f"no module named {settings.module!r}", ExitCode.NO_SCRIPT)
    else:
        raise LaunchError("no script given: perfrun [OPTIONS] SCRIPT [ARGS...]", 2)
    if settings.nsys and _which("nsys") is None:
        raise LaunchError(
            "--nsys: the nsys executable (Nsight Systems) is not on PATH; install it or "
            "drop --nsys",
            ExitCode.CONFIG,
        )


def _which(name: str) -> Optional[str]:
    """shutil.which, imported only when asked: shutil loads the compression
    modules, 5 ms of every run's start-up otherwise."""
    import shutil

    return shutil.which(name)


def check_torchrun(settings: Settings) -> None:
    """torchrun's node arguments, refused in one line before anything runs
    rather than by a traceback from torchrun once it started."""
    from .torchrun import argument_problem

    problem = argument_problem(
        settings.nproc_per_node, settings.nnodes, settings.node_rank, settings.master_port
    )
    if problem is not None:
        raise LaunchError(problem, ExitCode.CONFIG)


def check_metrics(settings: Settings) -> None:
    """--metrics-port, refused in one line before anything runs where the
    ranks could not serve: prometheus_client missing (the ranks run this
    python), or a port of this node's ranks taken already. A port taken
    after this check is the rank's note, never the run's end."""
    ports = settings.metrics_ports
    if not ports:
        return
    import importlib.util

    if importlib.util.find_spec("prometheus_client") is None:
        raise LaunchError(
            "--metrics-port needs the prometheus_client package, which this python does not "
            "have: pip install prometheus_client (or perfrun's extra, perfrun[metrics])",
            ExitCode.CONFIG,
        )
    for local_rank, port in enumerate(ports):
        problem = port_problem(port)
        if problem is not None:
            whose = f" (local rank {local_rank}'s)" if len(ports) > 1 else ""
            raise LaunchError(
                f"--metrics-port {settings.metrics_port}: port {port}{whose} {problem}; take "
                f"another (this node's ranks serve on {port_span(ports)})",
                ExitCode.CONFIG,
            )


def port_problem(port: int) -> Optional[str]:
    """Why a rank could not listen on `port` (every interface, as
    runtime/metrics.py binds it, reuse of a closing port's address
    allowed as there), or None."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("0.0.0.0", port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return "is in use"
            return f"cannot be listened on ({exc.strerror or exc})"
    return None


def metrics_notice(settings: Settings, width: Optional[int] = None) -> str:
    """Where Prometheus finds this node's ranks (--metrics-port), said with
    the start notice."""
    ports = settings.metrics_ports
    if len(ports) == 1:
        text = f"perfrun: metrics for Prometheus on port {ports[0]} of this machine"
    else:
        text = (f"perfrun: metrics for Prometheus on ports {port_span(ports)} of this machine "
                f"(local rank L on {ports[0]}+L)")
    return text if width is None else "\n".join(wrap(text, width, "", "  "))


def prepare_run_dir(log_dir: str) -> str:
    """Create this run's own folder and point `latest` at it. Fails here,
    before the script starts, if the folder cannot be written: never after
    hours of training."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    try:
        os.makedirs(log_dir, exist_ok=True)
        run_dir = os.path.join(log_dir, layout.run_folder_name(stamp, os.getpid()))
        os.makedirs(run_dir, exist_ok=False)
        probe = os.path.join(run_dir, ".probe")
        with open(probe, "w") as f:
            f.write("x" * 4096)
        os.unlink(probe)
    except OSError as exc:
        raise LaunchError(
            f"cannot write to the log folder {log_dir}: {exc.strerror or exc}", ExitCode.CONFIG
        ) from None
    _point_latest(log_dir, run_dir)
    return run_dir


def _point_latest(log_dir: str, run_dir: str) -> None:
    latest = os.path.join(log_dir, layout.LATEST)
    tmp = latest + f".tmp{os.getpid()}"
    try:
        os.symlink(os.path.basename(run_dir), tmp)
        os.replace(tmp, latest)
    except OSError:
        # A filesystem without links, or a `latest` that is a folder (a
        # log folder copied with cp -rL or scp -r): never removed, and no
        # link left beside it. `perfrun report` takes the newest run.
        try:
            os.unlink(tmp)
        except OSError:
            pass


@dataclass
class RunFolder:
    """Where a run's files go, and, for a node of a multi-node job, which
    job and which node (see job.py)."""

    path: str
    #: The node's key in the job folder (`nodes/node<K>.json`), or None for
    #: a run of one node in a folder of its own.
    node: Optional[str] = None
    job: Optional[dict[str, Any]] = None
    #: Earlier folders of the same job name passed over, and why.
    skipped: tuple[str, ...] = ()
    #: This perfrun as a task of a job srun or mpirun started, each task a
    #: "node" of one rank (external.py); None for a torchrun node.
    task: Optional[ExternalTask] = None


def _target(settings: Settings) -> list[str]:
    if settings.script is not None:
        return [settings.script, *settings.script_args]
    return ["-m", str(settings.module), *settings.script_args]


def prepare_job_dir(settings: Settings, task: Optional[ExternalTask] = None) -> RunFolder:
    """The folder of this node's multi-node job, shared by every node whose
    --log-dir is the same shared folder: named from the job, never from
    this node's clock (job.py); for a task of a job srun or mpirun started,
    named from that job (external.py). Fails here, before the script
    starts, if it cannot be written."""
    import socket

    from . import job as jobs

    if task is not None:
        name, key, launch = task.job, task.key, task.launch
    else:
        name = jobs.job_name(
            settings.rdzv_id, os.environ, settings.rdzv_endpoint, settings.master_addr,
            settings.master_port, settings.nnodes, settings.nproc_per_node, _target(settings),
        )
        key, launch = jobs.node_key(settings.node_rank, socket.gethostname(), os.getpid()), None
    try:
        os.makedirs(settings.log_dir, exist_ok=True)
        run_dir, skipped = jobs.choose_job_folder(settings.log_dir, name, key, launch)
        probe = os.path.join(run_dir, layout.NODES_DIR, f".probe{key}")
        with open(probe, "w") as f:
            f.write("x" * 4096)
        os.unlink(probe)
    except OSError as exc:
        raise LaunchError(
            f"cannot write to the log folder {settings.log_dir}: "
            f"{getattr(exc, 'strerror', None) or exc}",
            ExitCode.CONFIG,
        ) from None
    _point_latest(settings.log_dir, run_dir)
    if task is not None:
        from .external import task_job_facts

        facts = task_job_facts(task, _target(settings))
    else:
        facts = jobs.job_facts(name, settings.nnodes, settings.nproc_per_node,
                               _target(settings))
    return RunFolder(run_dir, key, facts, tuple(skipped), task)


def external_task(settings: Settings) -> Optional[ExternalTask]:
    """This perfrun as a task of a job srun or mpirun started (external.py),
    decided from the environment before the script starts; the module only
    where a launcher's variables say there are several tasks."""
    # perfrun starting the ranks itself (torchrun, a launcher's command
    # after perfrun) is a node of the job, never one rank.
    starts_ranks = settings.distributed or bool(settings.launch)
    ident = launch_identity(os.environ)
    if starts_ranks or ident.source is None or ident.world_size <= 1:
        return None
    from .external import external_task as task_of

    return task_of(os.environ, starts_ranks, _target(settings))


def run_folder(settings: Settings) -> RunFolder:
    if layout.is_multinode(settings.nnodes, settings.distributed):
        return prepare_job_dir(settings)
    task = external_task(settings)
    if task is not None:
        if settings.nsys:
            # nsys's output is named for torchrun's RANK or for rank 0:
            # every task would write the same report file.
            raise LaunchError(
                f"--nsys is not supported yet for ranks that {task.launcher} started (every "
                "task would write the same nsys report): run nsys on one rank by hand, or "
                "drop --nsys", ExitCode.CONFIG)
        return prepare_job_dir(settings, task)
    return RunFolder(prepare_run_dir(settings.log_dir))


def start_notice(settings: Settings, folder: RunFolder, width: Optional[int] = None) -> str:
    """What names the run folder before the script starts; for a node of a
    job, also the job, so the other nodes' users can check they joined the
    same one.

    `width`: a terminal's (prose.terminal_width). There the run folder, the
    one thing to copy from it, is a line of its own, never broken; in a
    pipe or a log the notice is one line, which grep finds whole."""
    target = settings.script or f"-m {settings.module}"
    head = f"perfrun: profiling {target}; results in"
    tail = ""
    job = folder.job
    task = folder.task
    if job is not None and task is not None:
        named = (f"job {job['name']}, named from the command line (no job id in the "
                 "environment)" if job.get("source") == "derived"
                 else f"job {job['id']} from ${job.get('source')}")
        tail = (f"({named}; rank {task.rank} of {task.world_size}, tasks of "
                f"{task.launcher}; every task writes here, and rank 0 prints the report)")
        if folder.skipped:
            tail += f"; passed over earlier runs of it: {', '.join(folder.skipped[:3])}"
    elif job is not None:
        if job.get("source") == "derived":
            named = (f"job {job['name']}, named from the rendezvous address and the command "
                     "line (--rdzv-id ID names it)")
        else:
            source = "--rdzv-id" if job.get("source") == "rdzv-id" else f"${job.get('source')}"
            named = f"job {job['id']} from {source}"
        tail = (f"({named}; node {folder.node} of {job.get('nnodes')}; every node of the job "
                "writes here)")
        if folder.skipped:
            tail += f"; passed over earlier runs of it: {', '.join(folder.skipped[:3])}"
    if width is None:
        return " ".join(x for x in (head, folder.path, tail) if x)
    lines = wrap(head, width, "", "  ") + [f"  {folder.path}"]
    if tail:
        lines += wrap(tail, width, "  ", "  ")
    return "\n".join(lines)


def expected_ranks(settings: Settings, task: Optional[ExternalTask] = None) -> int:
    if task is not None:
        return task.world_size
    if settings.launch:
        return settings.launch_ranks or 1  # where the launcher's options say
    if not settings.distributed:
        return 1
    nproc = settings.nproc_per_node or 1
    try:
        nnodes = int(settings.nnodes) if settings.nnodes else 1
    except ValueError:
        nnodes = 1  # an elastic range "MIN:MAX": this node's ranks only
    return nproc * nnodes if nnodes == 1 else nproc


def build_command(settings: Settings, run_dir: str) -> list[str]:
    target = [settings.script] if settings.script is not None else ["-m", str(settings.module)]
    target += list(settings.script_args)
    if settings.launch:
        # perfrun in front of a launcher's command: that command, as given.
        return [*settings.launch, *target]
    nsys: list[str] = []
    if settings.nsys:
        out = layout.nsys_output(run_dir, settings.distributed)
        nsys = [
            "nsys",
            "profile",
            "--trace=cuda,nvtx,osrt",
            "--sample=none",
            # A node per CUDA graph kernel, rather than one opaque range per
            # graph launch.
            "--cuda-graph-trace=node",
            f"--output={out}",
            "--force-overwrite=true",
        ]
        if settings.scheduler is not None:
            # perfrun calls cudaProfilerStart/Stop at the window's edges.
            nsys += ["--capture-range=cudaProfilerApi", "--capture-range-end=stop"]
        nsys += shlex.split(settings.nsys_args)
        if settings.distributed:
            # Each worker passes through nsys_rank.py even when every
            # rank is chosen: it ties nsys's life to torchrun's agent.
            ranks = settings.nsys_ranks or "all"
            selector = [sys.executable, "-E", "-m", "perfrun.launcher.nsys_rank", ranks]
            nsys = [*selector, "--", *nsys]
    if not settings.distributed:
        return [*nsys, sys.executable, *target]
    # torch.distributed.run, plus a record of how failed ranks ended.
    run = [sys.executable, "-m", "perfrun.launcher.torchrun"]
    flags = (
        ("--nproc-per-node", settings.nproc_per_node),
        ("--nnodes", settings.nnodes),
        ("--node-rank", settings.node_rank),
        ("--master-addr", settings.master_addr),
        ("--master-port", settings.master_port),
        ("--rdzv-backend", settings.rdzv_backend),
        ("--rdzv-endpoint", settings.rdzv_endpoint),
        ("--rdzv-id", settings.rdzv_id),
    )
    for flag, value in flags:
        if value is not None:
            run += [flag, str(value)]
    # A torchrun command's own options perfrun's settings do not hold.
    run += list(settings.torchrun_args or ())
    if nsys:
        # nsys inside each worker, so each rank gets its own report file.
        return [*run, "--no-python", *nsys, sys.executable, *target]
    return [*run, *target]


def launch_notice(settings: Settings, width: Optional[int] = None) -> str:
    """Which processes of a launcher's command are profiled, said before
    it starts: those that run the script (a launcher perfrun does not know
    is named as such, since that is all perfrun knows of it)."""
    target = settings.script or f"-m {settings.module}"
    name = os.path.basename(settings.launch[0])
    if settings.launch_kind == "command":
        text = (f"perfrun: note: {name} is no launcher perfrun knows; its processes that run "
                f"{target} are taken for the ranks, each identified by RANK, SLURM_PROCID, "
                "OMPI_COMM_WORLD_RANK or PMI_RANK where set (else rank 0)")
    else:
        text = f"perfrun: under {name}: its processes that run {target} are the ranks"
    return text if width is None else "\n".join(wrap(text, width, "", "  "))


def rank_target(settings: Settings) -> dict[str, str]:
    """What a rank runs, for the boot of each process a launcher starts to
    tell its ranks from the launcher's own processes: the script's real
    path, or the module's name."""
    if settings.script is not None:
        return {"script": os.path.realpath(settings.script)}
    return {"module": str(settings.module)}


def git_state(path: str) -> dict[str, Any]:
    """Commit and dirty flag of the repository holding `path`, if any: the
    baseline records them (never compared: they are what is expected to
    differ between a baseline and the change under test)."""
    folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    try:
        commit = subprocess.run(
            ["git", "-C", folder, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if commit.returncode != 0:
            return {}
        status = subprocess.run(
            ["git", "-C", folder, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return {}


def _git_state(settings: Settings) -> dict[str, Any]:
    return git_state(settings.script or os.getcwd())


def _terminal_owns_sigint() -> bool:
    """Ctrl-C (and Ctrl-\\) in a terminal already reaches the child (same
    process group); forwarding it again would deliver it twice."""
    try:
        fd = sys.stdin.fileno()
        return os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp()
    except (OSError, ValueError, AttributeError):
        return False


def _child_setup() -> Optional[Any]:
    """What the child runs between fork and exec: ask to be killed when
    perfrun dies, then make sure perfrun did not die already (the request
    only covers deaths after it)."""
    arm = parent_death_signal()
    if arm is None:
        return None
    parent = os.getpid()

    def setup() -> None:
        if arm() and os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return setup


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)


def run(settings: Settings, command_line: Optional[list[str]] = None) -> Outcome:
    check_target(settings)
    check_torchrun(settings)
    check_metrics(settings)
    folder = run_folder(settings)
    run_dir = folder.path
    task = folder.task
    if not settings.quiet and (task is None or task.rank == 0):
        # Of a job's tasks, rank 0's says it for all.
        # Where the results go, before the script's first line of output.
        width = terminal_width(sys.stderr)
        sys.stderr.write(start_notice(settings, folder, width) + "\n")
        if settings.metrics_port is not None:
            sys.stderr.write(metrics_notice(settings, width) + "\n")
        if settings.launch:
            sys.stderr.write(launch_notice(settings, width) + "\n")
        sys.stderr.flush()
    if settings.nsys:
        os.makedirs(os.path.join(run_dir, layout.NSYS_DIR), exist_ok=True)
    cmd = build_command(settings, run_dir)
    launcher = "torchrun" if settings.distributed else "command" if settings.launch else "python"
    extra = {
        "launcher": launcher,
        "package_root": PACKAGE_ROOT,
        "command": command_line,
        "launcher_pid": os.getpid(),
    }
    if settings.launch:
        # Which processes of the launcher's are ranks: those that run this.
        extra["rank_target"] = rank_target(settings)
    settings_file = layout.settings_path(run_dir, folder.node)
    try:
        atomic_write_text(settings_file, json.dumps(child_settings(settings, run_dir, BOOT_DIR,
                                                                   extra=extra)))
    except OSError as exc:
        raise LaunchError(f"cannot write to the log folder {settings.log_dir}: "
                          f"{exc.strerror or exc}", ExitCode.CONFIG) from None
    env = child_environment(settings_file, BOOT_DIR)
    status_path: Optional[str] = None
    if settings.distributed:
        # One per node: in a job folder every node's agent writes its own.
        name = layout.TORCHRUN_STATUS if folder.node is None else (
            layout.node_torchrun_status(folder.node)
        )
        status_path = os.path.join(run_dir, name)
        from .torchrun import TORCHRUN_STATUS_VAR

        env[TORCHRUN_STATUS_VAR] = status_path
    meta: dict[str, Any] = {
        "git": _git_state(settings) if (settings.baseline or settings.save_baseline) else {},
        "command": command_line,
        "child": cmd,
        "expected_ranks": expected_ranks(settings, task),
        "nnodes": settings.nnodes,
        "launcher": launcher,
        "started": time.time(),
        # Whose run it is: retention asks this process whether the run is over.
        "host": hostname(),
        "pid": os.getpid(),
    }
    if task is not None:
        from .external import task_record

        meta["task"] = task_record(task)
        # Not "python": each rank's status is its own task's (run.json's
        # merged one is a single task's).
        meta["launcher"] = task.launcher_id
    elif folder.node is not None:
        meta["node_rank"] = settings.node_rank
    write_meta = _meta_writer(run_dir, folder)
    try:
        write_meta(meta)
    except OSError as exc:
        raise LaunchError(f"cannot write to the log folder {settings.log_dir}: "
                          f"{exc.strerror or exc}", ExitCode.CONFIG) from None
    # Room for the record of how the run ended, should the disk fill.
    reserve = Reserve(layout.reserve_path(run_dir, _owner(folder)), RESERVE)

    # Handlers go in before the child starts; a signal that arrives before
    # there is a child to pass it to waits for it.
    proc: Optional[subprocess.Popen[bytes]] = None
    received: list[int] = []
    pending: list[int] = []

    def forward(signum: int, frame: Any) -> None:
        received.append(signum)
        if proc is None:
            pending.append(signum)
            return
        try:
            proc.send_signal(signum)
        except OSError:
            pass

    previous: dict[int, Any] = {}
    for sig in FORWARDED:
        try:
            if signal.getsignal(sig) in (signal.SIG_DFL, signal.default_int_handler):
                # Not one that is ignored (nohup, a background job): the
                # child inherits those as they are.
                previous[sig] = signal.signal(sig, forward)
        except (OSError, ValueError):
            pass
    start = time.monotonic()
    ooms_before = oom_kills()
    outcome_flags: dict[str, bool] = {"hung": False}
    host_load = None
    try:
        try:
            proc = subprocess.Popen(cmd, env=env, preexec_fn=_child_setup())
        except OSError as exc:
            reserve.release()
            raise LaunchError(start_failure(cmd, env, exc), ExitCode.CONFIG) from None
        if task is None or task.local_rank == 0:
            # One sampler a host: a job's first task there counts the others.
            host_load = _start_host_load(task is not None)
            # Only once the run has started: a run that cannot start must
            # not cost an old one.
            _prune(settings, run_dir)
        if _terminal_owns_sigint():
            # Only now: a child started while SIGINT is ignored would
            # ignore Ctrl-C itself.
            for sig in TERMINAL_SIGNALS:
                if sig in previous:
                    signal.signal(sig, signal.SIG_IGN)
        for signum in pending:
            proc.send_signal(signum)
        returncode = _wait(proc, settings, run_dir, outcome_flags)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    elapsed = time.monotonic() - start
    meta.update({"returncode": returncode, "elapsed": elapsed})
    ooms_after = oom_kills()
    if ooms_before is not None and ooms_after is not None:
        # The out-of-memory killer's work in the run's cgroup while it ran:
        # a rank killed outright then is said to be its victim.
        meta["oom_kills"] = max(0, ooms_after - ooms_before)
    evidence = _stop_host_load(host_load)
    if evidence is not None:
        meta["host_load"] = evidence
    if received:
        # What perfrun was sent and passed on: the child's status then says
        # how the child took it.
        meta["signals"] = [_signal_name(s) for s in received]
    if outcome_flags["hung"]:
        meta["hung"] = True
    reserve.release()
    if folder.node is None:
        _clear_reserves(run_dir)
    try:
        write_meta(meta)
        unsaved = None
    except OSError as exc:
        # A full disk: the run's end is not on disk, but the report of
        # what was kept is still printed, from this record (`meta`).
        unsaved = f"{layout.RUN_META} not updated: {full_reason(exc.errno, exc.strerror)}"
    waited = _wait_for_tasks(run_dir, task) if task is not None and task.rank == 0 else None
    return Outcome(run_dir=run_dir, returncode=returncode, command=cmd, elapsed=elapsed,
                   status_path=status_path, hung=outcome_flags["hung"], meta=meta,
                   meta_unsaved=unsaved, task=task, waited=waited)


def _wait_for_tasks(run_dir: str, task: ExternalTask) -> Optional[Waited]:
    """The task of rank 0, its own end recorded: the other tasks' ends,
    so that the job's report has every rank (external.py, bounded by its
    WAIT). Never a reason to lose the report: a failure is a note."""
    from .external import wait_for_tasks

    def tell(message: str) -> None:
        sys.stderr.write(f"perfrun: {message}\n")
        sys.stderr.flush()

    try:
        return wait_for_tasks(run_dir, task, tell)
    except Exception as exc:  # noqa: BLE001 - the report comes first
        tell(f"note: did not wait for the job's other tasks: {exc}")
        return None


def _owner(folder: RunFolder) -> str:
    """Whose reserve: the launcher of a run, or a node of a job."""
    return "launcher" if folder.node is None else f"node{folder.node}"


def _clear_reserves(run_dir: str) -> None:
    """The reserves ranks left when they were killed before their final
    save (a one-node run: every rank has ended with the launcher's child)."""
    try:
        names = os.listdir(run_dir)
    except OSError:
        return
    for name in names:
        if name.startswith(layout.RESERVE_PREFIX):
            try:
                os.unlink(os.path.join(run_dir, name))
            except OSError:
                pass


#: The longest single argument (or environment entry, NAME=VALUE) Linux
#: passes to a program, terminating NUL included: MAX_ARG_STRLEN, 32 pages.
MAX_ARG_STRLEN = 32 * 4096


def start_failure(cmd: list[str], env: dict[str, str], exc: OSError) -> str:
    """The one line for a child that could not be started (perfrun is
    running, so its python is there; what fails is the exec itself)."""
    if exc.errno == errno.E2BIG:
        try:
            arg_max = os.sysconf("SC_ARG_MAX")
        except (ValueError, OSError, AttributeError):
            arg_max = None
        return "cannot start the script: " + argument_space(cmd, env, arg_max)
    return f"cannot start the script ({cmd[0]}): {exc.strerror or exc}"


def argument_space(cmd: list[str], env: dict[str, str], arg_max: Optional[int]) -> str:
    """Why the kernel refused the argument list (E2BIG), with the figures:
    one argument longer than MAX_ARG_STRLEN, or arguments and environment
    together (each string, its NUL and its pointer) past ARG_MAX. The same
    list is refused to `python` itself: perfrun adds to it only the full
    path of python and two variables of a few dozen bytes."""
    strings = [os.fsencode(a) for a in cmd] + [os.fsencode(f"{k}={v}") for k, v in env.items()]
    longest = max((len(b) + 1 for b in strings), default=0)
    if longest > MAX_ARG_STRLEN:
        return (f"the argument list is too long: one argument is {longest - 1} bytes, and "
                f"the system takes at most {MAX_ARG_STRLEN - 1} in one")
    total = sum(len(b) + 1 for b in strings) + 8 * (len(strings) + 2)
    limit = f"at most {arg_max}" if arg_max else "less"
    return (f"the argument list is too long: the arguments and the environment take {total} "
            f"bytes, and the system takes {limit}")


def _wait(
    proc: subprocess.Popen[bytes], settings: Settings, run_dir: str, flags: dict[str, bool]
) -> int:
    """Wait for the child; with --hang-timeout, look at the ranks' files
    between waits (hang.py), so a hang is reported while the child lives."""
    if settings.hang_timeout is None:
        return proc.wait()
    from .hang import POLL, HangWatch

    watch = HangWatch(run_dir, settings.hang_timeout, settings.hang_action)
    while True:
        try:
            return proc.wait(timeout=POLL)
        except subprocess.TimeoutExpired:
            pass
        try:
            if not flags["hung"] and watch.poll(proc):
                flags["hung"] = True
        except Exception as exc:  # the watch must never end the run
            sys.stderr.write(f"perfrun: note: hang watch failed: {exc}\n")
            return proc.wait()


def _start_host_load(task_of_job: bool = False) -> Any:
    """Sample the host's load beside the job (hostload.py); its evidence
    goes into this launcher's record of the run (run.json, or the node's
    own record in a multi-node job folder). Never a reason for the run
    not to start. `task_of_job`: this perfrun is one task of a job srun or
    mpirun started, whose other tasks on this host are the job too."""
    try:
        from .hostload import HostLoadSampler

        sampler = HostLoadSampler(os.getpid(), task_of_job=task_of_job)
        sampler.start()
        return sampler
    except Exception as exc:  # noqa: BLE001 - the observer never stops the run
        sys.stderr.write(f"perfrun: note: host load not sampled: {exc}\n")
        return None


def _stop_host_load(sampler: Any) -> Optional[dict[str, Any]]:
    if sampler is None:
        return None
    try:
        return sampler.stop()  # type: ignore[no-any-return]
    except Exception as exc:  # noqa: BLE001
        sys.stderr.write(f"perfrun: note: host load not recorded: {exc}\n")
        return None


def _meta_writer(run_dir: str, folder: RunFolder) -> Any:
    """How this launcher records the run: run.json of its own, or, for a
    node of a job, its node's record and run.json merged from all nodes'."""
    if folder.node is None:
        return lambda meta: write_run_meta(run_dir, meta)
    node, job = folder.node, folder.job or {}
    return lambda meta: write_job_meta(run_dir, node, meta, job)


def _prune(settings: Settings, run_dir: str) -> None:
    """Retention, once this run's folder exists: never a reason for the run
    not to start."""
    from .retention import prune, removal_note

    try:
        removed = prune(settings.log_dir, settings.keep, os.path.basename(run_dir))
    except OSError as exc:
        sys.stderr.write(note_for_stream(f"perfrun: note: could not prune {settings.log_dir}: "
                                         f"{exc}", sys.stderr) + "\n")
        return
    if removed:
        # Always said, -q or not: perfrun deleted something.
        text = f"perfrun: note: {removal_note(removed, settings.log_dir, settings.keep)}"
        sys.stderr.write(note_for_stream(text, sys.stderr) + "\n")
        sys.stderr.flush()


def exit_like(returncode: int) -> int:
    """Exit the way the child did: a child killed by signal N kills us with N
    too (shells then show 128+N); otherwise return its status."""
    if returncode < 0:
        signum = -returncode
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            signal.signal(signum, signal.SIG_DFL)
        except (OSError, ValueError):
            pass  # SIGKILL and SIGSTOP have no handler to reset
        try:
            os.kill(os.getpid(), signum)
        except (OSError, ValueError):
            pass
        return 128 + signum
    return returncode
