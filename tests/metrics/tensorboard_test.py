"""log.tensorboard (src/core/tbevents.c): the event files a run writes, read by the `tensorboard`
package's own reader (the venv of tools/setup-venv.sh has it), against the run's own log.metrics.
Each scenario is one CTest test (tests/metrics.cmake):

  read_by_tensorboard  1 rank, 12 steps, validation every 4, a save every 6: TensorBoard's
                       EventAccumulator finds train/loss, lr, grad_norm, tokens_per_s, step_ms, the
                       memory peaks, val/loss and the saves' save/write_s, one value per step (or per
                       validation, per save) equal to the metrics file's as a float32; no train/mfu on
                       the CPU; its record reader reads every record (each CRC checked) and refuses a
                       copy with one flipped byte (so the CRCs it accepted are right); a resumed run
                       adds a second file, and the steps of both cover 1..16
  live                 the run is killed (SIGKILL) once its metrics file shows 2 steps: the event file
                       already holds every step but the last one the metrics file has (so they were
                       flushed as the run went, not at its end; a few steps' events fit in a stdio
                       buffer, so a kill later on would find most of them written out anyway: each
                       step is followed by a 0.3 s pause, GTRAIN_TEST_STEP_DELAY_MS, so that a test
                       slowed by a busy machine still kills the run within a step or two)
  ranks_and_errors     2 ranks: one event file (rank 0's); a log.tensorboard below a regular file is
                       exit 2 on both ranks with one line naming the key, before step 1
  mfu_with_peak        train.peak_tflops=0.5 on the CPU: every step line shows mfu, the metrics' mfu
                       times the step time times the peak is the same FLOP count at every step, the
                       console's percentage and train/mfu are the metrics' value; without the key the
                       CPU shows no mfu (null in the metrics)

Exit status: 0 pass, 1 fail (with the reason).
"""
import glob
import json
import math
import os
import shutil
import signal
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import testlib  # noqa: E402
from testlib import TINY_MODEL, check, fail, gtrain_lines, word_corpus  # noqa: E402

from tensorboard.backend.event_processing import event_accumulator  # noqa: E402
from tensorboard.compat.tensorflow_stub import errors as tb_errors  # noqa: E402
from tensorboard.compat.tensorflow_stub import pywrap_tensorflow  # noqa: E402

ARGS = None

CONFIG = TINY_MODEL + """[train]
seq_len = 32
micro_batch = 2
steps = {steps}
warmup_steps = 2
seed = 11
[data]
train = {prefix}.train.bin
val = {prefix}.val.bin
val_every = 4
val_batches = 1
[checkpoint]
dir = {work}/ck
every = 6
keep = 0
[log]
every = 100
metrics = {work}/metrics.jsonl
tensorboard = {work}/tb
"""


def setup(work, steps):
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    words = ["tensor", "board", "event", "record", "scalar", "step", "loss", "the", "a", "of", "wall", "time"]
    prefix = word_corpus(ARGS.prep, work, 3, words, 100_000, val_fraction="0.1")
    config = os.path.join(work, "tiny.ini")
    with open(config, "w") as f:
        f.write(CONFIG.format(steps=steps, prefix=prefix, work=work))
    return config


def run(cmd, **kw):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(cmd, capture_output=True, text=True, env=env, **kw)


def metrics(work):
    steps, vals, saves = {}, {}, {}
    with open(os.path.join(work, "metrics.jsonl")) as f:
        for line in f:
            o = json.loads(line)
            if "loss" in o:
                steps[o["step"]] = o
            elif "val_loss" in o:
                vals[o["step"]] = o["val_loss"]
            elif "save_step" in o:
                saves[o["save_step"]] = o
    return steps, vals, saves


def scalars(tb_dir):
    ea = event_accumulator.EventAccumulator(tb_dir, size_guidance={event_accumulator.SCALARS: 0})
    ea.Reload()
    return {tag: {e.step: e.value for e in ea.Scalars(tag)} for tag in ea.Tags()["scalars"]}


def close(tb_value, logged, rel=1e-6):
    """A float32 scalar of the event file against the metrics file's decimal of the same double (the
    metrics file rounds to its own digits: save_write_s to milliseconds)."""
    f32 = struct.unpack("<f", struct.pack("<f", logged))[0]
    return math.isclose(tb_value, f32, rel_tol=rel, abs_tol=1e-3 if rel > 1e-6 else 0.0)


def records(path):
    """Every record of an event file through TensorBoard's TFRecord reader (it checks both CRCs)."""
    reader = pywrap_tensorflow.PyRecordReader_New(path)
    n = 0
    while True:
        try:
            reader.GetNext()
        except tb_errors.OutOfRangeError:
            return n
        n += 1


