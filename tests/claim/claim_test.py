#!/usr/bin/env python3
"""One run per checkpoint.dir (src/core/runclaim.c): the real `gtrain` binary on a tiny model, two runs
pointed at one directory. Each scenario is one CTest test (tests/claim.cmake):

  second_run_refused   a run started 3 s after another on the same directory exits 2 before step 1,
                       one line naming the first's pid and host; the first ends 0 with all its state
                       files its own; its claim is gone after it (also after exit 75 and a failure
                       exit 2), and resuming the same run is allowed; gtrain --plan does not claim;
                       of two runs started at the same moment exactly one trains
  stale_taken_over     after kill -9 of a run its claim is taken over by the next run with one line;
                       so is a claim of a pid that now is another process (start time) or from before
                       a reboot (boot id); a live process of this host is refused
  other_host           a claim of a live pid written by hand with another host name: refused, the line
                       names the host and checkpoint.takeover; with checkpoint.takeover=true taken over;
                       an unreadable claim file likewise
  slurm_restart        a claim of Slurm job 4242 on another host: the same job with a higher
                       SLURM_RESTART_COUNT takes it over; the same restart count is refused; another
                       job takes it over only when squeue (a fake one here) says 4242 has ended
  slurm_steps          two steps of one Slurm job on one host (a sweep of two srun steps): the later
                       step is refused while the earlier one trains, which ends 0 with its files; on
                       another host a later step takes over only once squeue says the earlier step
                       has ended (not when it lists it, nor when squeue cannot answer)
  slurm_clusters       the claim records SLURM_CLUSTER_NAME; a claim of job 4242 of cluster alpha,
                       judged by a job of cluster beta: squeue is asked with -M alpha, and this
                       cluster's "Invalid job id" (or its own job 4242 that ended) is not taken for
                       the end of alpha's job; a claim that names no cluster, judged by a job that
                       has one, is not taken over on squeue's word
  multi_rank           2 ranks: one claim (rank 0's pid), one refusal line for a second 2-rank run

Exit status: 0 pass, 1 fail (with the reason).
"""
import os
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import testlib  # noqa: E402
from testlib import TINY_MODEL, check, fail, gtrain_lines, trained_steps, word_corpus  # noqa: E402,F401

ARGS = None
CLAIM = ".gtrain-claim"
HOST = os.uname().nodename

CONFIG = TINY_MODEL + """[train]
seq_len = 32
micro_batch = 2
steps = 8
warmup_steps = 2
seed = 7
[data]
train = {data}
val =
val_every = 0
[checkpoint]
every = 2
keep = 0
"""


def setup(work):
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    words = ["claim", "owner", "host", "pid", "run", "dir", "the", "a", "of", "stale", "token", "link"]
    prefix = word_corpus(ARGS.prep, work, 5, words, 200_000, words_per_line=(10, 10))
    config = os.path.join(work, "tiny.ini")
    with open(config, "w") as f:
        f.write(CONFIG.format(data=prefix + ".train.bin"))
    return config


def command(config, ck, np_, overrides):
    args = [ARGS.gtrain, config, f"checkpoint.dir={ck}"] + list(overrides)
    return args if np_ == 1 else [ARGS.mpiexec, ARGS.np_flag, str(np_)] + ARGS.mpi_flags.split() + args


def environ(extra=None, delay_ms=0):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["OMP_NUM_THREADS"] = "1"
    env["OMPI_MCA_rmaps_base_oversubscribe"] = "1"
    if delay_ms:  # a pause after every step (src/core/runstate_loop.c), so the run is still there later
        env["GTRAIN_TEST_HOOKS"] = "1"
        env["GTRAIN_TEST_STEP_DELAY_MS"] = str(delay_ms)
    env.update(extra or {})
    return env


def run(config, ck, *overrides, np_=1, env=None):
    p = subprocess.run(command(config, ck, np_, overrides), env=environ(env), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=240)
    return p.returncode, p.stdout, p.stderr


