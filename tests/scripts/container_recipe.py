#!/usr/bin/env python3
"""tools/container/gtrain.def, the Apptainer recipe, as far as a machine without Apptainer can check it.

    python3 tests/scripts/container_recipe.py SOURCE_DIR WORK_DIR

- the header names a base image (Bootstrap: docker, From: ...), and it has %post and %runscript;
- every %files source exists in the repository;
- %post installs every build package of tools/setup-debian.sh (the names are the same on Ubuntu),
  leaving out only those the tests and the quickstart need;
- %post, %environment, %runscript and %test are valid shell (`bash -n`; shellcheck when installed),
  with the build argument substituted;
- %runscript runs the program the build makes;
- where nvcc is installed, %post's CMake configure line, run here against this checkout with the
  recipe's flags (CUDA on, the default architecture), configures. The image itself (the base image's
  download, apt-get, the CUDA build inside it) is not built here.
"""
import os
import re
import shlex
import shutil
import subprocess
import sys

TEST_ONLY = {"fortunes", "python3-venv", "python3-matplotlib", "shellcheck", "strace"}


def fail(msg):
    print(f"FAILED: {msg}")
    sys.exit(1)


def sections(text):
    head, parts, name = [], {}, None
    for line in text.splitlines():
        m = re.match(r"%(\w+)\s*$", line)
        if m:
            name = m.group(1)
            parts[name] = []
        elif name is None:
            if line.strip() and not line.startswith("#"):
                head.append(line)
        else:
            parts[name].append(line)
    return head, {k: "\n".join(v) + "\n" for k, v in parts.items()}


def main():
    src, work = sys.argv[1], sys.argv[2]
    text = open(os.path.join(src, "tools/container/gtrain.def")).read()
    head, parts = sections(text)
    keys = dict(line.split(":", 1) for line in head)
    keys = {k.strip(): v.strip() for k, v in keys.items()}
    if keys.get("Bootstrap") != "docker" or not keys.get("From"):
        fail(f"the header needs Bootstrap: docker and From: (got {keys})")
    for need in ("post", "runscript", "files", "arguments"):
        if need not in parts:
            fail(f"no %{need} section")
    print(f"ok: base image {keys['From']}; sections {', '.join(sorted(parts))}")
    for line in parts["files"].split("\n"):
        if line.strip():
            source = line.split()[0]
            if not os.path.exists(os.path.join(src, source)):
                fail(f"%files names {source}, which is not in the repository")
    print("ok: every %files source exists")
    arch = re.search(r"CUDA_ARCH=(\S+)", parts["arguments"])
    if not arch:
        fail("%arguments sets no CUDA_ARCH")
    setup = open(os.path.join(src, "tools/setup-debian.sh")).read()
    wanted = set()
    for m in re.finditer(r"packages(?:\+)?=\(([^)]*)\)", setup.split('if [[ "${1:-}" == "--slurm" ]]')[0]):
        wanted |= set(m.group(1).split())
    wanted -= TEST_ONLY
    post_words = set(parts["post"].replace("\\\n", " ").split())
    missing = sorted(wanted - post_words)
    if missing:
        fail(f"%post does not install {missing}, which tools/setup-debian.sh installs for the build")
    print(f"ok: %post installs the {len(wanted)} build packages of tools/setup-debian.sh")
    os.makedirs(work, exist_ok=True)
    for name in ("post", "environment", "runscript", "test"):
        if name not in parts:
            continue
        body = parts[name].replace("{{ CUDA_ARCH }}", arch.group(1))
        path = os.path.join(work, f"{name}.sh")
        with open(path, "w") as f:
            f.write("#!/bin/sh\n" + body)
        r = subprocess.run(["bash", "-n", path], capture_output=True, text=True)
        if r.returncode:
            fail(f"%{name} is not valid shell: {r.stderr.strip()}")
        if shutil.which("shellcheck"):
            r = subprocess.run(["shellcheck", "-s", "sh", "-S", "warning", path], capture_output=True, text=True)
            if r.returncode:
                fail(f"shellcheck of %{name}:\n{r.stdout}")
    print("ok: %post, %environment, %runscript and %test are valid shell" +
          (" (bash -n, shellcheck)" if shutil.which("shellcheck") else " (bash -n)"))
    if "/opt/gtrain/build/gtrain" not in parts["runscript"]:
        fail("%runscript does not run /opt/gtrain/build/gtrain")
    post = parts["post"].replace("\\\n", " ").replace("{{ CUDA_ARCH }}", arch.group(1))
    configure = [line.strip() for line in post.split("\n") if line.strip().startswith("cmake -S")]
    if len(configure) != 1 or "-DGTRAIN_CUDA=ON" not in configure[0]:
        fail(f"%post has no one `cmake -S ... -DGTRAIN_CUDA=ON` configure line ({configure})")
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
    if not nvcc:
        print("ok: not configured here (no nvcc): the recipe's configure line is untried on this machine")
        return
    args = shlex.split(configure[0])
    build = os.path.join(work, "build")
    shutil.rmtree(build, ignore_errors=True)
    args[args.index("-B") + 1] = build
    args[args.index("-S") + 1] = src
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(nvcc) + os.pathsep + env.get("PATH", "")
    r = subprocess.run(args, capture_output=True, text=True, env=env)
    if r.returncode:
        fail(f"the recipe's configure line fails here: {' '.join(args)}\n{r.stdout[-1500:]}{r.stderr[-1500:]}")
    print(f"ok: its configure line ({' '.join(args[3:])}) configures this checkout with CUDA here")
    shutil.rmtree(build, ignore_errors=True)


if __name__ == "__main__":
    main()
