#!/usr/bin/python3
"""Reference for bench/python_model.sh: the ResNet example
(examples/resnet/model.py) trained by plain PyTorch, one thread per process,
batch 64 per process, SGD(lr 0.05, momentum 0.9), normalised Fashion-MNIST,
STEPS steps per process: --procs 1 is a plain training loop,
--procs 2 DistributedDataParallel (gloo, broadcast_buffers=True) with the
data split across the processes. With --rank, this process is that one
rank of --procs, its peers started elsewhere (one per network namespace:
--master is rank 0's address, GLOO_SOCKET_IFNAME the interface). The clock
starts after the data is loaded and the model built (a barrier, so every
rank has). Prints {"samples_per_sec", "train_seconds"} (all processes
together), from rank 0.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from pytorch_train import load_idx, normalize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_model(seed):
    sys.path.insert(0, os.path.join(ROOT, "examples", "resnet"))
    import model
    torch.manual_seed(seed)
    return model.make_model()


def train(rank, args, queue):
    torch.set_num_threads(1)
    if args.procs > 1:
        os.environ["MASTER_ADDR"] = args.master
        os.environ["MASTER_PORT"] = str(args.port)
        dist.init_process_group("gloo", rank=rank, world_size=args.procs)
    x = normalize(load_idx(f"{args.root}/train-images-idx3-ubyte.gz", 0x803))
    y = load_idx(f"{args.root}/train-labels-idx1-ubyte.gz", 0x801)
    model = make_model(args.seed)
    if args.procs > 1:
        model = nn.parallel.DistributedDataParallel(model, broadcast_buffers=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator()
    g.manual_seed(args.seed)
    perm = torch.randperm(x.shape[0], generator=g)[rank::args.procs]
    if args.procs > 1:
        dist.barrier()
    start = time.perf_counter()
    for s in range(args.steps):
        idx = perm[s * args.batch_size:(s + 1) * args.batch_size]
        opt.zero_grad()
        loss_fn(model(x[idx]), y[idx]).backward()
        opt.step()
    if args.procs > 1:
        dist.barrier()
    elapsed = time.perf_counter() - start
    if rank == 0:
        queue.put({"samples_per_sec": args.steps * args.batch_size * args.procs / elapsed,
                   "train_seconds": elapsed})
    if args.procs > 1:
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--procs", type=int, default=1)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--batch_size", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--root", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--port", type=int, default=29541)
    ap.add_argument("--rank", type=int, default=-1, help="run this rank alone")
    ap.add_argument("--master", default="127.0.0.1", help="rank 0's address")
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    if args.rank >= 0:
        train(args.rank, args, queue)
        if args.rank > 0:
            return
    elif args.procs == 1:
        train(0, args, queue)
    else:
        mp.spawn(train, args=(args, queue), nprocs=args.procs, join=True)
    print(json.dumps(queue.get()))


if __name__ == "__main__":
    main()
