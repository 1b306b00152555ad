#!/usr/bin/env python3
"""state_to_hf.py — a gtrain training-state file -> a Hugging Face LLaMA checkpoint directory.

    python3 tools/state_to_hf.py runs/tiny/step_00000200.h5 out/tiny-hf [--dtype bfloat16] [--max-shard-size 5GB]
                                 [--like DIR | --no-like]

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

--like DIR: the Hugging Face directory the run started from. Default: the state file's [model] init, when
that is a directory here (a relative path is taken from the working directory, as gtrain took it); one line
on stdout says which directory was used; --no-like turns the default off. DIR/config.json must describe the
state file's model (hidden_size, layers, heads, KV heads, head_dim, intermediate_size, vocab_size,
rms_norm_eps, every RoPE parameter, tie_word_embeddings, no biases, silu): a difference exits 2 naming the
key and both values, before anything is written. Then config.json takes from DIR what gtrain does not model:
max_position_embeddings (the published one, not original_max_position_embeddings x factor; gtrain's
max_seq_len when that is larger), bos/eos/pad_token_id, initializer_range, use_cache and any other key, but
not the older RoPE spelling (rope_scaling, rope_theta: rope_parameters is written), torch_dtype/dtype
(--dtype), transformers_version, _name_or_path, quantization_config or auto_map; architectures and
model_type stay LlamaForCausalLM/llama. And the files of LIKE_FILES that DIR has (generation_config.json,
tokenizer.json, tokenizer_config.json, special_tokens_map.json, tokenizer.model, added_tokens.json,
chat_template.jinja) are copied byte for byte, written the same way. Without --like and without a recorded
init, config.json is gtrain's alone.

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
import struct
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


# --like DIR: the files of a Hugging Face directory that gtrain does not model, copied byte for byte
LIKE_FILES = ["generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
              "tokenizer.model", "added_tokens.json", "chat_template.jinja"]
# config.json keys of DIR that are not carried over although gtrain does not write them: the older spelling
# of rope_parameters (rope_scaling, rope_theta; gtrain writes rope_parameters, checked below), the weights'
# dtype (follows --dtype), facts about the writer (transformers_version, _name_or_path), and what the plain
# float LlamaForCausalLM weights written here are not (quantization_config; auto_map names custom code that
# is not copied)
LIKE_DROP = {"rope_scaling", "rope_theta", "torch_dtype", "dtype", "transformers_version", "_name_or_path",
             "quantization_config", "auto_map"}


def f32(x):
    """float as gtrain holds it (float32), so 1e-05 in the INI equals 1e-05 in config.json"""
    return struct.unpack("<f", struct.pack("<f", float(x)))[0]


def like_model(path, c):
    """The model a Hugging Face config.json describes, with LlamaConfig's defaults for what it leaves out and
    both spellings of RoPE read as src/core/hf_import.c reads them: {config.json key: value}."""
    def get(key, default=None, src=c):
        v = src.get(key, default)
        if v is None:
            fail(f"{path}: no {key} (expected a LLaMA config.json)")
        return v
    try:
        heads, hidden = int(get("num_attention_heads")), int(get("hidden_size"))
        out = {"model_type": c.get("model_type", "llama"), "hidden_size": hidden,
               "num_hidden_layers": int(get("num_hidden_layers")), "num_attention_heads": heads,
               "num_key_value_heads": int(c.get("num_key_value_heads") or heads),
               "head_dim": int(c.get("head_dim") or hidden // max(heads, 1)),
               "intermediate_size": int(get("intermediate_size")), "vocab_size": int(get("vocab_size")),
               "rms_norm_eps": f32(c.get("rms_norm_eps", 1e-6)),
               "tie_word_embeddings": bool(c.get("tie_word_embeddings", False)),
               "hidden_act": c.get("hidden_act", "silu"), "attention_bias": bool(c.get("attention_bias", False)),
               "mlp_bias": bool(c.get("mlp_bias", False))}
        params, scaling = c.get("rope_parameters"), c.get("rope_scaling")
        rope = params if isinstance(params, dict) else scaling if isinstance(scaling, dict) else {}
        theta = rope["rope_theta"] if isinstance(params, dict) and "rope_theta" in params else c.get("rope_theta", 1e4)
        out["rope_type"] = rope.get("rope_type", rope.get("type")) or "default"
        out["rope_theta"] = f32(theta)
        if out["rope_type"] == "llama3":
            for k in ("factor", "low_freq_factor", "high_freq_factor"):
                out[k] = f32(get(k, src=rope))
            out["original_max_position_embeddings"] = int(get("original_max_position_embeddings", src=rope))
    except (TypeError, ValueError, ZeroDivisionError) as e:
        fail(f"{path}: not a LLaMA config.json ({e})")
    return out


def our_model(config):
    """The same fields of the config.json built from the state file's [model]."""
    rope = config["rope_parameters"]
    out = {k: config[k] for k in ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                  "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size",
                                  "tie_word_embeddings", "hidden_act", "attention_bias", "mlp_bias")}
    out.update(rms_norm_eps=f32(config["rms_norm_eps"]), rope_type=rope["rope_type"], rope_theta=f32(rope["rope_theta"]))
    if rope["rope_type"] == "llama3":
        out.update({k: f32(rope[k]) for k in ("factor", "low_freq_factor", "high_freq_factor")})
        out["original_max_position_embeddings"] = rope["original_max_position_embeddings"]
    return out


