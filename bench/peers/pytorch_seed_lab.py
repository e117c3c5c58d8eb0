#!/usr/bin/env python3
"""The PyTorch eager peer of `kiln bench train --model encoder-classifier`: the seed lab's model and
training step (the lab runs eager), at the same shape, on the same kind of data, timed the same way,
printing one JSON object.

Model (kiln's src/kiln/nn/encoder_classifier.h, layer for layer):
    x = dropout(word[ids] + position[t] + token_type[0])
    x = block(x) for each of --num-layers pre-LayerNorm blocks: x + dropout(proj(attention(ln_1 x)))
        then x + dropout(fc2(gelu(fc1(ln_2 x)))); attention bidirectional, the keys masked by the
        attention mask, dropout on its probabilities; GELU the tanh approximation, MLP 4h wide
    x = x + dropout(gelu(x W_j + b_j)) for each of --num-intermediate-layers residual layers
    h = final_layer_norm(x); pooled = tanh(pooler(h[:, 0]))
    loss = cross_entropy(out_proj(gelu(dense(pooled))), labels), the mean over the samples
kiln's initialisation: N(0, 0.02) for matrices and embeddings, the residual branches' output
projections (the blocks' two and the intermediate layers') N(0, 0.02 / sqrt(2 (layers +
intermediate layers))), zero biases, unit LayerNorm gains, the vocabulary padded to a multiple of
64 with zero rows. token_type_embeddings [2, hidden] is BERT's: every token is of type 0.
Attention: scaled_dot_product_attention with dropout_p (PyTorch 2; on PyTorch 1.13, the CPU peers'
Debian build, the same product spelled out). --attention-mask auto (the default) hands SDPA a mask
only when a micro-batch has padding, as transformers' BERT does, so unpadded batches take the flash
kernels; `always` passes the all-true mask too, as kiln always applies its key-padding mask.

Training step: --global-batch-size / --micro-batch-size micro-batches (accumulation), each loss
divided by their number; AdamW (PyTorch's fused one on CUDA) at kiln's defaults: lr 6e-4 on a
cosine decay to 0 over the run, betas (0.9, 0.999), eps 1e-8, weight decay 0.01 on matrices and
embeddings only; global-norm clipping at 1.0; fp32 master weights (the parameters stay fp32).
Precision: fp32; tf32 (fp32 with TF32 matmuls: torch.backends.cuda.matmul.allow_tf32); fp16
(autocast, dynamic loss scaling by GradScaler from 2^16, growth every 1000 steps: kiln's
--initial-loss-scale 65536 and loss-scale window); bf16 (autocast). On the CPU, bf16 runs CPU
autocast, while fp16 and tf32 compute in fp32 (as kiln's CPU back-end does; `compute` says so).
--recompute-granularity full wraps each block in torch.utils.checkpoint (non-reentrant, the
dropout masks replayed): kiln's --recompute-granularity full --recompute-method uniform
--recompute-num-layers 1.

Data, as kiln's --mock-data for a classifier (src/kiln/data/classification_tokens.h): uniform
random ids in [0, vocab), label = ids[1] mod num_labels, every position real; --padding random
gives each sample a uniformly drawn real length in [1, seq] instead (ids 0 past it).

Timing, as bench/peers/pytorch_gpt.py: each iteration between two device synchronisations, the
loss read back at its end; the median of the iterations after --warmup-iters. Reported:
samples_per_second (global batch / median), peak memory (torch.cuda.max_memory_allocated and
max_memory_reserved since the model was built, optimizer state included), every iteration's loss.

    pytorch_seed_lab.py [--precision fp32|tf32|fp16|bf16] [--recompute-granularity none|full]
                        [--global-batch-size 15] [--device cuda|cpu] [--threads N] ...
"""
import argparse
import contextlib
import json
import math
import resource
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from seed_lab_shape import add_shape_arguments  # beside this file: the lab's shape, shared with bench/seed_lab.py

VOCAB_PADDING = 64  # kiln's GptConfig::kVocabPadding: the embedding table's rows, a multiple of 64


def fail(message):
    sys.exit(f"pytorch_seed_lab.py: {message}")


