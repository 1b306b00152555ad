#!/usr/bin/env python3
"""gtrain's optimizer end to end against torch.optim.AdamW in float64 (tests/optim.cmake runs each case).

The reference shares nothing with gtrain but the documented contracts:
  - the model: transformers' LlamaForCausalLM (eager attention) in float64, from the same fp32 weights
    gtrain imports through model.init;
  - the batches: docs' sampling formula (src/core/data.h: window k = mix64(mix64(seed) + (s+1)*golden)
    mod N, step s takes global samples (s-1)*G .. s*G-1), recomputed here in Python;
  - the loss: the mean cross-entropy over the G x T tokens of the step;
  - clipping: torch.nn.utils.clip_grad_norm_ at train.grad_clip over all parameters;
  - AdamW: torch.optim.AdamW with two groups, weight decay on every matrix, the embedding and the LM
    head, none on the RMSNorm weights (docs/model.md);
  - the schedule: docs/model.md's words (linear warm-up over warmup_steps, then cosine or linear to min_lr at
    steps), written out here, set on the groups before each step.
gtrain trains STEPS steps on the CPU (fp32) at each world size, ZeRO stage and dist.grad_sync of the case
(grad_accum 2 at W = 2: micro-batches accumulate; at ZeRO-2/3, grad_sync = micro reduces unit by unit in
every micro-batch, step once per step) and saves its state; every master weight of the file must equal the reference's within WEIGHT_ATOL, every step's
lr (metrics) the schedule's within 1e-6 relative and every grad_norm the reference's pre-clip norm within
1e-5 relative.

Why the constants: grad_clip = 0.02 is far below the norms (1.0 .. 1.3) so every step clips, and adam_eps =
1e-5 is close enough to the clipped per-element gradients (~1e-4) that AdamW's update depends on the clipped
scale (with eps << |g| Adam would be blind to a constant rescaling). lr = 1e-2 makes a missed decay
(1e-2 * 0.1 * ~1 per step on a norm weight) or a wrong schedule show at ~1e-4 .. 1e-3, far above
the fp32 gap measured on a correct build (2.2e-7, one ulp at 1.0; docs/testing.md has each bug's).
"""
import argparse
import json
import math
import os
import shutil
import struct
import subprocess
import sys

import h5py
import numpy as np
import torch
import transformers

STEPS, WARMUP = 6, 2
LR, MIN_LR, WD, CLIP, EPS, B1, B2 = 1e-2, 1e-3, 0.1, 0.02, 1e-5, 0.9, 0.95
SEED = 1234
T, GLOBAL = 16, 8                    # sequence length, global batch in sequences
WEIGHT_ATOL = 2e-6                   # fp32 gtrain vs fp64 reference after STEPS steps: measured 2.2e-7 (1 ulp at 1.0)
LR_RTOL, NORM_RTOL = 1e-6, 1e-5     # measured 2e-9 and 1.6e-7
MODEL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=64, max_position_embeddings=T, rms_norm_eps=1e-5,
             rope_theta=10000.0, tie_word_embeddings=False, attention_dropout=0.0)
M64 = (1 << 64) - 1


def log(msg):
    print(msg, flush=True)


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr, flush=True)
    sys.exit(1)


def mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def window(seed, s, n_windows):
    return mix64((mix64(seed) + (s + 1) * 0x9E3779B97F4A7C15) & M64) % n_windows


def lr_at(step, schedule):
    """docs/model.md: linear warm-up over warmup_steps, then cosine/linear from lr to min_lr at `steps`."""
    if step <= WARMUP:
        return LR * step / WARMUP
    progress = (step - WARMUP) / (STEPS - WARMUP)
    if schedule == "linear":
        return LR + (MIN_LR - LR) * progress
    return MIN_LR + (LR - MIN_LR) * (1 + math.cos(math.pi * progress)) / 2


def make_init(work):
    torch.manual_seed(7)
    cfg = transformers.LlamaConfig(**MODEL, attn_implementation="eager")
    model = transformers.LlamaForCausalLM(cfg).float()
    with torch.no_grad():  # norm weights away from 1, so decaying them (a bug) moves them visibly
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    model.save_pretrained(f"{work}/init")
    rng = np.random.default_rng(3)
    tokens, t = [], 0
    for _ in range(4000):  # runs of a pattern with random jumps: gradients that are not noise
        t = (t + 5) % MODEL["vocab_size"] if rng.random() < 0.8 else int(rng.integers(MODEL["vocab_size"]))
        tokens.append(t)
    with open(f"{work}/train.bin", "wb") as f:  # docs/data-format.md: header, then u16 ids
        f.write(b"GTRNTOK\0" + struct.pack("<IIQII", 1, 2, len(tokens), MODEL["vocab_size"], 0))
        f.write(np.asarray(tokens, dtype="<u2").tobytes())
    return np.asarray(tokens, dtype=np.int64)


def reference(work, tokens, schedule):
    model = transformers.LlamaForCausalLM.from_pretrained(f"{work}/init", dtype=torch.float32,
                                                          attn_implementation="eager").double()
    model.train()
    decay = [p for n, p in model.named_parameters() if not n.endswith("norm.weight")]
    no_decay = [p for n, p in model.named_parameters() if n.endswith("norm.weight")]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=(B1, B2), eps=EPS)
    n_windows = len(tokens) - T
    norms = []
    for step in range(1, STEPS + 1):
        starts = [window(SEED, s, n_windows) for s in range((step - 1) * GLOBAL, step * GLOBAL)]
        x = torch.tensor(np.stack([tokens[k:k + T] for k in starts]))
        y = torch.tensor(np.stack([tokens[k + 1:k + T + 1] for k in starts]))
        opt.zero_grad()
        logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, MODEL["vocab_size"]), y.reshape(-1))
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)))
        for g in opt.param_groups:
            g["lr"] = lr_at(step, schedule)
        opt.step()
    return {n: p.detach().numpy() for n, p in model.named_parameters()}, norms


