#!/usr/bin/env bash
# perfrun's GPU checks in one command, on a machine with an NVIDIA GPU and
# no network:
#
#     bash scripts/gpu_check.sh          (from anywhere; it works in the repository root)
#     bash scripts/gpu_check.sh -k mfu   (arguments go to pytest: some checks only)
#
# It needs CUDA PyTorch, click, rich, pyyaml, psutil and nvidia-ml-py already
# installed. It installs perfrun itself in editable mode (no dependencies, no
# build isolation, so no index is asked), and nvtx, plotly (with narwhals) and pytest (with pluggy,
# iniconfig, packaging and pygments) from the wheels in .gpu-wheels/ when
# they cannot be imported. .gpu-wheels/ is not tracked by git: carry it to
# the GPU machine with the working tree. To fill it again, on a machine with
# network (the nvtx wheel is built per Python version; repeat for each):
#
#     pip download nvtx --no-deps -d .gpu-wheels --python-version 3.12 \
#         --platform manylinux2014_x86_64 --only-binary=:all:
#     pip download pytest -d .gpu-wheels --python-version 3.12 \
#         --platform manylinux2014_x86_64 --only-binary=:all:
#     pip download plotly narwhals --no-deps -d .gpu-wheels
#
# Then it prints the GPU, runs `pytest -m gpu tests/gpu` (one process, no
# xdist: the checks time the GPU and must not share it with each other) and
# prints the figures every check measured, kept one JSON object a line in
# $OUT/perfrun-gpu-figures.jsonl (/tmp when OUT is not set).
#
# Exit status: pytest's (0 only when every check passed), or 1 when the
# machine cannot run the checks (no usable CUDA, a dependency missing).
#
# PYTHON=/path/to/python picks the interpreter (default: python, else python3).

set -u

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
ROOT=$(pwd)
WHEELS="$ROOT/.gpu-wheels"
# Where wheels are unpacked when pip cannot install them (no pip, or a
# system Python that refuses): put on PYTHONPATH, which perfrun passes on.
SITE="${TMPDIR:-/tmp}/perfrun-gpu-site"

PY=${PYTHON:-}
if [ -z "$PY" ]; then
    if command -v python >/dev/null 2>&1; then PY=python; else PY=python3; fi
fi

FIGURES_DIR=${OUT:-/tmp}
mkdir -p "$FIGURES_DIR"
export PERFRUN_GPU_FIGURES="$FIGURES_DIR/perfrun-gpu-figures.jsonl"
: >"$PERFRUN_GPU_FIGURES"

say() { printf '\n== %s\n' "$*"; }
die() {
    printf 'gpu_check: %s\n' "$*" >&2
    exit 1
}

importable() { (cd / && "$PY" -c "import $1" >/dev/null 2>&1); }

# A system Python marked externally managed (PEP 668) refuses plain installs.
externally_managed() {
    "$PY" - <<'EOF'
import os, sys, sysconfig
marker = os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")
sys.exit(0 if sys.prefix == sys.base_prefix and os.path.exists(marker) else 1)
EOF
}

pip_install() {
    if externally_managed; then
        "$PY" -m pip install --disable-pip-version-check --no-input --break-system-packages "$@"
    else
        "$PY" -m pip install --disable-pip-version-check --no-input "$@"
    fi
}

# unpack_wheels NAME...: unpack each NAME's wheel for this Python into $SITE.
unpack_wheels() {
    mkdir -p "$SITE"
    "$PY" - "$WHEELS" "$SITE" "$@" <<'EOF'
import glob, os, sys, zipfile
wheels, site, names = sys.argv[1], sys.argv[2], sys.argv[3:]
tag = "-cp%d%d-" % sys.version_info[:2]
for name in names:
    found = [w for w in sorted(glob.glob(os.path.join(wheels, name + "-*.whl")))
             if tag in os.path.basename(w) or w.endswith("-none-any.whl")]
    if not found:
        sys.exit("no %s wheel for this Python in %s" % (name, wheels))
    zipfile.ZipFile(found[-1]).extractall(site)
    print("unpacked", os.path.basename(found[-1]))
EOF
}

# offline_install MODULE PACKAGE...: make MODULE importable from the wheels.
offline_install() {
    local module=$1
    shift
    importable "$module" && return 0
    [ -d "$WHEELS" ] || die "cannot import $module and $WHEELS is missing: carry it with the working tree"
    say "installing $* from .gpu-wheels (no network)"
    if pip_install --no-index --find-links "$WHEELS" "$@" && importable "$module"; then
        return 0
    fi
    echo "pip could not install $*; unpacking the wheels into $SITE instead"
    unpack_wheels "$@" || die "could not install $*"
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    importable "$module" || die "$module still cannot be imported"
}

say "Python"
"$PY" -c 'import sys; print(sys.executable, sys.version.split()[0])' || die "no Python: set PYTHON"

missing=""
for module in torch click rich yaml psutil pynvml; do
    importable "$module" || missing="$missing $module"
done
[ -z "$missing" ] || die "missing and not installable offline:$missing"

say "installing perfrun (editable, no dependencies, no build isolation)"
if ! pip_install --no-deps --no-build-isolation -e "$ROOT" || ! importable perfrun; then
    echo "perfrun could not be installed; using it from the source tree (PYTHONPATH)"
    export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
    importable perfrun || die "perfrun cannot be imported"
fi
(cd / && "$PY" -c 'import perfrun; print("perfrun from", perfrun.__file__)')
offline_install nvtx nvtx
offline_install pytest pytest pluggy iniconfig packaging pygments
# report.html embeds plotly's JavaScript bundle.
offline_install plotly plotly narwhals packaging

say "GPU"
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L
    nvidia-smi --query-gpu=name,driver_version,memory.total,mig.mode.current --format=csv
else
    echo "(nvidia-smi is not on PATH)"
fi
"$PY" - <<'EOF' || die "CUDA is not usable from PyTorch here: the GPU checks cannot run"
import torch
print("torch", torch.__version__, "CUDA", torch.version.cuda)
if not torch.cuda.is_available():
    raise SystemExit("torch.cuda.is_available() is False")
for i in range(torch.cuda.device_count()):
    major, minor = torch.cuda.get_device_capability(i)
    print(f"cuda:{i} {torch.cuda.get_device_name(i)} (sm_{major}{minor})")
EOF

say "pytest -m gpu tests/gpu"
# The project's addopts ask for xdist (-n auto); these checks run in one
# process, so the option is replaced rather than inherited.
"$PY" -m pytest -m gpu tests/gpu -p no:xdist -p no:cacheprovider -o addopts=-ra -v -s "$@"
status=$?

say "figures ($PERFRUN_GPU_FIGURES)"
if [ -s "$PERFRUN_GPU_FIGURES" ]; then
    cat "$PERFRUN_GPU_FIGURES"
    echo
    "$PY" - "$PERFRUN_GPU_FIGURES" <<'EOF' || true
import json, sys
for line in open(sys.argv[1], encoding="utf-8"):
    entry = json.loads(line)
    check = entry.pop("check")
    print(check)
    for key, value in entry.items():
        print(f"    {key}: {value}")
EOF
else
    echo "(no figures recorded)"
fi

if [ "$status" -eq 0 ]; then
    say "gpu_check: every GPU check passed"
else
    say "gpu_check: FAILED (pytest exit status $status)"
fi
exit "$status"
