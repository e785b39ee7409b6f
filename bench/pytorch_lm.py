#!/usr/bin/python3
"""Reference for bench/python_model.sh text-lm: the byte-level language
model example (examples/text-lm/model.py) trained by plain PyTorch on the
same corpus, windows and split as Tally's text dataset (the fortunes files
as one stream of bytes, windows of seq_len + 1, the last 10% the test
split), one thread per process, batch 32 per process, Adam(lr 0.002),
STEPS steps per process: --procs 1 is a plain training loop, --procs 2
DistributedDataParallel (gloo) with the windows split across the
processes. The clock starts after the data is loaded and the model built
(a barrier). Prints {"samples_per_sec", "train_seconds", "test_loss"}
(all processes together; the test loss in nats a byte, rank 0's
evaluation of the final weights).
"""
import argparse
import glob
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def windows(files, seq_len, test_fraction):
    """The training and test splits' windows, as Tally cuts them."""
    data = b"".join(open(p, "rb").read() for p in files)
    stream = np.frombuffer(data, np.uint8).astype(np.int64)
    cut = math.floor((1.0 - test_fraction) * len(stream))

    def cut_up(part):
        n = len(part) // (seq_len + 1)
        return torch.from_numpy(part[:n * (seq_len + 1)].reshape(n, seq_len + 1).copy())
    return cut_up(stream[:cut]), cut_up(stream[cut:])


@torch.no_grad()
def test_loss(model, test):
    model.eval()
    total = 0.0
    for i in range(0, len(test), 256):
        w = test[i:i + 256]
        out = model(w[:, :-1])
        total += float(F.cross_entropy(out.reshape(-1, out.shape[-1]), w[:, 1:].reshape(-1),
                                       reduction="sum"))
    return total / (len(test) * (test.shape[1] - 1))


def train(rank, args, queue):
    torch.set_num_threads(1)
    if args.procs > 1:
        os.environ["MASTER_ADDR"] = args.master
        os.environ["MASTER_PORT"] = str(args.port)
        dist.init_process_group("gloo", rank=rank, world_size=args.procs)
    train_w, test_w = windows(sorted(glob.glob(args.files)), args.seq_len, 0.1)
    sys.path.insert(0, os.path.join(ROOT, "examples", "text-lm"))
    import model as example
    torch.manual_seed(args.seed)
    model = example.make_model()
    if args.procs > 1:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(model.parameters(), lr=0.002)
    g = torch.Generator()
    g.manual_seed(args.seed)
    per_epoch = len(train_w) // args.procs // args.batch_size
    if args.procs > 1:
        dist.barrier()
    start = time.perf_counter()
    for s in range(args.steps):
        if s % per_epoch == 0:
            perm = torch.randperm(len(train_w), generator=g)[rank::args.procs]
        w = train_w[perm[(s % per_epoch) * args.batch_size:][:args.batch_size]]
        out = model(w[:, :-1])
        loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), w[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    if args.procs > 1:
        dist.barrier()
    elapsed = time.perf_counter() - start
    if rank == 0:
        inner = model.module if args.procs > 1 else model
        queue.put({"samples_per_sec": args.steps * args.batch_size * args.procs / elapsed,
                   "train_seconds": elapsed, "test_loss": test_loss(inner, test_w)})
    if args.procs > 1:
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--procs", type=int, default=1)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--batch_size", type=int, default=32)
    ap.add_argument("--seq_len", type=int, default=128)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--files", default="/usr/share/games/fortunes/*.u8")
    ap.add_argument("--port", type=int, default=29543)
    ap.add_argument("--master", default="127.0.0.1", help="rank 0's address")
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    if args.procs == 1:
        train(0, args, queue)
    else:
        mp.spawn(train, args=(args, queue), nprocs=args.procs, join=True)
    print(json.dumps(queue.get()))


if __name__ == "__main__":
    main()
