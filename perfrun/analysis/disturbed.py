"""Was this measurement disturbed? Flags from the evidence sampled during
the run, each with a one-line message and the figures it rests on.

A GPU held below its clocks by power or heat, another process on the same
GPU, new ECC or XID errors, a CPU shared with other work, a hypervisor
stealing cycles, or cores clocked far below their maximum make every
figure of the run, and any verdict of the gate, a statement about the
machine rather than the script. The report says so at its top, and the
gate gives no regression from such a run (gate.py, `disturbed_verdict`).

The evidence comes from two places: each rank's NVML sampler
(runtime/device.py: `device.gpus[].evidence` in the rank file) and each
node's launcher (launcher/hostload.py: `host_load` in run.json, or in each node's
record of a multi-node job). Everything here is a pure function of that
plain data.

Thresholds, and why:

* Other processes' CPU: at least `OTHER_CORES` (0.5) cores on average over
  the run, and at least `OTHER_SHARE` (5%) of the machine's cores. Half a
  core taken from a 2-core machine is a quarter of it; on a 64-core
  machine a few cores of background (monitoring agents, a shell) is
  ordinary and shares little with the job. A quiet machine's background
  (kernel threads, the sandbox's agent) measured 0.01 cores in each of 10
  runs on the 2-core machine perfrun is developed on, and a spin loop per
  core beside a run 1.33-1.37 (scripts/host_load_false_alarm.py).
* Steal: at least `STEAL` (5%) of all CPU time. A cloud VM sees a percent
  or two now and then; 5% is a hypervisor that gives the CPUs away.
* CPU frequency: the fastest core below `FREQ_RATIO` (60%) of the highest
  maximum in the median sample. Idle cores clock down by design, so only
  the fastest core counts; and a loaded server runs its all-core turbo at
  70-85% of the single-core maximum, which must not fire.
* GPU clocks held down by heat, a hardware slowdown or the power brake: in
  at least `SEVERE_SHARE` (5%) of the busy samples. These are never part
  of a healthy run.
* GPU power cap: only a *lowered* one. A GPU at full load sits at its
  power limit in normal operation, its clocks well below the maximum: an
  H100 SXM running a bf16 GPT alone was power-capped in 92% of its busy
  samples at a median SM clock of 1425 of 1980 MHz (72%). That is the
  hardware's own figure, not a disturbance. What changes the figures is
  an enforced power limit below the board's default (someone ran
  `nvidia-smi -pl`, or a power-capping service did): flagged when the
  lowest enforced limit seen is below `POWER_LIMIT_RATIO` (95%) of the
  default and the power cap held the clocks in at least `SOFT_SHARE`
  (25%) of the busy samples.
* Sync boost, applications clocks, display clocks: in at least
  `SOFT_SHARE` (25%) of the busy samples *and* the median SM clock below
  `SOFT_CLOCK` (85%) of the maximum: a pinned clock that holds the GPU
  well down.
* Other processes on the GPU: a compute process that is not the job's,
  seen in at least `OTHER_GPU_SAMPLES` (2) samples (or in every sample of
  a shorter run); a graphics-only process only when it used at least
  `GRAPHICS_BYTES` (512 MiB), since a workstation's display server always
  holds some.
* Any new uncorrected ECC error, any XID error.

Fractions need `MIN_BUSY` (3) busy samples; host averages need
`MIN_SECONDS` (2) seconds of sampling: fewer say nothing either way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

OTHER_CORES = 0.5
OTHER_SHARE = 0.05
STEAL = 0.05
FREQ_RATIO = 0.6
SEVERE_SHARE = 0.05
SOFT_SHARE = 0.25
SOFT_CLOCK = 0.85
POWER_LIMIT_RATIO = 0.95
OTHER_GPU_SAMPLES = 2
GRAPHICS_BYTES = 512 << 20
MIN_BUSY = 3
MIN_SECONDS = 2.0

#: Clock event reasons that mean the GPU could not run as it should.
SEVERE = ("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
#: Reasons that are ordinary at full load unless the clocks stay well down.
SOFT = ("sync_boost", "applications_clocks_setting", "display_clock_setting")
LABELS = {
    "sw_power_cap": "power-capped",
    "hw_slowdown": "slowed down by the hardware",
    "sw_thermal_slowdown": "thermally throttled (software)",
    "hw_thermal_slowdown": "thermally throttled (hardware)",
    "hw_power_brake_slowdown": "power-braked",
    "sync_boost": "held by sync boost",
    "applications_clocks_setting": "held by its applications clocks setting",
    "display_clock_setting": "held by its display clocks",
}


@dataclass(frozen=True)
class Flag:
    """One reason not to trust the run's figures."""

    #: Stable identifier: host_cpu_others, host_steal, host_cpu_frequency,
    #: gpu_throttled, gpu_power_limited, gpu_clocks_held, gpu_other_processes,
    #: gpu_ecc, gpu_xid.
    kind: str
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)
    host: Optional[str] = None
    gpu: Optional[int] = None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": self.message, "evidence": dict(self.evidence),
                "host": self.host, "gpu": self.gpu}


