#!/usr/bin/env python3
"""cpu_vs_torch.py — the Python side of bench/cpu_vs_torch.sh: gtrain against PyTorch eager on the CPU.

For one model shape (read from a gtrain config), on the same cores and the same number of threads:
  - gtrain trains it (recompute none, then full), its step times read from the metrics JSONL;
  - PyTorch trains transformers' LlamaForCausalLM of the same shape (attn_implementation="sdpa",
    fp32, torch.optim.AdamW with PyTorch's default CPU path, gradient_checkpointing_enable() for
    full recompute) on random token ids; with --torch-malloc LIB, a second PyTorch run with LIB
    preloaded (tcmalloc, say: PyTorch as installed allocates through glibc's malloc, which returns its
    large activation buffers to the kernel and so pays for freshly zeroed pages every step);
  - an sgemm loop runs every matrix product of one training step at the step's own shapes
    (forward, and both backward products of each linear layer, the LM head included) through the
    OpenBLAS library gtrain links, with ctypes: the time of that loop, plus the attention products'
    FLOPs at the same measured rate, is the "GEMM ceiling", the step time if everything that is not
    a matrix product took no time at all.
The runs alternate (gtrain, torch, gtrain, torch, ...) so that a change in the machine's load hits
both sides alike; each run's load average is printed beside its numbers. Step time is the median
over the timed steps (the first WARMUP steps of a run are not timed); peak memory is the peak
resident set of the process (ru_maxrss from wait4 for gtrain, getrusage for torch). The table
gives two estimates: the median step of all rounds, and the best step (least disturbed by other
processes, the better estimate on a shared machine); the ceiling likewise (median and best round).

  python3 bench/cpu_vs_torch.py compare --gtrain build/gtrain --config configs/llama100m.ini \
      --data data.bin --threads 2 --steps 4 --warmup 1 --rounds 2 --blas /path/libopenblas.so.0
  python3 bench/cpu_vs_torch.py torch  ...   (one torch run; prints one JSON line; used by compare)
  python3 bench/cpu_vs_torch.py gemm   ...   (the ceiling alone; prints one JSON line)

With --precision bf16 both sides train in bf16 mixed precision: gtrain with train.precision = bf16
(bf16 working tensors, matrix products through oneDNN), PyTorch with forward and loss under
torch.autocast("cpu", dtype=torch.bfloat16) (fp32 weights, AdamW in fp32); the ceiling is then the
step's linear-layer products through oneDNN in bf16 (build/bf16_gemm, bench/bf16_gemm.c, the same
primitives gtrain calls), plus the attention FLOPs at that rate, and the instruction set oneDNN ran on
is printed.

Not a test: numbers depend on the machine and on whatever else runs on it.
"""
import argparse
import configparser
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


# ---------------------------------------------------------------- the shape

def read_shape(path, overrides=()):
    """The [model] and [train] numbers of a gtrain config (inline ';' comments allowed)."""
    cp = configparser.ConfigParser(inline_comment_prefixes=(";", "#"))
    cp.read(path)
    m, t = cp["model"], cp["train"]
    shape = {
        "dim": int(m.get("dim", 128)), "layers": int(m.get("n_layers", 4)),
        "heads": int(m.get("n_heads", 4)), "kv_heads": int(m.get("n_kv_heads", 2)),
        "vocab": int(m.get("vocab_size", 256)), "ffn": int(m.get("ffn_dim", 352)),
        "eps": float(m.get("norm_eps", 1e-5)), "theta": float(m.get("rope_theta", 10000)),
        "seq": int(t.get("seq_len", 128)), "batch": int(t.get("micro_batch", 8)),
    }
    for o in overrides:
        k, v = o.split("=", 1)
        if k == "train.micro_batch":
            shape["batch"] = int(v)
        elif k == "train.seq_len":
            shape["seq"] = int(v)
    return shape


