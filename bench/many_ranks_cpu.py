#!/usr/bin/env python3
"""kiln's data parallelism on CPU ranks against PyTorch's, side by side in one run (PERF.md's CPU
bar): the demo's shape (4 layers, 128 wide, 4 heads, sequence 128, vocabulary 257, global batch
16, fp32, AdamW, clip 1.0) on random tokens, one thread a rank.

Rows, each run --repeats times back to back (runs on a 2-core machine vary by 20%); kiln's 2-rank
and 1-rank rows each run beside PyTorch's, in an order that alternates by repeat:
  kiln, 1 rank                      kiln train, accumulation 2
  kiln, 2 ranks, overlap on/off     kiln launch --nproc-per-node 2 -- kiln train ...
  kiln, 2 ranks, ZeRO-1             the same with --use-distributed-optimizer (buckets reduced to owners)
  PyTorch DDP, 2 ranks              kiln launch ... -- python3 bench/peers/pytorch_ddp_cpu.py
A kiln row's speed is the median of its iterations' tokens/s after --warmup-iters. Its reduce
waits come from the log line's range over the ranks (docs/many-ranks.md): the shortest wait, the
rank whose backward ended last, is the reduction the backward left unhidden; longest - shortest
is the ranks' skew (medians over the iterations). The share of the reduction the backward hides
= 1 - shortest(overlap on) / shortest(overlap off): with overlap off the whole reduction is
waited for after the backward.

  python3 bench/many_ranks_cpu.py --kiln build/kiln [--python /usr/bin/python3] [--repeats 2]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPE = ["--num-layers", "4", "--hidden-size", "128", "--num-attention-heads", "4", "--seq-length", "128"]
SPEED = re.compile(r"tokens per second: ([0-9.]+)")
WAIT = re.compile(r"grads reduce wait \(ms\): [0-9.]+ \(ranks ([0-9.]+)-([0-9.]+), longest rank \d+\)")


def run(command, env):
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        sys.exit(f"failed ({result.returncode}): {' '.join(command)}\n{result.stdout}\n{result.stderr}")
    return result.stdout + result.stderr


def kiln_row(args, ranks, overlap, env, zero=False):
    train = [args.kiln, "train", *SHAPE, "--vocab-size", "257", "--mock-data", "--micro-batch-size", "8",
             "--global-batch-size", "16", "--train-iters", str(args.warmup_iters + args.timed_iters),
             "--lr", "6e-4", "--eval-iters", "0", "--log-interval", "1", "--num-workers", "0",
             "--ddp-bucket-size", str(args.bucket_size)]
    if not overlap:
        train.append("--no-overlap-grad-reduce")
    if zero:
        train.append("--use-distributed-optimizer")
    command = train if ranks == 1 else [args.kiln, "launch", "--standalone", "--nproc-per-node", str(ranks),
                                        "--log-ranks", "0", "--", *train]
    speeds, shortest, skew = [], [], []
    for line in run(command, env).splitlines():
        if " iteration " not in line:
            continue
        speed, wait = SPEED.search(line), WAIT.search(line)
        if speed:
            speeds.append(float(speed.group(1)))
            low, high = (float(wait.group(1)), float(wait.group(2))) if wait else (0.0, 0.0)
            shortest.append(low)
            skew.append(high - low)
    timed = slice(args.warmup_iters, None)
    return statistics.median(speeds[timed]), statistics.median(shortest[timed]), statistics.median(skew[timed])


def pytorch_row(args, ranks, env):
    peer = [args.python, os.path.join(HERE, "peers", "pytorch_ddp_cpu.py"), *SHAPE, "--vocab-size", "257",
            "--micro-batch-size", "8", "--global-batch-size", "16", "--warmup-iters", str(args.warmup_iters),
            "--timed-iters", str(args.timed_iters)]
    command = peer if ranks == 1 else [args.kiln, "launch", "--standalone", "--nproc-per-node", str(ranks),
                                       "--log-ranks", "0", "--", *peer]
    output = run(command, env)
    document = json.loads(output[output.index("{"):output.rindex("}") + 1])
    return document["tokens_per_second"], document["peer"]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kiln", required=True)
    parser.add_argument("--python", default="/usr/bin/python3", help="a python3 with torch (Debian's python3-torch)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--warmup-iters", type=int, default=5)
    parser.add_argument("--timed-iters", type=int, default=40)
    parser.add_argument("--bucket-size", type=int, default=131072, help="kiln's --ddp-bucket-size (elements)")
    args = parser.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")

    rows = []
    for repeat in range(args.repeats):
        # Each kiln row right beside its PyTorch row, the pair's order alternating by repeat, so a
        # ratio compares runs seconds apart on a machine whose load drifts over minutes.
        kiln_first = repeat % 2 == 0
        if kiln_first:
            two, wait_on, skew_on = kiln_row(args, 2, True, env)
        torch_two, peer = pytorch_row(args, 2, env)
        if not kiln_first:
            two, wait_on, skew_on = kiln_row(args, 2, True, env)
        if kiln_first:
            one, _, _ = kiln_row(args, 1, True, env)
        torch_one, _ = pytorch_row(args, 1, env)
        if not kiln_first:
            one, _, _ = kiln_row(args, 1, True, env)
        two_off, wait_off, skew_off = kiln_row(args, 2, False, env)
        zero, _, _ = kiln_row(args, 2, True, env, zero=True)
        rows.append({"repeat": repeat + 1, "kiln_1_rank": one, "kiln_2_ranks": two, "kiln_2_ranks_no_overlap": two_off,
                     "kiln_2_ranks_zero1": zero, "shortest_reduce_wait_ms_overlap": wait_on, "shortest_reduce_wait_ms_no_overlap": wait_off,
                     "rank_skew_ms_overlap": skew_on, "rank_skew_ms_no_overlap": skew_off, "pytorch_1_process": torch_one,
                     "pytorch_ddp_2_ranks": torch_two, "peer": peer})
    print(f"# demo shape, fp32, global batch 16 x 128 tokens, 1 thread a rank, {args.timed_iters} timed iterations "
          f"after {args.warmup_iters}; kiln buckets of {args.bucket_size} elements; tokens/s (medians)")
    print(f"{'repeat':>6} {'kiln 1':>9} {'kiln 2':>9} {'kiln 2 no-ovl':>14} {'kiln 2 ZeRO-1':>14} {'torch 1':>9} {'DDP 2':>9} "
          f"{'kiln2/DDP2':>11} {'kiln2/kiln1':>12} {'min wait ovl':>12} {'min wait off':>12} {'hidden':>7} {'skew ovl':>9} {'skew off':>9}")
    for row in rows:
        hidden = 1 - row["shortest_reduce_wait_ms_overlap"] / row["shortest_reduce_wait_ms_no_overlap"] if row["shortest_reduce_wait_ms_no_overlap"] else 0
        row["hidden_share"] = hidden
        print(f"{row['repeat']:>6} {row['kiln_1_rank']:>9.0f} {row['kiln_2_ranks']:>9.0f} "
              f"{row['kiln_2_ranks_no_overlap']:>14.0f} {row['kiln_2_ranks_zero1']:>14.0f} {row['pytorch_1_process']:>9.0f} {row['pytorch_ddp_2_ranks']:>9.0f} "
              f"{row['kiln_2_ranks'] / row['pytorch_ddp_2_ranks']:>11.2f} {row['kiln_2_ranks'] / row['kiln_1_rank']:>12.2f} "
              f"{row['shortest_reduce_wait_ms_overlap']:>12.2f} {row['shortest_reduce_wait_ms_no_overlap']:>12.2f} {hidden:>7.0%} "
              f"{row['rank_skew_ms_overlap']:>9.2f} {row['rank_skew_ms_no_overlap']:>9.2f}")
    print(json.dumps({"rows": rows}))


if __name__ == "__main__":
    main()
