#!/usr/bin/env python3
"""Hugging Face checkpoints in and out, against transformers itself (tests/hf.cmake runs one case each).

Cases (--case):
  gqa      LLaMA-2 style with grouped-query attention (4 query heads, 2 KV heads), fp32 on disk, saved by
           save_pretrained split into several safetensors files with an index; the export is sharded too;
           and the same checkpoint imported at W = 1, 2 and 4 gives the same master weights, equal to the
           checkpoint's bit for bit
  llama31  LLaMA-3.1: llama3 RoPE scaling (every branch of it: unchanged, smoothed and scaled frequencies),
           rope_theta 500000, 4 query heads on 1 KV head, bf16 on disk, config.json rewritten in the form
           published checkpoints carry (rope_theta + rope_scaling)
  tied     LLaMA-3.2: tie_word_embeddings, fp16 on disk; the export also in bf16; import + an existing state
           file resumes from the state file
  broken   broken checkpoints exit 2 naming the file and the tensor or key, never crash
  like     the export of a run started from a LLaMA-3.2 style checkpoint carries over what gtrain does not
           model: config.json's max_position_embeddings (not original x factor), bos/eos/pad ids and other
           keys, generation_config.json and the tokenizer files byte for byte; transformers, AutoTokenizer
           and GenerationConfig load it; --no-like and a vanished init give gtrain's config.json alone;
           --like a checkpoint of another model exits 2 with one line naming the key and both values
  configs  configs/llama3.2_1b.ini and configs/llama3_8b.ini: `gtrain --plan` counts as many parameters as
           transformers' LlamaForCausalLM of the same [model] (built on the meta device, no memory)

For gqa, llama31 and tied:
  1. transformers builds a small random LlamaForCausalLM (norm weights perturbed, so their gradients matter)
     and save_pretrained()s it;
  2. gtrain imports it (tests/hf/hf_grads.c): the weights equal transformers' fp32 ones bit for bit (BF16
     and F16 on disk upcast alike); the loss on a token batch equals transformers' within 1e-5
     relative, every gradient within 1e-5 of its tensor's largest value, the RoPE inverse frequencies
     within 1 ulp; the gradients are bit-identical under recompute none/full/selective;
  3. gtrain trains 20 steps from `model.init`, tools/state_to_hf.py exports the final state file;
  4. transformers loads the export with no warning, and its loss on the validation tokens equals gtrain's
     val_loss within 1e-5 relative; the files are mode 0644.
"""
import argparse
import json
import logging
import os
import shutil
import stat
import struct
import subprocess
import sys
import warnings

import numpy as np
import torch
import transformers

TOL = 1e-5
T_SEQ, B_SEQ = 32, 4


def log(msg):
    print(msg, flush=True)


# ---------------------------------------------------------------- the reference model

def make_model(kind, out_dir, work):
    torch.manual_seed({"gqa": 1, "llama31": 2, "tied": 3, "broken": 4}[kind])
    common = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                  rms_norm_eps=1e-5, attention_dropout=0.0, attn_implementation="eager")
    if kind in ("gqa", "broken"):
        cfg = transformers.LlamaConfig(**common, num_key_value_heads=2, vocab_size=300, max_position_embeddings=64,
                                       rope_theta=10000.0, tie_word_embeddings=False)
    elif kind == "llama31":
        cfg = transformers.LlamaConfig(**common, num_key_value_heads=1, vocab_size=320, max_position_embeddings=256,
                                       rope_theta=500000.0, tie_word_embeddings=False,
                                       rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                     "high_freq_factor": 4.0,
                                                     "original_max_position_embeddings": 64})
    else:
        cfg = transformers.LlamaConfig(**common, num_key_value_heads=2, vocab_size=256, max_position_embeddings=64,
                                       rope_theta=10000.0, tie_word_embeddings=True)
    model = transformers.LlamaForCausalLM(cfg).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    dtype = {"gqa": torch.float32, "broken": torch.float32, "llama31": torch.bfloat16, "tied": torch.float16}[kind]
    shard = {"gqa": "60KB", "broken": "10GB", "llama31": "10GB", "tied": "10GB"}[kind]
    model.to(dtype).save_pretrained(out_dir, max_shard_size=shard)
    if kind == "llama31":  # the form published LLaMA-3.1 checkpoints carry
        path = os.path.join(out_dir, "config.json")
        c = json.load(open(path))
        rp = c.pop("rope_parameters")
        c["rope_theta"] = rp.pop("rope_theta")
        c["rope_scaling"] = rp
        json.dump(c, open(path, "w"), indent=2)
    files = sorted(f for f in os.listdir(out_dir) if f.endswith(".safetensors"))
    log(f"saved {kind}: {files} ({dtype})")
    return cfg, files


