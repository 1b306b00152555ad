#!/usr/bin/env python3
"""tools/state_to_hf.py gives a model that transformers loads and that computes what gtrain
computed: train a tiny model for a few steps, export its final state file, load it with
LlamaForCausalLM, and check that (1) every weight equals /model of the state file bit for bit and
(2) the validation loss over gtrain's validation batches matches the val_loss gtrain logged for the
same weights (within 1e-4 relative: float32, different summation order).

Fails (exit 1) when numpy, h5py, safetensors, torch or transformers are missing: it runs under
GTRAIN_HF_PYTHON, the venv that tools/run-tests.sh always makes (tools/setup-venv.sh), so a missing
package is a broken set-up, not a reason to skip.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

try:
    import h5py
    import numpy as np
    import safetensors  # noqa: F401
    import torch
    import transformers
except ImportError as e:
    print(f"FAIL: {e} in {sys.executable}: configure with -DGTRAIN_HF_PYTHON= the venv of tools/setup-venv.sh")
    sys.exit(1)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from val_loss_reference import val_loss_reference  # noqa: E402
from testlib import TINY_MODEL, word_corpus  # noqa: E402

CONFIG = TINY_MODEL + """rope_theta = 10000
[train]
seq_len = 32
micro_batch = 4
grad_accum = 1
steps = 6
precision = fp32
lr = 3e-3
min_lr = 3e-4
warmup_steps = 2
[data]
train = {work}/corpus.train.bin
val = {work}/corpus.val.bin
val_every = 6
val_batches = 3
[checkpoint]
dir = {work}/ck
every = 0
[log]
metrics = {work}/metrics.jsonl
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gtrain", required=True)
    ap.add_argument("--prep", required=True)
    ap.add_argument("--tool", required=True)
    ap.add_argument("--work", required=True)
    args = ap.parse_args()
    work = args.work
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)

    word_corpus(args.prep, work, 5, ["export", "hugging", "face", "llama", "weights", "state", "the", "a", "of", "tensor", "safetensors"], 180_000, words_per_line=(3, 12), val_fraction="0.1")
    with open(f"{work}/tiny.ini", "w") as f:
        f.write(CONFIG.format(work=work))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run([args.gtrain, f"{work}/tiny.ini"], check=True, env=env, stdout=subprocess.DEVNULL)
    state = f"{work}/ck/step_00000006.h5"
    val_loss = [json.loads(l)["val_loss"] for l in open(f"{work}/metrics.jsonl") if "val_loss" in l][-1]

    subprocess.run([sys.executable, args.tool, state, f"{work}/hf"], check=True)
    model = transformers.LlamaForCausalLM.from_pretrained(f"{work}/hf", torch_dtype=torch.float32,
                                                          attn_implementation="eager")
    model.eval()

    sd = model.state_dict()
    with h5py.File(state, "r") as f:
        names = sorted(f["model"].keys())
        assert sorted(sd.keys()) == names, f"names differ: {sorted(set(sd) ^ set(names))}"
        for name in names:
            assert np.array_equal(sd[name].numpy(), f["model"][name][()]), f"{name} differs"
    print(f"ok: {len(names)} tensors loaded by LlamaForCausalLM equal /model of {os.path.basename(state)}")

    hf_loss = val_loss_reference(model, f"{work}/corpus.val.bin", 4, 32, 3)
    rel = abs(hf_loss - val_loss) / abs(val_loss)
    print(f"val_loss: gtrain {val_loss:.7f}, transformers {hf_loss:.7f}, relative difference {rel:.2e}")
    assert rel < 1e-4, "the exported model does not compute what gtrain computed"

    # the file is an asynchronous save (the default): from another working directory, with a
    # relative path, the tool finds the rank files beside it; without one of them it refuses (exit 2)
    # instead of exporting the virtual datasets' fill value
    assert os.path.isdir(state + ".d"), "expected an asynchronous save (a .h5.d directory of rank files)"
    rel_state = os.path.relpath(state, "/")
    subprocess.run([sys.executable, args.tool, rel_state, f"{work}/hf_rel"], check=True, cwd="/")
    with h5py.File(state, "r") as f:
        from safetensors.numpy import load_file
        exported = load_file(f"{work}/hf_rel/model.safetensors")
        assert all(np.array_equal(exported[n], f["model"][n][()]) for n in exported), "relative path: tensors differ"
    moved = os.path.join(work, "moved", os.path.basename(state))  # the state copied whole, then one rank file lost
    shutil.rmtree(os.path.dirname(moved), ignore_errors=True)
    shutil.copytree(state + ".d", moved + ".d")
    shutil.copy(state, moved)
    os.remove(os.path.join(moved + ".d", sorted(os.listdir(moved + ".d"))[-1]))
    p = subprocess.run([sys.executable, args.tool, moved, f"{work}/hf_missing"], capture_output=True, text=True)
    print(p.stderr.strip())
    assert p.returncode == 2 and "is missing" in p.stderr, "a missing rank file must be refused"
    print("ok: read from another working directory; a missing rank file is refused")
    print("PASS: state_to_hf")


if __name__ == "__main__":
    main()