def step_gemms(s):
    """(M, N, K, transA, transB) of every sgemm in one training step, as gtrain calls them
    (src/core/model.c, src/kernels/cpu/cpu_matmul.c): per linear layer (IC -> OC) over BT rows,
    forward out = x W^T (BT, OC, IC, N, T), backward dx = dy W (BT, IC, OC, N, N) and
    dW += dy^T x (OC, IC, BT, T, N)."""
    BT, C, F, V = s["batch"] * s["seq"], s["dim"], s["ffn"], s["vocab"]
    kvd = C // s["heads"] * s["kv_heads"]
    layers = [(C, C), (C, kvd), (C, kvd), (C, C), (C, F), (C, F), (F, C)]
    out = []
    for ic, oc in layers * s["layers"] + [(C, V)]:
        out.append((BT, oc, ic, 0, 1))
        out.append((BT, ic, oc, 0, 0))
        out.append((oc, ic, BT, 1, 0))
    return out


def attention_flops(s):
    """Matrix-product FLOPs of causal attention in one training step: forward QK^T and PV
    (2 * 2*B*NH*T*T*HD, halved for the causal mask), backward twice that."""
    hd = s["dim"] // s["heads"]
    fwd = 2 * 2 * s["batch"] * s["heads"] * s["seq"] * s["seq"] * hd / 2
    return 3 * fwd * s["layers"]


# ---------------------------------------------------------------- the GEMM ceiling

_GENERIC_CORES = ("Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom")
_PROBE = '''
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
lib.openblas_get_corename.restype = ctypes.c_char_p
print(lib.openblas_get_corename().decode())
'''


def use_gtrains_blas_core(blas_path):
    """OpenBLAS reads OPENBLAS_CORETYPE when it is loaded; gtrain replaces a generic core that
    OpenBLAS falls back to on a CPU it does not know (src/core/gtrain_main.c, better_blas_core), so
    the ceiling must run the same kernels: the same rule, applied before this process loads it."""
    if os.environ.get("OPENBLAS_CORETYPE"):
        return
    core = subprocess.run([sys.executable, "-c", _PROBE, blas_path], stdout=subprocess.PIPE, text=True).stdout.strip()
    flags = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    if core in _GENERIC_CORES:
        if {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"} <= flags:
            os.environ["OPENBLAS_CORETYPE"] = "SkylakeX"
        elif {"avx2", "fma"} <= flags:
            os.environ["OPENBLAS_CORETYPE"] = "Haswell"


def gemm_ceiling(s, blas_path, threads, repeats=1):
    import numpy as np
    os.environ["OMP_NUM_THREADS"] = str(threads)
    use_gtrains_blas_core(blas_path)
    lib = ctypes.CDLL(blas_path)
    if hasattr(lib, "openblas_set_num_threads"):
        lib.openblas_set_num_threads(threads)
    sgemm = lib.cblas_sgemm
    sgemm.restype = None
    fp = ctypes.POINTER(ctypes.c_float)
    sgemm.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                      ctypes.c_float, fp, ctypes.c_int, fp, ctypes.c_int, ctypes.c_float, fp, ctypes.c_int]
    RowMajor, NoTrans, Trans = 101, 111, 112
    gemms = step_gemms(s)
    rng = np.random.default_rng(0)
    bufs = {}

    def buf(n):
        if n not in bufs:
            bufs[n] = rng.standard_normal(n, dtype=np.float32)
        return bufs[n].ctypes.data_as(fp)

    def run_some(which):
        for (M, N, K, ta, tb) in which:
            a, b, c = buf(M * K), buf(K * N), buf(M * N + 1)
            lda = M if ta else K
            ldb = K if tb else N
            sgemm(RowMajor, Trans if ta else NoTrans, Trans if tb else NoTrans, M, N, K, 1.0, a, lda, b, ldb,
                  0.0, c, N)

    # warm-up: each distinct shape once (page faults, thread start-up)
    run_some(sorted(set(gemms)))
    # passes until 2 s have gone (at least `repeats`, at most 20); the fastest pass is the ceiling
    times, cpus = [], []
    while len(times) < repeats or (sum(times) < 2.0 and len(times) < 20):
        t0, c0 = time.perf_counter(), time.process_time()
        run_some(gemms)
        times.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    t = min(times)
    # CPU seconds (all threads) of the fastest pass, scaled like the wall time for attention
    tc = cpus[times.index(t)]
    flops = sum(2.0 * M * N * K for (M, N, K, _, _) in gemms)
    rate = flops / t
    attn = attention_flops(s)
    return {"impl": "gemm", "gemm_s": t, "gemm_flops": flops, "gflops": rate / 1e9,
            "attn_flops": attn, "ceiling_step_s": t + attn / rate, "ceiling_cpu_s": tc * (1 + attn / flops),
            "load": os.getloadavg()[0]}


