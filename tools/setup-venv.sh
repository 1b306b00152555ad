#!/usr/bin/env bash
# Makes (once) the Python virtual environment the tests and benchmarks that need Python packages use:
# torch, transformers, tokenizers, safetensors, h5py, numpy and tensorboard (its event reader, for
# the log.tensorboard tests) from PyPI. It lives at a fixed path
# outside the clone (default /opt/gtrain-venv, or $GTRAIN_VENV), because PyPI's torch wheel brings
# about 5 GB of CUDA libraries: made once, reused by later runs and by CI on the same machine.
# Prints the interpreter's path on its last line.
#   bash tools/setup-venv.sh            make or reuse the venv
set -euo pipefail
venv=${GTRAIN_VENV:-/opt/gtrain-venv}
# Bump when the list changes: a venv with another stamp is brought up to date.
requirements="torch==2.15.0 transformers==5.24.0 tokenizers safetensors h5py numpy tensorboard"
stamp="$venv/.gtrain-requirements"

if [[ -x "$venv/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$requirements" ]] &&
   "$venv/bin/python" -c 'import torch, transformers, tokenizers, safetensors, h5py, numpy, tensorboard' 2>/dev/null; then
  echo "$venv/bin/python"
  exit 0
fi

py=${GTRAIN_VENV_PYTHON:-}
if [[ -z "$py" ]]; then
  for cand in python3 /usr/bin/python3; do
    if command -v "$cand" >/dev/null && "$cand" -c 'import venv, ensurepip' 2>/dev/null; then
      py=$(command -v "$cand"); break
    fi
  done
fi
[[ -n "$py" ]] || { echo "setup-venv: no python3 with venv/ensurepip (apt-get install python3-venv)" >&2; exit 1; }

echo "setup-venv: installing $requirements into $venv (once; torch is large)" >&2
[[ -x "$venv/bin/python" ]] || "$py" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >&2
# shellcheck disable=SC2086
"$venv/bin/python" -m pip install -q --disable-pip-version-check $requirements >&2
"$venv/bin/python" -c 'import torch, transformers, tokenizers, safetensors, h5py, numpy, tensorboard'
echo "$requirements" > "$stamp"
echo "$venv/bin/python"