def load_hf(path):
    """LlamaForCausalLM in fp32 from a directory, with every warning transformers emits collected."""
    records = []

    class Catch(logging.Handler):
        def emit(self, record):
            if record.levelno >= logging.WARNING:
                records.append(record.getMessage())

    handler = Catch()
    tlog = logging.getLogger("transformers")
    tlog.addHandler(handler)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = transformers.LlamaForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    tlog.removeHandler(handler)
    records += [str(w.message) for w in caught]
    model.eval()
    return model, records


# ---------------------------------------------------------------- token files (docs/data-format.md)

def write_tokens(path, tokens, vocab):
    header = b"GTRNTOK\0" + struct.pack("<IIQII", 1, 2, len(tokens), vocab, 0)
    with open(path, "wb") as f:
        f.write(header)
        f.write(np.asarray(tokens, dtype="<u2").tobytes())


def corpus(vocab, n, seed):
    """Learnable but not trivial: runs of an arithmetic pattern with random jumps."""
    rng = np.random.default_rng(seed)
    out, t = [], int(rng.integers(vocab))
    for _ in range(n):
        t = (t + 7) % vocab if rng.random() < 0.8 else int(rng.integers(vocab))
        out.append(t)
    return out


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from val_loss_reference import val_loss_reference  # noqa: E402  (tests/val_loss_reference.py)



def ini_text(cfg, init, work, steps, extra=""):
    rope = ""
    rs = cfg.rope_parameters
    if rs.get("rope_type") == "llama3":
        rope = (f"rope_type = llama3\nrope_factor = {rs['factor']}\nrope_low_freq_factor = {rs['low_freq_factor']}\n"
                f"rope_high_freq_factor = {rs['high_freq_factor']}\n"
                f"rope_original_max_position_embeddings = {rs['original_max_position_embeddings']}\n")
    return f"""[model]
dim = {cfg.hidden_size}
n_layers = {cfg.num_hidden_layers}
n_heads = {cfg.num_attention_heads}
n_kv_heads = {cfg.num_key_value_heads}
vocab_size = {cfg.vocab_size}
ffn_dim = {cfg.intermediate_size}
max_seq_len = {T_SEQ}
norm_eps = {cfg.rms_norm_eps}
rope_theta = {rs['rope_theta']}
tie_word_embeddings = {'true' if cfg.tie_word_embeddings else 'false'}
{rope}init = {init}
[train]
seq_len = {T_SEQ}
micro_batch = {B_SEQ}
grad_accum = 1
steps = {steps}
lr = 3e-3
min_lr = 3e-4
warmup_steps = {min(2, steps)}
device = cpu
precision = fp32
{extra}[data]
train = {work}/data.train.bin
val = {work}/data.val.bin
val_every = {steps}
val_batches = 3
[checkpoint]
dir = {work}/ck
every = 0
[log]
metrics = {work}/metrics.jsonl
"""


def run(cmd, **kw):
    env = dict(os.environ, OMP_NUM_THREADS="1", GTRAIN_PROGRESS="0")
    return subprocess.run(cmd, env=env, capture_output=True, text=True, **kw)


# ---------------------------------------------------------------- the checks

def check_grads(args, kind, hf_dir, ref, work):
    rng = np.random.default_rng(11)
    V, B, T = ref.config.vocab_size, 2, 24
    inputs = rng.integers(0, V, size=(B, T)).astype(np.int32)
    targets = rng.integers(0, V, size=(B, T)).astype(np.int32)
    with open(f"{work}/batch.bin", "wb") as f:
        f.write(np.array([B, T], dtype="<i4").tobytes() + inputs.astype("<i4").tobytes()
                + targets.astype("<i4").tobytes())
    p = run([args.grads, hf_dir, f"{work}/batch.bin", f"{work}/grads"])
    print(p.stdout, end="")
    assert p.returncode == 0, f"hf_grads failed ({p.returncode}): {p.stderr}"
    lines = open(f"{work}/grads.txt").read().splitlines()
    g_loss = float(lines[0].split()[1])
    g_inv = np.array([float(v) for v in lines[1].split()[1:]], dtype=np.float32)
    names = [(l.split()[0], int(l.split()[1])) for l in lines[2:]]
    g_all = np.fromfile(f"{work}/grads.bin", dtype="<f4")

    ref.zero_grad()
    logits = ref(input_ids=torch.tensor(inputs, dtype=torch.long)).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), torch.tensor(targets, dtype=torch.long).reshape(-1))
    loss.backward()
    rel = abs(g_loss - loss.item()) / abs(loss.item())
    log(f"loss: gtrain {g_loss:.9f}, transformers {loss.item():.9f}, relative difference {rel:.2e}")
    assert rel <= TOL, "loss differs"

    hf_inv = ref.model.rotary_emb.inv_freq.float().numpy()
    ulps = np.abs(g_inv.view(np.int32).astype(np.int64) - hf_inv.view(np.int32).astype(np.int64)).max()
    log(f"inv_freq ({ref.config.rope_parameters['rope_type']}): {len(hf_inv)} values, at most {ulps} ulp from "
        f"transformers'")
    assert ulps <= 1, f"inv_freq differs: {g_inv} vs {hf_inv}"

    params = dict(ref.named_parameters())
    assert [n for n, _ in names] == list(params), f"names differ: {[n for n, _ in names]} vs {list(params)}"
    # the import itself: BF16/F16/F32 on disk -> exactly the fp32 values transformers upcasts to
    imported, at = np.fromfile(f"{work}/grads.params.bin", dtype="<f4"), 0
    for name, numel in names:
        want = params[name].detach().numpy().reshape(-1)
        assert np.array_equal(imported[at: at + numel].view(np.uint32), want.view(np.uint32)), \
            f"imported {name} differs from transformers' fp32 values"
        at += numel
    log(f"import: {len(names)} tensors equal transformers' fp32 weights bit for bit")
    at, worst = 0, (0.0, "")
    for name, numel in names:
        g = g_all[at: at + numel]
        at += numel
        r = params[name].grad.detach().numpy().reshape(-1)
        err = np.abs(g - r).max() / max(np.abs(r).max(), 1e-30)
        worst = max(worst, (err, name))
        assert err <= TOL, f"gradient of {name} differs: {err:.2e} of its largest value"
    assert at == len(g_all)
    log(f"gradients: {len(names)} tensors, worst {worst[0]:.2e} of the tensor's largest value ({worst[1]})")