def start(config, ck, *overrides, np_=1, delay_ms=500):
    return subprocess.Popen(command(config, ck, np_, overrides), env=environ(delay_ms=delay_ms),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def wait_for(cond, what, proc, timeout=120):
    """Waits for cond() while the run proc is still there (a run that ended early fails at once)."""
    t0 = time.time()
    while not cond():
        if proc.poll() is not None:
            out, err = proc.communicate()
            fail(f"the run ended (exit {proc.returncode}) before {what}:\n{out}{err}")
        if time.time() - t0 > timeout:
            fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def read_claim(ck):
    out = {}
    try:
        with open(os.path.join(ck, CLAIM)) as f:
            for line in f:
                if " = " in line:
                    k, v = line.rstrip("\n").split(" = ", 1)
                    out[k] = v
    except FileNotFoundError:
        return None
    return out


def write_claim(ck, **fields):
    os.makedirs(ck, exist_ok=True)
    rec = {"host": HOST, "pid": os.getpid(), "pid_start": 0, "boot_id": "", "slurm_job": "", "slurm_restart": 0,
           "since": "2026-01-01T00:00:00Z", "token": "0123456789abcdef0123456789abcdef", "config": "by-hand.ini"}
    rec.update(fields)
    with open(os.path.join(ck, CLAIM), "w") as f:
        f.write("gtrain run claim\n" + "".join(f"{k} = {v}\n" for k, v in rec.items()))


def my_start_ticks():
    with open("/proc/self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def boot_id():
    with open("/proc/sys/kernel/random/boot_id") as f:
        return f.read().strip()


def takeover_lines(out):
    return [line for line in gtrain_lines(out) if "this run takes it over" in line]


def state_files(ck):
    return sorted(f for f in os.listdir(ck) if f.startswith("step_") and f.endswith(".h5")) if os.path.isdir(ck) else []


def claim_files(ck):
    return sorted(f for f in os.listdir(ck) if f.startswith(CLAIM))


# ------------------------------------------------------------------------------------------ scenarios

def second_run_refused(config, work):
    ck = os.path.join(work, "dup")
    # 1.5 s after each step: the first run is still training through the second run and the --plan below
    first = start(config, ck, "train.steps=12", delay_ms=1500)
    wait_for(lambda: read_claim(ck) is not None, "the first run's claim", first)
    claim = read_claim(ck)
    check(claim["pid"] == str(first.pid) and claim["host"] == HOST and len(claim["token"]) == 32,
          f"the claim names the first run: pid {claim['pid']} on {claim['host']}")
    time.sleep(3)
    check(first.poll() is None, "the first run is still training 3 s later")
    rc, out, err = run(config, ck, "train.steps=12", "train.seed=8")
    lines = gtrain_lines(err)
    refusals = [line for line in lines if "is in use by another run" in line]
    print("   ", refusals[0] if refusals else err)
    check(rc == 2, f"the second run exits 2 (got {rc})")
    check(len(refusals) == 1 and f"pid {first.pid} on host {HOST}" in refusals[0]
          and refusals[0].startswith(f"gtrain: command line: checkpoint.dir={ck}: '{ck}' is in use"),
          "one line names checkpoint.dir and the first run's pid and host")
    check(not trained_steps(out), "the second run trained no step")
    plan = subprocess.run([ARGS.gtrain, "--plan", config, f"checkpoint.dir={ck}"], env=environ(),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    check(first.poll() is None, "the first run is still training after gtrain --plan")
    claim = read_claim(ck)
    check(plan.returncode == 0 and claim is not None and claim["pid"] == str(first.pid),
          "gtrain --plan on the directory in use neither refuses nor claims")
    out1, _ = first.communicate(timeout=240)
    check(first.returncode == 0 and len(trained_steps(out1)) == 12, f"the first run ends 0 ({first.returncode})")
    check(state_files(ck) == [f"step_{s:08d}.h5" for s in (2, 4, 6, 8, 10, 12)], "all its state files are there")
    check(claim_files(ck) == [] and not os.path.exists(os.path.join(ck, ".watchdog")),
          "its claim (and the watchdog's directory) is gone after exit 0")
    rc, out, err = run(config, ck, "train.steps=14")
    check(rc == 0 and "resumed from" in out and not takeover_lines(out) and len(trained_steps(out)) == 2,
          f"resuming the same run after it ended is allowed, with no takeover line (exit {rc})")
    check(claim_files(ck) == [], "and leaves no claim")
    # started at the same moment, three times: exactly one of the two trains
    for i in range(3):
        both = [start(config, os.path.join(work, f"race{i}"), "train.steps=3", delay_ms=300) for _ in range(2)]
        codes = sorted(p.wait(timeout=240) for p in both)
        for p in both:
            p.communicate()
        check(codes == [0, 2] and claim_files(os.path.join(work, f"race{i}")) == [],
              f"two runs started together: one ends 0, the other is refused with 2 ({codes})")
    # a stop (75) releases the claim too
    p = start(config, ck, "train.steps=40")
    wait_for(lambda: len(state_files(ck)) >= 8, "a save of the stopped run", p)
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=120)
    check(p.returncode == 75 and claim_files(ck) == [], f"exit 75 after SIGTERM leaves no claim ({p.returncode})")
    # so does a failure exit it controls (2: a bad data file, after the claim was taken)
    rc, _, _ = run(config, ck, "train.steps=44", f"data.train={work}/missing.bin")
    check(rc == 2 and claim_files(ck) == [], f"exit 2 on bad data leaves no claim ({rc})")


def stale_taken_over(config, work):
    ck = os.path.join(work, "killed")
    p = start(config, ck, "train.steps=40")
    wait_for(lambda: len(state_files(ck)) >= 1, "the first save", p)
    os.killpg(p.pid, signal.SIGKILL)
    p.communicate()
    check(read_claim(ck)["pid"] == str(p.pid), "kill -9 leaves the claim behind")
    rc, out, err = run(config, ck, "train.steps=10")
    lines = takeover_lines(out)
    print("   ", lines[0] if lines else out + err)
    check(rc == 0 and len(lines) == 1 and f"pid {p.pid} on host {HOST}" in lines[0]
          and f"pid {p.pid} no longer exists" in lines[0], "the next run takes it over with one line and ends 0")
    check(claim_files(ck) == [], "and releases it at its end")

    # a pid that exists, but is another process than the claim's (its start time differs)
    write_claim(ck, pid=os.getpid(), pid_start=my_start_ticks() + 1, boot_id=boot_id())
    rc, out, _ = run(config, ck, "train.steps=12")
    lines = takeover_lines(out)
    check(rc == 0 and len(lines) == 1 and f"pid {os.getpid()} is now another process" in lines[0],
          "a reused pid (another start time) is taken over")
    write_claim(ck, pid=os.getpid(), pid_start=my_start_ticks(), boot_id="00000000-0000-0000-0000-000000000000")
    rc, out, _ = run(config, ck, "train.steps=14")
    lines = takeover_lines(out)
    check(rc == 0 and len(lines) == 1 and "rebooted" in lines[0], "a claim from before a reboot is taken over")

    # the same pid and start time: that process is alive on this host, refused even with takeover
    for extra in ([], ["checkpoint.takeover=true"]):
        write_claim(ck, pid=os.getpid(), pid_start=my_start_ticks(), boot_id=boot_id())
        rc, out, err = run(config, ck, "train.steps=16", *extra)
        lines = [line for line in gtrain_lines(err) if "is in use by another run" in line]
        check(rc == 2 and len(lines) == 1 and f"pid {os.getpid()} on host {HOST}" in lines[0]
              and f"kill -TERM {os.getpid()}" in lines[0] and not trained_steps(out),
              f"a live process of this host holds it {extra}: exit 2, one line")
        check(read_claim(ck)["token"] == "0123456789abcdef0123456789abcdef", "its claim is left alone")


def other_host(config, work):
    ck = os.path.join(work, "other")
    write_claim(ck, host="other-node", pid=os.getpid())
    rc, out, err = run(config, ck, "train.steps=4")
    lines = [line for line in gtrain_lines(err) if "is in use by another run" in line]
    print("   ", lines[0] if lines else err)
    check(rc == 2 and len(lines) == 1 and f"pid {os.getpid()} on host other-node" in lines[0]
          and "since 2026-01-01T00:00:00Z" in lines[0] and "checkpoint.takeover=true" in lines[0]
          and f"delete {ck}/{CLAIM}" in lines[0] and not trained_steps(out),
          "a claim from another host: exit 2, one line naming host, pid, since and how to take it over")
    check(read_claim(ck)["host"] == "other-node" and claim_files(ck) == [CLAIM], "the claim is left alone")
    rc, out, _ = run(config, ck, "train.steps=4", "checkpoint.takeover=true")
    lines = takeover_lines(out)
    print("   ", lines[0] if lines else out)
    check(rc == 0 and len(lines) == 1 and "other-node" in lines[0] and "checkpoint.takeover = true" in lines[0],
          "checkpoint.takeover=true takes it over with one line")
    check(claim_files(ck) == [], "and releases it at the end")
    # deleting the claim file, the other documented way
    write_claim(ck, host="other-node", pid=os.getpid())
    os.remove(os.path.join(ck, CLAIM))
    rc, out, _ = run(config, ck, "train.steps=6")
    check(rc == 0 and not takeover_lines(out), "with the claim file deleted the run starts, no takeover line")

    with open(os.path.join(ck, CLAIM), "w") as f:
        f.write("not a claim\n")
    rc, out, err = run(config, ck, "train.steps=8")
    lines = [line for line in gtrain_lines(err) if "does not read as gtrain's run claim" in line]
    check(rc == 2 and len(lines) == 1 and not trained_steps(out), "an unreadable claim file: exit 2, one line")
    rc, out, _ = run(config, ck, "train.steps=8", "checkpoint.takeover=true")
    check(rc == 0 and len(takeover_lines(out)) == 1, "and checkpoint.takeover=true takes it over")
    check(claim_files(ck) == [], "no claim file or temporary is left")


FAKE_SQUEUE = """#!/bin/sh
# squeue -h -j JOB -o %T as Slurm answers it, from the test's FAKE_SQUEUE_OUT and FAKE_SQUEUE_RC
echo "$*" >>"$FAKE_SQUEUE_LOG"
echo "$FAKE_SQUEUE_OUT"
exit "$FAKE_SQUEUE_RC"
"""


def slurm_restart(config, work):
    ck = os.path.join(work, "slurm")
    bin_dir = os.path.join(work, "bin")  # a squeue of the test's own, first on PATH
    os.makedirs(bin_dir)
    with open(os.path.join(bin_dir, "squeue"), "w") as f:
        f.write(FAKE_SQUEUE)
    os.chmod(os.path.join(bin_dir, "squeue"), 0o755)
    log = os.path.join(work, "squeue.log")
    slurm = {"PATH": bin_dir + os.pathsep + os.environ["PATH"], "FAKE_SQUEUE_LOG": log,
             "FAKE_SQUEUE_OUT": "RUNNING", "FAKE_SQUEUE_RC": "0"}
    # (job, restart count, step id, expected exit, why); later steps of the same job: slurm_steps
    cases = (("4242", "0", "3", 2, ""), ("999", "3", "3", 2, ""),
             ("4242", "1", "0", 0, "the same Slurm job 4242 restarted, restart 1 after 0"))
    for n, (job, restart, step, expect, why) in enumerate(cases):
        write_claim(ck, host="other-node", pid=os.getpid(), slurm_job="4242", slurm_restart=0, slurm_step=3)
        rc, out, err = run(config, ck, f"train.steps={2 + 2 * n}",
                           env=dict(slurm, SLURM_JOB_ID=job, SLURM_RESTART_COUNT=restart, SLURM_STEP_ID=step))
        what = f"SLURM_JOB_ID={job} SLURM_RESTART_COUNT={restart} SLURM_STEP_ID={step} on a claim of job 4242.3"
        if expect == 2:
            lines = [line for line in gtrain_lines(err) if "is in use by another run" in line]
            check(rc == 2 and len(lines) == 1 and "(Slurm job 4242, restart 0)" in lines[0], f"{what}: refused")
        else:
            lines = takeover_lines(out)
            print("   ", lines[0] if lines else out + err)
            check(rc == 0 and len(lines) == 1 and why in lines[0], f"{what}: taken over with one line")
    check(claim_files(ck) == [], "released at the end")
    rc, out, _ = run(config, ck, "train.steps=10", env=dict(slurm, SLURM_JOB_ID="4242", SLURM_RESTART_COUNT="2"))
    check(rc == 0 and not takeover_lines(out), "a restart after a clean end finds no claim")

    # another job of the cluster on another host: squeue says whether it still runs
    cases = (("RUNNING", "0", 2, ""), ("slurm_load_jobs error: Unable to contact slurm controller", "1", 2, ""),
             ("COMPLETED", "0", 0, "Slurm job 4242 has ended (squeue: COMPLETED)"),
             ("slurm_load_jobs error: Invalid job id specified", "1", 0,
              "Slurm job 4242 has ended (squeue: no such job any more)"))
    steps = 10
    for answer, code, expect, why in cases:
        steps += 2
        write_claim(ck, host="other-node", pid=os.getpid(), slurm_job="4242", slurm_restart=0)
        if os.path.exists(log):
            os.remove(log)
        rc, out, err = run(config, ck, f"train.steps={steps}", env=dict(slurm, SLURM_JOB_ID="5000",
                                                                        FAKE_SQUEUE_OUT=answer, FAKE_SQUEUE_RC=code))
        asked = open(log).read().split() if os.path.exists(log) else []
        check(asked == ["-h", "-j", "4242", "-o", "%T"], f"squeue was asked about job 4242 ({asked})")
        if expect == 2:
            lines = [line for line in gtrain_lines(err) if "is in use by another run" in line]
            check(rc == 2 and len(lines) == 1, f"squeue answers '{answer}': refused")
        else:
            lines = takeover_lines(out)
            check(rc == 0 and len(lines) == 1 and why in lines[0], f"squeue answers '{answer}': taken over")


def fake_squeue(work, script=FAKE_SQUEUE):
    """A squeue of the test's own, first on PATH; returns the environment that puts it there and its log."""
    bin_dir = os.path.join(work, "bin")
    os.makedirs(bin_dir, exist_ok=True)
    with open(os.path.join(bin_dir, "squeue"), "w") as f:
        f.write(script)
    os.chmod(os.path.join(bin_dir, "squeue"), 0o755)
    log = os.path.join(work, "squeue.log")
    return {"PATH": bin_dir + os.pathsep + os.environ["PATH"], "FAKE_SQUEUE_LOG": log}, log


def asked(log):
    """The argument lists squeue was called with since the log was last removed."""
    if not os.path.exists(log):
        return []
    with open(log) as f:
        lines = [line.split() for line in f]
    os.remove(log)
    return lines


def slurm_steps(config, work):
    # one host: step 1 of job 4242 while step 0 trains (the same allocation, the same directory)
    ck = os.path.join(work, "steps")
    slurm, log = fake_squeue(work)
    # were Slurm asked, it would say step 4242.0 is listed no more: a live process here outweighs that
    slurm.update(FAKE_SQUEUE_OUT="", FAKE_SQUEUE_RC="0")
    step0 = dict(slurm, SLURM_JOB_ID="4242", SLURM_STEP_ID="0", SLURM_CLUSTER_NAME="alpha")
    first = subprocess.Popen(command(config, ck, 1, ["train.steps=12"]), env=environ(step0, delay_ms=500),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    wait_for(lambda: read_claim(ck) is not None, "the first step's claim", first)
    claim = read_claim(ck)
    check(claim["slurm_job"] == "4242" and claim["slurm_step"] == "0" and claim.get("slurm_cluster") == "alpha",
          f"the claim names job 4242, step 0, cluster alpha ({claim})")
    wait_for(lambda: len(state_files(ck)) >= 1, "the first step's first save", first)
    asked(log)
    rc, out, err = run(config, ck, "train.steps=12", "train.seed=8", env=dict(step0, SLURM_STEP_ID="1"))
    check(asked(log) == [], "squeue is not asked about an owner on this host")
    lines = [line for line in gtrain_lines(err) if "is in use by another run" in line]
    print("   ", lines[0] if lines else (takeover_lines(out) or [out + err])[0])
    check(rc == 2 and len(lines) == 1 and f"pid {first.pid} on host {HOST}" in lines[0] and not trained_steps(out),
          f"step 1 of job 4242 on the host where step 0 trains: refused, exit 2 (got {rc})")
    check(first.poll() is None and read_claim(ck)["pid"] == str(first.pid), "step 0 still trains and holds its claim")
    out1, _ = first.communicate(timeout=240)
    check(first.returncode == 0 and len(trained_steps(out1)) == 12, f"step 0 ends 0 ({first.returncode})")
    check(state_files(ck) == [f"step_{s:08d}.h5" for s in (2, 4, 6, 8, 10, 12)] and claim_files(ck) == [],
          "with all its state files, and no claim left")

    # another host: a later step (launch/gtrain.sbatch's re-run after a lost node) takes over only
    # once Slurm no longer lists the earlier step among the job's running steps
    cases = (("4242.3", "0", 2, ""), ("squeue: error: Unable to contact slurm controller", "1", 2, ""),
             ("", "0", 0, "a later step of the same Slurm job 4242 (step 4 after 3), and Slurm lists step 4242.3 "
                          "no more"))
    steps = 12
    for answer, code, expect, why in cases:
        steps += 2
        write_claim(ck, host="other-node", pid=os.getpid(), slurm_job="4242", slurm_restart=0, slurm_step=3,
                    slurm_cluster="alpha")
        asked(log)
        rc, out, err = run(config, ck, f"train.steps={steps}",
                           env=dict(slurm, SLURM_JOB_ID="4242", SLURM_STEP_ID="4", SLURM_CLUSTER_NAME="alpha",
                                    FAKE_SQUEUE_OUT=answer, FAKE_SQUEUE_RC=code))
        what = f"step 4 of job 4242 on a claim of step 4242.3 on another host, squeue answers '{answer}' ({code})"
        check(asked(log) == [["-h", "-s4242.3", "-o", "%i"]], f"{what}: squeue was asked about step 4242.3")
        if expect == 2:
            lines = [line for line in gtrain_lines(err) if "is in use by another run" in line]
            check(rc == 2 and len(lines) == 1 and "other-node" in lines[0], f"{what}: refused")
        else:
            lines = takeover_lines(out)
            print("   ", lines[0] if lines else out + err)
            check(rc == 0 and len(lines) == 1 and why in lines[0], f"{what}: taken over with one line")


FAKE_SQUEUE_CLUSTERS = """#!/bin/sh
# squeue as two clusters answer it: -M alpha (--clusters=alpha) from FAKE_ALPHA_OUT/RC, with the
# "CLUSTER: alpha" line squeue prints first; anything else from FAKE_SQUEUE_OUT/RC (this cluster)
echo "$*" >>"$FAKE_SQUEUE_LOG"
case " $* " in
  *" -M alpha "* | *" --clusters=alpha "*)
    echo "CLUSTER: alpha"
    echo "$FAKE_ALPHA_OUT"
    exit "$FAKE_ALPHA_RC" ;;
esac
echo "$FAKE_SQUEUE_OUT"
exit "$FAKE_SQUEUE_RC"
"""


def slurm_clusters(config, work):
    ck = os.path.join(work, "clusters")
    slurm, log = fake_squeue(work, FAKE_SQUEUE_CLUSTERS)
    invalid = "slurm_load_jobs error: Invalid job id specified"
    # (claim's cluster, SLURM_JOB_ID, SLURM_RESTART_COUNT, this cluster's answer, alpha's answer and
    #  exit, the squeue calls expected, expected exit, why): this run is in cluster beta
    cases = (
        ("alpha", "5000", "0", invalid, "RUNNING", "0", [["-M", "alpha", "-h", "-j", "4242", "-o", "%T"]], 2, ""),
        ("alpha", "5000", "0", "COMPLETED", "RUNNING", "0", [["-M", "alpha", "-h", "-j", "4242", "-o", "%T"]], 2, ""),
        # the same job number, restarted, but of another cluster: another job
        ("alpha", "4242", "1", invalid, "RUNNING", "0", [["-M", "alpha", "-h", "-j", "4242", "-o", "%T"]], 2, ""),
        ("alpha", "5000", "0", invalid, "squeue: error: Problem talking to the database", "1",
         [["-M", "alpha", "-h", "-j", "4242", "-o", "%T"]], 2, ""),
        ("alpha", "5000", "0", "RUNNING", "COMPLETED", "0", [["-M", "alpha", "-h", "-j", "4242", "-o", "%T"]], 0,
         "Slurm job 4242 of cluster alpha has ended (squeue: COMPLETED)"),
        ("alpha", "5000", "0", "RUNNING", invalid, "1", [["-M", "alpha", "-h", "-j", "4242", "-o", "%T"]], 0,
         "Slurm job 4242 of cluster alpha has ended (squeue: no such job any more)"),
        # a claim that names no cluster (an older gtrain, or SLURM_CLUSTER_NAME unset there)
        ("", "5000", "0", invalid, "RUNNING", "0", [], 2, ""),
        # the same cluster: this cluster's own answer
        ("beta", "5000", "0", invalid, "RUNNING", "0", [["-h", "-j", "4242", "-o", "%T"]], 0,
         "Slurm job 4242 has ended (squeue: no such job any more)"),
    )
    steps = 0
    for cluster, job, restart, here, alpha, alpha_rc, calls, expect, why in cases:
        steps += 2
        write_claim(ck, host="other-node", pid=os.getpid(), slurm_job="4242", slurm_restart=0, slurm_step=0,
                    slurm_cluster=cluster)
        asked(log)
        env = dict(slurm, SLURM_JOB_ID=job, SLURM_RESTART_COUNT=restart, SLURM_STEP_ID="0", SLURM_CLUSTER_NAME="beta",
                   FAKE_SQUEUE_OUT=here, FAKE_SQUEUE_RC="1" if "error" in here else "0",
                   FAKE_ALPHA_OUT=alpha, FAKE_ALPHA_RC=alpha_rc)
        rc, out, err = run(config, ck, f"train.steps={steps}", env=env)
        what = (f"job {job} (restart {restart}) of cluster beta on a claim of job 4242 of cluster '{cluster}' "
                f"(beta says '{here}', alpha '{alpha}')")
        got = asked(log)
        check(got == calls, f"{what}: squeue asked {calls} (got {got})")
        if expect == 2:
            lines = [line for line in gtrain_lines(err) if "is in use by another run" in line]
            check(rc == 2 and len(lines) == 1 and not trained_steps(out), f"{what}: refused (exit {rc})")
            check(read_claim(ck)["token"] == "0123456789abcdef0123456789abcdef", "its claim is left alone")
        else:
            lines = takeover_lines(out)
            print("   ", lines[0] if lines else out + err)
            check(rc == 0 and len(lines) == 1 and why in lines[0], f"{what}: taken over with one line")


def multi_rank(config, work):
    ck = os.path.join(work, "ranks")
    first = start(config, ck, "train.steps=12", np_=2)
    wait_for(lambda: read_claim(ck) is not None, "the 2-rank run's claim", first)
    claim = read_claim(ck)
    wait_for(lambda: len(state_files(ck)) >= 1, "the first save", first)
    check(claim_files(ck) == [CLAIM], "one claim file, no temporaries")
    check(claim["pid"] != str(first.pid) and os.path.exists(f"/proc/{claim['pid']}"),
          "held by a rank's pid (not the launcher's)")
    rc, out, err = run(config, ck, "train.steps=12", np_=2)
    lines = [line for line in gtrain_lines(err) if "is in use by another run" in line]
    check(rc == 2 and len(lines) == 1 and f"pid {claim['pid']} on host {HOST}" in lines[0],
          f"a second 2-rank run: exit 2, one refusal line naming rank 0's pid (exit {rc})")
    check(not trained_steps(out), "it trained no step")
    out1, _ = first.communicate(timeout=240)
    check(first.returncode == 0 and claim_files(ck) == [], "the first ends 0 and leaves no claim")


SCENARIOS = {f.__name__: f for f in (second_run_refused, stale_taken_over, other_host, slurm_restart, slurm_steps,
                                      slurm_clusters, multi_rank)}


def main():
    global ARGS
    ARGS = testlib.scenario_args(SCENARIOS)
    t0 = time.time()
    print(f"scenario {ARGS.scenario}", flush=True)
    config = setup(ARGS.work)
    SCENARIOS[ARGS.scenario](config, ARGS.work)
    print(f"PASS: {ARGS.scenario}, {testlib.CHECKS} checks in {time.time() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