def read_by_tensorboard():
    work = ARGS.work
    config = setup(work, 12)
    out = run([ARGS.gtrain, config])
    check(out.returncode == 0, f"a 12-step run with log.tensorboard ends 0 (got {out.returncode}: {out.stderr[-400:]})")
    files = glob.glob(os.path.join(work, "tb", "*"))
    check(len(files) == 1 and "tfevents" in os.path.basename(files[0]),
          f"one event file named *tfevents* in log.tensorboard ({[os.path.basename(p) for p in files]})")
    steps, vals, saves = metrics(work)
    tb = scalars(os.path.join(work, "tb"))
    for tag, field in [("train/loss", "loss"), ("train/lr", "lr"), ("train/grad_norm", "grad_norm"),
                       ("train/tokens_per_s", "tok_per_s"), ("train/step_ms", "step_ms")]:
        got = tb.get(tag, {})
        check(sorted(got) == list(range(1, 13)), f"{tag}: one value at each step 1..12 (steps {sorted(got)})")
        bad = [s for s in got if not close(got[s], steps[s][field])]
        check(not bad, f"{tag} equals the metrics file's {field} to float32 precision at every step (differs at {bad})")
    gib = 1024.0 ** 3
    for tag, field in [("memory/act_peak_GiB", "act_peak_bytes"), ("memory/mem_peak_GiB", "mem_peak_bytes")]:
        got = tb.get(tag, {})
        bad = [s for s in range(1, 13) if s not in got or not close(got[s], steps[s][field] / gib)]
        check(not bad, f"{tag} is the metrics file's {field} in GiB at every step (differs at {bad})")
    check("train/mfu" not in tb and "memory/reserved_GiB" not in tb,
          "no train/mfu and no memory/reserved_GiB on the CPU (null in the metrics file)")
    check(sorted(vals) == [4, 8, 12] and sorted(tb.get("val/loss", {})) == [4, 8, 12] and
          all(close(tb["val/loss"][s], v) for s, v in vals.items()),
          f"val/loss at steps 4, 8, 12 equal to the metrics file's val_loss ({tb.get('val/loss')})")
    check(sorted(saves) == [6, 12] and sorted(tb.get("save/write_s", {})) == [6, 12] and
          all(close(tb["save/write_s"][s], o["save_write_s"], 2e-3) for s, o in saves.items()),
          f"save/write_s at the saves of steps 6 and 12, as the metrics file's records ({tb.get('save/write_s')})")
    n = records(files[0])
    per_step = sum(len(v) for v in tb.values())
    check(n == 1 + per_step, f"TensorBoard's record reader reads all {n} records, each CRC checked "
          f"(the file version and {per_step} scalars)")
    data = bytearray(open(files[0], "rb").read())
    data[len(data) // 2] ^= 0x10
    broken = os.path.join(work, "broken.tfevents")
    with open(broken, "wb") as f:
        f.write(data)
    try:
        records(broken)
        fail("TensorBoard's record reader accepted a file with one flipped byte: it does not check the CRCs")
    except tb_errors.DataLossError as e:
        check(True, f"a copy with one flipped byte is refused by the same reader ({str(e)[-40:]})")
    # a resumed run (to 16 steps): a second file, and the two together cover every step
    time.sleep(1.1)  # event files are named after the second they were opened in
    out = run([ARGS.gtrain, config, "train.steps=16"])
    check(out.returncode == 0, f"the resumed run to step 16 ends 0 ({out.stderr[-300:]})")
    files = glob.glob(os.path.join(work, "tb", "*tfevents*"))
    tb = scalars(os.path.join(work, "tb"))
    check(len(files) == 2 and sorted(tb["train/loss"]) == list(range(1, 17)),
          f"after the resume: 2 event files, train/loss at steps 1..16 ({len(files)} files, {sorted(tb['train/loss'])})")


def live():
    work = ARGS.work
    config = setup(work, 400)
    env = dict(os.environ, OMP_NUM_THREADS="1", GTRAIN_TEST_HOOKS="1", GTRAIN_TEST_STEP_DELAY_MS="300")
    p = subprocess.Popen([ARGS.gtrain, config, "checkpoint.dir=", "data.val_every=0"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, env=env)
    path = os.path.join(work, "metrics.jsonl")
    deadline = time.monotonic() + 240
    n = 0
    while n < 2:
        if p.poll() is not None:
            fail(f"the run ended ({p.returncode}) before its second step: {p.stderr.read()[-300:]}")
        if time.monotonic() > deadline:
            p.kill()
            fail("no 2 steps in the metrics file within 240 s")
        time.sleep(0.05)
        n = sum(1 for line in open(path) if '"loss"' in line) if os.path.exists(path) else 0
    p.send_signal(signal.SIGKILL)
    p.wait()
    logged = sorted(metrics(work)[0])
    tb = scalars(os.path.join(work, "tb"))
    have = sorted(tb.get("train/loss", {}))
    check(logged[-1] >= 2 and set(logged[:-1]) <= set(have),
          f"killed with {len(logged)} steps in the metrics file: the event file holds steps {have}, every one "
          f"but perhaps the last (flushed each step)")


def ranks_and_errors():
    work = ARGS.work
    config = setup(work, 6)
    mpi = [ARGS.mpiexec] + ARGS.mpi_flags.split() + [ARGS.np_flag, "2"]
    out = run(mpi + [ARGS.gtrain, config], timeout=240)
    check(out.returncode == 0, f"2 ranks with log.tensorboard end 0 ({out.stderr[-300:]})")
    files = glob.glob(os.path.join(work, "tb", "*"))
    check(len(files) == 1, f"one event file for 2 ranks, rank 0's ({[os.path.basename(p) for p in files]})")
    check(sorted(scalars(os.path.join(work, "tb"))["train/loss"]) == list(range(1, 7)), "its train/loss covers steps 1..6")
    blocker = os.path.join(work, "a-file")
    open(blocker, "w").close()
    out = run(mpi + [ARGS.gtrain, config, f"log.tensorboard={blocker}/tb", "checkpoint.dir="], timeout=240)
    lines = [line for line in gtrain_lines(out.stderr) if "tensorboard" in line]
    check(out.returncode == 2, f"log.tensorboard below a regular file: exit 2 on 2 ranks (got {out.returncode})")
    check(len(lines) == 1 and "log.tensorboard" in lines[0] and "a-file/tb" in lines[0] and "Not a directory" in lines[0],
          f"one line naming log.tensorboard, the path and the reason ({lines})")
    check("step 1" not in out.stdout, "before step 1")


def mfu_with_peak():
    work = ARGS.work
    config = setup(work, 6)
    out = run([ARGS.gtrain, config, "checkpoint.dir=", "log.every=1", "train.peak_tflops=0.5"])
    check(out.returncode == 0, f"a run with train.peak_tflops=0.5 on the CPU ends 0 ({out.stderr[-300:]})")
    steps = metrics(work)[0]
    lines = [line for line in out.stdout.splitlines() if line.startswith("step ") and "tok/s" in line]
    check(len(lines) == 6 and all(" | mfu " in line for line in lines), f"every step line shows mfu ({lines[:2]})")
    # mfu x step time x peak is the step's model FLOPs: the same at every step
    flops = [steps[s]["mfu"] * steps[s]["step_ms"] / 1e3 * 0.5e12 for s in sorted(steps)]
    check(all(math.isclose(f, flops[0], rel_tol=1e-3) for f in flops) and flops[0] > 0,
          f"the metrics' mfu is the step's model FLOPs over its time over 0.5 TFLOP/s ({flops[0]:.4g} FLOPs each step)")
    shown = [float(line.split(" | mfu ")[1].split("%")[0]) for line in lines]
    check(all(abs(m - 100 * steps[i + 1]["mfu"]) < 0.051 for i, m in enumerate(shown)),
          f"the console's mfu is the metrics' in percent ({shown})")
    tb = scalars(os.path.join(work, "tb"))
    check(all(close(tb["train/mfu"][s], steps[s]["mfu"]) for s in steps), "train/mfu in the events equals it")
    out = run([ARGS.gtrain, config, "checkpoint.dir=", "log.every=1"])
    lines = [line for line in out.stdout.splitlines() if line.startswith("step ") and "tok/s" in line]
    check(out.returncode == 0 and lines and not any("mfu" in line for line in lines) and
          all(o["mfu"] is None for o in metrics(work)[0].values()),
          "without train.peak_tflops the CPU shows no mfu, and the metrics' mfu is null")


SCENARIOS = {"read_by_tensorboard": read_by_tensorboard, "live": live, "ranks_and_errors": ranks_and_errors,
             "mfu_with_peak": mfu_with_peak}

if __name__ == "__main__":
    ARGS = testlib.scenario_args(SCENARIOS)
    SCENARIOS[ARGS.scenario]()
    print(f"PASS: {ARGS.scenario}, {testlib.CHECKS} checks")
