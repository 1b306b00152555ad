#!/usr/bin/env python3
"""Driver of the end-to-end data-parallel tests (tests/dist_train.cmake). Standard library only.

  prep        --work DIR --prep GTRAIN_PREP [--fallback-text FILE]
              a byte-level token file DIR/data/corpus.train.bin from /usr/share/common-licenses/*
              (or FALLBACK when that directory is missing)
  run         --work DIR --name NAME --world W --accum A --shard S -- MPIEXEC... GTRAIN
              writes DIR/NAME.ini (a tiny model, fixed global batch micro_batch*A*W = 16 sequences),
              runs `MPIEXEC... GTRAIN NAME.ini` in DIR (exit 0 expected) and checks DIR/NAME.metrics.jsonl:
              one line per step 1..STEPS, finite loss and grad_norm, and per step
                optim_bytes == 12 * slice_len     slice_len = ceil(n/W) (shard=optimizer), n (none)
                comm_bytes  == (W-1)*slice_len*4 [reduce-scatter] + (W-1)*slice_len*4 [all-gather]
                               (shard=optimizer), 2*(W-1)*n*4 // W [all-reduce] (shard=none), 0 at W=1
              where n is the parameter count (computed here from the shape, and checked against
              the count gtrain prints); --docs trains with document masking and restarting positions,
              --masked on a copy of the corpus with a loss mask (written by prep); --no-sep-loss
              with data.separator_loss = false, --sep-masked on a copy whose mask leaves out the same targets
  compare     --work DIR --ref NAME NAME...
              every run's loss within 1e-5 relative of the reference's, step by step; grad_norm and
              the final state files (h5diff over /model) too, where the runs wrote any
  expect-fail --work DIR --name NAME --world W --accum A --shard S --expect-rc RC --expect-msg TEXT
              -- MPIEXEC... GTRAIN : the run exits RC and its output contains TEXT
"""
import argparse
import glob
import json
import math
import os
import shutil
import subprocess
import sys

# The model and schedule every run shares. Global batch = MICRO * grad_accum * world = 16 sequences.
MODEL = dict(dim=64, n_layers=3, n_heads=4, n_kv_heads=2, vocab_size=256, ffn_dim=128, max_seq_len=32)
SEQ, MICRO, STEPS = 32, 4, 20
# micro-batches per step over all ranks (the global batch is MICRO x this); bench/zero_grid.sh varies it
GLOBAL_MICROS = int(os.environ.get("DT_GLOBAL_MICROS", "4"))
LOSS_RTOL = 1e-5        # the brief: summation order only
GRAD_NORM_RTOL = 1e-5   # observed ~1e-8 between world sizes
WEIGHT_ATOL = 1e-5      # final weights (absolute; parameters are O(0.02..1), updates O(lr = 1e-3))


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def n_params(m):
    c, hd = m["dim"], m["dim"] // m["n_heads"]
    kvd = m["n_kv_heads"] * hd
    per_layer = 2 * c * c + 2 * c * kvd + 3 * c * m["ffn_dim"] + 2 * c
    return (1 if m.get("tie_word_embeddings") else 2) * m["vocab_size"] * c + m["n_layers"] * per_layer + c


def units(m):
    """[(offset, numel)] of the ZeRO units (src/core/model.h): embedding, blocks, final norm (+ lm_head)."""
    c, hd = m["dim"], m["dim"] // m["n_heads"]
    kvd = m["n_kv_heads"] * hd
    block = 2 * c * c + 2 * c * kvd + 3 * c * m["ffn_dim"] + 2 * c
    embed = m["vocab_size"] * c
    head = c + (0 if m.get("tie_word_embeddings") else embed)
    out, off = [], 0
    for size in [embed] + [block] * m["n_layers"] + [head]:
        out.append((off, size))
        off += size
    return out


