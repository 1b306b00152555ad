#!/usr/bin/env python3
"""link_rate.py — the link rate that gives a CPU run the communication-to-compute ratio of a real
configuration, for `tests/cluster/cluster.sh up N --link RATE`. Prints the arithmetic.

On a real cluster a data-parallel step computes for T_c and sends B bytes per rank over a link of R
bytes/s; what matters for overlap is the ratio (B / R) / T_c. A CPU run computes far fewer tokens per
step, far slower, so its link must be shaped to keep that ratio: R_cpu = B_cpu / (ratio_ref x T_c,cpu).

The reference (defaults; every number is an option): LLaMA-2 7B (6,738,415,616 parameters, 32 layers,
dim 4096, sequence 4096) on 8 nodes of 8 H100 (64 ranks), a 4M-token (4,194,304) global batch: 65,536
tokens per GPU per step; ~400 TFLOP/s effective per H100; 400 Gb/s of InfiniBand per GPU (50 GB/s).
  model FLOPs per token  6 N + 6 L d T   (forward and backward of every matmul, causal attention as
                                          half the T x T square: the convention of docs/metrics.md)
  bytes per rank         ZeRO-1 by gtrain's ring model (src/dist/comm.h): the reduce-scatter of the
                         fp32 gradients and the all-gather of the bf16 working weights,
                         (W-1)/W x N x (4 + 2)
The CPU side is measured here, from two runs of the same config (the same per-rank work: global
batch = micro_batch x grad_accum x ranks):
  T_c   the mean step_ms of a one-rank run (no communication), steps after the first
  B     comm_bytes per step of a W-rank run (the ring model, identical on every step)
  and the achieved FLOP/s of the one-rank run (its mfu against train.peak_tflops = 1), to print the
  other ratio too: the link with the reference's FLOP per byte (the hardware ratio, which ignores
  how many tokens a step computes).

  bench/link_rate.py --run configs/tiny.ini [KEY=VALUE ...] [--world 2] [--steps 3] [--build build]
  bench/link_rate.py --one ONE_RANK.metrics.jsonl --many W_RANKS.metrics.jsonl   (runs done already;
                         the one-rank run with train.peak_tflops=1 for the FLOP/s line)
Not a measurement to publish on a machine that other work shares: the step time is what it is now.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def metrics(path):
    lines = []
    with open(path) as f:
        for ln in f:
            x = json.loads(ln)
            if "step_ms" in x:
                lines.append(x)
    if not lines:
        sys.exit(f"link_rate: {path}: no step lines")
    return lines


def run(args, world, path):
    gtrain = os.path.join(args.build, "gtrain")
    cmd = [args.mpiexec, "--allow-run-as-root", "-n", str(world), gtrain, args.run, *args.overrides,
           f"train.steps={args.steps}", "train.warmup_steps=1", "train.peak_tflops=1", "checkpoint.every=0",
           "checkpoint.dir=", "data.val=", f"log.metrics={path}"]
    env = dict(os.environ, OMPI_MCA_rmaps_base_oversubscribe="1")
    print("link_rate: " + " ".join(cmd), file=sys.stderr)
    r = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.exit(f"link_rate: the {world}-rank run ended with exit {r.returncode}:\n{r.stderr[-2000:]}")
    return metrics(path)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--run", metavar="CONFIG", help="run CONFIG at one rank and at --world ranks")
    p.add_argument("overrides", nargs="*", help="KEY=VALUE overrides for --run")
    p.add_argument("--world", type=int, default=2, help="ranks of the shaped run (default 2)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--build", default="build")
    p.add_argument("--mpiexec", default=os.environ.get("MPIEXEC", "mpiexec"))
    p.add_argument("--one", help="metrics of a one-rank run")
    p.add_argument("--many", help="metrics of a run at --world ranks")
    ref = p.add_argument_group("the reference configuration")
    ref.add_argument("--ref-name", default="LLaMA-2 7B, 8 nodes x 8 H100, 4M-token global batch")
    ref.add_argument("--ref-params", type=float, default=6738415616)
    ref.add_argument("--ref-layers", type=int, default=32)
    ref.add_argument("--ref-dim", type=int, default=4096)
    ref.add_argument("--ref-seq", type=int, default=4096)
    ref.add_argument("--ref-ranks", type=int, default=64)
    ref.add_argument("--ref-global-tokens", type=float, default=4194304)
    ref.add_argument("--ref-tflops", type=float, default=400, help="effective TFLOP/s per GPU")
    ref.add_argument("--ref-link-gbit", type=float, default=400, help="Gb/s per GPU")
    ref.add_argument("--ref-weight-bytes", type=int, default=2, help="bytes of a working weight (bf16)")
    a = p.parse_args()
    if a.run:
        with tempfile.TemporaryDirectory(prefix="link_rate-") as d:
            one = run(a, 1, os.path.join(d, "one.jsonl"))
            many = run(a, a.world, os.path.join(d, "many.jsonl"))
    elif a.one and a.many:
        one, many = metrics(a.one), metrics(a.many)
    else:
        p.error("--run CONFIG, or --one and --many")

    # the reference
    W, N = a.ref_ranks, a.ref_params
    tok = a.ref_global_tokens / W
    flop_tok = 6 * N + 6 * a.ref_layers * a.ref_dim * a.ref_seq
    t_ref = flop_tok * tok / (a.ref_tflops * 1e12)
    b_ref = (W - 1) / W * N * (4 + a.ref_weight_bytes)
    link_ref = a.ref_link_gbit * 1e9 / 8
    c_ref = b_ref / link_ref
    ratio = c_ref / t_ref
    print(f"reference: {a.ref_name}")
    print(f"  tokens per rank per step  {a.ref_global_tokens:.0f} / {W} = {tok:.0f}")
    print(f"  FLOP per token            6 x {N:.4g} + 6 x {a.ref_layers} x {a.ref_dim} x {a.ref_seq} = {flop_tok:.4g}")
    print(f"  compute per step          {flop_tok:.4g} x {tok:.0f} / {a.ref_tflops:g}e12 FLOP/s = {t_ref:.3f} s")
    print(f"  bytes per rank per step   {W - 1}/{W} x {N:.4g} x (4 + {a.ref_weight_bytes}) = {b_ref:.4g} B")
    print(f"  communication per step    {b_ref:.4g} B / {link_ref:.4g} B/s = {c_ref:.3f} s")
    print(f"  ratio                     {c_ref:.3f} / {t_ref:.3f} = {ratio:.4f}")
    print(f"  FLOP per byte of link     {a.ref_tflops:g}e12 / {link_ref:.4g} = {a.ref_tflops * 1e12 / link_ref:.0f}")

    # here
    steps = one[1:] if len(one) > 1 else one
    t_c = sum(x["step_ms"] for x in steps) / len(steps) / 1e3
    b = many[-1]["comm_bytes"]
    if not b:
        sys.exit("link_rate: the multi-rank run sent no bytes (one rank?)")
    rate = b / (ratio * t_c)
    print("this run")
    print(f"  compute per step          {t_c:.3f} s (one rank, mean over {len(steps)} step(s))")
    print(f"  bytes per rank per step   {b} B (comm_bytes at {a.world} ranks)")
    print(f"  link for the same ratio   {b} / ({ratio:.4f} x {t_c:.3f}) = {rate:.4g} B/s = {rate * 8 / 1e6:.0f} mbit")
    mfu = [x.get("mfu") for x in steps]
    if all(isinstance(m, (int, float)) for m in mfu):
        flops = sum(mfu) / len(mfu) * 1e12  # mfu against train.peak_tflops = 1
        hw = flops / (a.ref_tflops * 1e12 / link_ref)
        print(f"  achieved                  {flops / 1e9:.1f} GFLOP/s; the link with the reference's FLOP per byte: "
              f"{flops:.4g} / {a.ref_tflops * 1e12 / link_ref:.0f} = {hw:.4g} B/s = {hw * 8 / 1e6:.0f} mbit")
    print(f"shape: tests/cluster/cluster.sh up {a.world} --link {max(1, round(rate * 8 / 1e6))}mbit")


if __name__ == "__main__":
    main()
