#!/usr/bin/env python3
"""The PyTorch peer of `kiln bench train`: the same GPT-2 shape trained on the same kind of data
(uniform random tokens), timed the same way (median of iterations after warm-up), printing one
JSON object with the same field names (the losses of every iteration among them).

Model: GPT-2 (pre-LayerNorm, learned positions, tied embeddings, biases, tanh GELU), attention
through scaled_dot_product_attention (flash kernels where the dtype allows), fused AdamW,
global-norm clipping at 1.0. Precision: fp32, tf32 (fp32 with TF32 matmuls) or bf16 autocast.
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def causal_attention(q, k, v):
    """SDPA where this PyTorch has it (2.0 on); the same product spelled out on older ones (the CPU
    peers run Debian's PyTorch 1.13)."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).triu(1)
    return scores.masked_fill(mask, float("-inf")).softmax(dim=-1) @ v


class Block(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(hidden)
        self.c_attn = nn.Linear(hidden, 3 * hidden)
        self.c_proj = nn.Linear(hidden, hidden)
        self.ln_2 = nn.LayerNorm(hidden)
        self.c_fc = nn.Linear(hidden, 4 * hidden)
        self.mlp_proj = nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        batch, seq, hidden = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(hidden, dim=2)
        shape = (batch, seq, self.heads, hidden // self.heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        y = causal_attention(q, k, v)
        x = x + self.c_proj(y.transpose(1, 2).reshape(batch, seq, hidden))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, layers, hidden, heads, vocab, positions):
        super().__init__()
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(positions, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden)
        residual_std = 0.02 / math.sqrt(2 * layers)
        for name, parameter in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(parameter)
            elif parameter.dim() == 2:
                std = residual_std if name.endswith(("c_proj.weight", "mlp_proj.weight")) else 0.02
                nn.init.normal_(parameter, 0.0, std)

    def forward(self, tokens, targets):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.wte(tokens) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied classifier
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--num-layers", type=int, default=12)
    parser.add_argument("--hidden-size", type=int, default=768)
    parser.add_argument("--num-attention-heads", type=int, default=12)
    parser.add_argument("--seq-length", type=int, default=1024)
    parser.add_argument("--vocab-size", type=int, default=50257)
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--precision", choices=["fp32", "tf32", "bf16"], default="bf16")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--warmup-iters", type=int, default=3)
    parser.add_argument("--timed-iters", type=int, default=10)
    args = parser.parse_args()

    torch.manual_seed(1234)
    torch.backends.cuda.matmul.allow_tf32 = args.precision == "tf32"
    torch.backends.cudnn.allow_tf32 = args.precision == "tf32"
    device = torch.device("cuda")
    padded_vocab = (args.vocab_size + 63) // 64 * 64  # as kiln: padding rows never predicted here either
    model = Gpt(args.num_layers, args.hidden_size, args.num_attention_heads, padded_vocab, args.seq_length).to(device)
    parameters = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    step_model = torch.compile(model) if args.compile else model

    def step():
        tokens = torch.randint(0, args.vocab_size, (args.micro_batch_size, args.seq_length + 1), device=device)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = step_model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    times, losses = [], []
    torch.cuda.reset_peak_memory_stats()
    for iteration in range(args.warmup_iters + args.timed_iters):
        torch.cuda.synchronize()
        start = time.perf_counter()
        loss = step()
        losses.append(loss.item())
        torch.cuda.synchronize()
        if iteration >= args.warmup_iters:
            times.append((time.perf_counter() - start) * 1e3)
    ms = statistics.median(times)
    tokens_per_second = args.micro_batch_size * args.seq_length / (ms * 1e-3)
    flops_per_token = 6 * parameters + 12 * args.num_layers * args.hidden_size * args.seq_length
    print(json.dumps({
        "peer": "pytorch " + torch.__version__ + (" compile" if args.compile else " eager"),
        "device": torch.cuda.get_device_name(), "precision": args.precision,
        "num_layers": args.num_layers, "hidden_size": args.hidden_size, "seq_length": args.seq_length,
        "micro_batch_size": args.micro_batch_size, "parameters": parameters,
        "median_ms_per_iteration": ms, "tokens_per_second": tokens_per_second,
        "model_tflops": flops_per_token * tokens_per_second / 1e12,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30, "losses": losses,
    }))


if __name__ == "__main__":
    main()
