#!/usr/bin/python3
"""PyTorch's DataLoader over the same data Tally's loader reads
(bench/loader.sh): torchvision's ImageFolder with the transforms Tally's
image_folder applies, or .npy arrays read through a memory map, shuffled in
batches, nothing computed on them.

  pytorch_loader.py folder ROOT --channels 1|3 --size H [--resize S]
                    [--mean M ... --std S ...] [--workers N] [--batch 64]
  pytorch_loader.py npy X.npy Y.npy [--workers N] [--batch 64]
prints one JSON object: samples_per_sec of each repeat and their median.
The workers are started once (persistent_workers) and an untimed epoch
warms them up, as Tally's loader thread is started before its timing.
"""
import argparse
import json
import statistics
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class Arrays(Dataset):
    """uint8 .npy images scaled to [0, 1], as Tally's arrays dataset."""

    def __init__(self, x, y):
        self.x = np.load(x, mmap_mode="r")
        self.y = np.load(y, mmap_mode="r")

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return torch.from_numpy(self.x[i].astype(np.float32) / 255.0), int(self.y[i])


def folder(args):
    from PIL import Image
    from torchvision import datasets, transforms
    mode = "L" if args.channels == 1 else "RGB"
    steps = []
    if args.resize:
        steps += [transforms.Resize(args.resize), transforms.CenterCrop(args.size)]
    steps.append(transforms.ToTensor())
    if args.mean:
        steps.append(transforms.Normalize(args.mean, args.std))

    def load(path):
        with open(path, "rb") as f:
            return Image.open(f).convert(mode)
    return datasets.ImageFolder(args.root, transform=transforms.Compose(steps), loader=load)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("kind", choices=["folder", "npy"])
    p.add_argument("paths", nargs="+")
    p.add_argument("--channels", type=int, default=3)
    p.add_argument("--size", type=int, default=28)
    p.add_argument("--resize", type=int, default=0)
    p.add_argument("--mean", type=float, nargs="*")
    p.add_argument("--std", type=float, nargs="*")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.kind == "folder":
        args.root = args.paths[0]
        data = folder(args)
    else:
        data = Arrays(*args.paths)
    loader = DataLoader(data, batch_size=args.batch, shuffle=True, num_workers=args.workers,
                        persistent_workers=args.workers > 0)
    rates = []
    for r in range(args.repeats + 1):
        began = time.perf_counter()
        n = sum(len(y) for _, y in loader)
        if r > 0:
            rates.append(n / (time.perf_counter() - began))
    print(json.dumps({"samples_per_sec": [int(v) for v in rates],
                      "median": round(statistics.median(rates), 1), "size": len(data),
                      "workers": args.workers}))


if __name__ == "__main__":
    main()
