#!/usr/bin/env python3
"""make_state_seeds.py — the seed corpus of the state-file fuzzer (tests/fuzz/fuzz_state.c).

    python make_state_seeds.py REAL_STATE.h5 OUT_DIR

REAL_STATE.h5 is a state file that gtrain saved for the model of tests/fuzz/state_model.ini
(docs/fuzzing.md has the command). The seeds are that file and variants of it, each with one thing
wrong that a byte mutator would rarely build: a missing group, attribute or tensor, a tensor of the
wrong shape, rank or type, attributes and /config of the wrong type, an extra tensor, an unchunked
tensor, a truncated copy. Needs h5py (the venv of tools/setup-venv.sh).
"""
import os
import shutil
import sys

import h5py
import numpy as np


def variant(src, out_dir, name, edit):
    path = os.path.join(out_dir, "seed_" + name)
    shutil.copyfile(src, path)
    with h5py.File(path, "r+", libver="latest") as f:
        edit(f)


def replace(f, name, data, **kw):
    attrs = dict(f[name].attrs)
    del f[name]
    f.create_dataset(name, data=data, **kw)
    for k, v in attrs.items():
        f[name].attrs[k] = v


def main():
    src, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    shutil.copyfile(src, os.path.join(out, "seed_real"))
    with h5py.File(src, "r") as f:
        names = sorted(f["model"].keys())
    mat = next(n for n in names if "proj" in n)
    norm = next(n for n in names if "norm" in n)
    t = f"model/{mat}"

    edits = {
        "no_train_group": lambda f: f.__delitem__("train"),
        "no_exp_avg_group": lambda f: f.__delitem__("optim/exp_avg"),
        "no_config": lambda f: f.__delitem__("config"),
        "no_tensor": lambda f: f.__delitem__(t),
        "transposed": lambda f: replace(f, t, np.ascontiguousarray(f[t][...].T), chunks=True, fletcher32=True),
        "float64": lambda f: replace(f, t, f[t][...].astype(np.float64), chunks=True, fletcher32=True),
        "int32": lambda f: replace(f, t, f[t][...].astype(np.int32)),
        "rank3": lambda f: replace(f, t, f[t][...].reshape((1,) + f[t].shape)),
        "scalar": lambda f: replace(f, f"model/{norm}", np.float32(1.0)),
        "contiguous": lambda f: replace(f, t, f[t][...]),
        "extra_tensor": lambda f: f.create_dataset("model/model.extra.weight", data=np.zeros(4, np.float32)),
        "model_is_dataset": lambda f: (f.__delitem__("model"), f.create_dataset("model", data=np.zeros(3))),
        "step_string": lambda f: f.attrs.__setitem__("step", np.bytes_("seven")),
        "format_vlen": lambda f: f.attrs.__setitem__("format", "gtrain-state"),
        "format_other": lambda f: f.attrs.__setitem__("format", np.bytes_("other-state")),
        "version_float": lambda f: f.attrs.__setitem__("format_version", 1.0),
        "version_2": lambda f: f.attrs.__setitem__("format_version", np.int64(2)),
        "no_world_size": lambda f: f.attrs.__delitem__("world_size"),
        "shard_int": lambda f: f.attrs.__setitem__("shard", np.int64(1)),
        "lr_string": lambda f: f["train"].attrs.__setitem__("lr", np.bytes_("fast")),
        "seq_len_array": lambda f: f["train"].attrs.__setitem__("seq_len", np.arange(3)),
        "format_array": lambda f: f.attrs.__setitem__("format", np.array([b"gtrain-state", b"gtrain-state"])),
        "config_array": lambda f: replace(f, "config", np.array([f["config"][()]] * 3)),
        "config_int": lambda f: replace(f, "config", np.arange(5)),
        "config_vlen": lambda f: replace(f, "config", "[model]\ndim = 8\n"),
        "config_bad_ini": lambda f: replace(f, "config", np.bytes_("[model]\ndim = abc\n[nope]\n")),
    }
    for name, edit in edits.items():
        variant(src, out, name, edit)
    data = open(src, "rb").read()
    open(os.path.join(out, "seed_truncated"), "wb").write(data[: len(data) // 2])


if __name__ == "__main__":
    main()
