#!/usr/bin/python3
"""Reference: PyTorch DistributedDataParallel (gloo), N processes on this
machine, one thread each, batch 64 per process, SGD(lr 0.02, momentum 0.9),
one epoch of normalised Fashion-MNIST split across the processes. Prints a
JSON summary with the training loop's samples/s (all processes together).
With --steps N: N steps of random data instead (--optimizer adam, the
74M-parameter --model mlp-large: bench/memory.sh), and every process's
peak resident memory. With --rank, this process is that one rank of
--procs, its peers started elsewhere (one per network namespace: --master
is rank 0's address, GLOO_SOCKET_IFNAME the interface); rank 0 prints.
"""
import argparse
import json
import os
import resource
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from pytorch_train import load_idx, model_for, normalize


def run(rank, args, port, queue):
    os.environ["MASTER_ADDR"] = args.master
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args.procs)
    root = args.root
    if args.steps:
        g = torch.Generator()
        g.manual_seed(args.seed + rank)
        n = args.steps * args.batch_size * args.procs
        xtr = torch.randn(n, 1, 28, 28, generator=g)
        ytr = torch.randint(0, 10, (n,), generator=g)
    else:
        xtr = normalize(load_idx(f"{root}/train-images-idx3-ubyte.gz", 0x803))
        ytr = load_idx(f"{root}/train-labels-idx1-ubyte.gz", 0x801)
    torch.manual_seed(args.seed)
    model = nn.parallel.DistributedDataParallel(model_for(args.model))
    if args.compress == "fp16":
        # PyTorch's own gradient compression: all-reduce in float16.
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    if args.optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=0.001)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator()
    g.manual_seed(args.seed)
    perm = torch.randperm(xtr.shape[0], generator=g)[rank::args.procs]
    dist.barrier()
    start = time.perf_counter()
    for b in range(0, perm.shape[0], args.batch_size):
        idx = perm[b:b + args.batch_size]
        opt.zero_grad()
        loss = loss_fn(model(xtr[idx]), ytr[idx])
        loss.backward()
        opt.step()
    dist.barrier()
    elapsed = time.perf_counter() - start
    if args.steps:
        # ru_maxrss: the process's peak resident set (VmHWM), in KiB.
        queue.put({"rank": rank, "peak_rss_mb":
                   resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
                   "samples_per_sec": xtr.shape[0] / elapsed,
                   "train_seconds": elapsed})
        dist.destroy_process_group()
        return
    if rank == 0:
        xte = normalize(load_idx(f"{root}/t10k-images-idx3-ubyte.gz", 0x803))
        yte = load_idx(f"{root}/t10k-labels-idx1-ubyte.gz", 0x801)
        with torch.no_grad():
            acc = (model(xte).argmax(1) == yte).float().mean().item()
        queue.put({"samples_per_sec": xtr.shape[0] / elapsed, "train_seconds": elapsed,
                   "test_accuracy": acc})
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["mlp", "cnn", "mlp-large"], required=True)
    ap.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
    ap.add_argument("--steps", type=int, default=0,
                    help="N steps of random data (0: one epoch of Fashion-MNIST)")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--root", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--batch_size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--compress", choices=["none", "fp16"], default="none")
    ap.add_argument("--port", type=int, default=29533)
    ap.add_argument("--rank", type=int, default=-1, help="run this rank alone")
    ap.add_argument("--master", default="127.0.0.1", help="rank 0's address")
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    if args.rank >= 0:
        if args.steps:
            raise SystemExit("--rank trains one epoch of Fashion-MNIST (no --steps)")
        run(args.rank, args, args.port, queue)
        if args.rank == 0:
            print(json.dumps(queue.get()))
        return
    mp.spawn(run, args=(args, args.port, queue), nprocs=args.procs, join=True)
    if args.steps:
        ranks = sorted((queue.get() for _ in range(args.procs)), key=lambda r: r["rank"])
        print(json.dumps({"samples_per_sec": ranks[0]["samples_per_sec"],
                          "peak_rss_mb": [r["peak_rss_mb"] for r in ranks],
                          "launcher_peak_rss_mb":
                          resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}))
        return
    print(json.dumps(queue.get()))


if __name__ == "__main__":
    main()