def bf16_ceiling(s, bf16_gemm, threads):
    """The bf16 GEMM ceiling: bench/bf16_gemm.c times the step's linear-layer products through
    oneDNN (its last line: "ceiling FP32_S BF16_S BF16_CPU_S"); attention's FLOPs are added at the same
    rate, in wall and in CPU seconds."""
    kvd = s["dim"] // s["heads"] * s["kv_heads"]
    cmd = [bf16_gemm, str(s["batch"] * s["seq"]), str(s["dim"]), str(s["ffn"]), str(s["vocab"]), str(s["layers"]),
           str(kvd), "2", "bf16"]
    r = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS=str(threads)), capture_output=True, text=True,
                       check=True)
    lines = r.stdout.strip().splitlines()
    isa = lines[0].split("oneDNN ISA: ", 1)[-1]
    t, tc = float(lines[-1].split()[2]), float(lines[-1].split()[3])
    flops = sum(2.0 * M * N * K for (M, N, K, _, _) in step_gemms(s))
    rate = flops / t
    attn = attention_flops(s)
    return {"impl": "gemm-bf16", "gemm_s": t, "gemm_flops": flops, "gflops": rate / 1e9, "attn_flops": attn,
            "ceiling_step_s": t + attn / rate, "ceiling_cpu_s": tc * (1 + attn / flops), "isa": isa,
            "load": os.getloadavg()[0]}


# ---------------------------------------------------------------- PyTorch

def torch_run(s, threads, steps, warmup, checkpoint, seed=0, precision="fp32"):
    import resource
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=s["vocab"], hidden_size=s["dim"], intermediate_size=s["ffn"],
                         num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
                         num_key_value_heads=s["kv_heads"], max_position_embeddings=s["seq"],
                         rms_norm_eps=s["eps"], rope_theta=s["theta"], tie_word_embeddings=False,
                         attention_dropout=0.0, use_cache=False)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    model.train()
    if checkpoint:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    gen = torch.Generator().manual_seed(seed)
    times, cpu = [], []
    for i in range(warmup + steps):
        x = torch.randint(0, s["vocab"], (s["batch"], s["seq"]), generator=gen)
        t0, c0 = time.perf_counter(), time.process_time()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        if i >= warmup:
            times.append(dt)
            cpu.append(dc)
    return {"impl": "torch", "precision": precision, "checkpoint": checkpoint, "step_s": statistics.median(times),
            "steps_s": times, "cpu_steps_s": cpu, "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "load": os.getloadavg()[0], "torch": torch.__version__}


# ---------------------------------------------------------------- gtrain

def gtrain_run(gtrain, config, data, threads, steps, warmup, recompute, overrides, precision="fp32"):
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "m.jsonl")
        cmd = [gtrain, config, f"train.steps={warmup + steps}", f"memory.recompute={recompute}",
               f"data.train={data}", "data.val=", "data.val_every=0", f"log.metrics={metrics}",
               "checkpoint.dir=", "checkpoint.resume=never", "train.grad_accum=1", "model.dropout=0",
               "train.device=cpu", f"train.precision={precision}", "train.warmup_steps=0"] + list(overrides)
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        # CPU seconds (all threads) at each step's end: /proc/PID/stat read when the step's metrics
        # line appears (polled every 5 ms, so a step's CPU time is known to about 10 ms)
        tick = os.sysconf("SC_CLK_TCK")
        cpu_marks, seen = [], 0
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid == p.pid:
                break
            time.sleep(0.005)
            try:
                n = sum(1 for _ in open(metrics))
                if n > seen:
                    f = open(f"/proc/{p.pid}/stat").read().rsplit(")", 1)[1].split()
                    cpu_marks += [(int(f[11]) + int(f[12])) / tick] * (n - seen)
                    seen = n
            except (OSError, IndexError, ValueError):
                pass
        err = p.stderr.read().decode(errors="replace")
        p.returncode = os.waitstatus_to_exitcode(status)
        if p.returncode != 0:
            sys.exit(f"cpu_vs_torch: {' '.join(cmd)} failed ({p.returncode}):\n{err}")
        rows = [json.loads(line) for line in open(metrics)]
    times = [r["step_ms"] / 1e3 for r in rows[warmup:]]
    cpu = [b - a for a, b in zip(cpu_marks[warmup - 1:], cpu_marks[warmup:])] if warmup >= 1 else []
    return {"impl": "gtrain", "recompute": recompute, "step_s": statistics.median(times), "steps_s": times,
            "cpu_steps_s": cpu,
            "peak_rss": ru.ru_maxrss * 1024, "mem_peak_bytes": rows[-1].get("mem_peak_bytes"),
            "load": os.getloadavg()[0]}