def attention(q, k, v, keep, dropout_p):
    """Softmax(q k^T / sqrt(d)) v over [batch, heads, seq, head size], keys where `keep`
    ([batch, 1, 1, seq], True for a real token) is False hidden; None: no mask."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=dropout_p)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    return F.dropout(scores.softmax(dim=-1), dropout_p) @ v


class Block(nn.Module):
    """A pre-LayerNorm transformer block, kiln's src/kiln/nn/block.h with the key-padding mask."""

    def __init__(self, hidden, heads, hidden_dropout, attention_dropout, device):
        super().__init__()
        self.heads, self.hidden_dropout, self.attention_dropout = heads, hidden_dropout, attention_dropout
        self.ln_1 = nn.LayerNorm(hidden, eps=1e-5, device=device)
        self.qkv = nn.Linear(hidden, 3 * hidden, device=device)
        self.attention_output = nn.Linear(hidden, hidden, device=device)
        self.ln_2 = nn.LayerNorm(hidden, eps=1e-5, device=device)
        self.intermediate = nn.Linear(hidden, 4 * hidden, device=device)
        self.output = nn.Linear(4 * hidden, hidden, device=device)

    def forward(self, x, keep):
        batch, seq, hidden = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(hidden, dim=2)
        shape = (batch, seq, self.heads, hidden // self.heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        y = attention(q, k, v, keep, self.attention_dropout if self.training else 0.0)
        y = self.attention_output(y.transpose(1, 2).reshape(batch, seq, hidden))
        x = x + F.dropout(y, self.hidden_dropout, self.training)
        y = self.output(F.gelu(self.intermediate(self.ln_2(x)), approximate="tanh"))
        return x + F.dropout(y, self.hidden_dropout, self.training)


class EncoderClassifier(nn.Module):
    """kiln's EncoderClassifier (the seed lab's model), with BERT's token-type embeddings."""

    def __init__(self, args, device):
        super().__init__()
        hidden = args.hidden_size
        self.hidden_dropout, self.recompute = args.hidden_dropout, args.recompute_granularity == "full"
        padded_vocab = (args.vocab_size + VOCAB_PADDING - 1) // VOCAB_PADDING * VOCAB_PADDING
        self.word_embeddings = nn.Embedding(padded_vocab, hidden, device=device)
        self.position_embeddings = nn.Embedding(args.seq_length, hidden, device=device)
        self.token_type_embeddings = nn.Embedding(2, hidden, device=device)
        self.blocks = nn.ModuleList(
            Block(hidden, args.num_attention_heads, args.hidden_dropout, args.attention_dropout, device)
            for _ in range(args.num_layers))
        self.intermediate = nn.ModuleList(nn.Linear(hidden, hidden, device=device)
                                          for _ in range(args.num_intermediate_layers))
        self.final_layer_norm = nn.LayerNorm(hidden, eps=1e-5, device=device)
        self.pooler = nn.Linear(hidden, hidden, device=device)
        self.dense = nn.Linear(hidden, hidden, device=device)
        self.out_proj = nn.Linear(hidden, args.num_labels, device=device)
        self.init_weights(args.vocab_size, args.num_layers + args.num_intermediate_layers)

    @torch.no_grad()
    def init_weights(self, vocab_size, residual_layers):
        residual_std = 0.02 / math.sqrt(2 * residual_layers)
        residual = {id(b.attention_output.weight) for b in self.blocks} | {id(b.output.weight) for b in self.blocks}
        residual |= {id(layer.weight) for layer in self.intermediate}
        for module in self.modules():
            if isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
            elif isinstance(module, (nn.Linear, nn.Embedding)):
                std = residual_std if id(module.weight) in residual else 0.02
                nn.init.normal_(module.weight, 0.0, std)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
        self.word_embeddings.weight[vocab_size:].zero_()  # padding rows: no id looks them up

    def forward(self, ids, keep, labels):
        positions = torch.arange(ids.shape[1], device=ids.device)
        token_types = torch.zeros_like(ids)  # one text a sample: type 0 everywhere
        x = self.word_embeddings(ids) + self.position_embeddings(positions) + self.token_type_embeddings(token_types)
        x = F.dropout(x, self.hidden_dropout, self.training)
        for block in self.blocks:
            if self.recompute and self.training:
                x = checkpoint(block, x, keep, use_reentrant=False)
            else:
                x = block(x, keep)
        for layer in self.intermediate:
            x = x + F.dropout(F.gelu(layer(x), approximate="tanh"), self.hidden_dropout, self.training)
        pooled = torch.tanh(self.pooler(self.final_layer_norm(x)[:, 0]))
        logits = self.out_proj(F.gelu(self.dense(pooled), approximate="tanh"))
        return F.cross_entropy(logits.float(), labels)


def parse_arguments():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shape_arguments(parser)
    parser.add_argument("--global-batch-size", type=int, default=0, help="0: the micro-batch (no accumulation)")
    parser.add_argument("--precision", choices=["fp32", "tf32", "fp16", "bf16"], default="bf16")
    parser.add_argument("--recompute-granularity", choices=["none", "full"], default="none")
    parser.add_argument("--padding", choices=["none", "random"], default="none")
    parser.add_argument("--attention-mask", choices=["auto", "always"], default="auto")
    parser.add_argument("--lr", type=float, default=6e-4)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--clip-grad", type=float, default=1.0)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (torch.set_num_threads); 0: torch's")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--warmup-iters", type=int, default=3)
    parser.add_argument("--timed-iters", type=int, default=10)
    args = parser.parse_args()
    if args.global_batch_size == 0:
        args.global_batch_size = args.micro_batch_size
    checks = [
        (min(args.num_layers, args.hidden_size, args.num_attention_heads, args.seq_length, args.vocab_size,
             args.micro_batch_size) > 0, "shape and batch sizes must be positive"),
        (args.hidden_size % args.num_attention_heads == 0,
         f"--hidden-size {args.hidden_size} is not a multiple of --num-attention-heads {args.num_attention_heads}"),
        (args.global_batch_size % args.micro_batch_size == 0, f"--global-batch-size {args.global_batch_size} is not a"
         f" multiple of --micro-batch-size {args.micro_batch_size}"),
        (args.num_intermediate_layers >= 0 and args.num_labels >= 2,
         "--num-intermediate-layers must be >= 0 and --num-labels >= 2"),
        (args.seq_length >= 2, "--seq-length must be at least 2 (the label is read from the second id)"),
        (0.0 <= args.hidden_dropout < 1.0 and 0.0 <= args.attention_dropout < 1.0, "dropouts must be in [0, 1)"),
        (args.warmup_iters >= 0 and args.timed_iters > 0, "--warmup-iters must be >= 0 and --timed-iters positive"),
    ]
    for ok, message in checks:
        if not ok:
            fail(message)
    return args