def train_from_init(args, cfg, hf_dir, work, steps, n_train, n_val, echo=False):
    """Token files of n_train / n_val random ids, then gtrain `steps` steps from model.init = hf_dir."""
    V = cfg.vocab_size
    write_tokens(f"{work}/data.train.bin", corpus(V, n_train, 1), V)
    write_tokens(f"{work}/data.val.bin", corpus(V, n_val, 2), V)
    ini = f"{work}/run.ini"
    open(ini, "w").write(ini_text(cfg, hf_dir, work, steps))
    p = run([args.gtrain, ini])
    if echo:
        print(p.stdout, end="")
    assert p.returncode == 0, f"gtrain failed ({p.returncode}): {p.stdout}\n{p.stderr}"
    assert "model.init:" in p.stdout, "no line about the import"
    return p, ini


def train_export_compare(args, kind, hf_dir, cfg, work):
    p, ini = train_from_init(args, cfg, hf_dir, work, 20, 20000, 2000, echo=True)
    first = json.loads(open(f"{work}/metrics.jsonl").readline())
    steps = [json.loads(l) for l in open(f"{work}/metrics.jsonl") if '"loss"' in l]
    log(f"trained: loss {steps[0]['loss']:.4f} at step 1 -> {steps[-1]['loss']:.4f} at step {steps[-1]['step']}")
    assert first["step"] == 1
    val_loss = [json.loads(l)["val_loss"] for l in open(f"{work}/metrics.jsonl") if "val_loss" in l][-1]
    state = f"{work}/ck/step_00000020.h5"

    out = f"{work}/export"
    extra = ["--max-shard-size", "50KB"] if kind == "gqa" else []
    p = subprocess.run([sys.executable, args.tool, state, out] + extra, capture_output=True, text=True)
    print(p.stdout, end="")
    assert p.returncode == 0, f"state_to_hf failed: {p.stderr}"
    files = sorted(os.listdir(out))
    log(f"export: {files}")
    for f in files:
        mode = stat.S_IMODE(os.stat(os.path.join(out, f)).st_mode)
        assert mode == 0o644, f"{f} has mode {oct(mode)}, expected 0644"
    if kind == "gqa":
        assert "model.safetensors.index.json" in files and sum(f.endswith(".safetensors") for f in files) >= 2
    model, warns = load_hf(out)
    assert not warns, f"transformers warned loading the export: {warns}"
    assert model.config.tie_word_embeddings == cfg.tie_word_embeddings
    # every RoPE number carried over (a tiny random model's loss hardly notices the scaling)
    assert model.config.rope_parameters == cfg.rope_parameters, \
        f"rope {model.config.rope_parameters} exported, {cfg.rope_parameters} imported"
    if cfg.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr(), "head not tied"
    hf_loss = val_loss_reference(model, f"{work}/data.val.bin", B_SEQ, T_SEQ, 3)
    rel = abs(hf_loss - val_loss) / abs(val_loss)
    log(f"val_loss: gtrain {val_loss:.9f}, transformers on the export {hf_loss:.9f}, relative difference {rel:.2e}")
    assert rel <= TOL, "the exported model does not compute what gtrain computed"
    return ini, state, model