# ---------------------------------------------------------------- compare

def torch_variants(a):
    """The PyTorch runs to compare with: as installed (glibc malloc), and, with --torch-malloc LIB,
    once more with LIB preloaded (a caching allocator such as tcmalloc: glibc hands PyTorch's large
    activation buffers back to the kernel and gets fresh zeroed pages every step)."""
    out = [("torch", {})]
    if a.torch_malloc:
        name = os.path.basename(a.torch_malloc).split(".")[0].removeprefix("lib").split("_")[0]
        out.append((f"torch+{name}", {"LD_PRELOAD": a.torch_malloc}))
    return out


def run_torch_subprocess(a, checkpoint, extra_env):
    """torch in a process of its own, so that its peak RSS is its own."""
    cmd = [sys.executable, __file__, "torch", "--config", a.config, "--threads", str(a.threads),
           "--steps", str(a.steps), "--warmup", str(a.warmup), "--precision", a.precision] + \
        (["--checkpoint"] if checkpoint else [])
    for o in a.override:
        cmd += ["--override", o]
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), **extra_env)
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def compare(a):
    s = read_shape(a.config, a.override)
    tokens = s["batch"] * s["seq"]
    ceils = []
    variants = torch_variants(a)
    impls = ["gtrain"] + [v for v, _ in variants]
    print(f"# {os.path.basename(a.config)}: dim {s['dim']}, {s['layers']} layers, heads {s['heads']}/"
          f"{s['kv_heads']}, ffn {s['ffn']}, vocab {s['vocab']}, {s['batch']} x {s['seq']} tokens per step, "
          f"{a.threads} threads, medians of {a.steps} steps after {a.warmup}, precision {a.precision}"
          + (" (torch: autocast bf16)" if a.precision == "bf16" else ""), flush=True)
    res = {impl: {"none": [], "full": []} for impl in impls}
    for r in range(a.rounds):
        ceil = bf16_ceiling(s, a.bf16_gemm, a.threads) if a.precision == "bf16" else gemm_ceiling(s, a.blas, a.threads)
        ceils.append(ceil)
        kind = f"bf16 oneDNN on {ceil['isa']}" if a.precision == "bf16" else "sgemm"
        print(f"#   round {r + 1} GEMM ceiling: {ceil['gemm_flops'] / 1e12:.3f} TFLOP of linear-layer {kind} in "
              f"{ceil['gemm_s']:.3f} s ({ceil['gflops']:.0f} GFLOP/s) + {ceil['attn_flops'] / 1e9:.0f} GFLOP of "
              f"attention at that rate = {ceil['ceiling_step_s']:.3f} s/step (load {ceil['load']:.1f})", flush=True)
        for pol in a.policies:
            g = gtrain_run(a.gtrain, a.config, a.data, a.threads, a.steps, a.warmup, pol, a.override, a.precision)
            res["gtrain"][pol].append(g)
            print(f"#   round {r + 1} gtrain {pol}: {g['step_s']:.3f} s/step (load {g['load']:.1f})", flush=True)
            for name, env in variants:
                t = run_torch_subprocess(a, pol == "full", env)
                res[name][pol].append(t)
                print(f"#   round {r + 1} {name} {pol}: {t['step_s']:.3f} s/step (load {t['load']:.1f})", flush=True)
    # Medians say what a typical step took; on a shared machine the best (least disturbed) step of
    # all rounds is the better estimate of what the code can do, so both are printed.
    ceil_med = statistics.median(c["ceiling_step_s"] for c in ceils)
    ceil_best = min(c["ceiling_step_s"] for c in ceils)
    ceil_cpu = min(c["ceiling_cpu_s"] for c in ceils)
    print(f"\nGEMM ceiling: median {ceil_med:.3f} s/step ({statistics.median(c['gflops'] for c in ceils):.0f} "
          f"GFLOP/s), best {ceil_best:.3f} s/step ({max(c['gflops'] for c in ceils):.0f} GFLOP/s), "
          f"{ceil_cpu:.2f} CPU s")

    def steps(impl, pol, pick):
        return pick(t for x in res[impl][pol] for t in x["steps_s"])

    def cpu(impl, pol):
        c = [v for x in res[impl][pol] for v in x.get("cpu_steps_s", [])]
        return statistics.median(c) if c else float("nan")

    # One row per run and policy. "gtrain speed-up" is the other run's step time over gtrain's (tokens/s
    # of gtrain over the other's); % of ceiling is the GEMM ceiling's step time over the run's, in wall
    # seconds (median and best) and in CPU seconds of all threads (hardly changed by waiting for cores,
    # the fairer figure when other processes run).
    print()
    print("| recompute | run | s/step median / best | tok/s median | gtrain speed-up median / best | "
          "peak RSS | % of GEMM ceiling median / best | CPU s/step | % of ceiling (CPU) | load |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for pol in a.policies:
        for impl in impls:
            med, best = steps(impl, pol, statistics.median), steps(impl, pol, min)
            gm, gb = steps("gtrain", pol, statistics.median), steps("gtrain", pol, min)
            rss = max(x["peak_rss"] for x in res[impl][pol]) / 2**20
            loads = [x["load"] for x in res[impl][pol]]
            c = cpu(impl, pol)
            up = "" if impl == "gtrain" else f"{med / gm:.2f}x / {best / gb:.2f}x"
            print(f"| {pol} | {impl} | {med:.3f} / {best:.3f} | {tokens / med:.0f} | {up} | {rss:.0f} MiB | "
                  f"{100 * ceil_med / med:.0f}% / {100 * ceil_best / best:.0f}% | {c:.2f} | "
                  f"{100 * ceil_cpu / c:.0f}% | {min(loads):.1f}-{max(loads):.1f} |")
    if "none" in a.policies and "full" in a.policies:
        def over(impl, pick):
            return 100 * (steps(impl, "full", pick) / steps(impl, "none", pick) - 1)
        print("\nfull-recompute overhead (median / best; CPU s): " + ", ".join(
            f"{impl} {over(impl, statistics.median):+.0f}% / {over(impl, min):+.0f}%; "
            f"{100 * (cpu(impl, 'full') / cpu(impl, 'none') - 1):+.0f}%" for impl in impls))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"shape": s, "precision": a.precision, "ceilings": ceils, "runs": res}, f, indent=1)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("mode", choices=("compare", "torch", "gemm"))
    p.add_argument("--config", required=True, help="gtrain config giving the shape")
    p.add_argument("--override", action="append", default=[], help="train.micro_batch=N or train.seq_len=N")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=3, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    p.add_argument("--rounds", type=int, default=2, help="alternations of gtrain and torch")
    p.add_argument("--policies", nargs="+", default=["none", "full"], choices=("none", "full"))
    p.add_argument("--checkpoint", action="store_true", help="torch mode: gradient checkpointing")
    p.add_argument("--gtrain", default="build/gtrain")
    p.add_argument("--data", help="gtrain token file")
    p.add_argument("--blas", help="libopenblas that gtrain links (for the GEMM ceiling)")
    p.add_argument("--json", help="compare: also write every number here")
    p.add_argument("--torch-malloc", help="compare: also run torch with this malloc library preloaded")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                   help="bf16: gtrain train.precision = bf16, torch under autocast bf16, the ceiling in bf16")
    p.add_argument("--bf16-gemm", default="build/bf16_gemm", help="bench/bf16_gemm.c's binary (bf16 ceiling)")
    a = p.parse_args(argv)
    s = read_shape(a.config, a.override)
    if a.mode == "torch":
        print(json.dumps(torch_run(s, a.threads, a.steps, a.warmup, a.checkpoint, precision=a.precision)))
    elif a.mode == "gemm":
        print(json.dumps(gemm_ceiling(s, a.blas, a.threads)))
    else:
        compare(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