def make_grad_scaler(enabled, device):
    """Dynamic loss scaling as kiln's fp16 runs it in this comparison: from 2^16, doubled after 1000
    steps without overflow, halved on one."""
    options = dict(init_scale=2.0 ** 16, growth_interval=1000, enabled=enabled)
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler(device, **options)
    return torch.cuda.amp.GradScaler(**options)


def make_optimizer(model, args, cuda):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    options = dict(lr=args.lr, betas=(0.9, 0.999), eps=1e-8)
    if cuda:
        try:
            return torch.optim.AdamW(groups, fused=True, **options), "fused"
        except (TypeError, RuntimeError):  # a PyTorch without the fused kernel
            pass
    return torch.optim.AdamW(groups, **options), "default"


def main():
    args = parse_arguments()
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        fail("--device cuda, but this PyTorch sees no CUDA device (--device cpu runs on the CPU)")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    tf32 = cuda and args.precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    # What autocast computes in: CUDA takes fp16 and bf16; the CPU peer takes bf16 (CPU autocast),
    # and computes fp16 and tf32 in fp32, as kiln's CPU back-end does.
    autocast_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(args.precision)
    if not cuda and args.precision == "fp16":
        autocast_dtype = None
    compute = {torch.float16: "fp16 autocast", torch.bfloat16: "bf16 autocast", None: "fp32"}[autocast_dtype]
    if tf32:
        compute = "fp32, TF32 matmuls"
    if not cuda and args.precision in ("fp16", "tf32"):
        print(f"pytorch_seed_lab.py: {args.precision} on the CPU computes in fp32", file=sys.stderr)

    model = EncoderClassifier(args, device).train()
    parameters = sum(p.numel() for p in model.parameters())
    optimizer, adamw = make_optimizer(model, args, cuda)
    scaler = make_grad_scaler(autocast_dtype == torch.float16, args.device)
    accumulation = args.global_batch_size // args.micro_batch_size
    iterations = args.warmup_iters + args.timed_iters
    host_random = torch.Generator().manual_seed(args.seed)  # the padding lengths, drawn on the host
    positions = torch.arange(args.seq_length)

    def micro_batch():
        ids = torch.randint(0, args.vocab_size, (args.micro_batch_size, args.seq_length), device=device)
        keep = None
        if args.padding == "random":
            lengths = torch.randint(1, args.seq_length + 1, (args.micro_batch_size,), generator=host_random)
            real = positions[None, :] < lengths[:, None]
            if not bool(real.all()):
                keep = real.to(device, non_blocking=True)
                ids = ids.masked_fill(~keep, 0)
        if keep is None and args.attention_mask == "always":
            keep = torch.ones(args.micro_batch_size, args.seq_length, dtype=torch.bool, device=device)
        if keep is not None:
            keep = keep[:, None, None, :]
        return ids, keep, ids[:, 1] % args.num_labels

    def learning_rate(iteration):  # kiln's default schedule: cosine to 0 over the run, no warm-up
        return 0.5 * args.lr * (1.0 + math.cos(math.pi * min(iteration, iterations) / iterations))

    def autocast():
        if autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(args.device, dtype=autocast_dtype)

    def step(iteration):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(iteration)
        total = torch.zeros((), device=device)
        for _ in range(accumulation):
            ids, keep, labels = micro_batch()
            with autocast():
                loss = model(ids, keep, labels)
            scaler.scale(loss / accumulation).backward()
            total += loss.detach()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        return total / accumulation

    def synchronize():
        if cuda:
            torch.cuda.synchronize()

    times, losses, skipped = [], [], 0
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    for iteration in range(iterations):
        scale = scaler.get_scale() if scaler.is_enabled() else 1.0
        synchronize()
        start = time.perf_counter()
        loss = step(iteration + 1)
        losses.append(loss.item())
        synchronize()
        if iteration >= args.warmup_iters:
            times.append((time.perf_counter() - start) * 1e3)
        if scaler.is_enabled() and scaler.get_scale() < scale:  # an overflow: GradScaler skipped the update
            skipped += 1
    ms = statistics.median(times)
    samples_per_second = args.global_batch_size / (ms * 1e-3)
    print(json.dumps({
        "peer": f"pytorch {torch.__version__} eager",
        "device": torch.cuda.get_device_name() if cuda else f"cpu, {torch.get_num_threads()} threads",
        "precision": args.precision, "compute": compute,
        "recompute": "full (torch.utils.checkpoint per block)" if args.recompute_granularity == "full" else "none",
        "num_layers": args.num_layers, "hidden_size": args.hidden_size,
        "num_attention_heads": args.num_attention_heads, "num_intermediate_layers": args.num_intermediate_layers,
        "num_labels": args.num_labels, "seq_length": args.seq_length, "vocab_size": args.vocab_size,
        "micro_batch_size": args.micro_batch_size, "global_batch_size": args.global_batch_size,
        "accumulation_steps": accumulation, "hidden_dropout": args.hidden_dropout,
        "attention_dropout": args.attention_dropout, "padding": args.padding, "attention_mask": args.attention_mask,
        "attention": "sdpa" if hasattr(F, "scaled_dot_product_attention") else "explicit softmax",
        "adamw": adamw, "parameters": parameters, "warmup_iters": args.warmup_iters, "timed_iters": args.timed_iters,
        "median_ms_per_iteration": ms, "samples_per_second": samples_per_second,
        "tokens_per_second": samples_per_second * args.seq_length,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30 if cuda else None,
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "loss_scale": scaler.get_scale() if scaler.is_enabled() else None, "skipped_iterations": skipped,
        "losses": losses,
    }))


if __name__ == "__main__":
    main()
