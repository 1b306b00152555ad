#!/usr/bin/env python3
"""state_to_hf.py — a gtrain training-state file -> a Hugging Face LLaMA checkpoint.

    python3 tools/state_to_hf.py runs/tiny/step_00000200.h5 out/tiny-hf [--dtype float32|bfloat16|float16]

writes out/tiny-hf/model.safetensors (the fp32 master weights of /model, under the same Hugging Face
state-dict names gtrain uses) and out/tiny-hf/config.json (a LlamaConfig built from the [model]
section of the file's /config), so that

    transformers.LlamaForCausalLM.from_pretrained("out/tiny-hf")

loads it. The optimizer moments (/optim) are not exported. Needs numpy, h5py and safetensors
(torch too for --dtype bfloat16). gtrain's byte-level data has no tokenizer files: token i is byte i.
Exit status: 0 done, 2 bad arguments or not a gtrain state file. The file layout is in
docs/state-format.md.
"""
import argparse
import configparser
import json
import os
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


def llama_config(model, n_params_dtype):
    """LlamaConfig fields from gtrain's [model] section (configs/README.md has the keys)."""
    dim, n_heads = int(model["dim"]), int(model["n_heads"])
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
        "max_position_embeddings": int(model["max_seq_len"]),
        "rms_norm_eps": float(model["norm_eps"]),
        "rope_theta": float(model["rope_theta"]),
        "rope_scaling": None,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": float(model["dropout"]),
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "torch_dtype": n_params_dtype,
    }


def main():
    ap = argparse.ArgumentParser(description="gtrain state file -> Hugging Face model.safetensors + config.json")
    ap.add_argument("state", help="a gtrain state file (DIR/step_NNNNNNNN.h5)")
    ap.add_argument("out", help="output directory (created)")
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                    help="dtype of the exported weights (default float32, the master weights as they are)")
    args = ap.parse_args()
    try:
        import h5py
        import numpy as np
        from safetensors.numpy import save_file
    except ImportError as e:
        fail(f"needs numpy, h5py and safetensors ({e})")

    if not os.path.isfile(args.state):
        fail(f"{args.state}: no such file")
    with h5py.File(args.state, "r") as f:
        if as_text(f.attrs.get("format", b"")) != "gtrain-state":
            fail(f"{args.state}: not a gtrain state file (no format = gtrain-state attribute)")
        version = int(f.attrs["format_version"])
        if version != 1:
            fail(f"{args.state}: format_version {version}; this tool reads version 1")
        step = int(f.attrs["step"])
        ini = configparser.ConfigParser(interpolation=None, inline_comment_prefixes=None)
        ini.read_string(as_text(f["config"][0]))
        config = llama_config(ini["model"], args.dtype)
        tensors = {}
        for name, dset in f["model"].items():  # reading verifies every chunk's Fletcher32 checksum
            tensors[name] = np.ascontiguousarray(dset[()], dtype=np.float32)

    layers = config["num_hidden_layers"]
    expected = 3 + 9 * layers
    if len(tensors) != expected:
        fail(f"{args.state}: {len(tensors)} tensors in /model, expected {expected} for {layers} layers")

    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "model.safetensors")
    meta = {"format": "pt", "source": os.path.basename(args.state), "step": str(step)}
    if args.dtype == "float32":
        save_file(tensors, path, metadata=meta)
    elif args.dtype == "float16":
        save_file({k: v.astype(np.float16) for k, v in tensors.items()}, path, metadata=meta)
    else:
        try:
            import torch
            from safetensors.torch import save_file as save_torch
        except ImportError:
            fail("--dtype bfloat16 needs torch")
        save_torch({k: torch.from_numpy(v).to(torch.bfloat16) for k, v in tensors.items()}, path, metadata=meta)
    with open(os.path.join(args.out, "config.json"), "w") as out:
        json.dump(config, out, indent=2)
        out.write("\n")
    n = sum(v.size for v in tensors.values())
    print(f"state_to_hf: {args.state} (step {step}) -> {path} ({n} parameters, {args.dtype}) and config.json")


if __name__ == "__main__":
    main()
