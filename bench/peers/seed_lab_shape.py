"""The seed lab's classifier: its shape and dropout flags, with the lab's values as defaults (18
layers, hidden 1280, 20 heads, 2 intermediate layers, 2 labels, sequence 512, vocabulary 30000,
micro-batch 5, dropout 0.1). One list for bench/seed_lab.py, which passes them to both sides, and
for the peer bench/peers/pytorch_seed_lab.py, so the two cannot default to different models."""

# (flag, type, default)
SHAPE = [
    ("--num-layers", int, 18),
    ("--hidden-size", int, 1280),
    ("--num-attention-heads", int, 20),
    ("--num-intermediate-layers", int, 2),
    ("--num-labels", int, 2),
    ("--seq-length", int, 512),
    ("--vocab-size", int, 30000),
    ("--micro-batch-size", int, 5),
    ("--hidden-dropout", float, 0.1),
    ("--attention-dropout", float, 0.1),
]


def _attribute(flag):
    return flag[2:].replace("-", "_")


def add_shape_arguments(parser):
    for flag, kind, default in SHAPE:
        parser.add_argument(flag, type=kind, default=default)


def shape_flags(args):
    """The flags that give another program the shape parsed into args."""
    flags = []
    for flag, _, _ in SHAPE:
        flags += [flag, getattr(args, _attribute(flag))]
    return flags
