#!/usr/bin/env python3
"""kiln against PyTorch eager on the seed lab's model, row by row, in one run: for each precision
(fp32, TF32, fp16, bf16), without and with per-block checkpointing, and bf16 with 3 micro-batches
accumulated, `kiln bench train --model encoder-classifier` and then bench/peers/pytorch_seed_lab.py
on the same shape, precision, recomputation and batch, back to back, and one table: samples/s of
each, their ratio, each side's peak memory, and a verdict against the speed issue's bar (kiln at
least 1.5x PyTorch's samples/s, with a lower peak).

What each side reports (both on random ids, every position real, label = ids[1] mod labels, hidden
and attention dropout 0.1, AdamW at kiln's defaults, clipping 1.0):
  kiln     the median iteration of `kiln bench train --json` after its warm-up (samples/s = global
           batch / median), peak_memory_gib: the peak of kiln's own device buffers (parameters,
           gradients, optimizer state, activations, workspaces), device_used_gib: what the driver
           reported in use after the run (CUDA context included);
  PyTorch  the same median, peak_memory_gib: torch.cuda.max_memory_allocated() (its reserved peak
           beside it in the JSON).
The memory verdict compares the two peak_memory_gib. Each run's losses must be those of a
classifier at initialisation on unlearnable labels: ln(labels) -0.25/+1.5, finite.

`kiln bench train` checks its losses against a GPT's on random tokens (ln vocab) and exits 1 after
printing its JSON for this model; that one refusal is set aside here (the classifier's check above
replaces it) and the run counts. Any other failure marks the row failed, and the other rows still run.

    bench/seed_lab.py --kiln build/kiln [--device cuda] [--rows bf16,bf16+ckpt,...]
                      [--time-left SECONDS] [--out DIR] [--repeats N] [shape flags as kiln's]

--time-left: start no row whose two runs may not end within SECONDS of this script's start (each run
is given --reserve-kiln / --reserve-peer seconds), and stop any run at that time; skipped rows are
named. --peer-device differs from --device for a rehearsal (kiln on the CUDA emulator, PyTorch on
the CPU). --repeats N alternates kiln and PyTorch N times a row and reports each side's median.
Exit status 1 when a run failed (not when a row misses the bar).
"""
import argparse
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import time

PEERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers")
PEER = os.path.join(PEERS, "pytorch_seed_lab.py")
sys.path.insert(0, PEERS)
from seed_lab_shape import add_shape_arguments, shape_flags  # noqa: E402  (the peer's own list)
# name: (precision, per-block checkpointing, micro-batches accumulated)
ROWS = {
    "fp32": ("fp32", False, 1), "fp32+ckpt": ("fp32", True, 1),
    "tf32": ("tf32", False, 1), "tf32+ckpt": ("tf32", True, 1),
    "fp16": ("fp16", False, 1), "fp16+ckpt": ("fp16", True, 1),
    "bf16": ("bf16", False, 1), "bf16+ckpt": ("bf16", True, 1),
    "bf16+acc3": ("bf16", False, 3),
}
# The order rows run in: bf16 first (the lab's precision), fp32 (the slowest) last, so a deadline
# cuts those.
RUN_ORDER = ["bf16", "bf16+ckpt", "bf16+acc3", "fp16", "fp16+ckpt", "tf32", "tf32+ckpt", "fp32", "fp32+ckpt"]
BAR = 1.5
# kiln bench train's refusal of losses that are not a GPT's on random tokens (src/kiln/cli/bench.cpp)
GPT_LOSS_REFUSAL = "losses are not those of a GPT on uniformly random tokens"