def check_bf16_export(args, state, fp32_model, work):
    out = f"{work}/export_bf16"
    p = subprocess.run([sys.executable, args.tool, state, out, "--dtype", "bfloat16"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    cfg = json.load(open(f"{out}/config.json"))
    assert cfg["dtype"] == "bfloat16"
    m = transformers.LlamaForCausalLM.from_pretrained(out, dtype=torch.bfloat16)
    n = 0
    for (name, a), (_, b) in zip(fp32_model.state_dict().items(), m.state_dict().items()):
        assert torch.equal(a.to(torch.bfloat16), b), f"{name}: bf16 export differs from torch's rounding"
        n += 1
    log(f"bf16 export: {n} tensors equal torch's fp32 -> bf16 rounding")


def check_export_bad_out(args, state, work):
    """An output path that is a file (a typo, a tab-completed file name) exits 2 with one line, no traceback."""
    out = f"{work}/export_is_a_file"
    open(out, "w").write("not a directory\n")
    for target in (out, f"{out}/sub"):
        p = subprocess.run([sys.executable, args.tool, state, target], capture_output=True, text=True)
        msg = p.stderr.strip()
        log(f"export to {target}: exit {p.returncode}: {msg}")
        assert p.returncode == 2, f"export to {target}: exit {p.returncode}, expected 2"
        assert len(msg.splitlines()) == 1 and target in msg, f"export to {target}: expected one line naming it"
    assert open(out).read() == "not a directory\n", "the file in the way was changed"


def check_resume_wins(args, ini, work):
    p = run([args.gtrain, ini, "train.steps=21"])
    print(p.stdout, end="")
    assert p.returncode == 0, p.stderr
    assert "not read: resuming from the state file" in p.stdout, "no line saying the state file wins"
    assert "continuing at step 21" in p.stdout


def check_init_takes_unset_keys(args, hf_dir, work, first_loss):
    """An INI whose [model] has only init (and max_seq_len, the run's choice): the other keys come from
    config.json, one note lists them, and the run is the one with every key written out."""
    full = open(f"{work}/run.ini").read()
    model, rest = full.split("[train]", 1)
    keep = [l for l in model.splitlines() if l.startswith(("[model]", "init =", "max_seq_len ="))]
    ini = f"{work}/init_only.ini"
    open(ini, "w").write("\n".join(keep) + "\n[train]" + rest)
    p = run([args.gtrain, ini, "train.steps=1", f"checkpoint.dir={work}/ck_init_only",
             f"log.metrics={work}/init_only.jsonl"])
    assert p.returncode == 0, f"gtrain failed ({p.returncode}): {p.stdout}\n{p.stderr}"
    notes = [l for l in p.stderr.splitlines() if "taken from its config.json" in l]
    log(f"init only: {notes}")
    assert len(notes) == 1, f"expected one line listing the keys taken: {p.stderr}"
    for key in ("dim = 64", "n_layers = 2", "n_kv_heads = 1", "vocab_size = 320", "rope_theta = 500000",
                "rope_type = llama3", "rope_original_max_position_embeddings = 64"):
        assert key in notes[0], f"the note does not list {key}"
    loss = json.loads(open(f"{work}/init_only.jsonl").readline())["loss"]
    assert loss == first_loss, f"step 1 loss {loss} with the keys taken, {first_loss} with them written out"


def check_world_sizes(args, hf_dir, cfg, work):
    """lr 1e-30 and no weight decay: one step leaves the master weights as imported, bit for bit."""
    from safetensors.numpy import load_file
    want = {}
    for f in os.listdir(hf_dir):
        if f.endswith(".safetensors"):
            want.update(load_file(os.path.join(hf_dir, f)))
    import h5py
    for W in (1, 2, 4):
        wdir = f"{work}/w{W}"
        os.makedirs(wdir, exist_ok=True)
        for f in ("data.train.bin", "data.val.bin"):
            shutil.copy(f"{work}/{f}", f"{wdir}/{f}")
        text = ini_text(cfg, hf_dir, wdir, 1).replace("lr = 3e-3\nmin_lr = 3e-4\nwarmup_steps = 1\n",
                                                      "lr = 1e-30\nmin_lr = 0\nwarmup_steps = 0\nweight_decay = 0\n")
        open(f"{wdir}/run.ini", "w").write(text)
        cmd = [args.mpiexec, "-n", str(W)] + args.mpiexec_flags.split() + [args.gtrain, f"{wdir}/run.ini"]
        p = run(cmd)
        assert p.returncode == 0, f"W={W}: {p.stdout}\n{p.stderr}"
        with h5py.File(f"{wdir}/ck/step_00000001.h5", "r") as h:
            names = list(h["model"].keys())
            assert sorted(names) == sorted(want), f"W={W}: tensors {sorted(set(names) ^ set(want))}"
            for name in names:
                assert np.array_equal(h["model"][name][()], want[name].astype(np.float32)), f"W={W}: {name} differs"
        log(f"W={W}: the {len(names)} imported tensors equal the checkpoint bit for bit")


# ---------------------------------------------------------------- broken checkpoints

def read_st(path):
    raw = open(path, "rb").read()
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def write_st(path, header, data):
    text = json.dumps(header).encode()
    open(path, "wb").write(len(text).to_bytes(8, "little") + text + data)


def check_broken(args, work):
    good = f"{work}/good"
    cfg, _ = make_model("broken", good, work)
    V = cfg.vocab_size
    write_tokens(f"{work}/data.train.bin", corpus(V, 4000, 1), V)
    write_tokens(f"{work}/data.val.bin", corpus(V, 1000, 2), V)
    header, data = read_st(f"{good}/model.safetensors")
    names = [k for k in header if k != "__metadata__"]
    last = max(names, key=lambda k: header[k]["data_offsets"][1])
    victim = "model.layers.1.mlp.up_proj.weight"

    def variant(name, edit):
        d = f"{work}/{name}"
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(good, d)
        edit(d)
        return d

    def truncated(d):
        raw = open(f"{d}/model.safetensors", "rb").read()
        open(f"{d}/model.safetensors", "wb").write(raw[:-100])

    def lying_offsets(d):
        h = json.loads(json.dumps(header))
        h[victim]["data_offsets"][1] += 4
        write_st(f"{d}/model.safetensors", h, data)

    def offsets_past_end(d):
        h = json.loads(json.dumps(header))
        b, e = h[victim]["data_offsets"]
        h[victim]["data_offsets"] = [b + len(data), e + len(data)]
        write_st(f"{d}/model.safetensors", h, data)

    def bad_dtype(d):
        h = json.loads(json.dumps(header))
        h[victim]["dtype"] = "F64"
        write_st(f"{d}/model.safetensors", h, data)

    def not_json(d):
        raw = open(f"{d}/model.safetensors", "rb").read()
        n = int.from_bytes(raw[:8], "little")
        open(f"{d}/model.safetensors", "wb").write(raw[:8] + b"{\"oops" + b"x" * (n - 6) + raw[8 + n:])

    def huge_header(d):
        raw = open(f"{d}/model.safetensors", "rb").read()
        open(f"{d}/model.safetensors", "wb").write((len(raw) * 2).to_bytes(8, "little") + raw[8:])

    def missing_tensor(d):
        h = json.loads(json.dumps(header))
        del h[victim]
        write_st(f"{d}/model.safetensors", h, data)

    def wrong_shape(d):
        h = json.loads(json.dumps(header))
        h[victim]["shape"] = list(reversed(h[victim]["shape"]))
        write_st(f"{d}/model.safetensors", h, data)

    def bias(d):
        c = json.load(open(f"{d}/config.json"))
        c["attention_bias"] = True
        json.dump(c, open(f"{d}/config.json", "w"))

    def rope_yarn(d):
        c = json.load(open(f"{d}/config.json"))
        c["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}
        json.dump(c, open(f"{d}/config.json", "w"))

    def ffn_bigger(d):
        c = json.load(open(f"{d}/config.json"))
        c["intermediate_size"] += 32
        json.dump(c, open(f"{d}/config.json", "w"))

    st = "model.safetensors"
    cases = [  # (name, edit, INI override, strings the message must contain)
        ("truncated", truncated, [], [st, last]),
        ("lying_offsets", lying_offsets, [], [st, victim, "data_offsets"]),
        ("offsets_past_end", offsets_past_end, [], [st, victim, "past the end"]),
        ("bad_dtype", bad_dtype, [], [st, victim, "F64"]),
        ("not_json", not_json, [], [st, "not JSON"]),
        ("huge_header", huge_header, [], [st, "header length"]),
        ("missing_tensor", missing_tensor, [], [victim, "none of the"]),
        ("wrong_shape", wrong_shape, [], [st, victim, "shape"]),
        ("attention_bias", bias, [], ["config.json", "attention_bias"]),
        ("rope_yarn", rope_yarn, [], ["config.json", "yarn"]),
        ("config_mismatch", lambda d: None, ["model.dim=32"],
         ["config.json", "hidden_size = 64", "[model] dim (set on the command line) = 32"]),
        ("ffn_mismatch_names_the_ini_line", ffn_bigger, [],
         ["config.json", "intermediate_size = ", "ffn_mismatch_names_the_ini_line.ini:", "[model] ffn_dim = "]),
        ("tie_mismatch", lambda d: None, ["model.tie_word_embeddings=true"], ["config.json", "tie_word_embeddings"]),
        ("every_mismatch_at_once", ffn_bigger, ["model.n_layers=3"],
         ["config.json", "intermediate_size = ", "every_mismatch_at_once.ini:", "[model] ffn_dim = ",
          "num_hidden_layers = 2, but [model] n_layers (set on the command line) = 3"]),
        ("no_weights", lambda d: os.remove(f"{d}/model.safetensors"), [], ["no model.safetensors"]),
        ("init_missing", lambda d: None, [f"model.init={work}/no_such_dir"],
         ["[model] init", "no_such_dir", "No such file or directory"]),
        ("init_is_a_file", lambda d: None, [f"model.init={good}/config.json"],
         ["[model] init", "config.json", "not a directory"]),
    ]
    for name, edit, overrides, needles in cases:
        d = variant(name, edit)
        ini = f"{work}/{name}.ini"
        open(ini, "w").write(ini_text(cfg, d, work, 1))
        p = run([args.gtrain, ini] + overrides)
        msg = p.stderr.strip()
        log(f"{name}: exit {p.returncode}: {msg}")
        assert p.returncode == 2, f"{name}: exit {p.returncode}, expected 2"
        assert len(msg.splitlines()) == 1, f"{name}: expected one line"
        for s in needles:
            assert s in msg, f"{name}: the message does not name '{s}'"


# ---------------------------------------------------------------- export --like (the original's other files)

def make_like_checkpoint(d, work):
    """A small random LLaMA-3.2 style checkpoint in the form a published one has: rope_theta + rope_scaling
    (llama3), a max_position_embeddings (256) that is not original_max_position_embeddings x factor (512),
    bos/eos/pad ids, torch_dtype and an old transformers_version, a generation_config.json, and a BPE
    tokenizer trained here (tokenizer.json, tokenizer_config.json, special_tokens_map.json) plus a
    tokenizer.model (arbitrary bytes: only its copy is checked)."""
    import tokenizers
    from tokenizers import models, pre_tokenizers, trainers, decoders
    torch.manual_seed(5)
    specials = ["<pad>", "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = [" ".join(f"word{i % 37} thing{(i * 7) % 23} the gradient of {i}" for i in range(j, j + 20))
            for j in range(200)]
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=300, special_tokens=specials,
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>",
                                                eos_token="<|end_of_text|>", pad_token="<pad>")
    fast.save_pretrained(d)
    if not os.path.exists(f"{d}/special_tokens_map.json"):  # transformers 5 keeps them in tokenizer_config.json
        json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>", "pad_token": "<pad>"},
                  open(f"{d}/special_tokens_map.json", "w"), indent=2)
    open(f"{d}/tokenizer.model", "wb").write(bytes(range(256)) * 3)
    ids = {t: tok.token_to_id(t) for t in specials}
    V = 320
    assert tok.get_vocab_size() <= V
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=V, rms_norm_eps=1e-5, max_position_embeddings=256,
                                   tie_word_embeddings=True, initializer_range=0.03, attention_dropout=0.0,
                                   bos_token_id=ids["<|begin_of_text|>"],
                                   eos_token_id=[ids["<|end_of_text|>"], ids["<|eot_id|>"]],
                                   pad_token_id=ids["<pad>"],
                                   rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
                                   rope_theta=500000.0)
    transformers.LlamaForCausalLM(cfg).float().save_pretrained(d)
    c = json.load(open(f"{d}/config.json"))
    rp = c.pop("rope_parameters")
    c["rope_theta"] = rp.pop("rope_theta")
    c["rope_scaling"] = rp
    c.pop("dtype", None)
    c.update(torch_dtype="bfloat16", transformers_version="4.45.0.dev0")
    json.dump(c, open(f"{d}/config.json", "w"), indent=2)
    gen = {"_from_model_config": True, "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
           "do_sample": True, "temperature": 0.6, "top_p": 0.9, "transformers_version": "4.45.0.dev0"}
    json.dump(gen, open(f"{d}/generation_config.json", "w"), indent=2)
    return cfg, c


