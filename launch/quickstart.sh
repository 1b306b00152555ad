#!/usr/bin/env bash
# quickstart.sh — README command 1: from a fresh Debian machine to a trained tiny model and its text.
#
#   bash launch/quickstart.sh
#
# Installs the packages (tools/setup-debian.sh, as root), builds (tools/build.sh), makes the byte-level
# fortune corpus (tools/prepare-corpus.sh), trains configs/tiny.ini on 2 CPU ranks (one rank per GPU
# when there are GPUs) into runs/tiny/, plots the loss to runs/tiny/loss.png (matplotlib; else a
# gnuplot text chart; else a table), and prints text sampled from the newest training-state file.
# Stopped runs continue where they stopped when started again (checkpoint.resume=auto).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash tools/setup-debian.sh
bash tools/build.sh
bash tools/prepare-corpus.sh

run=runs/tiny
mkdir -p "$run"
ranks=2
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  ranks=$(nvidia-smi -L | grep -c '^GPU ')
fi
launch/local.sh -n "$ranks" configs/tiny.ini log.metrics="$run/metrics.jsonl" checkpoint.dir="$run"

# ---------------------------------------------------------------- the loss curve
echo
plotted=""
for py in python3 /usr/bin/python3; do
  if command -v "$py" >/dev/null 2>&1 && "$py" -c 'import matplotlib' 2>/dev/null; then
    "$py" tools/plot_metrics.py "$run/metrics.jsonl" -o "$run/loss.png" && plotted=1
    break
  fi
done
# "step":N, "loss":X and "val_loss":X of each JSONL line, for the fallbacks
extract() { # KEY -> "step value" lines
  sed -n "s/.*\"step\":\([0-9]*\).*\"$1\":\([-0-9.eE+]*\).*/\1 \2/p" "$run/metrics.jsonl"
}
if [[ -z "$plotted" ]] && command -v gnuplot >/dev/null 2>&1; then
  tmp=$(mktemp -d)
  extract loss >"$tmp/train.dat"
  extract val_loss >"$tmp/val.dat"
  gnuplot -e "set terminal dumb 100 28; set title 'runs/tiny: loss vs step'; set xlabel 'step';
              plot '$tmp/train.dat' with lines title 'train', '$tmp/val.dat' with points pt 'O' title 'val'" &&
    plotted=1
  rm -rf "$tmp"
fi
if [[ -z "$plotted" ]]; then
  echo "(no matplotlib or gnuplot: apt-get install python3-matplotlib for runs/tiny/loss.png)"
  echo "step   train loss   (every 20 steps)"
  extract loss | awk '$1 == 1 || $1 % 20 == 0 { printf "%5d   %.4f\n", $1, $2 }'
  echo "validation loss:"
  extract val_loss | awk '{ printf "%5d   %.4f\n", $1, $2 }'
fi

# ---------------------------------------------------------------- what it learned
state=$(ls "$run"/step_*.h5 2>/dev/null | sort | tail -n 1 || true)
if [[ -z "$state" ]]; then
  echo "quickstart: no training-state file in $run" >&2
  exit 1
fi
echo
echo "=== text from $state ==="
build/gtrain-sample "$state" --prompt "The meaning of life is" --tokens 200 --seed 1
echo
