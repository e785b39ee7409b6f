#!/usr/bin/python3
"""A table of 2^26 rows x 16 (4 GiB of float32, as much again in Adagrad's
sums) trains over four shard processes, none of which holds it whole (TALLY_LARGE_SHARDS and
TALLY_LARGE_BOUND_GIB change the four shards and their 3 GiB).

The model's nn.EmbeddingBag is built on the meta device (the worker never
holds the table either), and its forward sweeps the ids: each step looks up
the next 335,552 rows, so that 200 steps touch every row of the table once.
Each shard runs with --max_table_bytes=3 GiB. The test checks that

  - the job SUCCEEDS after 200 steps;
  - the shards together hold every row (2^26), and every row pushed was
    stepped (the job's table figures);
  - each shard's peak resident memory (VmHWM) is over its quarter's 2 GiB
    of values and sums, under its bound, and under the table's own 4 GiB
    of values: no process held it whole.

It runs for about two minutes (114 s on two cores) and takes 12 GiB: ctest runs it
alone, and only when asked (label `large`: deploy/test.sh runs it with
TALLY_LARGE_TESTS=1, or `ctest -L large`).

  large_table_test.py BUILD_DIR
"""
import os
import shutil
import sys
import tempfile
import time

try:
    from cluster_util import Cluster, fail
    import torch  # noqa: F401 - the worker's, checked here to skip early
    from tally import tally_pb2 as pb
except ImportError as e:
    print(f"SKIP: {e}")
    sys.exit(77)

ROWS, DIM, STEPS, BATCH = 1 << 26, 16, 200, 64
PER_SAMPLE = 5243                 # ids a sample pools
PER_STEP = BATCH * PER_SAMPLE     # 335,552: 200 steps cover 2^26 rows
# --max_table_bytes of each shard, and the shards: 3 GiB over 4 by
# default; TALLY_LARGE_BOUND_GIB=2 TALLY_LARGE_SHARDS=6 trains the table
# (8 GiB with its sums) at four times what one process may hold.
BOUND = int(float(os.environ.get("TALLY_LARGE_BOUND_GIB", "3")) * (1 << 30))
SHARDS = int(os.environ.get("TALLY_LARGE_SHARDS", "4"))

MODEL = '''
import torch
from torch import nn

ROWS, DIM, BATCH, PER_SAMPLE = %d, %d, %d, %d


class Sweep(nn.Module):
    """Each step pools the next BATCH * PER_SAMPLE rows of the table, one
    run of PER_SAMPLE a sample, beside the sample's own features."""

    def __init__(self):
        super().__init__()
        # On the meta device: its 4 GiB live on the shards only.
        self.table = nn.EmbeddingBag(ROWS, DIM, mode="mean", device="meta")
        self.head = nn.Linear(DIM + 8, 4)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def forward(self, x):
        b = x.shape[0]
        start = int(self.calls) * BATCH * PER_SAMPLE
        self.calls += 1
        ids = (torch.arange(b * PER_SAMPLE, dtype=torch.int64) + start) %% ROWS
        offsets = torch.arange(0, b * PER_SAMPLE, PER_SAMPLE, dtype=torch.int64)
        pooled = self.table(ids, offsets)
        return self.head(torch.cat([pooled, x], dim=1))


def make_model():
    return Sweep()
''' % (ROWS, DIM, BATCH, PER_SAMPLE)

SPEC = f"""name: large-table
model:
  python: {{file: model.py}}
  loss: cross_entropy
  embeddings:
    - {{name: table, ids: direct, num_embeddings: {ROWS}, dim: {DIM}, init: uniform,
       optimizer: {{type: adagrad, lr: 0.01}}}}
dataset: {{name: synthetic, train_size: {STEPS * BATCH}, test_size: 64, features: 8, classes: 4}}
training: {{epochs: 1, batch_size: {BATCH}, max_steps: {STEPS}, seed: 3, workers: 1, shards: {SHARDS}}}
optimizer: {{type: sgd, lr: 0.1}}
"""


def peak_rss(proc):
    """The process's peak resident set (VmHWM), in bytes."""
    with open(f"/proc/{proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    fail(f"no VmHWM for process {proc.pid}")


def main():
    tmp = tempfile.mkdtemp(prefix="tally-large-table-")
    with open(f"{tmp}/model.py", "w") as f:
        f.write(MODEL)
    with open(f"{tmp}/job.yaml", "w") as f:
        f.write(SPEC)
    cluster = Cluster(tmp, shards=SHARDS, shard_args=[f"--max_table_bytes={BOUND}"])
    try:
        worker = cluster.python_worker("pyworker")
        start = time.time()
        job = cluster.client.submit(f"{tmp}/job.yaml")
        job = cluster.client.wait(job.id, timeout=900)
        took = time.time() - start
        if job.state != pb.SUCCEEDED:
            fail(f"{job.id} {pb.JobState.Name(job.state)}: {job.message}\n"
                 + cluster.log("pyworker") + "".join(cluster.log(f"shard{i}")
                                                    for i in range(SHARDS)))
        if job.metrics.step != STEPS:
            fail(f"the job ended at step {job.metrics.step}")
        table = {t.name: t for t in job.metrics.tables}["table"]
        if table.rows != ROWS:
            fail(f"the shards hold {table.rows} rows of {ROWS}")
        if table.rows_applied != STEPS * PER_STEP:
            fail(f"{table.rows_applied} rows stepped, {STEPS * PER_STEP} pushed")
        values = ROWS * DIM * 4
        # Each shard holds its quarter: its values and sums at least (2
        # GiB), under its bound and under the table's values alone.
        share = ROWS // SHARDS * DIM * 4 * 2
        print(f"the table with its sums is {ROWS * DIM * 8 / BOUND:.1f} times a shard's bound")
        rss = [peak_rss(p) for p in cluster.shards]
        for i, b in enumerate(rss):
            if not 0.95 * share < b < min(BOUND, values):
                fail(f"shard {i}: peak RSS {b / 2**30:.2f} GiB (its share {share / 2**30:.0f} "
                     f"GiB, bound {BOUND / 2**30:.0f} GiB, the table's values "
                     f"{values / 2**30:.0f} GiB)")
        print(f"large table: {ROWS} x {DIM} rows ({values / 2**30:.0f} GiB of values, as much "
              f"in Adagrad's sums) over {SHARDS} shards, {STEPS} steps in {took:.0f} s; "
              f"peak RSS per shard "
              f"{', '.join(f'{b / 2**30:.2f}' for b in rss)} GiB (bound "
              f"{BOUND / 2**30:.0f}); worker {peak_rss(worker) / 2**30:.2f} GiB")
    finally:
        cluster.stop()
    shutil.rmtree(tmp, ignore_errors=True)
    print("PASS")


if __name__ == "__main__":
    main()
