#!/usr/bin/env python3
"""Stands in for a PyTorch peer (bench/peers/pytorch_gpt.py or pytorch_attention.py) where there is
no PyTorch or GPU, for `bench/device-check.sh --rehearse`: it parses the arguments with the real
peer's own options (read from its source, so a flag the peer does not take fails here as it would
there) and prints one JSON object with the real peer's field names and placeholder numbers.

    stand_in_peer.py gpt|attention PEER-ARGUMENTS...
"""
import argparse
import ast
import builtins
import json
import math
import pathlib
import sys

PEERS = pathlib.Path(__file__).resolve().parents[2] / "bench" / "peers"
SOURCES = {"gpt": PEERS / "pytorch_gpt.py", "attention": PEERS / "pytorch_attention.py"}


def peer_parser(source):
    """An ArgumentParser with every `parser.add_argument(...)` of the peer's source (literal
    arguments; `type=` names a builtin)."""
    parser = argparse.ArgumentParser(prog=source.name)
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            names = [ast.literal_eval(argument) for argument in node.args]
            options = {}
            for keyword in node.keywords:
                if keyword.arg == "type":
                    options["type"] = getattr(builtins, keyword.value.id)
                else:
                    options[keyword.arg] = ast.literal_eval(keyword.value)
            parser.add_argument(*names, **options)
    return parser


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in SOURCES:
        sys.exit("stand_in_peer.py: first argument must be gpt or attention")
    kind = sys.argv[1]
    args = peer_parser(SOURCES[kind]).parse_args(sys.argv[2:])
    if kind == "gpt":
        row = {"peer": "stand-in" + (" compile" if args.compile else " eager"), "device": "none",
               "precision": args.precision, "micro_batch_size": args.micro_batch_size,
               "median_ms_per_iteration": 1.0, "tokens_per_second": 1.0, "model_tflops": 0.0,
               "peak_memory_gib": 0.0, "losses": [math.log(args.vocab_size)] * (args.warmup_iters + args.timed_iters)}
    else:
        row = {"who": "pytorch", "device": "none", "batch": args.batch, "seq_length": args.seq_length,
               "heads": args.num_attention_heads, "head_size": args.head_size, "forward_ms": 1.0,
               "backward_ms": 1.0, "forward_tflops": 0.0, "backward_tflops": 0.0}
    print(json.dumps(row))


if __name__ == "__main__":
    main()