def parse_arguments():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kiln", required=True, help="the kiln binary (build/kiln, build-pack/kiln, ...)")
    parser.add_argument("--python", default=sys.executable, help="the Python that runs the peer (needs torch)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="kiln's device")
    parser.add_argument("--peer-device", choices=["cuda", "cpu"], help="PyTorch's device (default: --device)")
    parser.add_argument("--rows", help="which rows, comma-separated: " + ", ".join(ROWS) +
                        " (default: all; on --device cpu all but TF32's, which kiln refuses on the CPU)")
    add_shape_arguments(parser)
    parser.add_argument("--warmup-iters", type=int, default=3)
    parser.add_argument("--timed-iters", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=1, help="kiln then PyTorch this many times a row")
    parser.add_argument("--threads", type=int, default=0,
                        help="CPU threads a side (OMP_NUM_THREADS for both, and the peer's --threads); 0: theirs")
    parser.add_argument("--kiln-switches", default="", help="more kiln bench train flags, as one string")
    parser.add_argument("--peer-switches", default="", help="more peer flags, as one string")
    parser.add_argument("--time-left", type=float, default=0, help="seconds this script may take; 0: no limit")
    parser.add_argument("--reserve-kiln", type=float, default=40, help="seconds a kiln run may take, for --time-left")
    parser.add_argument("--reserve-peer", type=float, default=40, help="seconds a peer run may take, for --time-left")
    parser.add_argument("--out", default="", help="folder for seedlab.jsonl (every run) and failed runs' stderr")
    args = parser.parse_args()
    args.peer_device = args.peer_device or args.device
    if args.rows is None:
        args.rows = ",".join(row for row in ROWS if args.device == "cuda" or ROWS[row][0] != "tf32")
    args.rows = [row for row in args.rows.split(",") if row]
    unknown = [row for row in args.rows if row not in ROWS]
    if unknown or not args.rows:
        sys.exit(f"seed_lab.py: unknown row(s) {', '.join(unknown) or '(none given)'}; rows are {', '.join(ROWS)}")
    if not os.access(args.kiln, os.X_OK):
        sys.exit(f"seed_lab.py: --kiln {args.kiln} is not an executable file")
    if args.repeats < 1 or args.timed_iters < 1 or args.warmup_iters < 0:
        sys.exit("seed_lab.py: --repeats and --timed-iters must be positive, --warmup-iters >= 0")
    return args


def run_flags(args, accumulation):
    return shape_flags(args) + ["--global-batch-size", args.micro_batch_size * accumulation,
                                "--warmup-iters", args.warmup_iters, "--timed-iters", args.timed_iters]


def kiln_command(args, row):
    precision, checkpointing, accumulation = ROWS[row]
    command = [args.kiln, "bench", "train", "--model", "encoder-classifier", "--device", args.device,
               "--skip-gemm-ceiling", "--json"] + run_flags(args, accumulation)
    # fp16: kiln's dynamic loss scale starts where GradScaler's does (2^16), not at Megatron's 2^32,
    # whose first steps overflow and are skipped (faster, and not training) on both sides.
    command += {"fp32": [], "tf32": ["--tf32"], "fp16": ["--fp16", "--initial-loss-scale", 65536],
                "bf16": ["--bf16"]}[precision]
    if checkpointing:
        command += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", 1]
    return [str(part) for part in command] + shlex.split(args.kiln_switches)


def peer_command(args, row):
    precision, checkpointing, accumulation = ROWS[row]
    command = [args.python, PEER, "--device", args.peer_device, "--precision", precision,
               "--recompute-granularity", "full" if checkpointing else "none"] + run_flags(args, accumulation)
    if args.threads:
        command += ["--threads", args.threads]
    return [str(part) for part in command] + shlex.split(args.peer_switches)


def losses_problem(losses, num_labels):
    """Why these losses cannot be the classifier's early steps on unlearnable labels; '' if they can."""
    low, high = math.log(num_labels) - 0.25, math.log(num_labels) + 1.5
    for i, loss in enumerate(losses or []):
        if not math.isfinite(loss) or not low <= loss <= high:
            return (f"iteration {i + 1}'s loss {loss:.4f} is outside [{low:.4f}, {high:.4f}]"
                    f" (ln {num_labels} -0.25/+1.5)")
    return "" if losses else "no losses reported"


class Runner:
    """Runs the commands under the --time-left deadline and records every outcome in seedlab.jsonl."""

    def __init__(self, args):
        self.args, self.started = args, time.monotonic()
        self.failures, self.skipped = [], []
        self.out = args.out
        if self.out:
            os.makedirs(self.out, exist_ok=True)
            open(os.path.join(self.out, "seedlab.jsonl"), "w").close()

    def left(self):
        return math.inf if self.args.time_left <= 0 else self.args.time_left - (time.monotonic() - self.started)

    def run(self, who, row, repeat, command, env=None):
        """The command's JSON object with what ran it ("who", "row", "wall_s"), or one saying it
        failed ("failed": why)."""
        fields = {"who": who, "row": row, "repeat": repeat}
        if self.left() < 1:  # the run before took the time there was
            self.skip(f"{row} {who}")
            return {"failed": "skipped at the deadline", **fields}
        print(f"seed_lab.py: {row} {who}: {shlex.join(command)}", file=sys.stderr, flush=True)
        started = time.monotonic()
        try:
            done = subprocess.run(command, capture_output=True, text=True, env=env,
                                  timeout=None if self.left() == math.inf else max(1.0, self.left()))
            stdout, stderr, status = done.stdout, done.stderr, done.returncode
        except OSError as error:  # not started: a missing or unexecutable file
            stdout, stderr, status = "", f"{command[0]}: {error.strerror}", -1
        except subprocess.TimeoutExpired as expired:  # killed at the deadline
            stderr = expired.stderr or ""
            stdout, stderr, status = "", stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr, None
        fields["wall_s"] = round(time.monotonic() - started, 1)
        objects = [line for line in stdout.splitlines() if line.startswith("{")]
        result = None
        if objects:
            try:
                result = json.loads(objects[-1])
            except json.JSONDecodeError:
                result = None
        why = ""
        if status is None:
            why = f"stopped at the deadline after {fields['wall_s']} s"
        elif result is None:
            why = f"exit status {status}, no JSON object printed"
        elif status != 0 and not (who == "kiln" and GPT_LOSS_REFUSAL in stderr):
            why = f"exit status {status}"
        if why:
            tail = "\n".join(stderr.strip().splitlines()[-5:])
            if self.out:
                with open(os.path.join(self.out, f"seedlab-{row}-{who}-{repeat}.stderr"), "w") as log:
                    log.write(stderr)
            print(f"FAILED: {row} {who}: {why}\n{tail}", file=sys.stderr, flush=True)
            self.failures.append(f"{row} {who}: {why}")
            result = {"failed": why}
        elif status != 0:
            result["gpt_loss_check_set_aside"] = True
        if "failed" not in result and "samples_per_second" not in result:  # kiln bench train reports the time
            result["samples_per_second"] = result["global_batch_size"] / (result["median_ms_per_iteration"] * 1e-3)
        result.update(fields)
        if "failed" not in result:
            result["loss_problem"] = losses_problem(result.get("losses"), self.args.num_labels)
        if self.out:
            with open(os.path.join(self.out, "seedlab.jsonl"), "a") as log:
                log.write(json.dumps(result) + "\n")
        return result

    def skip(self, row):
        self.skipped.append(row)
        print(f"SKIPPED (deadline: {max(0.0, self.left()):.0f} s left): {row}", file=sys.stderr, flush=True)


def summary(runs):
    """One side's row from its repeats: the median samples/s and the largest peak, or why there is none."""
    done = [r for r in runs if "failed" not in r]
    if not done:
        return {"failed": runs[0]["failed"] if runs else "not run"}
    peaks = [r["peak_memory_gib"] for r in done if r.get("peak_memory_gib") is not None]
    problems = [r["loss_problem"] for r in done if r["loss_problem"]]
    return {"samples_per_second": statistics.median(r["samples_per_second"] for r in done),
            "spread": (min(r["samples_per_second"] for r in done), max(r["samples_per_second"] for r in done)),
            "peak_memory_gib": max(peaks) if peaks else None, "runs": len(done),
            "last_loss": (done[-1].get("losses") or [math.nan])[-1], "loss_problem": problems[0] if problems else ""}


def verdict(kiln, peer):
    if "failed" in kiln or "failed" in peer:
        return "no verdict (a run failed)"
    if kiln["loss_problem"] or peer["loss_problem"]:
        return "no verdict (implausible losses: " + (kiln["loss_problem"] or peer["loss_problem"]) + ")"
    ratio = kiln["samples_per_second"] / peer["samples_per_second"]
    speed = f"{'meets' if ratio >= BAR else 'short of'} {BAR}x"
    if kiln["peak_memory_gib"] is None or peer["peak_memory_gib"] is None:
        return speed + ", memory n/a"
    below = kiln["peak_memory_gib"] < peer["peak_memory_gib"]
    return speed + (", less memory" if below else ", NOT less memory")


def print_table(args, results):
    def gib(value):
        return "n/a" if value is None else f"{value:.2f}"

    def speed(side):
        if "failed" in side:
            return "skipped" if side["failed"] == "skipped at the deadline" else "failed"
        low, high = side["spread"]
        spread = f" ({low:.1f}-{high:.1f})" if side["runs"] > 1 else ""
        return f"{side['samples_per_second']:.1f}{spread}"

    print(f"\nseed lab: encoder classifier, {args.num_layers} layers x {args.hidden_size}, {args.num_attention_heads} "
          f"heads, {args.num_intermediate_layers} intermediate layers, seq {args.seq_length}, vocab {args.vocab_size}, "
          f"micro-batch {args.micro_batch_size}; kiln on {args.device}, PyTorch eager on {args.peer_device}; median of "
          f"{args.timed_iters} iterations after {args.warmup_iters}"
          + (f", median of {args.repeats} runs a side (range)" if args.repeats > 1 else ""))
    spread_width = 24 if args.repeats > 1 else 10
    print(f"{'row':>10} | {'kiln samples/s':>{spread_width}} {'torch samples/s':>{spread_width}} {'ratio':>6} |"
          f" {'kiln GiB':>8} {'torch GiB':>9} | {'kiln loss':>9} {'torch loss':>10} |"
          f" verdict (bar: {BAR}x, less memory)")
    met = 0
    for row in args.rows:
        if row not in results:
            print(f"{row:>10} | {'skipped':>{spread_width}}")
            continue
        kiln, peer = results[row]
        ratio = ("" if "failed" in kiln or "failed" in peer
                 else f"{kiln['samples_per_second'] / peer['samples_per_second']:.2f}")
        losses = [f"{side['last_loss']:.4f}" if "failed" not in side else "" for side in (kiln, peer)]
        said = verdict(kiln, peer)
        met += said == f"meets {BAR}x, less memory"
        print(f"{row:>10} | {speed(kiln):>{spread_width}} {speed(peer):>{spread_width}} {ratio:>6} |"
              f" {gib(kiln.get('peak_memory_gib')):>8} {gib(peer.get('peak_memory_gib')):>9} |"
              f" {losses[0]:>9} {losses[1]:>10} | {said}")
    print(f"{met} of {len(args.rows)} rows meet the bar (kiln GiB: its buffers' peak; torch GiB: max_memory_allocated;"
          " loss: the last iteration's)")


def main():
    args = parse_arguments()
    runner = Runner(args)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads)) if args.threads else None
    results = {}
    for row in [row for row in RUN_ORDER if row in args.rows]:
        if runner.left() < args.repeats * (args.reserve_kiln + args.reserve_peer):
            runner.skip(row)
            continue
        runs = {"kiln": [], "pytorch": []}
        for repeat in range(args.repeats):
            runs["kiln"].append(runner.run("kiln", row, repeat, kiln_command(args, row), env))
            runs["pytorch"].append(runner.run("pytorch", row, repeat, peer_command(args, row), env))
        results[row] = (summary(runs["kiln"]), summary(runs["pytorch"]))
    print_table(args, results)
    if runner.skipped:
        print(f"{len(runner.skipped)} skipped at the deadline: {', '.join(runner.skipped)}")
    if runner.failures:
        print(f"{len(runner.failures)} run(s) failed:\n  " + "\n  ".join(runner.failures), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
