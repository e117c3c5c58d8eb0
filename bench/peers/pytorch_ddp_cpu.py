#!/usr/bin/env python3
"""The PyTorch peer of kiln's CPU data parallelism: the GPT of pytorch_gpt.py trained by
DistributedDataParallel over gloo on CPU ranks, each rank one process started by a torchrun-style
launcher (`kiln launch --standalone --nproc-per-node 2 -- python3 bench/peers/pytorch_ddp_cpu.py`;
RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT come from it). Uniform random tokens, fp32, AdamW,
global-norm clipping at 1.0, the global batch split into micro-batch x ranks x accumulation
(DDP's no_sync() for every micro-batch but the last). Rank 0 prints one JSON object: the median
milliseconds per iteration after warm-up and the tokens per second of the whole job.
"""
import argparse
import contextlib
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

from pytorch_gpt import Gpt


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--num-layers", type=int, default=4)
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--num-attention-heads", type=int, default=4)
    parser.add_argument("--seq-length", type=int, default=128)
    parser.add_argument("--vocab-size", type=int, default=257)
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--global-batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1, help="torch threads a rank")
    parser.add_argument("--warmup-iters", type=int, default=5)
    parser.add_argument("--timed-iters", type=int, default=30)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group("gloo", init_method="env://")
    rank = dist.get_rank() if distributed else 0
    ranks = dist.get_world_size() if distributed else 1
    accumulation = args.global_batch_size // (args.micro_batch_size * ranks)
    assert accumulation * args.micro_batch_size * ranks == args.global_batch_size, "global batch not divisible"

    torch.manual_seed(1234)
    padded_vocab = (args.vocab_size + 63) // 64 * 64
    model = Gpt(args.num_layers, args.hidden_size, args.num_attention_heads, padded_vocab, args.seq_length)
    parameters = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=6e-4, betas=(0.9, 0.95), eps=1e-8)
    step_model = torch.nn.parallel.DistributedDataParallel(model) if distributed else model
    generator = torch.Generator().manual_seed(1000 + rank)

    def step():
        for micro in range(accumulation):
            tokens = torch.randint(0, args.vocab_size, (args.micro_batch_size, args.seq_length + 1),
                                   generator=generator)
            last = micro + 1 == accumulation
            sync = contextlib.nullcontext() if last or not distributed else step_model.no_sync()
            with sync:
                loss = step_model(tokens[:, :-1], tokens[:, 1:]) / accumulation
                loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    times = []
    for iteration in range(args.warmup_iters + args.timed_iters):
        start = time.perf_counter()
        step()
        if iteration >= args.warmup_iters:
            times.append((time.perf_counter() - start) * 1e3)
    ms = statistics.median(times)
    if rank == 0:
        print(json.dumps({
            "peer": f"pytorch {torch.__version__} " + ("DistributedDataParallel (gloo)" if distributed else "one process"),
            "ranks": ranks, "threads_per_rank": args.threads, "parameters": parameters,
            "global_batch_size": args.global_batch_size, "seq_length": args.seq_length,
            "median_ms_per_iteration": ms,
            "tokens_per_second": args.global_batch_size * args.seq_length / (ms * 1e-3),
        }), flush=True)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
