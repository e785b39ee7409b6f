#!/usr/bin/python3
"""Reference: the same training loop in PyTorch, for side-by-side throughput.

Trains the MLP or CNN example on Fashion-MNIST with batch 64, SGD
(lr 0.02, as the examples, momentum 0.9), one thread, reading the same IDX files, with the data
preloaded as tensors (no DataLoader), and prints a JSON summary like
tally-worker's --summary_json.
"""
import argparse
import gzip
import json
import time

import numpy as np
import torch
from torch import nn


def load_idx(path, magic):
    with gzip.open(path, "rb") as f:
        data = f.read()
    assert int.from_bytes(data[:4], "big") == magic, path
    if magic == 0x803:
        n, r, c = (int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(3))
        arr = np.frombuffer(data, dtype=np.uint8, offset=16).reshape(n, 1, r, c)
        return torch.from_numpy(arr.astype(np.float32) / 255.0)
    arr = np.frombuffer(data, dtype=np.uint8, offset=8)
    return torch.from_numpy(arr.astype(np.int64))


def normalize(x):
    return (x - 0.2860) / 0.3530


def model_for(name):
    if name == "mlp-large":  # 74M parameters (bench/memory.sh)
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 8192), nn.ReLU(),
                             nn.Linear(8192, 8192), nn.ReLU(), nn.Linear(8192, 10))
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(),
                             nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
    return nn.Sequential(nn.Conv2d(1, 10, 5), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(1440, 10))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["mlp", "cnn"], required=True)
    ap.add_argument("--root", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch_size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--lr", type=float, default=0.02)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    xtr = normalize(load_idx(f"{args.root}/train-images-idx3-ubyte.gz", 0x803))
    ytr = load_idx(f"{args.root}/train-labels-idx1-ubyte.gz", 0x801)
    xte = normalize(load_idx(f"{args.root}/t10k-images-idx3-ubyte.gz", 0x803))
    yte = load_idx(f"{args.root}/t10k-labels-idx1-ubyte.gz", 0x801)

    model = model_for(args.model)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    n = xtr.shape[0]
    steps = 0
    start = time.perf_counter()
    for _ in range(args.epochs):
        perm = torch.randperm(n)
        for b in range(0, n, args.batch_size):
            idx = perm[b:b + args.batch_size]
            x, y = xtr[idx], ytr[idx]
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            steps += 1
    elapsed = time.perf_counter() - start
    with torch.no_grad():
        acc = (model(xte).argmax(1) == yte).float().mean().item()
    print(json.dumps({"samples_per_sec": n * args.epochs / elapsed,
                      "steps": steps, "final_loss": loss.item(),
                      "test_accuracy": acc, "train_seconds": elapsed}))


if __name__ == "__main__":
    main()
