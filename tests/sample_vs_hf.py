#!/usr/bin/env python3
"""gtrain-sample picks the tokens the model says it should, checked against transformers: train a
very small byte-level model, export its state file (tools/state_to_hf.py), and for every token that
gtrain-sample generated recompute the next-token logits with LlamaForCausalLM in float64 over the
same context (the newest max_seq_len tokens, as gtrain-sample slides its window):
  greedy (--temperature 0)       each token is the reference's argmax (its logit within 1e-4 of the
                                 best: float32 against float64 may swap only near-ties)
  --top-k 1 --temperature 1      the greedy text, token for token
  --top-k 5 --temperature 1      each token is among the reference's 5 likeliest (within 1e-4), and
                                 not always the argmax (the sampling ran)
Fails (exit 1) when numpy, torch or transformers are missing in this Python (GTRAIN_HF_PYTHON).
"""
import argparse
import os
import shutil
import subprocess
import sys

try:
    import torch
    import transformers
except ImportError as e:
    print(f"FAIL: {e} in {sys.executable}: configure with -DGTRAIN_HF_PYTHON= the venv of tools/setup-venv.sh")
    sys.exit(1)

from testlib import word_corpus  # noqa: E402  (tests/ is this script's directory)

CONFIG = """[model]
dim = 32
n_layers = 2
n_heads = 2
n_kv_heads = 1
vocab_size = 256
ffn_dim = 96
max_seq_len = 64
[train]
seq_len = 32
micro_batch = 4
steps = 40
precision = fp32
lr = 1e-2
min_lr = 1e-3
warmup_steps = 2
seed = 3
[data]
train = {work}/corpus.train.bin
val =
[checkpoint]
dir = {work}/ck
every = 0
"""
TOL = 1e-4


def fail(msg):
    print(f"FAIL: {msg}", flush=True)
    sys.exit(1)


def sample(args, state, *opts):
    """gtrain-sample's ids: the model's input (prompt) followed by the generated tokens."""
    p = subprocess.run([args.sample, state, "--prompt", "ab", "--tokens", "100", "--seed", "7", "--ids"] + list(opts),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        fail(f"gtrain-sample {' '.join(opts)}: exit {p.returncode}: {p.stderr}")
    return [int(x) for x in p.stdout.split()]


def reference_logits(model, ids, n_in, window):
    """For each generated position n, float64 logits of the token after ids[n - window .. n - 1]."""
    out = []
    with torch.no_grad():
        for n in range(n_in, len(ids)):
            ctx = ids[max(0, n - window):n]
            out.append(model(torch.tensor([ctx])).logits[0, -1])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gtrain", required=True)
    ap.add_argument("--prep", required=True)
    ap.add_argument("--sample", required=True)
    ap.add_argument("--tool", required=True)
    ap.add_argument("--work", required=True)
    args = ap.parse_args()
    work = args.work
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    word_corpus(args.prep, work, 11, ["abacus", "abbey", "sample", "greedy", "token", "logits", "argmax", "the", "a", "of", "byte"], 135_000, words_per_line=(3, 12), val_fraction="0")
    with open(f"{work}/tiny.ini", "w") as f:
        f.write(CONFIG.format(work=work))
    subprocess.run([args.gtrain, f"{work}/tiny.ini"], check=True, env=dict(os.environ, OMP_NUM_THREADS="1"),
                   stdout=subprocess.DEVNULL)
    state = f"{work}/ck/step_00000040.h5"
    subprocess.run([sys.executable, args.tool, state, f"{work}/hf"], check=True, stdout=subprocess.DEVNULL)
    model = transformers.LlamaForCausalLM.from_pretrained(f"{work}/hf", torch_dtype=torch.float64,
                                                          attn_implementation="eager")
    model.eval()
    window = model.config.max_position_embeddings
    if window != 64:
        fail(f"the export's max_position_embeddings is {window}, expected max_seq_len 64")

    greedy = sample(args, state, "--temperature", "0")
    n_in = len(greedy) - 100
    if n_in < 2 or greedy[n_in - 2:n_in] != [ord("a"), ord("b")]:
        fail(f"gtrain-sample's input {greedy[:n_in]} does not end with the prompt 'ab'")
    ref = reference_logits(model, greedy, n_in, window)
    worst = 0.0
    for i, logits in enumerate(ref):
        got = greedy[n_in + i]
        gap = float(logits.max() - logits[got])
        worst = max(worst, gap)
        if gap > TOL:
            fail(f"greedy token {i} (position {n_in + i}): gtrain-sample chose {got}, the reference's argmax is "
                 f"{int(logits.argmax())} (logit {float(logits.max()):.6f} vs {float(logits[got]):.6f})")
    print(f"greedy: 100 tokens, each the reference's argmax (largest logit gap {worst:.2e})")

    top1 = sample(args, state, "--temperature", "1", "--top-k", "1")
    if top1 != greedy:
        fail("--top-k 1 --temperature 1 differs from greedy")
    print("--top-k 1: the greedy tokens")

    top5 = sample(args, state, "--temperature", "1", "--top-k", "5")
    if top5[:n_in] != greedy[:n_in]:
        fail("--top-k 5: another input than greedy's")
    ref = reference_logits(model, top5, n_in, window)
    not_argmax = 0
    for i, logits in enumerate(ref):
        got = top5[n_in + i]
        fifth = float(torch.topk(logits, 5).values[-1])
        if float(logits[got]) < fifth - TOL:
            rank = int((logits > logits[got]).sum())
            fail(f"--top-k 5: token {i} (position {n_in + i}) is {got}, the reference's #{rank + 1}, not in its top 5")
        not_argmax += float(logits.max() - logits[got]) > TOL
    if not_argmax == 0:
        fail("--top-k 5 --temperature 1 picked the argmax 100 times: no sampling happened")
    print(f"--top-k 5: 100 tokens within the reference's top 5, {not_argmax} of them not its argmax")
    print("PASS")


if __name__ == "__main__":
    main()