# where the state file's value of each compared field comes from (configs/README.md has the [model] keys)
GTRAIN_KEY = {"model_type": "model (gtrain's LLaMA)", "hidden_size": "[model] dim",
              "num_hidden_layers": "[model] n_layers", "num_attention_heads": "[model] n_heads",
              "num_key_value_heads": "[model] n_kv_heads", "head_dim": "head dim ([model] dim / n_heads)",
              "intermediate_size": "[model] ffn_dim", "vocab_size": "[model] vocab_size",
              "rms_norm_eps": "[model] norm_eps", "tie_word_embeddings": "[model] tie_word_embeddings",
              "hidden_act": "model (gtrain's LLaMA)", "attention_bias": "model (gtrain's LLaMA)",
              "mlp_bias": "model (gtrain's LLaMA)", "rope_type": "[model] rope_type", "rope_theta": "[model] rope_theta",
              "factor": "[model] rope_factor", "low_freq_factor": "[model] rope_low_freq_factor",
              "high_freq_factor": "[model] rope_high_freq_factor",
              "original_max_position_embeddings": "[model] rope_original_max_position_embeddings"}


def like_config(like, config, max_seq_len):
    """gtrain's config.json with what DIR/config.json knows and gtrain does not (max_position_embeddings,
    bos/eos/pad_token_id, use_cache, initializer_range, ...); exits 2 when DIR describes another model."""
    path = os.path.join(like, "config.json")
    try:
        with open(path, "rb") as f:
            c = json.loads(f.read())
    except OSError as e:
        fail(f"{path}: cannot read: {e.strerror} (--like expects the Hugging Face directory the run started "
             f"from; --no-like exports without it)")
    except ValueError as e:
        fail(f"{path}: not JSON ({e})")
    if not isinstance(c, dict):
        fail(f"{path}: not a JSON object")
    theirs, ours = like_model(path, c), our_model(config)
    for key, value in ours.items():
        if theirs.get(key) != value:
            where = f"rope {key}" if key in ("rope_type", "rope_theta", "factor", "low_freq_factor",
                                             "high_freq_factor", "original_max_position_embeddings") else key
            def show(v):  # float32 values as %g: 1e-05, not 9.999999747378752e-06
                return f"{v:g}" if isinstance(v, float) else json.dumps(v)
            fail(f"{path}: {where} = {show(theirs.get(key))}, but the state file's {GTRAIN_KEY[key]} = "
                 f"{show(value)} (--like must be the checkpoint the run started from; --no-like exports "
                 f"without it)")
    out = dict(config)
    for key, value in c.items():
        if key not in ours and key not in LIKE_DROP and key not in ("architectures", "rope_parameters",
                                                                     "attention_dropout"):
            out[key] = value
    # a run that trained on longer sequences than the checkpoint was published for says so
    out["max_position_embeddings"] = max(int(c.get("max_position_embeddings", max_seq_len)), max_seq_len)
    return out


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
    like = ap.add_mutually_exclusive_group()
    like.add_argument("--like", metavar="DIR",
                      help="the Hugging Face directory the run started from: its config.json must describe the "
                           "same model; the keys gtrain does not model, generation_config.json and the tokenizer "
                           "files are carried over (default: the state file's [model] init, when it is there)")
    like.add_argument("--no-like", action="store_true", help="do not default --like to [model] init")
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
        if "rank_dir" in f.attrs:  # an asynchronous save: its tensors live in the rank files beside it
            rank_dir = os.path.join(os.path.dirname(os.path.abspath(args.state)), as_text(f.attrs["rank_dir"]))
            for r in range(int(f.attrs["rank_files"])):
                path = os.path.join(rank_dir, f"rank_{r:05d}.h5")
                if not os.path.isfile(path):  # h5py would read its part as the fill value (NaN)
                    fail(f"{args.state}: its rank file {path} is missing (copy the .h5.d directory with the file)")
        ini = configparser.ConfigParser(interpolation=None, inline_comment_prefixes=None)
        ini.read_string(as_text(f["config"][0]))
        config = llama_config(ini["model"], args.dtype)
        max_seq_len = int(ini["model"]["max_seq_len"])
        init = ini["model"].get("init", "").strip()
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

    # --like, or the directory the run was initialized from (relative paths as gtrain read them: from the
    # working directory), checked before anything is written
    like, how = args.like, "--like"
    if like is None and not args.no_like and init:
        if os.path.isdir(init):
            like, how = init, "[model] init of the state file"
        else:
            print(f"state_to_hf: [model] init = {init} of the state file is not a directory here: exporting "
                  f"gtrain's config.json only (--like DIR names it)")
    if like is not None:
        if not os.path.isdir(like):
            fail(f"--like {like}: not a directory (expected the Hugging Face directory the run started from)")
        config = like_config(like, config, max_seq_len)
        copied = [n for n in LIKE_FILES if os.path.isfile(os.path.join(like, n))]
        print(f"state_to_hf: like {like} ({how}): config.json keys gtrain does not model"
              f"{''.join(', ' + n for n in copied)}")

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
    if like is not None:
        for name in copied:
            try:
                with open(os.path.join(like, name), "rb") as f:
                    data = f.read()
            except OSError as e:
                fail(f"{os.path.join(like, name)}: cannot read: {e.strerror}")
            write_atomic(os.path.join(args.out, name), [data])
    n = sum(stored[k].size for k in names)
    print(f"state_to_hf: {args.state} (step {step}) -> {args.out}: {n} parameters, {args.dtype}, "
          f"{len(files)} safetensors file{'s' if len(files) > 1 else ''}{', tied embeddings' if tied else ''}, "
          f"rope {config['rope_parameters']['rope_type']}")


if __name__ == "__main__":
    main()
