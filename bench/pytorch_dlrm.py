#!/usr/bin/python3
"""Reference for bench/python_model.sh dlrm: the DLRM example
(examples/dlrm/model.py) trained by plain PyTorch on the same synthetic
clicks (tally._native.make_clicks: the samples Tally's workers make), its
26 tables as nn.EmbeddingBag(sparse=True) looked up by the ids' hashed rows
(as Tally's hashed tables, started from the same rows), SGD(lr 0.1) on the
towers and torch.optim.Adagrad(lr 0.02) on the tables; one thread per
process, batch 256 per process, STEPS steps per process: --procs 1 is a
plain loop, --procs 2 DistributedDataParallel (gloo, which all-reduces the
tables' sparse gradients) with the samples split across the processes.
The clock starts after the data is made and the model built (a barrier).
--rows sets each table's rows (the example's 20,000 by default).
Prints {"samples_per_sec", "train_seconds", "test_loss", "test_auc",
"peak_rss", "wire_bytes_per_step"} (rank 0's evaluation of the final
weights: log-loss and AUC over the test split; each rank's peak resident
bytes, and the bytes each rank wrote in the training loop, its sockets'
all-reduces, over its steps: lists in rank order).
"""
import argparse
import json
import math
import os
import resource
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "build", "python"))
from tally import _native  # noqa: E402


class HashedBag(nn.Module):
    def __init__(self, name, rows, dim, seed):
        super().__init__()
        self.salt, self.rows = _native.table_salt(name), rows
        self.bag = nn.EmbeddingBag(rows, dim, mode="sum", sparse=True)
        with torch.no_grad():
            self.bag.weight.copy_(torch.from_numpy(_native.init_table(
                name, rows, dim, seed, "uniform", math.sqrt(1 / rows))))

    def forward(self, ids):
        return self.bag(torch.from_numpy(_native.hash_rows(ids.numpy(), self.salt, self.rows)))


def written():
    """The bytes this process has written (its sockets' too)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("wchar:"))


@torch.no_grad()
def evaluate(model, x, y):
    model.eval()
    logits = torch.cat([model(x[i:i + 1024]) for i in range(0, len(x), 1024)])
    loss = float(F.binary_cross_entropy_with_logits(logits, y.float()))
    return loss, _native.auc(logits.double().tolist(), y.int().tolist())


def train(rank, args, queue):
    torch.set_num_threads(1)
    if args.procs > 1:
        os.environ["MASTER_ADDR"] = args.master
        os.environ["MASTER_PORT"] = str(args.port)
        dist.init_process_group("gloo", rank=rank, world_size=args.procs)
    (tx, ty), (vx, vy), _ = _native.make_clicks(args.train_size, args.test_size,
                                                 cardinality=args.cardinality, seed=1)
    tx, ty = torch.from_numpy(tx), torch.from_numpy(ty).long()
    sys.path.insert(0, os.path.join(ROOT, "examples", "dlrm"))
    import model as example
    torch.manual_seed(args.seed)
    model = example.make_model()
    for k in range(example.CATEGORICAL):
        model.tables[k] = HashedBag(f"tables.{k}", args.rows or example.ROWS, example.DIM,
                                    args.seed)
    tables = [p for n, p in model.named_parameters() if n.startswith("tables.")]
    towers = [p for n, p in model.named_parameters() if not n.startswith("tables.")]
    net = nn.parallel.DistributedDataParallel(model) if args.procs > 1 else model
    opt = torch.optim.SGD(towers, lr=0.1)
    table_opt = torch.optim.Adagrad(tables, lr=0.02)
    g = torch.Generator()
    g.manual_seed(args.seed)
    per_epoch = len(tx) // args.procs // args.batch_size
    if args.procs > 1:
        dist.barrier()
    wrote = written()
    start = time.perf_counter()
    for s in range(args.steps):
        if s % per_epoch == 0:
            perm = torch.randperm(len(tx), generator=g)[rank::args.procs]
        idx = perm[(s % per_epoch) * args.batch_size:][:args.batch_size]
        loss = F.binary_cross_entropy_with_logits(net(tx[idx]), ty[idx].float())
        opt.zero_grad()
        table_opt.zero_grad()
        loss.backward()
        opt.step()
        table_opt.step()
    if args.procs > 1:
        dist.barrier()
    elapsed = time.perf_counter() - start
    mine = {"rank": rank, "wire": (written() - wrote) / args.steps,
            "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    if rank == 0:
        loss, auc = evaluate(model, torch.from_numpy(vx), torch.from_numpy(vy))
        mine.update({"samples_per_sec": args.steps * args.batch_size * args.procs / elapsed,
                     "train_seconds": elapsed, "test_loss": loss, "test_auc": auc})
    queue.put(mine)
    if args.procs > 1:
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--procs", type=int, default=1)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--batch_size", type=int, default=256)
    ap.add_argument("--train_size", type=int, default=262144)
    ap.add_argument("--test_size", type=int, default=8192)
    ap.add_argument("--cardinality", type=int, default=10000)
    ap.add_argument("--rows", type=int, default=0, help="each table's rows (0: the example's)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--port", type=int, default=29544)
    ap.add_argument("--master", default="127.0.0.1", help="rank 0's address")
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    if args.procs == 1:
        train(0, args, queue)
    else:
        mp.spawn(train, args=(args, queue), nprocs=args.procs, join=True)
    ranks = sorted((queue.get() for _ in range(args.procs)), key=lambda r: r["rank"])
    out = {k: v for k, v in ranks[0].items() if k not in ("rank", "wire", "rss")}
    out["peak_rss"] = [r["rss"] for r in ranks]
    out["wire_bytes_per_step"] = [r["wire"] for r in ranks]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