def run_gtrain(args, work, name, world, shard, sync, schedule):
    accum = GLOBAL // (2 * world)
    ck = f"{work}/ck_{name}"
    shutil.rmtree(ck, ignore_errors=True)
    ini = f"{work}/{name}.ini"
    m = MODEL
    open(ini, "w").write(f"""[model]
dim = {m['hidden_size']}
n_layers = {m['num_hidden_layers']}
n_heads = {m['num_attention_heads']}
n_kv_heads = {m['num_key_value_heads']}
vocab_size = {m['vocab_size']}
ffn_dim = {m['intermediate_size']}
max_seq_len = {T}
norm_eps = {m['rms_norm_eps']}
rope_theta = {m['rope_theta']}
dropout = 0
init = {work}/init
[train]
seq_len = {T}
micro_batch = 2
grad_accum = {accum}
steps = {STEPS}
lr = {LR}
min_lr = {MIN_LR}
warmup_steps = {WARMUP}
lr_schedule = {schedule}
weight_decay = {WD}
beta1 = {B1}
beta2 = {B2}
adam_eps = {EPS}
grad_clip = {CLIP}
seed = {SEED}
precision = fp32
device = cpu
[memory]
recompute = none
[dist]
shard = {shard}
grad_sync = {sync}
[data]
train = {work}/train.bin
val = {work}/train.bin
val_every = 0
[checkpoint]
dir = {ck}
every = {STEPS}
resume = never
[log]
metrics = {work}/{name}.metrics.jsonl
""")
    if os.path.exists(f"{work}/{name}.metrics.jsonl"):
        os.remove(f"{work}/{name}.metrics.jsonl")
    cmd = [os.path.abspath(args.gtrain), ini]
    if world > 1:
        cmd = [args.mpiexec, "-n", str(world)] + args.mpiexec_flags.split() + cmd
    env = dict(os.environ, OMP_NUM_THREADS="1", GTRAIN_PROGRESS="0")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=work)
    if p.returncode != 0:
        fail(f"gtrain {name} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    metrics = [json.loads(l) for l in open(f"{work}/{name}.metrics.jsonl") if '"loss"' in l]
    with h5py.File(f"{ck}/step_{STEPS:08d}.h5", "r") as f:
        weights = {n: f["model"][n][()] for n in f["model"]}
    return weights, metrics


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gtrain", required=True)
    ap.add_argument("--mpiexec", default="mpiexec")
    ap.add_argument("--mpiexec-flags", default="")
    ap.add_argument("--work", required=True)
    ap.add_argument("--schedule", choices=["cosine", "linear"], required=True)
    ap.add_argument("--runs", required=True, help="comma-separated WORLD:SHARD[:GRAD_SYNC], e.g. 1:none,2:optimizer,2:parameters:micro")
    args = ap.parse_args()
    torch.set_num_threads(1)
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    tokens = make_init(args.work)
    ref, ref_norms = reference(args.work, tokens, args.schedule)
    log(f"reference ({args.schedule}): pre-clip grad norms {', '.join(f'{n:.3f}' for n in ref_norms)}; "
        f"lr {', '.join(f'{lr_at(s, args.schedule):.5f}' for s in range(1, STEPS + 1))}")
    if min(ref_norms) <= CLIP:
        fail(f"grad_clip {CLIP} does not clip every step (norms {ref_norms}): the test would miss clipping bugs")
    bad = []
    for spec in args.runs.split(","):
        world, shard, sync = (spec.split(":") + ["auto"])[:3]
        world = int(world)
        name = f"w{world}_{shard}_{sync}_{args.schedule}"
        got, metrics = run_gtrain(args, args.work, name, world, shard, sync, args.schedule)
        if sorted(got) != sorted(ref):
            fail(f"{name}: tensors differ: {sorted(set(got) ^ set(ref))}")
        worst = max((float(np.abs(got[n].astype(np.float64) - ref[n]).max()), n) for n in ref)
        if [m["step"] for m in metrics] != list(range(1, STEPS + 1)):
            fail(f"{name}: metrics steps {[m['step'] for m in metrics]}")
        lr_err = max(abs(m["lr"] - lr_at(m["step"], args.schedule)) / lr_at(m["step"], args.schedule) for m in metrics)
        norm_err = max(abs(m["grad_norm"] - r) / r for m, r in zip(metrics, ref_norms))
        log(f"{name}: max |w - w_ref| {worst[0]:.2e} ({worst[1]}), lr rel {lr_err:.1e}, grad_norm rel {norm_err:.1e}")
        if worst[0] > WEIGHT_ATOL:
            bad.append(f"{name}: {worst[1]} differs from torch's AdamW by {worst[0]:.2e} > {WEIGHT_ATOL}")
        if lr_err > LR_RTOL:
            bad.append(f"{name}: lr differs from the schedule by {lr_err:.2e} relative "
                       f"(gtrain {[m['lr'] for m in metrics]})")
        if norm_err > NORM_RTOL:
            bad.append(f"{name}: grad_norm differs from the reference by {norm_err:.2e} relative")
        if bad and os.environ.get("GTRAIN_MUTANTS_FAIL_FAST"):  # tools/mutants.py: the first failing run is enough
            fail("\n  ".join(bad))
    if bad:
        fail("\n  ".join(bad))
    log("all runs equal the reference")


if __name__ == "__main__":
    main()