def slices(n, world):
    sl = -(-n // world)
    return sl, [(min(r * sl, n), min((r + 1) * sl, n)) for r in range(world)]


def overlap(a0, a1, b0, b1):
    return max(0, min(a1, b1) - max(a0, b0))


def micro_acc_peak(us, tied, N):
    """Elements of gradient accumulators at their peak under grad_sync = micro (zero.h): the one being
    filled and the previous unit's, still reducing; tied, the embedding's stays open all backward."""
    Ue, Ub, Uh = us[0][1], us[1][1], us[-1][1]
    if tied:
        return max(Uh + Ue + Ub, Ue + 2 * Ub if N >= 2 else 0)
    return max(Uh + Ub, 2 * Ub if N >= 2 else 0, Ub + Ue)


# MPI's reduce-scatter staging (src/dist/comm.h): a blocking one in chunks of at most STAGING_BYTES,
# W x min(chunk, slice) x 4 bytes kept from step 1 on; a started one W x (its elements in the rank's
# slice) x 4 from start to wait; at most BUCKETS_IN_FLIGHT gradient buckets in flight (src/core/zero.h)
STAGING_BYTES, MAX_CALL_ELEMS, BUCKETS_IN_FLIGHT = 16 << 20, 1 << 26, 2


def staging(m, world, shard, micro, bucket_mb, rank):
    """comm_staging_bytes of rank `rank` (None: the most of any rank, what the planner predicts)."""
    stage = {"none": 0, "optimizer": 1, "gradients": 2, "parameters": 3}[shard]
    if world < 2 or stage == 0:
        return 0
    if rank is None:
        return max(staging(m, world, shard, micro, bucket_mb, r) for r in range(world))
    n, us, W = n_params(m), units(m), world
    sl, sls = slices(n, world)
    if micro:  # one unit in flight at a time
        return max(W * overlap(off, off + size, *sls[rank]) * 4 for off, size in us)
    if bucket_mb > 0:  # each bucket's range of the padded buffer against the padded slice [r sl, (r+1) sl)
        held = []
        most = 0
        for lo, hi in bucket_plan(m, world, bucket_mb):
            b1 = sl * W if hi == len(us) else us[hi - 1][0] + us[hi - 1][1]
            held = held[-(BUCKETS_IN_FLIGHT - 1):] + [W * overlap(us[lo][0], b1, rank * sl, (rank + 1) * sl) * 4]
            most = max(most, sum(held))
        return most
    chunk = max(1, min(MAX_CALL_ELEMS, STAGING_BYTES // 4) // W)
    return W * min(chunk, sl) * 4


def check_staging(name, stdout, lines, m, world, shard, micro, bucket_mb):
    """Every step's comm_staging_bytes (rank 0's) is the formula's, and so is the prediction gtrain
    printed (the most of any rank, and rank 0's): the planner counts the staging to the byte."""
    want0, want = staging(m, world, shard, micro, bucket_mb, 0), staging(m, world, shard, micro, bucket_mb, None)
    pred = [ln for ln in stdout.splitlines() if "predicted reduce-scatter staging per rank" in ln]
    if want and not pred:
        fail(f"{name}: gtrain printed no predicted reduce-scatter staging (the formula says {want})")
    if pred:
        words = pred[0].replace(",", "").replace(";", "").split()
        i = words.index("comm_staging_bytes")  # "comm_staging_bytes N rank 0 M"
        got, got0 = int(words[i + 1]), int(words[i + 4])
        if (got, got0) != (want, want0):
            fail(f"{name}: predicted staging {got} (rank 0 {got0}), the formula says {want} (rank 0 {want0})")
    for x in lines:
        if x.get("comm_staging_bytes") != want0:
            fail(f"{name} step {x['step']}: comm_staging_bytes {x.get('comm_staging_bytes')}, expected {want0} "
                 f"(world {world}, shard {shard}, micro {micro}, bucket_mb {bucket_mb})")
    return want0, want


def grad_micro_of(m, shard, sync, accum, world):
    """dist.grad_sync as the run resolved it: `sync` is the configured mode, or with auto the one the
    trainer printed (resolved_sync: the planner's choice, by its time model; test_timemodel tests that
    choice). Only ZeRO-2/3 have the mode."""
    if shard not in ("gradients", "parameters"):
        return False
    return sync == "micro"


def resolved_sync(a, stdout):
    """dist.grad_sync as configured, or with auto what the trainer's start-up line says it chose."""
    if a.sync != "auto" or a.shard not in ("gradients", "parameters"):
        return a.sync
    line = [ln for ln in stdout.splitlines() if "predicted peaks per rank" in ln]
    if not line:
        fail(f"{a.name}: gtrain printed no grad_sync choice")
    return "micro" if "grad_sync micro" in line[0] else "step"


def longest_segment(recompute, n_layers):
    if recompute == "full":
        return 1
    if recompute.startswith("uniform:"):
        return int(recompute.split(":")[1])
    return 1


def expected(m, world, accum, shard, sync, recompute, prefetch=1, rank=0, precision="fp32"):
    """Per-step figures of rank `rank`, from src/dist/comm.h's ring model, optim.h and zero.h:
    optim_bytes, comm_bytes, collective call counts, unit gathers, params/grads peak bytes. The working
    parameters (ZeRO-1/2 all-gather, ZeRO-3 gathers, params peak) are e bytes each: 2 in bf16, 4 in fp32;
    gradients and their reductions stay fp32 (4) in both."""
    n = n_params(m)
    sl, sls = slices(n, world)
    W, e = world, (2 if precision == "bf16" else 4)
    stage = {"none": 0, "optimizer": 1, "gradients": 2, "parameters": 3}[shard]
    micro = grad_micro_of(m, shard, sync, accum, world)
    sharded = stage >= 1 and W > 1
    us = units(m)
    tied = 1 if m.get("tie_word_embeddings") else 0
    N = m["n_layers"]
    cnt = lambda u, r: overlap(us[u][0], us[u][0] + us[u][1], *sls[r])
    calls = dict(all_reduce=0, reduce_scatter=0, all_gather=0, reduce_scatter_v=0, all_gather_v=0, scalar=0)  # the loss's reduction is not counted
    comm = 0
    if stage == 0 and W > 1:
        calls["all_reduce"] = 1
        comm += 2 * (W - 1) * n * 4 // W
    if sharded:
        calls["scalar"] += 1  # the grad norm
    if stage >= 1 and not micro and W > 1:
        calls["reduce_scatter"] = 1
        comm += (W - 1) * sl * 4
    if micro:  # every unit once per micro-batch, reduce-scatter-v: (total - own count)
        calls["reduce_scatter_v"] = accum * len(us)
        comm += accum * sum((us[u][1] - cnt(u, rank)) * 4 for u in range(len(us)))
    if stage in (1, 2) and W > 1:
        calls["all_gather"] = 1
        comm += (W - 1) * sl * e
    gathers = 0
    if stage == 3:  # forward: every unit (+ the tied embedding for the head); backward: each block ONCE
        gathered = list(range(len(us))) + ([0] if tied else []) + list(range(1, N + 1))
        gathers = accum * len(gathered)
        calls["all_gather_v"] = gathers
        comm += accum * sum((us[u][1] - cnt(u, (rank + 1) % W)) * e for u in gathered)
    n_pad = sl * W if sharded else n
    slice_len = sl if stage >= 1 else n
    Ue, Ub, Uh = us[0][1], us[1][1], us[-1][1]
    K = longest_segment(recompute, N)
    bound = {}
    if stage == 3 and prefetch == 0:
        # gathered one at a time, except a recompute segment (K blocks) and the tied head (+ embedding)
        params_peak = slice_len * e + max(Ue, Uh + tied * Ue, K * Ub) * e
    elif stage == 3:
        params_peak = None  # with prefetch: the planner's replay; bounded by the units in use + depth
        bound["params_peak_bytes"] = slice_len * e + (K + prefetch + tied) * max(Ue, Ub, Uh) * e
    else:
        params_peak = n_pad * e
    if micro:
        # the accumulator in use and the previous unit's, still reducing (one reduce-scatter in flight);
        # tied: the embedding's accumulator stays open from the head's backward to its own
        grads_peak = slice_len * 4 + micro_acc_peak(us, tied, N) * 4
    else:
        grads_peak = n_pad * 4
    optim = 12 * (sl if sharded else n)
    return dict(optim_bytes=optim, comm_bytes=comm, calls=calls, unit_gathers=gathers,
                params_peak_bytes=params_peak, grads_peak_bytes=grads_peak), bound


# --docs: documents inside the windows, delimited by the byte 'e' (a few per 32-token window), with
# block-causal attention and RoPE positions restarting at each; --masked: the masked copy of the corpus
# (cmd_prep), its loss mask read (docs/data-format.md)
DOCS = "document_mask = true\nreset_positions = true\nseparator = 101\nseparator_role = eos\n"
MASKED_TRAIN = "data/masked.train.bin"
# --no-sep-loss: data.separator_loss = false with the separator 'e'; --sep-masked: instead a copy of the
# corpus whose loss mask leaves out the same targets (those whose input is 'e'), loss_mask = on
NO_SEP_LOSS = "separator = 101\nseparator_loss = false\n"
SEPMASK_TRAIN = "data/sepmask.train.bin"


def write_config(work, name, accum, shard, recompute="none", sync="auto", steps=None, every=0, keep=1,
                 resume="never", state_dir=None, model=None, prefetch=1, precision="fp32", docs=False, masked=False,
                 no_sep_loss=False, sep_masked=False, bucket_mb=0,
                 param_gather=False):
    m = model or MODEL
    data_keys = ((DOCS if docs else "") + ("loss_mask = on\n" if masked or sep_masked else "") +
                 (NO_SEP_LOSS if no_sep_loss else ""))
    train = MASKED_TRAIN if masked else SEPMASK_TRAIN if sep_masked else "data/corpus.train.bin"
    text = f"""; written by tests/dist/dist_train.py: {name}
[model]
dim = {m['dim']}
n_layers = {m['n_layers']}
n_heads = {m['n_heads']}
n_kv_heads = {m['n_kv_heads']}
vocab_size = {m['vocab_size']}
ffn_dim = {m['ffn_dim']}
max_seq_len = {m['max_seq_len']}
tie_word_embeddings = {"true" if m.get("tie_word_embeddings") else "false"}
dropout = 0

[train]
seq_len = {SEQ}
micro_batch = {MICRO}
grad_accum = {accum}
steps = {steps or STEPS}
lr = 1e-3
min_lr = 1e-4
warmup_steps = 2
lr_schedule = cosine
weight_decay = 0.1
grad_clip = 1.0
seed = 4242
precision = {precision}
device = cpu

[memory]
recompute = {recompute}

[dist]
shard = {shard}
grad_sync = {sync}
prefetch = {prefetch}
bucket_mb = {bucket_mb}
overlap_param_gather = {"true" if param_gather else "false"}
comm = mpi

[data]
train = {train}
val =
val_every = 0
{data_keys}
[checkpoint]
dir = {state_dir or name + ".state"}
every = {every}
keep = {keep}
resume = {resume}

[log]
every = 5
metrics = {name}.metrics.jsonl
"""
    path = os.path.join(work, name + ".ini")
    with open(path, "w") as f:
        f.write(text)
    return name + ".ini"


def cmd_prep(a):
    os.makedirs(os.path.join(a.work, "data"), exist_ok=True)
    sources = sorted(p for p in glob.glob("/usr/share/common-licenses/*") if os.path.isfile(p))
    if not sources:
        sources = [a.fallback_text]
    corpus = os.path.join(a.work, "data", "corpus.txt")
    with open(corpus, "wb") as out:
        for p in sources:
            with open(p, "rb") as f:
                out.write(f.read())
    size = os.path.getsize(corpus)
    need = STEPS * MICRO * GLOBAL_MICROS * (SEQ + 1)
    print(f"corpus: {len(sources)} file(s), {size} bytes (the runs read about {need} tokens)")
    r = subprocess.run([a.prep, "--val-fraction", "0", "-o", os.path.join(a.work, "data", "corpus"), corpus],
                       capture_output=True, text=True)
    print(r.stdout + r.stderr)
    if r.returncode != 0:
        fail(f"gtrain-prep exited {r.returncode}")
    # the masked copy: the same tokens, a loss mask counting the tokens of every other line (so the
    # samples, micro-batches and ranks of a step count different numbers of targets)
    with open(os.path.join(a.work, "data", "corpus.train.bin"), "rb") as f:
        raw = f.read()
    count = int.from_bytes(raw[16:24], "little")
    tokens = raw[32:32 + 2 * count:2]  # byte-level: the low byte of each u16 token
    mask, line = bytearray(count), 0
    for i, t in enumerate(tokens):
        mask[i] = line & 1
        line += t == 10
    # and the copy for --sep-masked: every target counted but those whose input is the separator 'e'
    sepmask = bytearray(b"\1" * count)
    for i, t in enumerate(tokens[:-1]):
        if t == 101:
            sepmask[i + 1] = 0
    for path, m in ((MASKED_TRAIN, mask), (SEPMASK_TRAIN, sepmask)):
        with open(os.path.join(a.work, path), "wb") as f:
            f.write(raw)
        with open(os.path.join(a.work, path[:-4] + ".mask"), "wb") as f:
            f.write(b"GTRNMSK\0" + (1).to_bytes(4, "little") + (1).to_bytes(4, "little") + count.to_bytes(8, "little")
                    + bytes(8) + bytes(m))
        print(f"{path}: {sum(m)} of {count} tokens counted")


def read_metrics(path):
    if not os.path.exists(path):
        fail(f"{path} was not written")
    lines = []
    with open(path) as f:
        for ln in f:
            ln = ln.strip()
            if ln:
                obj = json.loads(ln)
                if "loss" in obj:  # validation lines carry val_loss only
                    lines.append(obj)
    return lines


def model_of(a):
    return dict(MODEL, tie_word_embeddings=True) if getattr(a, "tied", False) else MODEL


def launch(a, ini):
    cmd = a.cmd + [ini]
    print("+ (cd " + a.work + " && " + " ".join(cmd) + ")", flush=True)
    r = subprocess.run(cmd, cwd=a.work, capture_output=True, text=True)
    print(r.stdout)
    print(r.stderr, file=sys.stderr)
    if r.returncode != 0:
        fail(f"{a.name}: gtrain exited {r.returncode}")
    if getattr(a, "expect_out", "") and a.expect_out not in r.stdout:
        fail(f"{a.name}: the output does not say '{a.expect_out}'")
    return r


def check_metrics(a, r, lines, first_step):
    name, m = a.name, model_of(a)
    n = n_params(m)
    printed = [ln for ln in r.stdout.splitlines() if ln.startswith("gtrain: ") and ln.split()[1].isdigit()
               and ln.split()[2].startswith("parameters")]
    if not printed or printed[0].split()[1] != str(n):
        fail(f"{name}: expected gtrain to report {n} parameters, got {printed[:1]}")
    steps = [x["step"] for x in lines]
    if steps != list(range(first_step, STEPS + 1)):
        fail(f"{name}: metrics steps {steps}, expected {first_step}..{STEPS}")
    sync = resolved_sync(a, r.stdout)
    want, bound = expected(m, a.world, a.accum, a.shard, sync, a.recompute, a.prefetch, precision=a.precision)
    # the planner's prediction gtrain prints must be the measured peak too (ZeRO-2/3)
    pred = [ln for ln in r.stdout.splitlines() if "predicted peaks per rank" in ln]
    if a.shard in ("gradients", "parameters"):
        if not pred:
            fail(f"{name}: gtrain printed no predicted peaks")
        words = pred[0].replace(",", "").split()
        for key in ("params_peak_bytes", "grads_peak_bytes"):
            got = int(words[words.index(key) + 1])
            if want[key] is None:  # measured must equal the prediction, within the closed-form bound (expected())
                want[key] = got
                if got > bound[key]:
                    fail(f"{name}: predicted {key} {got} exceeds the bound {bound[key]}")
            elif got != want[key]:
                fail(f"{name}: predicted {key} {got}, the formula says {want[key]}")
    for x in lines:
        for key in ("loss", "grad_norm"):
            if x.get(key) is None or not math.isfinite(x[key]):
                fail(f"{name} step {x['step']}: {key} = {x.get(key)}")
        for key in ("optim_bytes", "comm_bytes", "unit_gathers", "params_peak_bytes", "grads_peak_bytes", "calls"):
            if x.get(key) != want[key]:
                fail(f"{name} step {x['step']}: {key} {x.get(key)}, expected {want[key]} "
                     f"(n = {n}, world {a.world}, accum {a.accum}, shard {a.shard}, grad_sync {sync}, "
                     f"recompute {a.recompute})")
        if x.get("tokens") != x["step"] * MICRO * GLOBAL_MICROS * SEQ:
            fail(f"{name} step {x['step']}: tokens {x.get('tokens')}, expected {x['step'] * MICRO * GLOBAL_MICROS * SEQ}")
        if "comm_ms" not in x or x["comm_ms"] < 0 or x.get("comm_total_ms", -1) < x["comm_ms"]:
            fail(f"{name} step {x['step']}: comm_ms {x.get('comm_ms')} / comm_total_ms {x.get('comm_total_ms')}")
        check_exposed(a, x)
    st0, _ = check_staging(name, r.stdout, lines, m, a.world, a.shard,
                           grad_micro_of(m, a.shard, sync, a.accum, a.world), 0)
    print(f"{name}: {len(lines)} steps, comm_staging_bytes {st0}, per step optim_bytes {want['optim_bytes']}, comm_bytes {want['comm_bytes']}, "
          f"calls {want['calls']}, unit gathers {want['unit_gathers']}, params peak {want['params_peak_bytes']}, "
          f"grads peak {want['grads_peak_bytes']}: ok; final loss {lines[-1]['loss']:.7f}")


def check_exposed(a, x):
    """comm_exposed_ms (docs/data-parallel.md, "What the metrics say"): the waits alone, so at most
    comm_ms; 0 on one rank; above 0 at W > 1 (every step waits for at least the gradient norm's
    reduction); equal to comm_ms and comm_total_ms where every collective blocks (ZeRO-0/1)."""
    name, e = a.name, x.get("comm_exposed_ms")
    if e is None or e < 0 or e > x["comm_ms"]:
        fail(f"{name} step {x['step']}: comm_exposed_ms {e}, comm_ms {x['comm_ms']}: want 0 <= exposed <= comm_ms")
    if a.world == 1 and e != 0:
        fail(f"{name} step {x['step']}: comm_exposed_ms {e} on one rank, want 0")
    if a.world > 1 and not e > 0:
        fail(f"{name} step {x['step']}: comm_exposed_ms {e} at W = {a.world}, want > 0 (the step waits on reductions)")
    if a.world > 1 and a.shard in ("none", "optimizer") and not e == x["comm_ms"] == x["comm_total_ms"]:
        fail(f"{name} step {x['step']}: blocking collectives only, yet comm_exposed_ms {e}, comm_ms {x['comm_ms']}, "
             f"comm_total_ms {x['comm_total_ms']} differ")


def check_shape(a):
    if MICRO * a.accum * a.world != MICRO * GLOBAL_MICROS:
        fail(f"world {a.world} x grad_accum {a.accum} is not {GLOBAL_MICROS} micro-batches per step")


def cmd_run(a):
    check_shape(a)
    name = a.name
    if os.path.exists(os.path.join(a.work, name + ".metrics.jsonl")):
        os.remove(os.path.join(a.work, name + ".metrics.jsonl"))
    shutil.rmtree(os.path.join(a.work, name + ".state"), ignore_errors=True)
    os.makedirs(os.path.join(a.work, name + ".state"))
    every = STEPS // 2 if a.save_half else 0
    ini = write_config(a.work, name, a.accum, a.shard, a.recompute, a.sync, every=every, keep=2,
                       model=model_of(a), prefetch=a.prefetch, precision=a.precision, docs=a.docs,
                       masked=a.masked, no_sep_loss=a.no_sep_loss, sep_masked=a.sep_masked)
    r = launch(a, ini)
    check_metrics(a, r, read_metrics(os.path.join(a.work, name + ".metrics.jsonl")), 1)


def cmd_resume(a):
    """Continue run FROM's state file of step STEPS/2 under this run's world and shard: the steps after it
    must match FROM's own (compare them with `compare`)."""
    check_shape(a)
    name, half = a.name, STEPS // 2
    src = os.path.join(a.work, a.source + ".state", f"step_{half:08d}.h5")
    if not os.path.exists(src):
        fail(f"{src} missing: run {a.source} with --save-half first")
    d = os.path.join(a.work, name + ".state")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    shutil.copy(src, d)
    if os.path.isdir(src + ".d"):  # an asynchronous save: its rank files go with it
        shutil.copytree(src + ".d", os.path.join(d, os.path.basename(src) + ".d"))
    if os.path.exists(os.path.join(a.work, name + ".metrics.jsonl")):
        os.remove(os.path.join(a.work, name + ".metrics.jsonl"))
    ini = write_config(a.work, name, a.accum, a.shard, a.recompute, a.sync, every=0, keep=2, resume="auto",
                       model=model_of(a), prefetch=a.prefetch, precision=a.precision)
    r = launch(a, ini)
    want = f"resumed from {name}.state/{os.path.basename(src)} (step {half})"  # dir relative to the work dir
    if want not in r.stdout:
        fail(f"{name}: the output does not say '{want}': the run did not resume from the copied file")
    check_metrics(a, r, read_metrics(os.path.join(a.work, name + ".metrics.jsonl")), half + 1)


def bucket_plan(m, world, mb):
    """[(u_lo, u_hi)] of the gradient buckets (src/core/zero.c gt_zero_set_buckets): from the head unit
    down, consecutive units until at least mb MiB of fp32 gradients."""
    us, want = units(m), int(mb * 1024 * 1024)
    out, hi = [], len(us)
    while hi > 0:
        lo = hi - 1
        size = us[lo][1] * 4
        while lo > 0 and size < want:
            lo -= 1
            size += us[lo][1] * 4
        out.append((lo, hi))
        hi = lo
    return out


GATHER_WINDOW = 2  # zero.h: GT_ZERO_PARAM_GATHERS_IN_FLIGHT


def cmd_buckets(a):
    """The same run (6 steps, grad_sync = step) with dist.bucket_mb = 0 and = --bucket-mb (and with
    --param-gather also dist.overlap_param_gather = true): the losses, grad norms and final weights must
    be EQUAL (bit for bit: every MPI reduce-scatter sums in rank order, so the cut into buckets changes
    nothing; a gather copies); the bucketed run reduces the expected buckets, those above block 0
    started before block 0's backward ended, and sends the same bytes (with --param-gather: the
    weights' gather as one all_gather_v per unit, by the v-formula of comm.h)."""
    check_shape(a)
    m, steps = model_of(a), 6
    plan = bucket_plan(m, a.world, a.bucket_mb)
    early = sum(1 for lo, hi in plan if lo >= 2)
    runs, staged, totals = {}, {}, {}
    for tag, mb in (("flat", 0), ("bucket", a.bucket_mb)):
        name = f"{a.name}_{tag}"
        shutil.rmtree(os.path.join(a.work, name + ".state"), ignore_errors=True)
        os.makedirs(os.path.join(a.work, name + ".state"))
        if os.path.exists(os.path.join(a.work, name + ".metrics.jsonl")):
            os.remove(os.path.join(a.work, name + ".metrics.jsonl"))
        ini = write_config(a.work, name, a.accum, a.shard, a.recompute, "step", steps=steps, keep=1, model=m,
                           prefetch=a.prefetch, bucket_mb=mb, param_gather=a.param_gather and tag == "bucket")
        r = launch(a, ini)
        lines = read_metrics(os.path.join(a.work, name + ".metrics.jsonl"))
        if [x["step"] for x in lines] != list(range(1, steps + 1)):
            fail(f"{name}: metrics steps {[x['step'] for x in lines]}, expected 1..{steps}")
        runs[tag] = lines
        staged[tag] = check_staging(name, r.stdout, lines, m, a.world, a.shard, False, mb)
        totals[tag] = r.stdout
    for f, b in zip(runs["flat"], runs["bucket"]):
        st = f["step"]
        if f["buckets"] != 0:
            fail(f"step {st}: the unbucketed run reduced {f['buckets']} buckets")
        if (b["buckets"], b["buckets_early"]) != (len(plan), early):
            fail(f"step {st}: {b['buckets']} buckets, {b['buckets_early']} started before block 0's backward "
                 f"ended; expected {len(plan)} ({plan}) and {early}")
        if b["calls"]["reduce_scatter"] != 0 or b["calls"]["reduce_scatter_v"] != f["calls"]["reduce_scatter_v"] + len(plan):
            fail(f"step {st}: calls {b['calls']} (bucketed) vs {f['calls']}: expected the reduce-scatter cut "
                 f"into {len(plan)}")
        want_bytes, want_ag, want_agv = f["comm_bytes"], f["calls"]["all_gather"], f["calls"]["all_gather_v"]
        want_window = 0
        if a.param_gather:  # rank 0's view: every unit's block but its successor's (rank 1's) own
            n, us = n_params(m), units(m)
            sl, sls = slices(n, a.world)
            # a step counts the gathers it starts: the first GATHER_WINDOW at its end, the others in the
            # next step's forward (one in flight ends, the next starts); step 1 follows a blocking
            # gather of the initial weights, so it starts only its end's
            started = us if st > 1 else us[:GATHER_WINDOW]
            want_bytes += sum((size - overlap(off, off + size, *sls[1 % a.world])) * 4 for off, size in started)
            want_bytes -= (a.world - 1) * sl * 4
            want_ag, want_agv = 0, want_agv + len(started)
            want_window = min(GATHER_WINDOW, len(us))
        if f["param_gathers_in_flight"] != 0 or b["param_gathers_in_flight"] != want_window:
            fail(f"step {st}: param_gathers_in_flight {b['param_gathers_in_flight']} (unbucketed "
                 f"{f['param_gathers_in_flight']}): expected {want_window} of the weights' gathers in flight "
                 f"at once at the most (0 without the overlapped gather)")
        if b["comm_bytes"] != want_bytes:
            fail(f"step {st}: comm_bytes {b['comm_bytes']} bucketed, expected {want_bytes} (unbucketed {f['comm_bytes']})")
        if (b["calls"]["all_gather"], b["calls"]["all_gather_v"]) != (want_ag, want_agv):
            fail(f"step {st}: calls {b['calls']}: expected all_gather {want_ag}, all_gather_v {want_agv}")
        for key in ("loss", "grad_norm"):
            if b[key] != f[key]:
                fail(f"step {st}: {key} {b[key]!r} bucketed vs {f[key]!r} unbucketed: not bit for bit")
    fs, bs = newest_state(a.work, a.name + "_flat"), newest_state(a.work, a.name + "_bucket")
    h5diff = shutil.which("h5diff")
    if not fs or not bs or not h5diff:
        fail(f"final states {fs}, {bs}; h5diff {h5diff}")
    cmd = [h5diff, fs, bs, "/model", "/model"]  # no tolerance: equal
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        fail("final weights differ (bucketed vs unbucketed): " + " ".join(cmd) + "\n" + (r.stdout + r.stderr)[-3000:])
    check_staging_budget(a, f"{a.name}_bucket", totals["bucket"], staged["bucket"][1])
    print(f"buckets: {len(plan)} per step ({plan}), {early} started before block 0's backward ended; "
          f"losses, grad norms and final weights equal over {steps} steps; comm_staging_bytes "
          f"{staged['flat'][0]} unbucketed, {staged['bucket'][0]} bucketed (rank 0)")


def check_staging_budget(a, name, stdout, want):
    """The memory check before step 1 counts the staging: the predicted total gtrain printed is the
    staging plus the rest (state, activations, workspace: other_bytes, summed apart), and a
    memory.budget of the rest plus half the staging must stop the run with exit 2, naming the staging."""
    pred = [ln for ln in stdout.splitlines() if "predicted reduce-scatter staging per rank" in ln]
    if not pred or "total_bytes" not in pred[0] or "other_bytes" not in pred[0]:
        fail(f"{name}: no predicted total and other bytes beside the staging in the output")
    words = pred[0].replace(",", "").replace(";", "").split()
    total, other = int(words[words.index("total_bytes") + 1]), int(words[words.index("other_bytes") + 1])
    if total != other + want:
        fail(f"{name}: the predicted total {total} is not the staging {want} + the rest {other}")
    budget = other + want // 2
    cmd = a.cmd + [name + ".ini", f"memory.budget={budget}"]
    print("+ (cd " + a.work + " && " + " ".join(cmd) + ")", flush=True)
    r = subprocess.run(cmd, cwd=a.work, capture_output=True, text=True)
    if r.returncode != 2 or "reduce-scatter staging" not in r.stderr:
        fail(f"{name}: memory.budget={budget} (the predicted total {total} less half the staging {want}): exit "
             f"{r.returncode}, expected 2 from the memory check naming the staging\n{r.stdout}{r.stderr}")
    print(f"{name}: total {total} = staging {want} + the rest {other}; memory.budget {budget} = the rest + half the "
          f"staging: refused before step 1 (exit 2)")


def newest_state(work, name):
    files = sorted(glob.glob(os.path.join(work, name + ".state", "step_*.h5")))
    return files[-1] if files else None


def cmd_compare(a):
    ref = read_metrics(os.path.join(a.work, a.ref + ".metrics.jsonl"))
    ok = True
    print(f"{'run':10s} {'max rel diff loss':>18s} {'max rel diff grad_norm':>23s} {'final loss':>12s}")
    print(f"{a.ref:10s} {0.0:18.3g} {0.0:23.3g} {ref[-1]['loss']:12.7f}")
    for name in a.names:
        if name == a.ref:
            continue
        other = read_metrics(os.path.join(a.work, name + ".metrics.jsonl"))
        steps = {m["step"] for m in other}
        ref_here = [m for m in ref if m["step"] in steps]   # a resumed run has the later steps only
        if [m["step"] for m in other] != [m["step"] for m in ref_here] or not other:
            fail(f"{name}: steps differ from {a.ref}")
        worst_loss = worst_norm = 0.0
        for r, o in zip(ref_here, other):
            dl = abs(o["loss"] - r["loss"]) / abs(r["loss"])
            dn = abs(o["grad_norm"] - r["grad_norm"]) / abs(r["grad_norm"])
            worst_loss, worst_norm = max(worst_loss, dl), max(worst_norm, dn)
            if dl > a.loss_rtol:
                print(f"FAIL: {name} step {r['step']}: loss {o['loss']!r} vs {a.ref} {r['loss']!r} "
                      f"(relative difference {dl:.3g} > {a.loss_rtol})", file=sys.stderr)
                ok = False
            if dn > a.grad_norm_rtol:
                print(f"FAIL: {name} step {r['step']}: grad_norm {o['grad_norm']!r} vs {a.ref} "
                      f"{r['grad_norm']!r} (relative difference {dn:.3g} > {a.grad_norm_rtol})", file=sys.stderr)
                ok = False
        print(f"{name:10s} {worst_loss:18.3g} {worst_norm:23.3g} {other[-1]['loss']:12.7f}")

    # final weights: the newest training-state file of every run (checkpoint.dir = NAME.state)
    ref_state = newest_state(a.work, a.ref)
    if ref_state is None:
        fail(f"no training-state file in {a.ref}.state/: the final weights cannot be compared")
    else:
        h5diff = shutil.which("h5diff")
        if not h5diff:
            fail("state files exist but h5diff is not installed (apt-get install hdf5-tools)")
        for name in a.names:
            if name == a.ref:
                continue
            st = newest_state(a.work, name)
            if st is None or os.path.basename(st) != os.path.basename(ref_state):
                print(f"FAIL: {name}: newest state file {st}, expected one like {ref_state}", file=sys.stderr)
                ok = False
                continue
            # absolute tolerance: h5diff's relative mode (-p) fails on weights that are ~0
            cmd = [h5diff, "-d", repr(a.weight_atol), ref_state, st, "/model", "/model"]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                print(f"FAIL: {name}: final weights differ from {a.ref} beyond {a.weight_atol}: " + " ".join(cmd),
                      file=sys.stderr)
                print((r.stdout + r.stderr)[-4000:], file=sys.stderr)
                ok = False
            else:
                print(f"{name}: /model of {os.path.basename(st)} within {a.weight_atol} of {a.ref}")
    if not ok:
        sys.exit(1)
    print("compare: ok")


def cmd_expect_fail(a):
    ini = write_config(a.work, a.name, a.accum, a.shard)
    cmd = a.cmd + [ini]
    print("+ (cd " + a.work + " && " + " ".join(cmd) + ")", flush=True)
    r = subprocess.run(cmd, cwd=a.work, capture_output=True, text=True, timeout=100)
    out = r.stdout + r.stderr
    print(out)
    if r.returncode != a.expect_rc:
        fail(f"exit code {r.returncode}, expected {a.expect_rc}")
    if a.expect_msg not in r.stderr:
        fail(f"stderr does not say '{a.expect_msg}'")
    if "shard = " + a.shard not in r.stderr:
        fail(f"the message does not name the key value 'shard = {a.shard}'")
    print("ok")


def main():
    argv = sys.argv[1:]
    cmd = []
    if "--" in argv:
        i = argv.index("--")
        argv, cmd = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="what", required=True)
    s = sub.add_parser("prep")
    s.add_argument("--work", required=True)
    s.add_argument("--prep", required=True)
    s.add_argument("--fallback-text", required=True)
    for nm in ("run", "expect-fail", "resume", "buckets"):
        s = sub.add_parser(nm)
        if nm == "buckets":
            s.add_argument("--bucket-mb", type=float, required=True)
            s.add_argument("--param-gather", action="store_true", help="also dist.overlap_param_gather = true")
        s.add_argument("--recompute", default="none")
        s.add_argument("--sync", default="auto")
        s.add_argument("--prefetch", type=int, default=1)
        s.add_argument("--tied", action="store_true")
        s.add_argument("--precision", default="fp32", help="train.precision (bf16: working parameters 2 bytes)")
        s.add_argument("--save-half", action="store_true", help="also save the state at step STEPS/2")
        s.add_argument("--docs", action="store_true", help="document_mask + reset_positions (DOCS)")
        s.add_argument("--masked", action="store_true", help="the masked copy of the corpus, loss_mask = on")
        s.add_argument("--no-sep-loss", action="store_true", help="data.separator_loss = false (NO_SEP_LOSS)")
        s.add_argument("--sep-masked", action="store_true", help="the copy masking the separator's targets")
        s.add_argument("--expect-out", default="", help="text gtrain's output must hold")
        if nm == "resume":
            s.add_argument("--from", dest="source", required=True)
        s.add_argument("--work", required=True)
        s.add_argument("--name", required=True)
        s.add_argument("--world", type=int, required=True)
        s.add_argument("--accum", type=int, required=True)
        s.add_argument("--shard", required=True)
        if nm == "expect-fail":
            s.add_argument("--expect-rc", type=int, required=True)
            s.add_argument("--expect-msg", required=True)
    s = sub.add_parser("compare")
    s.add_argument("--work", required=True)
    s.add_argument("--ref", required=True)
    s.add_argument("--loss-rtol", type=float, default=LOSS_RTOL)
    s.add_argument("--grad-norm-rtol", type=float, default=GRAD_NORM_RTOL)
    s.add_argument("--weight-atol", type=float, default=WEIGHT_ATOL)
    s.add_argument("names", nargs="+")
    a = p.parse_args(argv)
    a.cmd = cmd
    if a.what in ("run", "expect-fail", "resume", "buckets") and not cmd:
        p.error("the mpiexec ... gtrain command goes after --")
    {"prep": cmd_prep, "run": cmd_run, "compare": cmd_compare, "expect-fail": cmd_expect_fail,
     "resume": cmd_resume, "buckets": cmd_buckets}[a.what](a)


if __name__ == "__main__":
    main()
