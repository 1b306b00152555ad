# fault_run.sh — sourced by the fault tests (rank_death_ends_job.sh, stops_table.sh, blas_core.sh,
# watchdog_names_hung_rank.sh): `fault_run_dir PREP WORKDIR` makes WORKDIR afresh, enters it, prepares a
# byte corpus from the system's licence texts and writes run.ini, a model small enough that a step takes
# milliseconds, set to run far longer than any test waits. A test appends its own sections to run.ini.
# shellcheck shell=bash
fault_run_dir() {
  local prep=$1 work=$2
  rm -rf "$work" && mkdir -p "$work" && cd "$work" || return 1
  "$prep" --val-fraction 0 -o corpus /usr/share/common-licenses/* >/dev/null || return 1
  cat >run.ini <<'INI'
[model]
dim = 32
n_layers = 2
n_heads = 2
n_kv_heads = 1
ffn_dim = 64
max_seq_len = 32
[train]
seq_len = 32
micro_batch = 2
steps = 10000
warmup_steps = 1
[data]
train = corpus.train.bin
val =
INI
}
