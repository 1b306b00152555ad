#!/usr/bin/env python3
"""state_to_hf.py — a gtrain training-state file -> a Hugging Face LLaMA checkpoint directory.

    python3 tools/state_to_hf.py runs/tiny/step_00000200.h5 out/tiny-hf [--dtype bfloat16] [--max-shard-size 5GB]

writes into out/tiny-hf/
  config.json                      a LlamaConfig in the form transformers 5 writes (rope_parameters), built
                                   from the [model] section of the file's /config: tied embeddings, llama3
                                   RoPE scaling and grouped-query attention included
  model.safetensors                the fp32 master weights of /model under their Hugging Face names
                                   (no lm_head.weight when the embeddings are tied), or, when the weights
                                   are larger than --max-shard-size,
  model-0000i-of-0000n.safetensors + model.safetensors.index.json
so that transformers.LlamaForCausalLM.from_pretrained("out/tiny-hf") loads it, without warnings. Every
file is written under a temporary name, then renamed, with mode 0644. The optimizer moments (/optim) are
not exported. gtrain's byte-level data has no tokenizer files: token i is byte i.

--dtype float32 (default: the master weights as they are), bfloat16 (rounded to nearest even) or float16.
Needs numpy and h5py only (the safetensors files are written here: an 8-byte header length, a JSON header,
the raw little-endian tensors). Exit status: 0 done, 2 bad arguments or not a gtrain state file. The
state file layout is in docs/state-format.md.
"""
import argparse
import configparser
import json
import os
import re
import sys


def fail(msg):
    print(f"state_to_hf: {msg}", file=sys.stderr)
    sys.exit(2)


def as_text(value):
    if isinstance(value, bytes):
        return value.decode()
    if hasattr(value, "tobytes") and getattr(value, "dtype", None) is not None and value.dtype.kind == "S":
        return value.tobytes().rstrip(b"\0").decode()
    return str(value)


def parse_size(text):
    """'5GB', '500MB', '2GiB', '123' -> bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"'{text}' is not a size (expected e.g. 5GB, 500MB, 2GiB or 123)")
    unit = (m.group(2) or "B").upper()
    scale = {"B": 1, "K": 1000, "KB": 1000, "KIB": 1024, "M": 10**6, "MB": 10**6, "MIB": 2**20,
             "G": 10**9, "GB": 10**9, "GIB": 2**30, "T": 10**12, "TB": 10**12, "TIB": 2**40}[unit]
    size = int(float(m.group(1)) * scale)
    if size <= 0:
        raise argparse.ArgumentTypeError("the size must be > 0")
    return size


def llama_config(model, dtype):
    """LlamaConfig fields from gtrain's [model] section (configs/README.md has the keys); keys that a
    state file from before a key existed lacks take gtrain's defaults."""
    dim, n_heads = int(model["dim"]), int(model["n_heads"])
    max_pos = int(model["max_seq_len"])
    rope = {"rope_type": "default", "rope_theta": float(model["rope_theta"])}
    if model.get("rope_type", "default") == "llama3":
        rope.update(rope_type="llama3", factor=float(model["rope_factor"]),
                    low_freq_factor=float(model["rope_low_freq_factor"]),
                    high_freq_factor=float(model["rope_high_freq_factor"]),
                    original_max_position_embeddings=int(model["rope_original_max_position_embeddings"]))
        # transformers expects the extended context to exceed the original one (it warns otherwise)
        max_pos = max(max_pos, int(rope["original_max_position_embeddings"] * rope["factor"]))
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": dim,
        "intermediate_size": int(model["ffn_dim"]),
        "num_hidden_layers": int(model["n_layers"]),
        "num_attention_heads": n_heads,
        "num_key_value_heads": int(model["n_kv_heads"]),
        "head_dim": dim // n_heads,
        "vocab_size": int(model["vocab_size"]),
        "max_position_embeddings": max_pos,
        "rms_norm_eps": float(model["norm_eps"]),
        "rope_parameters": rope,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": float(model["dropout"]),
        "tie_word_embeddings": model.get("tie_word_embeddings", "false") == "true",
        "initializer_range": 0.02,
        "dtype": dtype,
    }


ST_DTYPE = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}


def encode(array, dtype, np):
    """fp32 array -> little-endian bytes of dtype."""
    a = np.ascontiguousarray(array, dtype="<f4")
    if dtype == "float32":
        return a.tobytes()
    if dtype == "float16":
        return a.astype("<f2").tobytes()
    bits = a.view("<u4").astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # round to nearest even
    nan = np.isnan(a)
    rounded[nan] = (bits[nan] >> 16) | 0x40  # keep NaN a (quiet) NaN
    return rounded.astype("<u2").tobytes()