def export(args, state, out, *extra):
    p = subprocess.run([sys.executable, args.tool, state, out] + list(extra), capture_output=True, text=True)
    log(f"state_to_hf {' '.join(extra)} -> exit {p.returncode}: {p.stdout.strip()} {p.stderr.strip()}")
    return p


def check_like(args, work):
    hf_dir = f"{work}/hf"
    cfg, published = make_like_checkpoint(hf_dir, work)
    assert published["max_position_embeddings"] != 64 * 8
    V = cfg.vocab_size
    p, ini = train_from_init(args, cfg, hf_dir, work, 3, 4000, 1000)
    state = f"{work}/ck/step_00000003.h5"

    # 1. the default: [model] init of the state file
    out = f"{work}/export"
    p = export(args, state, out)
    assert p.returncode == 0, p.stderr
    said = [l for l in p.stdout.splitlines() if hf_dir in l]
    assert len(said) == 1, f"expected one stdout line naming {hf_dir}: {p.stdout}"
    c = json.load(open(f"{out}/config.json"))
    for key in ("max_position_embeddings", "bos_token_id", "eos_token_id", "pad_token_id", "initializer_range",
                "use_cache"):
        assert c.get(key) == published[key], f"config.json {key} = {c.get(key)}, the original's {published[key]}"
    for key in ("torch_dtype", "rope_scaling", "rope_theta", "transformers_version"):
        assert key not in c, f"config.json carries {key} over"
    assert c["dtype"] == "float32" and c["architectures"] == ["LlamaForCausalLM"] and c["model_type"] == "llama"
    names = ["generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
             "tokenizer.model"]
    for n in names:
        assert open(f"{out}/{n}", "rb").read() == open(f"{hf_dir}/{n}", "rb").read(), f"{n} differs"
        mode = stat.S_IMODE(os.stat(f"{out}/{n}").st_mode)
        assert mode == 0o644, f"{n} has mode {oct(mode)}"
    log(f"export: max_position_embeddings {c['max_position_embeddings']}, bos {c['bos_token_id']}, eos "
        f"{c['eos_token_id']}, pad {c['pad_token_id']}; {', '.join(names)} byte-identical")
    model, warns = load_hf(out)
    assert not warns, f"transformers warned loading the export: {warns}"
    assert model.config.max_position_embeddings == published["max_position_embeddings"]
    assert model.config.bos_token_id == published["bos_token_id"]
    assert model.config.rope_parameters == cfg.rope_parameters
    with h5py_file(state) as h:
        for name, t in model.state_dict().items():
            if name == "lm_head.weight":
                continue  # tied
            assert np.array_equal(t.numpy(), h["model"][name][()]), f"{name} is not the trained weight"
    gen = transformers.GenerationConfig.from_pretrained(out)
    assert gen.eos_token_id == published["eos_token_id"] and gen.temperature == 0.6
    ours, theirs = transformers.AutoTokenizer.from_pretrained(out), transformers.AutoTokenizer.from_pretrained(hf_dir)
    sample = "the gradient of word3 thing7 is not 42"
    assert ours(sample)["input_ids"] == theirs(sample)["input_ids"] and len(ours(sample)["input_ids"]) > 3
    assert ours.eos_token_id == c["eos_token_id"][0] and ours.bos_token_id == c["bos_token_id"]
    log("transformers loads the export without warnings; AutoTokenizer and GenerationConfig load from it")

    # a run on longer sequences than the checkpoint was published for keeps its own max_seq_len
    p = run([args.gtrain, ini, "model.max_seq_len=1024", f"checkpoint.dir={work}/ck1024"])
    assert p.returncode == 0, f"gtrain failed ({p.returncode}): {p.stdout}\n{p.stderr}"
    p = export(args, f"{work}/ck1024/step_00000003.h5", f"{work}/export1024")
    assert p.returncode == 0, p.stderr
    c = json.load(open(f"{work}/export1024/config.json"))
    assert c["max_position_embeddings"] == 1024 and c["bos_token_id"] == published["bos_token_id"], c

    # 2. --no-like, and a recorded init that is gone: gtrain's config.json alone, as before --like
    plain = f"{work}/export_plain"
    p = export(args, state, plain, "--no-like")
    assert p.returncode == 0 and hf_dir not in p.stdout, p.stdout + p.stderr
    c = json.load(open(f"{plain}/config.json"))
    assert c["max_position_embeddings"] == 64 * 8 and "bos_token_id" not in c, c
    assert not [n for n in names if os.path.exists(f"{plain}/{n}")], os.listdir(plain)
    os.rename(hf_dir, f"{hf_dir}.moved")
    p = export(args, state, f"{work}/export_gone")
    os.rename(f"{hf_dir}.moved", hf_dir)
    assert p.returncode == 0, p.stderr
    assert "not a directory" in p.stdout and hf_dir in p.stdout, p.stdout
    assert open(f"{work}/export_gone/config.json").read() == open(f"{plain}/config.json").read()
    assert sorted(os.listdir(f"{work}/export_gone")) == sorted(os.listdir(plain))
    log("--no-like and a vanished init: gtrain's config.json alone")

    # 3. --like a checkpoint of another model: exit 2, one line naming the key and both values, nothing written
    other = f"{work}/other"
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=32, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=V, tie_word_embeddings=True)).save_pretrained(other)

    def edited(name, **change):
        d = f"{work}/{name}"
        shutil.copytree(hf_dir, d)
        c = json.load(open(f"{d}/config.json"))
        for k, v in change.items():
            if k in c["rope_scaling"]:
                c["rope_scaling"][k] = v
            else:
                c[k] = v
        json.dump(c, open(f"{d}/config.json", "w"))
        return d

    cases = [(other, ["other/config.json: hidden_size = 32,", "[model] dim = 64"]),
             (edited("factor", factor=32.0), ["rope factor = 32,", "[model] rope_factor = 8 "]),
             (edited("untied", tie_word_embeddings=False),
              ["tie_word_embeddings = false,", "[model] tie_word_embeddings = true"]),
             (edited("kv", num_key_value_heads=1), ["num_key_value_heads = 1,", "[model] n_kv_heads = 2"]),
             (edited("eps", rms_norm_eps=1e-6), ["rms_norm_eps = 1e-06,", "[model] norm_eps = 1e-05 "]),
             (f"{work}/no_such_dir", ["no_such_dir", "not a directory"])]
    for d, needles in cases:
        bad = f"{work}/export_bad"
        p = export(args, state, bad, "--like", d)
        msg = p.stderr.strip()
        assert p.returncode == 2, f"--like {d}: exit {p.returncode}, expected 2"
        assert len(msg.splitlines()) == 1, f"--like {d}: expected one line: {msg}"
        for s in needles:
            assert s in msg, f"--like {d}: the message does not name '{s}': {msg}"
        assert not os.path.exists(bad), f"--like {d}: wrote {bad}"


