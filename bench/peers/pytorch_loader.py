#!/usr/bin/env python3
"""The PyTorch peer of `kiln bench loader`: torch.utils.data.DataLoader on the same data.

  python3 bench/peers/pytorch_loader.py --csv DIR [--tokens PREFIX --seq-length 1024] --workers 0,1,2,4

--csv DIR     a classification folder written by `kiln data synth` (metadata.json + CSV files).
              The Dataset indexes every row's byte offset once (as kiln does) and a sample is one
              pread of that row + parse into tensors, the usual hand-written map-style dataset.
--tokens P    a Megatron indexed dataset (P.bin / P.idx, uint16 or int32): samples are windows of
              seq_length + 1 tokens at shuffled offsets, read from a numpy memmap.
Each worker count reads every CSV row (or --batches batches of tokens) twice; the table gives
samples/s per pass, the same columns as kiln's. --json prints JSON lines instead.
"""
import argparse
import json
import os
import struct
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


def parse_row(line):
    """'"1,2,3","1,1,0",1' -> ([1,2,3], [1,1,0], 1)"""
    first_close = line.index('"', 1)
    ids = [int(x) for x in line[1:first_close].split(",")]
    second_open = line.index('"', first_close + 1)
    second_close = line.index('"', second_open + 1)
    mask = [int(x) for x in line[second_open + 1:second_close].split(",")]
    label = int(line[second_close + 2:])
    return ids, mask, label


class CsvDataset(Dataset):
    def __init__(self, folder):
        with open(os.path.join(folder, "metadata.json")) as f:
            meta = json.load(f)
        self.rows = []  # (path, offset, length)
        for entry in meta["files"]:
            path = os.path.join(folder, entry["name"])
            with open(path, "rb") as f:
                f.readline()  # header
                offset = f.tell()
                for line in f:
                    if line.strip():
                        self.rows.append((path, offset, len(line)))
                    offset += len(line)
        self.descriptors = {}  # per process: forked workers must not share file offsets
        self.pid = None

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):
        if self.pid != os.getpid():
            self.descriptors, self.pid = {}, os.getpid()
        path, offset, length = self.rows[index]
        fd = self.descriptors.get(path)
        if fd is None:
            fd = self.descriptors[path] = os.open(path, os.O_RDONLY)
        ids, mask, label = parse_row(os.pread(fd, length, offset).decode().rstrip("\r\n"))
        return torch.tensor(ids), torch.tensor(mask), torch.tensor(label)


class TokenWindows(Dataset):
    def __init__(self, prefix, seq_length, samples, seed=1234):
        with open(prefix + ".idx", "rb") as f:
            header = f.read(34)
        assert header[:9] == b"MMIDIDX\x00\x00", "not a Megatron MMIDIDX index"
        code = header[17]
        dtype = np.uint16 if code == 8 else np.int32
        self.tokens = np.memmap(prefix + ".bin", dtype=dtype, mode="r")
        self.seq = seq_length
        rng = np.random.default_rng(seed)
        self.starts = rng.integers(0, len(self.tokens) - seq_length - 1, size=samples)

    def __len__(self):
        return len(self.starts)

    def __getitem__(self, index):
        start = int(self.starts[index])
        window = torch.from_numpy(self.tokens[start:start + self.seq + 1].astype(np.int64))
        return window[:-1], window[1:]


def samples_per_second(dataset, workers, batch_size, prefetch):
    # prefetch_factor only with workers: torch 1.x rejects anything but its default 2 without
    # them, torch 2.x anything but None.
    multiprocessing = {"prefetch_factor": prefetch, "persistent_workers": True} if workers > 0 else {}
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=workers, **multiprocessing)
    rates = []
    for _ in range(2):
        start = time.perf_counter()
        count = 0
        for batch in loader:
            count += batch[0].shape[0]
        rates.append(count / (time.perf_counter() - start))
    return rates


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--csv")
    parser.add_argument("--tokens")
    parser.add_argument("--seq-length", type=int, default=1024)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--micro-batch-size", type=int, default=32)
    parser.add_argument("--prefetch-factor", type=int, default=2)
    parser.add_argument("--workers", default="0,1,2,4")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    workers = [int(w) for w in args.workers.split(",")]
    sets = []
    if args.csv:
        sets.append(("csv", args.csv, CsvDataset(args.csv)))
    if args.tokens:
        sets.append(("tokens", args.tokens,
                     TokenWindows(args.tokens, args.seq_length, args.batches * args.micro_batch_size)))
    if not sets:
        parser.error("give --csv and/or --tokens")
    if not args.json:
        print(f"# torch {torch.__version__} DataLoader | batch {args.micro_batch_size} | prefetch {args.prefetch_factor}")
    for kind, path, dataset in sets:
        if not args.json:
            print(f"# {kind}: {path}, {len(dataset)} samples\n#{'workers':>8} {'pass 1 samp/s':>16} {'pass 2 samp/s':>16}")
        for w in workers:
            first, second = samples_per_second(dataset, w, args.micro_batch_size, args.prefetch_factor)
            if args.json:
                print(json.dumps({"peer": "pytorch", "format": kind, "data_path": path, "workers": w,
                                  "pass1_samples_per_second": first, "pass2_samples_per_second": second}))
            else:
                print(f" {w:>8} {first:>16.0f} {second:>16.0f}")


if __name__ == "__main__":
    main()
