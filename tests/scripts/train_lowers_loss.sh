#!/usr/bin/env bash
# Training on real English text lowers the loss: byte-level tokens of the fortunes corpus (or, if
# the fortunes package is missing, the licence texts every Debian system has), 60 steps of a small
# model; the mean training loss of the last 10 steps must be at least 1.0 nat below the first
# step's (byte-level text starts near ln 256 = 5.55), and the validation loss must fall too.
#   train_lowers_loss.sh GTRAIN GTRAIN_PREP WORKDIR
set -euo pipefail
gtrain=$1 prep=$2 work=$3
rm -rf "$work" && mkdir -p "$work" && cd "$work"
texts=()
for f in /usr/share/games/fortunes/*; do
  case "$f" in *.dat|*.u8) continue ;; esac
  [[ -f "$f" ]] && texts+=("$f")
done
((${#texts[@]})) || texts=(/usr/share/common-licenses/*)
"$prep" --val-fraction 0.05 -o corpus "${texts[@]}" >/dev/null
cat >run.ini <<INI
[model]
dim = 64
n_layers = 2
n_heads = 4
n_kv_heads = 2
ffn_dim = 160
max_seq_len = 64
[train]
seq_len = 64
micro_batch = 8
steps = 60
warmup_steps = 5
lr = 3e-3
[data]
train = corpus.train.bin
val = corpus.val.bin
val_every = 30
val_batches = 4
[log]
every = 10
metrics = metrics.jsonl
INI
OMP_NUM_THREADS=1 "$gtrain" run.ini
python3 - <<'PY'
import json, sys
rows = [json.loads(l) for l in open("metrics.jsonl")]
train = [r for r in rows if "loss" in r]
val = [r["val_loss"] for r in rows if "val_loss" in r]
assert [r["step"] for r in train] == list(range(1, 61)), "one metrics line per step, counted from 1"
for key in ("step", "loss", "lr", "grad_norm", "tokens", "tok_per_s", "step_ms", "mfu", "act_peak_bytes",
            "mem_peak_bytes", "recomputed_blocks", "optim_bytes", "comm_bytes", "mem_reserved_bytes"):
    assert key in train[0], f"metrics line lacks {key}"
assert train[0]["mfu"] is None, "mfu is null on the CPU"
assert train[0]["mem_reserved_bytes"] is None, "mem_reserved_bytes is null on the CPU (no caching allocator)"
assert train[0]["act_peak_bytes"] > 0 and train[0]["mem_peak_bytes"] > train[0]["act_peak_bytes"]
first, last = train[0]["loss"], sum(r["loss"] for r in train[-10:]) / 10
print(f"loss: step 1 {first:.4f} -> mean of last 10 {last:.4f}; val {val}")
if not last < first - 1.0:
    sys.exit("training did not lower the loss by 1 nat")
if not (len(val) == 2 and val[1] < val[0]):
    sys.exit("validation loss did not fall")
PY
