#!/usr/bin/env python3
"""plot_metrics.py — a picture of a gtrain run from its metrics file (log.metrics, JSONL).

    python3 tools/plot_metrics.py runs/tiny/metrics.jsonl -o runs/tiny/loss.png

Top panel: training loss per optimizer step and validation loss (the lines with val_loss).
Bottom panel: throughput in tokens/s. A run that was stopped and resumed appends to the same file;
a step logged twice (steps redone after a hard kill) keeps its last line.

Needs matplotlib (Debian: apt-get install python3-matplotlib; pip: pip install matplotlib).
Exit codes: 0 written, 2 bad arguments, unreadable/empty metrics, or matplotlib missing.
"""
import argparse
import json
import math
import sys


def read_metrics(path):
    train, val = {}, {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                # the last line of a run killed mid-write may be cut off; anything else is an error
                print(f"plot_metrics: {path}:{number}: skipping a line that is not JSON ({e.msg})", file=sys.stderr)
                continue
            if not isinstance(rec, dict) or "step" not in rec:
                continue
            step = rec["step"]
            if rec.get("val_loss") is not None:
                val[step] = rec["val_loss"]
            elif rec.get("loss") is not None:
                train[step] = rec
    return train, val


def main():
    ap = argparse.ArgumentParser(description="Plot training/validation loss and tokens/s of a gtrain metrics file.")
    ap.add_argument("metrics", help="the JSONL file written by gtrain (log.metrics)")
    ap.add_argument("-o", "--output", help="PNG (or .svg/.pdf) to write (default: METRICS with .png)")
    ap.add_argument("--title", help="figure title (default: the metrics path)")
    args = ap.parse_args()

    try:
        train, val = read_metrics(args.metrics)
    except OSError as e:
        print(f"plot_metrics: {args.metrics}: {e.strerror}", file=sys.stderr)
        return 2
    if not train and not val:
        print(f"plot_metrics: {args.metrics}: no metrics lines (step, loss / val_loss) in it", file=sys.stderr)
        return 2

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_metrics: matplotlib is not installed for " + sys.executable +
              " (Debian: apt-get install python3-matplotlib, then run it with /usr/bin/python3; "
              "or: pip install matplotlib)", file=sys.stderr)
        return 2

    out = args.output or (args.metrics[:-6] if args.metrics.endswith(".jsonl") else args.metrics) + ".png"
    steps = sorted(train)
    loss = [train[s]["loss"] for s in steps]
    tps = [train[s].get("tok_per_s") for s in steps]
    vsteps = sorted(val)

    fig, (ax_loss, ax_tps) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True,
                                          gridspec_kw={"height_ratios": [3, 1.3]})
    ax_loss.plot(steps, loss, color="tab:blue", linewidth=1.2, label="train loss")
    if vsteps:
        ax_loss.plot(vsteps, [val[s] for s in vsteps], "o-", color="tab:orange", markersize=4,
                     linewidth=1.5, label="validation loss")
    ax_loss.set_ylabel("loss (nats / token)")
    ax_loss.grid(True, alpha=0.3)
    ax_loss.legend(loc="upper right")
    last = f"step {steps[-1]}: loss {loss[-1]:.4f}" if steps else ""
    if vsteps:
        last += f", val_loss {val[vsteps[-1]]:.4f}"
    ax_loss.set_title((args.title or args.metrics) + (f"\n{last}" if last else ""), fontsize=10)

    pts = [(s, t) for s, t in zip(steps, tps) if t is not None and math.isfinite(t)]
    if pts:
        ax_tps.plot([p[0] for p in pts], [p[1] for p in pts], color="tab:green", linewidth=1)
        ax_tps.set_ylim(bottom=0)
    ax_tps.set_ylabel("tokens / s")
    ax_tps.set_xlabel("optimizer step")
    ax_tps.grid(True, alpha=0.3)

    fig.tight_layout()
    try:
        fig.savefig(out, dpi=110)
    except OSError as e:
        print(f"plot_metrics: cannot write {out}: {e.strerror}", file=sys.stderr)
        return 2
    print(f"plot_metrics: wrote {out} ({len(steps)} steps, {len(vsteps)} validation points)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
