#!/usr/bin/env python3
"""The PyTorch peer of `kiln bench attention`: scaled_dot_product_attention on the same shapes
(q, k and v split from one packed [B, T, 3C] tensor as GPT-2 does, so the same strides), forward
and backward timed separately with CUDA events (mean of --iters calls after --warmup), TFLOP/s by
the same count as kiln (FlashAttention's: 4 B T^2 C forward, halved when causal, backward 2.5x).
Prints one JSON object with kiln's field names.

The padding masks are a boolean attn_mask (every 8th key padded, as kiln's), which PyTorch runs
on its memory-efficient or math kernels, not flash.
"""
import argparse
import json

import torch
import torch.nn.functional as F


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dtype", default="bf16", choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seq-length", type=int, default=1024)
    parser.add_argument("--num-attention-heads", type=int, default=12)
    parser.add_argument("--head-size", type=int, default=64)
    parser.add_argument("--mask", default="causal", choices=["causal", "padding", "causal_padding"])
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    B, T, NH, HS = args.batch, args.seq_length, args.num_attention_heads, args.head_size
    C = NH * HS
    generator = torch.Generator(device="cuda").manual_seed(1)
    qkv = (torch.rand(B, T, 3 * C, device="cuda", generator=generator) * 2 - 1).to(dtype).requires_grad_()
    dout = (torch.rand(B, NH, T, HS, device="cuda", generator=generator) * 2 - 1).to(dtype)
    q, k, v = (t.view(B, T, NH, HS).transpose(1, 2) for t in qkv.split(C, dim=2))
    causal = args.mask != "padding"
    attn_mask = None
    if args.mask != "causal":
        keep = torch.ones(B, T, dtype=torch.bool, device="cuda")
        keep.view(-1)[::8] = False
        attn_mask = keep[:, None, None, :]
        if causal:
            attn_mask = attn_mask & torch.ones(T, T, dtype=torch.bool, device="cuda").tril()

    def forward():
        if attn_mask is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)

    def timed(call):
        for _ in range(args.warmup):
            call()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(args.iters):
            call()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / args.iters

    with torch.no_grad():
        forward_ms = timed(forward)
    out = forward()
    backward_ms = timed(lambda: torch.autograd.grad(out, qkv, dout, retain_graph=True))
    flops = 4.0 * B * T * T * C * (0.5 if causal else 1.0)
    print(json.dumps({
        "who": "pytorch", "device": torch.cuda.get_device_name(), "dtype": args.dtype, "mask": args.mask,
        "batch": B, "seq_length": T, "heads": NH, "head_size": HS, "torch": torch.__version__,
        "forward_ms": forward_ms, "backward_ms": backward_ms,
        "forward_tflops": flops / (forward_ms * 1e-3) * 1e-12,
        "backward_tflops": 2.5 * flops / (backward_ms * 1e-3) * 1e-12,
    }))


if __name__ == "__main__":
    main()