def _num(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _pct(x: float) -> str:
    return f"{x * 100:.0f}%" if x >= 0.1 else f"{x * 100:.1f}%"


# -- host ------------------------------------------------------------------------


def host_flags(ev: Mapping[str, Any], prefix: str = "") -> list[Flag]:
    """Flags from one host's launcher evidence (hostload.summarise).
    `prefix` names the host when the job had several."""
    out: list[Flag] = []
    host = ev.get("host") if isinstance(ev.get("host"), str) else None
    seconds = _num(ev.get("seconds"))
    if seconds is None or seconds < MIN_SECONDS:
        return out
    cores = _num(ev.get("cpu_count"))
    others = _num(ev.get("other_cores"))
    if others is not None:
        limit = max(OTHER_CORES, OTHER_SHARE * cores) if cores else OTHER_CORES
        if others >= limit:
            job = _num(ev.get("job_cores"))
            top = [t for t in ev.get("top_others") or [] if isinstance(t, Mapping)]
            named = ", ".join(
                f"{t.get('name')} (pid {t.get('pid')}) {float(t.get('cores') or 0):.2f}"
                for t in top[:3] if (_num(t.get("cores")) or 0) >= 0.05
            )
            msg = (f"{prefix}other processes used {others:.2f} CPU cores on average"
                   f" ({int(cores) if cores else '?'} cores"
                   + (f"; the job {job:.2f}" if job is not None else "") + ")"
                   + (f": {named}" if named else ""))
            out.append(Flag("host_cpu_others", msg, {
                "other_cores": others, "other_cores_max": _num(ev.get("other_cores_max")),
                "job_cores": job, "cpu_count": cores, "threshold_cores": limit,
                "top_others": top[:5],
            }, host))
    steal = _num(ev.get("steal_fraction"))
    if steal is not None and steal >= STEAL:
        out.append(Flag("host_steal", f"{prefix}steal {steal * 100:.1f}% of CPU time (the "
                        "hypervisor ran other machines on these CPUs)",
                        {"steal_fraction": steal, "threshold": STEAL}, host))
    freq = ev.get("cpu_freq")
    if isinstance(freq, Mapping):
        ratio = _num(freq.get("ratio_median"))
        if ratio is not None and ratio < FREQ_RATIO:
            top_mhz, max_mhz = _num(freq.get("fastest_mhz_median")), _num(freq.get("max_mhz"))
            out.append(Flag(
                "host_cpu_frequency",
                f"{prefix}CPU clocked down: the fastest core ran at {top_mhz or 0:.0f} of "
                f"{max_mhz or 0:.0f} MHz ({ratio * 100:.0f}%) in the median sample",
                {"ratio_median": ratio, "fastest_mhz_median": top_mhz, "max_mhz": max_mhz,
                 "threshold": FREQ_RATIO}, host))
    return out


# -- GPU -------------------------------------------------------------------------


def gpu_flags(ev: Mapping[str, Any], label: str, host: Optional[str] = None,
              index: Optional[int] = None) -> list[Flag]:
    """Flags from one GPU's evidence (runtime/device.py). `label` is how
    the message names it ("GPU 0", "node-3 GPU 1")."""
    out: list[Flag] = []
    busy = int(_num(ev.get("busy_samples")) or 0)
    read = int(_num(ev.get("reasons_samples")) or 0)
    reasons = ev.get("reasons") if isinstance(ev.get("reasons"), Mapping) else {}
    median, top = _num(ev.get("sm_clock_median")), _num(ev.get("sm_clock_max"))
    clock_text = (f"; SM clock median {median:.0f} of {top:.0f} MHz"
                  if median is not None and top else "")
    figures = {"busy_samples": busy, "sm_clock_median": median, "sm_clock_min":
               _num(ev.get("sm_clock_min")), "sm_clock_max": top}
    if read >= MIN_BUSY:
        severe = {k: float(reasons[k]) for k in SEVERE
                  if (_num(reasons.get(k)) or 0) >= SEVERE_SHARE}
        if severe:
            parts = ", ".join(f"{LABELS[k]} in {_pct(v)}" for k, v in severe.items())
            out.append(Flag("gpu_throttled", f"{label} {parts} of busy samples{clock_text}",
                            {**figures, "reasons": severe, "threshold": SEVERE_SHARE}, host, index))
        low_clock = median is not None and top is not None and top > 0 and median < SOFT_CLOCK * top
        soft = {k: float(reasons[k]) for k in SOFT if (_num(reasons.get(k)) or 0) >= SOFT_SHARE}
        limit, default = _num(ev.get("power_limit_w")), _num(ev.get("power_default_limit_w"))
        capped = _num(reasons.get("sw_power_cap")) or 0
        if (limit is not None and default and limit < POWER_LIMIT_RATIO * default
                and capped >= SOFT_SHARE):
            out.append(Flag(
                "gpu_power_limited",
                f"{label} power limit lowered to {limit:.0f} W of its default {default:.0f} W; "
                f"power-capped in {_pct(capped)} of busy samples{clock_text}",
                {**figures, "power_limit_w": limit, "power_default_limit_w": default,
                 "sw_power_cap": capped, "threshold": POWER_LIMIT_RATIO}, host, index))
        if soft and low_clock:
            parts = ", ".join(f"{LABELS[k]} in {_pct(v)}" for k, v in soft.items())
            out.append(Flag("gpu_clocks_held", f"{label} {parts} of busy samples{clock_text}",
                            {**figures, "reasons": soft, "threshold": SOFT_SHARE,
                             "clock_threshold": SOFT_CLOCK}, host, index))
    samples = int(_num(ev.get("process_reads")) or 0)
    needed = min(OTHER_GPU_SAMPLES, max(1, samples // 2))
    others = []
    for p in ev.get("other_processes") or []:
        if not isinstance(p, Mapping):
            continue
        seen = int(_num(p.get("samples")) or 0)
        used = _num(p.get("used_memory_max"))
        if p.get("kind") == "graphics" and (used is None or used < GRAPHICS_BYTES):
            continue
        if seen >= needed:
            others.append(p)
    if others:
        def one(p: Mapping[str, Any]) -> str:
            used = _num(p.get("used_memory_max"))
            mem = f", {used / (1 << 30):.1f} GiB" if used is not None else ""
            return f"{p.get('name') or 'unknown'} (pid {p.get('pid')}{mem})"

        n = len(others)
        out.append(Flag(
            "gpu_other_processes",
            f"{label} shared with {n} other process{'es' if n != 1 else ''}: "
            + ", ".join(one(p) for p in others[:3]) + (", ..." if n > 3 else ""),
            {"processes": [dict(p) for p in others]}, host, index))
    ecc = _num(ev.get("ecc_uncorrected_new"))
    if ecc:
        out.append(Flag("gpu_ecc", f"{label}: {int(ecc)} new uncorrected ECC error"
                        f"{'s' if ecc != 1 else ''} during the run",
                        {"ecc_uncorrected_new": int(ecc)}, host, index))
    xids = [int(x) for x in ev.get("xid_errors") or [] if _num(x) is not None]
    if xids:
        shown = ", ".join(str(x) for x in sorted(set(xids)))
        out.append(Flag("gpu_xid", f"{label}: XID error{'s' if len(xids) != 1 else ''} during "
                        f"the run ({shown})", {"xid_errors": xids}, host, index))
    return out


# -- a run -----------------------------------------------------------------------


def host_evidence(meta: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Each host's launcher evidence in run.json: its own (`host_load`), or
    each node's record in a multi-node job folder."""
    out = []
    own = meta.get("host_load")
    if isinstance(own, Mapping):
        out.append(own)
    nodes = meta.get("nodes")
    if isinstance(nodes, Mapping):
        for key in sorted(nodes, key=str):
            node = nodes[key]
            if isinstance(node, Mapping) and isinstance(node.get("host_load"), Mapping):
                if node["host_load"] not in out:
                    out.append(node["host_load"])
    return out


def gpu_evidence(ranks: Iterable[Mapping[str, Any]]) -> list[tuple[str, int, Mapping[str, Any]]]:
    """(host, CUDA index, evidence) for each physical GPU once: every rank
    on a host may sample every GPU it sees, so a GPU (by host and UUID) is
    taken from the rank that sampled it most."""
    best: dict[tuple[str, str], tuple[int, int, Mapping[str, Any]]] = {}
    for data in ranks:
        host = str((data.get("env") or {}).get("hostname") or "?")
        device = data.get("device")
        if not isinstance(device, Mapping):
            continue
        for i, g in enumerate(device.get("gpus") or []):
            if not isinstance(g, Mapping) or not isinstance(g.get("evidence"), Mapping):
                continue
            ev = g["evidence"]
            index = int(_num(g.get("index")) if _num(g.get("index")) is not None else i)
            key = (host, str(g.get("uuid") or g.get("pci_bus_id") or f"index{index}"))
            samples = int(_num(ev.get("samples")) or 0)
            if key not in best or samples > best[key][0]:
                best[key] = (samples, index, ev)
    return [(host, index, ev) for (host, _), (_, index, ev) in sorted(
        best.items(), key=lambda kv: (kv[0][0], kv[1][1]))]


def run_flags(meta: Mapping[str, Any], ranks: Iterable[Mapping[str, Any]]) -> list[Flag]:
    """Every flag of a run: from its run.json (`meta`) and its ranks' files."""
    hosts = host_evidence(meta)
    gpus = gpu_evidence(ranks)
    many = len({h.get("host") for h in hosts} | {h for h, _, _ in gpus}) > 1
    out: list[Flag] = []
    for ev in hosts:
        prefix = f"{ev.get('host')}: " if many and ev.get("host") else ""
        out.extend(host_flags(ev, prefix))
    for host, index, ev in gpus:
        label = f"{host} GPU {index}" if many else f"GPU {index}"
        out.extend(gpu_flags(ev, label, host, index))
    return out


def flags_of(run: Any) -> list[Flag]:
    """`run_flags` of a RunResults (a results folder or a baseline)."""
    return run_flags(run.meta or {}, [r.data for r in run.ranks])
