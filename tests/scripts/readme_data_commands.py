#!/usr/bin/env python3
"""README.md's data section runs as written: the commands of its sh blocks ("## Your own data"), one by
one, in a fresh directory laid out as a checkout after the quickstart (build/, tools/, configs/, launch/
and an empty data/), with two changes only: the venv's Python is PYTHON, and every training command
(build/gtrain, launch/local.sh) gets `train.steps=2 data.val_every=2 data.val_batches=1` appended (a
later override wins), so that each trains two steps. Each must exit 0; the blend must print its
realised mix, the instruction-tuning run its model.init import and its loss masks.

    readme_data_commands.py SOURCE_DIR BUILD_DIR PYTHON WORK_DIR
"""
import os
import re
import shutil
import subprocess
import sys

VENV_PYTHON = "/opt/gtrain-venv/bin/python"
SHORT = " train.steps=2 data.val_every=2 data.val_batches=1"


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def commands(readme):
    text = open(readme, encoding="utf-8").read()
    m = re.search(r"^## Your own data\n(.*?)^## ", text, re.S | re.M)
    if not m:
        fail("README.md has no section '## Your own data'")
    cmds = []
    for block in re.findall(r"```sh\n(.*?)```", m.group(1), re.S):
        for cmd in re.sub(r"\\\n\s*", " ", block).splitlines():
            cmd = re.sub(r"\s{2,}#\s.*$", "", cmd).strip()  # a trailing comment
            if cmd:
                cmds.append(cmd)
    return cmds


def main():
    src, build, python, work = (os.path.abspath(a) for a in sys.argv[1:5])
    cmds = commands(os.path.join(src, "README.md"))
    joined = "\n".join(cmds)
    for want in ("tools/tiny_hf_checkpoint.py", "--format chat", ":0.8", "model.init=", "launch/local.sh"):
        if want not in joined:
            fail("the data section's commands lack %r:\n%s" % (want, joined))
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.join(work, "data"))
    os.symlink(build, os.path.join(work, "build"))
    for d in ("tools", "configs", "launch"):
        os.symlink(os.path.join(src, d), os.path.join(work, d))
    env = dict(os.environ, GTRAIN_BIN=os.path.join(build, "gtrain"), OMP_NUM_THREADS="1")
    outs = []
    for cmd in cmds:
        run = cmd.replace(VENV_PYTHON, python)
        if run.startswith(("build/gtrain ", "launch/local.sh ")):
            run += SHORT
        print("+ " + run, flush=True)
        p = subprocess.run(["bash", "-c", run], cwd=work, env=env, capture_output=True, text=True, timeout=600)
        out = p.stdout + p.stderr
        if p.returncode != 0:
            fail("exit %d: %s\n%s" % (p.returncode, run, out[-4000:]))
        outs.append((run, out))
    trains = [(c, o) for c, o in outs if c.startswith(("build/gtrain ", "launch/local.sh "))]
    if len(trains) != 2:
        fail("expected two training commands (a blend, an instruction-tuning run), found %d" % len(trains))
    (_, blend), (_, sft) = trains
    for out, wants in ((blend, ("train data blend of 2 sources, realised mix", "step 2/2")),
                       (sft, ("model.init: ", "from runs/tiny-hf", "train data has loss masks", "step 2/2",
                              "val_loss"))):
        for w in wants:
            if w not in out:
                fail("the output lacks %r:\n%s" % (w, out[-3000:]))
    print("\n".join(l for _, o in trains for l in o.splitlines() if "blend of" in l or l.startswith("step 2")))
    print("readme data commands: %d commands ran" % len(cmds))


if __name__ == "__main__":
    main()
