#!/usr/bin/env bash
# The built-in corpus: the English text of Debian's `fortunes` package (installed by
# setup-debian.sh), byte-level tokenized by gtrain-prep into data/fortunes.{train,val}.bin.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -s data/fortunes.train.bin && -s data/fortunes.val.bin ]]; then exit 0; fi
mkdir -p data
files=()
for f in /usr/share/games/fortunes/*; do
  case "$f" in *.dat|*.u8) continue ;; esac
  [[ -f "$f" ]] && files+=("$f")
done
if ((${#files[@]} == 0)); then
  echo "prepare-corpus: no fortunes text in /usr/share/games/fortunes (apt-get install fortunes)" >&2
  exit 2
fi
build/gtrain-prep --val-fraction 0.1 -o data/fortunes "${files[@]}"