def h5py_file(path):
    import h5py
    return h5py.File(path, "r")


def hf_config_of_ini(path):
    import configparser
    ini = configparser.ConfigParser(interpolation=None, inline_comment_prefixes=(";",))
    ini.read(path)
    m = ini["model"]
    rope = {"rope_type": m.get("rope_type", "default"), "rope_theta": float(m["rope_theta"])}
    if rope["rope_type"] == "llama3":
        rope.update(factor=float(m["rope_factor"]), low_freq_factor=float(m["rope_low_freq_factor"]),
                    high_freq_factor=float(m["rope_high_freq_factor"]),
                    original_max_position_embeddings=int(m["rope_original_max_position_embeddings"]))
    return transformers.LlamaConfig(
        hidden_size=int(m["dim"]), num_hidden_layers=int(m["n_layers"]), num_attention_heads=int(m["n_heads"]),
        num_key_value_heads=int(m["n_kv_heads"]), vocab_size=int(m["vocab_size"]),
        intermediate_size=int(m["ffn_dim"]), rms_norm_eps=float(m["norm_eps"]), rope_parameters=rope,
        max_position_embeddings=131072, tie_word_embeddings=m.get("tie_word_embeddings", "false") == "true")


def check_configs(args):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for name in ("llama3.2_1b.ini", "llama3_8b.ini"):
        path = os.path.join(root, "configs", name)
        p = run([args.gtrain, "--plan", "--world", "8", path])
        assert p.returncode == 0, p.stderr
        ours = int(p.stdout.split("model: ")[1].split()[0])
        with torch.device("meta"):
            model = transformers.LlamaForCausalLM(hf_config_of_ini(path))
        theirs = sum(t.numel() for t in model.parameters())  # a tied tensor is listed once
        log(f"{name}: gtrain --plan {ours} parameters, transformers {theirs}")
        assert ours == theirs, f"{name}: parameter counts differ"
        # the [data] paths must match what tools/prep_tokenized.py -o data/llama3 writes (PREFIX.SPLIT.NNNNNN.bin)
        import configparser
        import fnmatch
        ini = configparser.ConfigParser(interpolation=None, inline_comment_prefixes=(";",))
        ini.read(path)
        for split in ("train", "val"):
            pattern, made = ini["data"][split], f"data/llama3.{split}.000000.bin"
            assert fnmatch.fnmatch(made, pattern), f"{name}: [data] {split} = {pattern} does not match {made}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", required=True, choices=["gqa", "llama31", "tied", "broken", "configs", "like"])
    ap.add_argument("--gtrain", required=True)
    ap.add_argument("--grads", required=True)
    ap.add_argument("--tool", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--mpiexec", default="mpiexec")
    ap.add_argument("--mpiexec-flags", default="--allow-run-as-root --oversubscribe")
    args = ap.parse_args()
    torch.set_num_threads(1)
    work = args.work
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    if args.case == "configs":
        check_configs(args)
        print("PASS: configs")
        return
    if args.case == "like":
        check_like(args, work)
        print("PASS: like: the export carries the original's config keys, generation config and tokenizer")
        return
    if args.case == "broken":
        check_broken(args, work)
        print("PASS: broken checkpoints exit 2 with the file and the tensor named")
        return
    hf_dir = f"{work}/hf"
    cfg, files = make_model(args.case, hf_dir, work)
    if args.case == "gqa":
        assert len(files) >= 2 and os.path.exists(f"{hf_dir}/model.safetensors.index.json")
    ref, warns = load_hf(hf_dir)
    check_grads(args, args.case, hf_dir, ref, work)
    ini, state, exported = train_export_compare(args, args.case, hf_dir, cfg, work)
    if args.case == "tied":
        check_bf16_export(args, state, exported, work)
        check_export_bad_out(args, state, work)
        check_resume_wins(args, ini, work)
    if args.case == "gqa":
        check_world_sizes(args, hf_dir, cfg, work)
    if args.case == "llama31":
        check_init_takes_unset_keys(args, hf_dir, work, json.loads(open(f"{work}/metrics.jsonl").readline())["loss"])
    print(f"PASS: {args.case}")


if __name__ == "__main__":
    main()
