#!/usr/bin/env bash
# Remake docs/report.png and docs/watch.png, the README's pictures, from a
# real two-rank gloo run (tests/scripts/watch_ddp.py: rank 1 sleeps outside
# the phases, so rank 0 waits in Backward's all-reduce).
#
# Needs chromium and tmux (Debian packages: apt-get install chromium tmux)
# and perfrun installed in the active Python. report.png is headless
# Chromium's screenshot of the run's report.html; watch.png is `perfrun
# watch` as tmux showed it at 80 columns mid-run (capture-pane with its
# colours, drawn by rich as SVG, then photographed by Chromium).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
work=$(mktemp -d)
trap 'tmux -L perfrun-docs kill-server 2>/dev/null || true; rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
shot() {  # shot URL WIDTH HEIGHT OUT
    chromium --headless --disable-gpu --no-sandbox --hide-scrollbars \
        --window-size="$2,$3" --virtual-time-budget=15000 --screenshot="$4" "$1" 2>/dev/null
}

mkdir -p "$work/log"
tmux -L perfrun-docs new-session -d -x 80 -y 30 -s w \
    "$(command -v python) -m perfrun watch $work/log --interval 0.5; sleep 600"
python -m perfrun -q --log-dir "$work/log" --nproc-per-node 2 tests/scripts/watch_ddp.py \
    --stop-file "$work/stop" --max-seconds 30 --slow-ms 1 >/dev/null 2>&1 &
run=$!
sleep 15
tmux -L perfrun-docs capture-pane -e -p -t w > "$work/watch.ansi"
touch "$work/stop"
wait "$run" || true

python - "$work" <<'EOF'
import sys
from rich.console import Console
from rich.text import Text

work = sys.argv[1]
raw = open(f"{work}/watch.ansi", encoding="utf-8").read().rstrip("\n")
console = Console(record=True, width=80, file=open("/dev/null", "w"), force_terminal=True,
                  color_system="truecolor")
console.print(Text.from_ansi(raw))
console.save_svg(f"{work}/watch.svg", title="perfrun watch (tmux, 80 columns)")
EOF
size=$(grep -o 'viewBox="0 0 [0-9.]* [0-9.]*"' "$work/watch.svg" | head -1 | tr -d '"' \
       | awk '{printf "%d %d", $3, $4}')
read -r w h <<< "$size"
printf '<html><body style="margin:0"><img src="watch.svg" style="width:%spx;height:%spx">' \
    "$w" "$h" > "$work/watch.html"
shot "file://$work/watch.html" "$w" "$h" "$root/docs/watch.png"

python -m perfrun report "$work/log" --format html --output "$work/report.html"
shot "file://$work/report.html" 1200 1750 "$root/docs/report.png"
echo "wrote docs/report.png and docs/watch.png"
