"""testlib.py — what the Python tests that run the real binaries share: the check tally that ends a
scenario with "PASS: ..., N checks" or stops it at the first failed check, and the word corpus that
gtrain-prep turns into the byte tokens of a tiny model (a deterministic text from a seed and a word
list, so each test keeps its own data). Imported with the tests directory on sys.path; Debian's
python3 alone suffices."""
import argparse
import os
import random
import subprocess
import sys

CHECKS = 0

# The [model] section of the tiny configs these tests train (0.1 M parameters, steps of milliseconds);
# each test's config goes on with its own [train], [data] and [checkpoint] sections.
TINY_MODEL = """[model]
dim = 64
n_layers = 2
n_heads = 4
n_kv_heads = 2
vocab_size = 256
ffn_dim = 160
max_seq_len = 64
"""


def fail(msg):
    print(f"FAIL: {msg}", flush=True)
    sys.exit(1)


def check(cond, msg):
    """One named check: counted and printed when it holds, the end of the test when it does not."""
    global CHECKS
    CHECKS += 1
    if not cond:
        fail(msg)
    print(f"  ok: {msg}", flush=True)


def word_corpus(prep, work, seed, words, size, words_per_line=(4, 14), val_fraction="0"):
    """WORK/corpus.txt of about SIZE bytes of sentences drawn from WORDS, then gtrain-prep's
    WORK/corpus.train.bin (and .val.bin with a VAL_FRACTION above 0); returns the prefix WORK/corpus."""
    rng = random.Random(seed)
    lines, n = [], 0
    while n < size:
        line = " ".join(rng.choice(words) for _ in range(rng.randint(*words_per_line))).capitalize() + ".\n"
        lines.append(line)
        n += len(line)
    text = os.path.join(work, "corpus.txt")
    with open(text, "w") as f:
        f.writelines(lines)
    prefix = os.path.join(work, "corpus")
    subprocess.run([prep, "--val-fraction", str(val_fraction), "-o", prefix, text], check=True,
                   stdout=subprocess.DEVNULL)
    return prefix


def scenario_args(scenarios, *required):
    """The command line of a test script that runs one named scenario against the real binaries:
    --gtrain, --prep, the REQUIRED options, --mpiexec, --np-flag, --mpi-flags, --work, SCENARIO."""
    ap = argparse.ArgumentParser()
    for name in ("--gtrain", "--prep") + required + ("--mpiexec",):
        ap.add_argument(name, required=True)
    ap.add_argument("--np-flag", default="-n")
    ap.add_argument("--mpi-flags", default="")
    ap.add_argument("--work", required=True)
    ap.add_argument("scenario", choices=sorted(scenarios))
    return ap.parse_args()


def gtrain_lines(text):
    """gtrain's own lines, less the announcement of a test hook the scenario set (src/core/testhooks.c)."""
    return [line for line in text.splitlines()
            if line.startswith("gtrain:") and not line.startswith("gtrain: test hook active:")]


def trained_steps(out):
    """The step lines of a run's output."""
    return [line for line in out.splitlines() if line.startswith("step ")]