def write_atomic(path, chunks):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        for c in chunks:
            f.write(c)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def write_safetensors(path, tensors, dtype, metadata, np):
    """tensors: list of (name, fp32 array)."""
    header, blobs, at = {"__metadata__": metadata}, [], 0
    for name, array in tensors:
        blob = encode(array, dtype, np)
        header[name] = {"dtype": ST_DTYPE[dtype], "shape": list(array.shape), "data_offsets": [at, at + len(blob)]}
        blobs.append(blob)
        at += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as the reference writer does
    write_atomic(path, [len(text).to_bytes(8, "little"), text] + blobs)


def main():
    ap = argparse.ArgumentParser(description="gtrain state file -> Hugging Face config.json + safetensors")
    ap.add_argument("state", help="a gtrain state file (DIR/step_NNNNNNNN.h5)")
    ap.add_argument("out", help="output directory (created)")
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                    help="dtype of the exported weights (default float32, the master weights as they are)")
    ap.add_argument("--max-shard-size", type=parse_size, default=parse_size("5GB"), metavar="SIZE",
                    help="largest safetensors file before the weights are split into shards with an index "
                         "(default 5GB; e.g. 500MB, 2GiB)")
    args = ap.parse_args()
    try:
        import h5py
        import numpy as np
    except ImportError as e:
        fail(f"needs numpy and h5py ({e}) in {sys.executable}: pip install h5py numpy, or run this script with "
             f"/opt/gtrain-venv/bin/python (tools/setup-venv.sh)")

    if not os.path.isfile(args.state):
        fail(f"{args.state}: no such file")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        fail(f"{args.out}: exists and is not a directory (expected the output directory, created when missing)")
    try:
        f = h5py.File(args.state, "r")
    except OSError as e:
        fail(f"{args.state}: not an HDF5 file ({e})")
    with f:
        if as_text(f.attrs.get("format", b"")) != "gtrain-state":
            fail(f"{args.state}: not a gtrain state file (no format = gtrain-state attribute)")
        version = int(f.attrs["format_version"])
        if version != 1:
            fail(f"{args.state}: format_version {version}; this tool reads version 1")
        step = int(f.attrs["step"])
        ini = configparser.ConfigParser(interpolation=None, inline_comment_prefixes=None)
        ini.read_string(as_text(f["config"][0]))
        config = llama_config(ini["model"], args.dtype)
        stored = {}
        for name, dset in f["model"].items():  # reading verifies every chunk's Fletcher32 checksum
            stored[name] = np.ascontiguousarray(dset[()], dtype=np.float32)

    layers, tied = config["num_hidden_layers"], config["tie_word_embeddings"]
    per_layer = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                 "mlp.up_proj", "mlp.down_proj", "input_layernorm", "post_attention_layernorm"]
    names = ["model.embed_tokens.weight"]
    names += [f"model.layers.{i}.{p}.weight" for i in range(layers) for p in per_layer]
    names += ["model.norm.weight"] + ([] if tied else ["lm_head.weight"])
    if sorted(names) != sorted(stored):
        missing, extra = sorted(set(names) - set(stored)), sorted(set(stored) - set(names))
        fail(f"{args.state}: /model does not match its [model] config (missing {missing[:3]}, unexpected "
             f"{extra[:3]})")

    # shards: tensors in model order, a new file when the next tensor would pass the limit
    esize = 4 if args.dtype == "float32" else 2
    shards, size = [[]], 0
    for name in names:
        nbytes = stored[name].size * esize
        if shards[-1] and size + nbytes > args.max_shard_size:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as e:
        fail(f"{args.out}: cannot create the output directory: {e.strerror}")
    for old in os.listdir(args.out):  # a previous export's files would confuse the loader
        if re.fullmatch(r"model(-\d{5}-of-\d{5})?\.safetensors(\.index\.json)?", old):
            os.remove(os.path.join(args.out, old))
    meta = {"format": "pt", "source": os.path.basename(args.state), "step": str(step)}
    files = []
    for i, shard in enumerate(shards):
        fname = "model.safetensors" if len(shards) == 1 else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        write_safetensors(os.path.join(args.out, fname), [(n, stored[n]) for n in shard], args.dtype, meta, np)
        files.append(fname)
    if len(shards) > 1:
        index = {"metadata": {"total_size": sum(stored[n].size * esize for n in names)},
                 "weight_map": {n: files[i] for i, shard in enumerate(shards) for n in shard}}
        write_atomic(os.path.join(args.out, "model.safetensors.index.json"),
                     [(json.dumps(index, indent=2) + "\n").encode()])
    write_atomic(os.path.join(args.out, "config.json"), [(json.dumps(config, indent=2) + "\n").encode()])
    n = sum(stored[k].size for k in names)
    print(f"state_to_hf: {args.state} (step {step}) -> {args.out}: {n} parameters, {args.dtype}, "
          f"{len(files)} safetensors file{'s' if len(files) > 1 else ''}{', tied embeddings' if tied else ''}, "
          f"rope {config['rope_parameters']['rope_type']}")


if __name__ == "__main__":
    main()
