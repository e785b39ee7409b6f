#!/usr/bin/python3
"""Sparse embedding tables (model.embeddings) trained by a Python worker
over three shard processes.

  equal      a byte-level model with an nn.Embedding (ids: direct) and an
             nn.EmbeddingBag (ids: hashed into 97 rows), its tables on the
             shards, trains bit for bit as its dense twin does (the same
             module with both tables as ordinary parameters, started from
             the rows the shards make, looking the hashed ids up itself):
             plain SGD, over 1, 2 and 3 shards; every dense parameter and
             the test loss are equal. The job's table figures: only rows
             the batches touch move (at most the 97 and 256 rows exist),
             row bytes are rows * dim * 4, and the messages carry little
             more than them.
  two        the same on two workers over two shards: the rows of both
             workers' batches summed on the shards, bit for bit the dense
             twin's on two workers.
  hybrid     tables: async on two workers (the dense part bsp): every
             push's rows stepped alone as they come, so the tables train
             as sync on twice their learning rate, within 1e-4, and far
             from sync on it.
  modes      tables under ssp and async: ssp with staleness 0 is bit for
             bit bsp on two workers; ssp(2) and async train and end, async
             stepping every push's rows alone.
  adagrad    the same with both tables on Adagrad, over 2 shards, against a
             plain PyTorch loop on the batches the worker trained: SGD on
             the dense parameters, torch.optim.Adagrad on the tables.
  adam       the same with both tables on lazy Adam, against the loop with
             sparse modules and torch.optim.SparseAdam.
  dlrm       the example's DLRM (examples/dlrm: 26 hashed tables on Adagrad,
             each naming its input column, so that a step pulls every
             table's rows before the forward pass, one message per shard)
             on synthetic clicks, one worker, 50 steps over 2 shards,
             against PyTorch with nn.EmbeddingBag(sparse=True) and the same
             optimizers (SGD on the towers, torch.optim.Adagrad on the
             tables), on the batches the worker trained.
  criteo     the dlrm's clicks samples written as Criteo TSV files (zero
             counts left empty, the test file's lines ending in CRLF)
             train the DLRM bit for bit as the clicks dataset does; a bad
             line FAILS the job naming the file, line and field.
  dynamic    a dynamic table keyed by the byte ids trains bit for bit as
             the direct one; its export is the ids it holds and their rows;
             with min_count and evict_after_steps ids are filtered and
             stale rows dropped, as the metrics and the export say.
  lost       a shard killed mid-job (coordinator --state_dir, shards
             --table_dir): the job resumes from the checkpoint, tables
             loaded from the shards' files, and ends bit for bit as the
             job undisturbed, no worker restarted.
  respawn    a shard killed -9 and started again on its port at two steps
             of one DLRM job (1 s later, before its lease lapses, and 3 s
             later, after): the job rolls back to its checkpoint each time,
             the worker's runner of the old placement ends without failing
             it, and it SUCCEEDS with the undisturbed job's test AUC and
             loss exactly.
  restart    after a coordinator restart (--state_dir) an ended job's
             tables still come with `tally fetch`, from the shards that
             kept them, found by the addresses the job's file keeps.
  errors     an id outside a direct table FAILS the job naming the table
             and the id; a table that is not the model's, or whose dim
             differs, is refused at submit; a dynamic table with
             num_embeddings is refused naming the field; the worker and shards train the next job.

  sparse_test.py BUILD_DIR [PHASE...]   (all phases when none named)
"""
import glob
import math
import os
import shutil
import sys
import tempfile
import time

import numpy as np

try:
    from cluster_util import Cluster, fail
    import torch
    import torch.nn.functional as F
    import tally
    from tally import _native
    from tally import tally_pb2 as pb
    from tally.client import SubmitError
    from tally.engine import ModelError
except ImportError as e:
    print(f"SKIP: {e}")
    sys.exit(77)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = "/usr/share/common-licenses/GPL-3"
SEED, STEPS, BATCH, SEQ, LR = 5, 30, 8, 24, 0.1
TABLE_LR = 0.05

MODEL = '''
import math
import os
import numpy as np
import torch
from torch import nn
from tally import _native

SEED = %d
RECORD = os.environ.get("TALLY_RECORD")


class LM(nn.Module):
    """Bytes -> an embedding per byte, a bag (mean) of the window's hashed
    bytes, a hidden layer, the next byte's logits."""

    def __init__(self, dense=False, record=False):
        super().__init__()
        self.emb = nn.Embedding(256, 16)
        self.bag = nn.EmbeddingBag(97, 8, mode="mean")
        self.mix = nn.Linear(24, 32)
        self.out = nn.Linear(32, 256)
        self.dense, self.record, self.seen = dense, record, 0
        if dense:
            # The rows the shards would make.
            with torch.no_grad():
                self.emb.weight.copy_(torch.from_numpy(
                    _native.init_table("emb", 256, 16, SEED, "normal", 1.0)))
                self.bag.weight.copy_(torch.from_numpy(
                    _native.init_table("bag", 97, 8, SEED, "uniform", math.sqrt(1 / 97))))

    def forward(self, x):
        if self.record and RECORD and self.training:
            np.save(f"{RECORD}/{self.seen:04d}.npy", x.numpy())
            self.seen += 1
        ids = x
        if self.dense:  # what a hashed table does with ids
            ids = torch.from_numpy(_native.hash_rows(x.numpy(), _native.table_salt("bag"), 97))
        e = self.emb(x)
        b = self.bag(ids).unsqueeze(1).expand(-1, x.shape[1], -1)
        return self.out(torch.tanh(self.mix(torch.cat([e, b], dim=2))))


def make_dense():
    return LM(dense=True)


def make_sparse():
    return LM()


def make_recorded():
    return LM(record=True)


def make_small():
    m = LM()
    m.emb = nn.Embedding(100, 16)  # ids are bytes: up to 255
    return m
''' % SEED


def spec(tmp, build, shards=1, tables=None, steps=STEPS, name=None, workers=1, epochs=1,
         consistency=""):
    name = name or f"{build}-{shards}"
    lines = [f"name: {name}",
             "model:",
             f"  python: {{file: model.py, build: {build}}}",
             "  loss: cross_entropy"]
    if tables:
        lines.append("  embeddings:")
        for t in tables:
            lines.append("    - {" + ", ".join(f"{k}: {v}" for k, v in t.items()) + "}")
    lines += [f"dataset: {{name: text, train: {CORPUS}, seq_len: {SEQ}}}",
              f"training: {{epochs: {epochs}, batch_size: {BATCH}, max_steps: {steps}, "
              f"seed: {SEED}, workers: {workers}, shards: {shards}"
              + (f", consistency: {consistency}" if consistency else "") + "}",
              f"optimizer: {{type: sgd, lr: {LR}}}"]
    path = f"{tmp}/{name}.yaml"
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


SGD_TABLES = [{"name": "emb", "ids": "direct"},
              {"name": "bag", "ids": "hashed", "init": "uniform"}]


def run(cluster, path, worker="pyworker"):
    job = cluster.client.submit(path)
    job = cluster.client.wait(job.id, timeout=300)
    if job.state != pb.SUCCEEDED:
        fail(f"{job.id} {pb.JobState.Name(job.state)}: {job.message}\n" + cluster.log(worker))
    return job


def weights(cluster, tmp, job):
    out = f"{tmp}/{job.id}.safetensors"
    cluster.client.fetch(job.id, out)
    return tally.load_state_dict(out)


def check_tables(job, workers=1):
    """The job's table figures: only touched rows, and their bytes."""
    dims = {"emb": 16, "bag": 8}
    limit = {"emb": 256, "bag": 97}
    tables = {t.name: t for t in job.metrics.tables}
    if sorted(tables) != ["bag", "emb"]:
        fail(f"the job reports tables {sorted(tables)}")
    for name, t in tables.items():
        if not 0 < t.rows <= limit[name]:
            fail(f"{name}: {t.rows} rows held")
        if t.rows_pulled == 0 or t.pulled_bytes != t.rows_pulled * dims[name] * 4:
            fail(f"{name}: {t.rows_pulled} rows pulled, {t.pulled_bytes} bytes")
        if t.pushed_bytes != t.rows_pushed * dims[name] * 4:
            fail(f"{name}: {t.rows_pushed} rows pushed, {t.pushed_bytes} bytes")
        # A row's number (at most 10 bytes) and a few bytes a message.
        over = t.pull_wire_bytes - t.pulled_bytes
        if not 0 < over <= t.rows_pulled * 10 + (STEPS + 2) * 3 * 64:
            fail(f"{name}: pull messages {t.pull_wire_bytes} bytes for "
                 f"{t.pulled_bytes} of rows")
        # Each step pulls a table's unique rows once and pushes them once;
        # with one worker every row pushed is stepped, with more a row
        # several pushed is stepped once.
        applied_ok = (t.rows_applied == t.rows_pushed if workers == 1
                      else 0 < t.rows_applied <= t.rows_pushed)
        if t.rows_pushed > t.rows_pulled or not applied_ok:
            fail(f"{name}: pulled {t.rows_pulled}, pushed {t.rows_pushed}, "
                 f"applied {t.rows_applied}")
    return tables


def equal(cluster, tmp):
    dense = run(cluster, spec(tmp, "make_dense"))
    want = weights(cluster, tmp, dense)
    for shards in (1, 2, 3):
        job = run(cluster, spec(tmp, "make_sparse", shards, SGD_TABLES))
        got = weights(cluster, tmp, job)
        # The tables too: fetched from the shards, as the model's
        # emb.weight and bag.weight.
        if sorted(got) != sorted(want):
            fail(f"the sparse job exports {sorted(got)}, the dense {sorted(want)}")
        for name, t in got.items():
            if not torch.equal(t, want[name]):
                diff = float((t - want[name]).abs().max())
                fail(f"{shards} shards: {name} differs from the dense twin by {diff:.3e}")
        if job.metrics.test_loss != dense.metrics.test_loss:
            fail(f"{shards} shards: test loss {job.metrics.test_loss!r}, dense "
                 f"{dense.metrics.test_loss!r}")
        tables = check_tables(job)
        print(f"equal: {shards} shards: {len(got)} tensors (the tables' too) bit-identical, test loss "
              f"{job.metrics.test_loss:.6f}; rows held emb {tables['emb'].rows} bag "
              f"{tables['bag'].rows}, pulled {tables['emb'].rows_pulled + tables['bag'].rows_pulled}"
              f" rows, {tables['emb'].pull_wire_bytes + tables['bag'].pull_wire_bytes} bytes "
              f"of messages for {tables['emb'].pulled_bytes + tables['bag'].pulled_bytes} of rows")
    # The comparison sees the tables: on another learning rate, they differ.
    other = [dict(t, optimizer=f"{{type: sgd, lr: {2 * LR}}}") for t in SGD_TABLES]
    got = weights(cluster, tmp, run(cluster, spec(tmp, "make_sparse", 2, other, name="other-lr")))
    if all(torch.equal(t, want[name]) for name, t in got.items()):
        fail("tables on twice the learning rate trained the same dense parameters")


def two(cluster, tmp):
    dense = run(cluster, spec(tmp, "make_dense", 2, workers=2, name="dense-two"))
    job = run(cluster, spec(tmp, "make_sparse", 2, SGD_TABLES, workers=2, name="sparse-two"))
    want, got = weights(cluster, tmp, dense), weights(cluster, tmp, job)
    if sorted(got) != sorted(want):
        fail(f"two workers: the sparse job exports {sorted(got)}")
    for name, t in got.items():
        if not torch.equal(t, want[name]):
            fail(f"two workers: {name} differs from the dense twin by "
                 f"{float((t - want[name]).abs().max()):.3e}")
    tables = check_tables(job, workers=2)
    print(f"two: 2 workers, 2 shards: {len(got)} tensors (the tables' too) bit-identical, test loss "
          f"{job.metrics.test_loss:.6f}; rows pushed emb {tables['emb'].rows_pushed} "
          f"bag {tables['bag'].rows_pushed}")


def hybrid(cluster, tmp):
    """tables: async on two workers (PERSIA's hybrid: the dense part bsp):
    each worker's row gradients are stepped as they come, alone, so a row
    both workers' batches touch is stepped twice a step where sync steps
    it once with the mean; with equal batches that is sync on twice the
    tables' learning rate, but for rows one worker read after the other's
    step (the asynchrony, small at this rate)."""
    asyn = run(cluster, spec(tmp, "make_sparse", 2, SGD_TABLES, workers=2, name="hybrid",
                             consistency="{mode: bsp, tables: async}"))
    doubled = [dict(t, optimizer=f"{{type: sgd, lr: {2 * LR}}}") for t in SGD_TABLES]
    twice = run(cluster, spec(tmp, "make_sparse", 2, doubled, workers=2, name="sync-2lr"))
    once = run(cluster, spec(tmp, "make_sparse", 2, SGD_TABLES, workers=2, name="sync-lr"))
    got, near, far = (weights(cluster, tmp, j) for j in (asyn, twice, once))
    for name, t in tables_of(asyn).items():
        if t.rows_applied != t.rows_pushed:
            fail(f"hybrid: {name}: {t.rows_pushed} rows pushed, {t.rows_applied} stepped "
                 "(each push's rows are stepped alone)")
    for name, t in tables_of(once).items():
        if not t.rows_applied < t.rows_pushed:
            fail(f"sync: {name}: {t.rows_pushed} rows pushed, {t.rows_applied} stepped "
                 "(a row both workers pushed is stepped once)")
    d_near = max(float((got[n] - near[n]).abs().max()) for n in ("emb.weight", "bag.weight"))
    d_far = max(float((got[n] - far[n]).abs().max()) for n in ("emb.weight", "bag.weight"))
    if not d_near < 1e-4 or not d_far > 100 * d_near:
        fail(f"hybrid: tables {d_near:.3e} from sync at twice the rate, {d_far:.3e} from sync "
             "at the same rate")
    print(f"hybrid: 2 workers, tables async: {sum(t.rows_pushed for t in asyn.metrics.tables)} "
          f"rows pushed, all stepped; tables {d_near:.2e} from sync at twice the rate, "
          f"{d_far:.2e} from sync at the rate; test loss {asyn.metrics.test_loss:.6f} (sync "
          f"{once.metrics.test_loss:.6f})")


def modes(cluster, tmp):
    """Tables follow ssp and async. ssp with staleness 0 is bsp: bit for bit
    the bsp job on two workers, tables included. With staleness 2 and in
    async the job trains and ends; async steps every push's rows alone."""
    bsp = weights(cluster, tmp, run(cluster, spec(tmp, "make_sparse", 2, SGD_TABLES, workers=2,
                                                  name="bsp-two")))
    ssp0 = weights(cluster, tmp, run(cluster, spec(
        tmp, "make_sparse", 2, SGD_TABLES, workers=2, name="ssp0",
        consistency="{mode: ssp, staleness: 0}")))
    for name, t in ssp0.items():
        if not torch.equal(t, bsp[name]):
            fail(f"ssp staleness 0: {name} differs from bsp by "
                 f"{float((t - bsp[name]).abs().max()):.3e}")
    ssp2 = run(cluster, spec(tmp, "make_sparse", 2, SGD_TABLES, workers=2, name="ssp2",
                             consistency="{mode: ssp, staleness: 2}"))
    asyn = run(cluster, spec(tmp, "make_sparse", 2, SGD_TABLES, workers=2, name="async",
                             consistency="{mode: async}"))
    for job in (ssp2, asyn):
        if not math.isfinite(job.metrics.test_loss):
            fail(f"{job.id}: test loss {job.metrics.test_loss}")
    if ssp2.metrics.step != STEPS:
        fail(f"ssp: the job ended at step {ssp2.metrics.step} of {STEPS}")
    for name, t in tables_of(asyn).items():
        if t.rows_pushed == 0 or t.rows_applied != t.rows_pushed:
            fail(f"async: {name}: {t.rows_pushed} rows pushed, {t.rows_applied} stepped")
    for name, t in tables_of(ssp2).items():
        if not 0 < t.rows_applied <= t.rows_pushed:
            fail(f"ssp: {name}: {t.rows_pushed} rows pushed, {t.rows_applied} stepped")
    print(f"modes: ssp(0) bit for bit bsp on two workers; ssp(2) test loss "
          f"{ssp2.metrics.test_loss:.6f}, async {asyn.metrics.test_loss:.6f} (versions "
          f"{asyn.metrics.step}), every async push's rows stepped")


def tables_of(job):
    """The job's table figures by name."""
    return {t.name: t for t in job.metrics.tables}


def windows():
    """The training windows' inputs -> their labels (the stream's next
    bytes), as the text dataset cuts them."""
    data = np.frombuffer(open(CORPUS, "rb").read(), np.uint8)
    n = len(data) // (SEQ + 1)
    table = {}
    for k in range(n):
        w = data[k * (SEQ + 1):(k + 1) * (SEQ + 1)].astype(np.int64)
        key = w[:SEQ].tobytes()
        if key in table and not np.array_equal(table[key], w[1:]):
            # Two windows alike but for their next byte (SEQ 24 has none
            # in this corpus; 16 has three): the labels would be a guess.
            fail(f"the corpus has two windows {key!r} with other next bytes")
        table[key] = w[1:]
    return table


def adagrad(cluster, tmp):
    against_loop(cluster, tmp, "adagrad", lambda p: torch.optim.Adagrad(p, lr=TABLE_LR), 1e-6)


def adam(cluster, tmp):
    against_loop(cluster, tmp, "adam", lambda p: torch.optim.SparseAdam(p, lr=TABLE_LR), 1e-6,
                 sparse=True)


def against_loop(cluster, tmp, kind, make_opt, bound, sparse=False):
    """Both tables on `kind` against a plain PyTorch loop on the batches
    the worker trained: SGD on the dense parameters, make_opt on the
    tables (as sparse nn.Embedding(Bag)s when `sparse`)."""
    record = f"{tmp}/batches"
    tables = [dict(t, optimizer=f"{{type: {kind}, lr: {TABLE_LR}}}") for t in SGD_TABLES]
    job = run(cluster, spec(tmp, "make_recorded", 2, tables, name=kind))
    got = weights(cluster, tmp, job)
    batches = [np.load(p) for p in sorted(glob.glob(f"{record}/*.npy"))]
    if len(batches) != STEPS:
        fail(f"the worker trained {len(batches)} batches, not {STEPS}")
    labels = windows()
    ns = {}
    exec(compile(MODEL, "model.py", "exec"), ns)
    torch.manual_seed(SEED)
    model = ns["make_dense"]()
    model.emb.sparse = model.bag.sparse = sparse
    model.train()
    tables_params = [model.emb.weight, model.bag.weight]
    dense_params = [p for n, p in model.named_parameters() if not n.startswith(("emb.", "bag."))]
    opt = torch.optim.SGD(dense_params, lr=LR)
    table_opt = make_opt(tables_params)
    for x in batches:
        y = torch.from_numpy(np.stack([labels[row.tobytes()] for row in x]))
        opt.zero_grad()
        table_opt.zero_grad()
        out = model(torch.from_numpy(x))
        F.cross_entropy(out.reshape(-1, 256), y.reshape(-1)).backward()
        opt.step()
        table_opt.step()
    worst = 0.0
    for name, t in model.state_dict().items():
        worst = max(worst, float((got[name].double() - t.double()).abs().max()))
    print(f"{kind}: 2 shards against the plain loop (SGD + torch.optim."
          f"{type(table_opt).__name__}): parameters and tables within {worst:.2e} "
          f"after {STEPS} steps")
    if worst > bound:
        fail(f"the parameters or tables differ from the plain loop by {worst:.2e}")


DLRM_RECORDER = """

import os as _os
import numpy as _np


class Recorded(DLRM):
    def __init__(self):
        super().__init__()
        self.seen = 0

    def forward(self, x):
        where = _os.environ.get("TALLY_RECORD")
        if where and self.training:
            _np.save(f"{where}/dlrm-x-{self.seen:04d}.npy", x.numpy())
            self.seen += 1
        return super().forward(x)


def make_recorded():
    return Recorded()
"""


class HashedBag(torch.nn.Module):
    """What a hashed table does, in plain PyTorch: the ids' rows, then a
    sparse nn.EmbeddingBag started from the rows the shards make."""

    def __init__(self, name, rows, dim, seed):
        super().__init__()
        self.salt, self.rows = _native.table_salt(name), rows
        self.bag = torch.nn.EmbeddingBag(rows, dim, mode="sum", sparse=True)
        with torch.no_grad():
            self.bag.weight.copy_(torch.from_numpy(_native.init_table(
                name, rows, dim, seed, "uniform", math.sqrt(1 / rows))))

    def forward(self, ids):
        return self.bag(torch.from_numpy(_native.hash_rows(ids.numpy(), self.salt, self.rows)))


def dlrm_job(tmp, name, dataset, steps, batch, build="make_recorded", epochs=1):
    """The example's DLRM as a job over 2 shards: each table names its
    column, so a step pulls every table's rows at once."""
    tables = "\n".join(f"    - {{name: tables.{k}, features: [{13 + k}], ids: hashed, "
                        f"init: uniform, optimizer: {{type: adagrad, lr: {TABLE_LR}}}}}"
                        for k in range(26))
    path = f"{tmp}/dlrm/{name}.yaml"
    with open(path, "w") as f:
        f.write(f"""name: {name}
model:
  python: {{file: model.py, build: {build}}}
  loss: binary_cross_entropy
  embeddings:
{tables}
dataset: {dataset}
training: {{epochs: {epochs}, batch_size: {batch}, max_steps: {steps}, seed: {SEED}, workers: 1, shards: 2}}
optimizer: {{type: sgd, lr: {LR}}}
""")
    return path


def write_dlrm(tmp):
    with open(f"{ROOT}/examples/dlrm/model.py") as f:
        code = f.read() + DLRM_RECORDER
    os.makedirs(f"{tmp}/dlrm", exist_ok=True)
    with open(f"{tmp}/dlrm/model.py", "w") as f:
        f.write(code)
    return code


CLICKS = "{name: clicks, train_size: 4096, test_size: 1024, cardinality: 5000}"


def dlrm(cluster, tmp):
    steps, batch = 50, 64
    code = write_dlrm(tmp)
    path = dlrm_job(tmp, "dlrm-test", CLICKS, steps, batch)
    job = run(cluster, path)
    got = weights(cluster, tmp, job)
    xs = sorted(glob.glob(f"{tmp}/batches/dlrm-x-*.npy"))
    if len(xs) != steps:
        fail(f"the worker trained {len(xs)} batches, not {steps}")
    ns = {}
    exec(compile(code, "model.py", "exec"), ns)
    # One intra-op thread, as the worker's: a matmul's sums in its order.
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    model = ns["make_model"]()
    for k in range(26):
        model.tables[k] = HashedBag(f"tables.{k}", ns["ROWS"], ns["DIM"], SEED)
    model.train()
    sparse = [p for n, p in model.named_parameters() if n.startswith("tables.")]
    dense = [p for n, p in model.named_parameters() if not n.startswith("tables.")]
    opt = torch.optim.SGD(dense, lr=LR)
    table_opt = torch.optim.Adagrad(sparse, lr=TABLE_LR)
    (train_x, train_y), (test_x, test_y), teacher = _native.make_clicks(
        4096, 1024, cardinality=5000, seed=1)
    label = {row.tobytes(): int(y) for row, y in zip(train_x, train_y)}
    for xf in xs:
        x = np.load(xf)
        y = torch.tensor([label[row.tobytes()] for row in x], dtype=torch.float32)
        opt.zero_grad()
        table_opt.zero_grad()
        F.binary_cross_entropy_with_logits(model(torch.from_numpy(x)), y).backward()
        opt.step()
        table_opt.step()
    worst = 0.0
    for name, t in model.state_dict().items():
        # HashedBag's tables.K.bag.weight is the file's tables.K.weight.
        got_t = got[name.replace(".bag.weight", ".weight")]
        worst = max(worst, float((got_t.double() - t.double()).abs().max()))
    touched = {t.name: t.rows for t in job.metrics.tables}
    # The job's AUC is the test split's, all of it at once: the final
    # weights' scores, as PyTorch's metric of the same scores would be.
    model.eval()
    with torch.no_grad():
        scores = model(torch.from_numpy(test_x)).double()
    want_auc = _native.auc(scores.tolist(), test_y.astype(np.int64).tolist())
    best = _native.auc(list(teacher), test_y.astype(np.int64).tolist())
    if abs(job.metrics.test_auc - want_auc) > 1e-4 or not 0.5 < job.metrics.test_auc < best:
        fail(f"the job's test AUC {job.metrics.test_auc:.6f}; the weights' {want_auc:.6f}, "
             f"the teacher's {best:.4f}")
    print(f"dlrm: 26 tables over 2 shards against PyTorch's sparse EmbeddingBag + Adagrad: "
          f"parameters and tables within {worst:.2e} after {steps} steps; "
          f"{sum(touched.values())} rows held of {26 * ns['ROWS']}; "
          f"test log-loss {job.metrics.test_loss:.4f}, AUC {job.metrics.test_auc:.4f} "
          f"(the teacher's {best:.4f})")
    if worst > 1e-5:
        fail(f"the DLRM's parameters or tables differ from PyTorch's by {worst:.2e}")
    if len(touched) != 26 or not 0 < sum(touched.values()) < 26 * ns["ROWS"]:
        fail(f"the tables report {touched}")


def criteo_lines(x, y, crlf):
    """Samples as Criteo's TSV: the label, the counts in decimal (a zero
    left empty, as Criteo's missing values), the ids in 8-digit hex."""
    out = []
    for row, label in zip(x, y):
        ints = ["" if v == 0 else str(v) for v in row[:13]]
        ids = [f"{v:08x}" for v in row[13:]]
        out.append("\t".join([str(int(label))] + ints + ids) + ("\r\n" if crlf else "\n"))
    return "".join(out)


def criteo(cluster, tmp):
    """The clicks samples written as Criteo's TSV files train the DLRM bit
    for bit as the clicks dataset does: the reader gives the same samples,
    missing counts as 0, CRLF lines as LF ones."""
    write_dlrm(tmp)
    (train_x, train_y), (test_x, test_y), _ = _native.make_clicks(
        4096, 1024, cardinality=5000, seed=1)
    if not (train_x[:, 13:] < 2 ** 32).all() or not (train_x[:, :13] == 0).any():
        fail("the clicks ids are not 32-bit, or no count is 0")
    with open(f"{tmp}/dlrm/train.tsv", "w") as f:
        f.write(criteo_lines(train_x, train_y, crlf=False))
    with open(f"{tmp}/dlrm/test.tsv", "w") as f:
        f.write(criteo_lines(test_x, test_y, crlf=True))
    data = (f"{{name: criteo, train: {tmp}/dlrm/train.tsv, test: {tmp}/dlrm/test.tsv}}")
    a = run(cluster, dlrm_job(tmp, "dlrm-clicks", CLICKS, 20, 64, "make_model"))
    b = run(cluster, dlrm_job(tmp, "dlrm-criteo", data, 20, 64, "make_model"))
    wa, wb = weights(cluster, tmp, a), weights(cluster, tmp, b)
    differ = [n for n in wa if not torch.equal(wa[n], wb[n])]
    if differ or a.metrics.test_auc != b.metrics.test_auc:
        fail(f"criteo against clicks: {differ} differ; AUC {b.metrics.test_auc} "
             f"against {a.metrics.test_auc}")
    # A bad line fails the job naming the file, the line and the field.
    with open(f"{tmp}/dlrm/bad.tsv", "w") as f:
        f.write(criteo_lines(train_x[:9], train_y[:9], crlf=False))
        f.write("1\t" + "\t".join(["2"] * 13) + "\t" + "\t".join(["zz"] * 26) + "\n")
    bad = cluster.client.submit(dlrm_job(
        tmp, "dlrm-bad", f"{{name: criteo, train: {tmp}/dlrm/bad.tsv}}", 2, 4, "make_model"))
    bad = cluster.client.wait(bad.id, timeout=120)
    want = f"{tmp}/dlrm/bad.tsv:10: field 15 (C1) is not 1 to 16 hexadecimal digits"
    if bad.state != pb.FAILED or want not in bad.message:
        fail(f"a bad Criteo line: {pb.JobState.Name(bad.state)} {bad.message!r}")
    print(f"criteo: the clicks samples as TSV files train bit for bit as clicks "
          f"({len(wa)} tensors, AUC {b.metrics.test_auc:.4f}); a bad line FAILED: "
          f"{bad.message[-80:]!r}")


def dynamic(cluster, tmp):
    """A dynamic table keyed by the byte ids trains bit for bit as the
    direct table of 256 rows (a row's initial values depend on the table
    and the id alone); its export is the ids it holds and their rows,
    which are the direct table's rows at those ids. With a frequency
    filter and eviction, ids seen once get no row, stale rows go, and the
    export holds what the metrics say is held."""
    direct = run(cluster, spec(tmp, "make_sparse", 2, SGD_TABLES, name="direct"))
    tables = [{"name": "emb", "dynamic": "true"}, SGD_TABLES[1]]
    job = run(cluster, spec(tmp, "make_sparse", 2, tables, name="dynamic"))
    want, got = weights(cluster, tmp, direct), weights(cluster, tmp, job)
    ids, rows = got.pop("emb.ids"), got.pop("emb.rows")
    if sorted(got) != sorted(k for k in want if k != "emb.weight"):
        fail(f"the dynamic job exports {sorted(got)}")
    for name, t in got.items():
        if not torch.equal(t, want[name]):
            fail(f"dynamic: {name} differs from the direct table's job")
    held = {t.name: t for t in job.metrics.tables}["emb"]
    if len(ids) != held.rows or len(set(ids.tolist())) != len(ids) or \
            not torch.equal(rows, want["emb.weight"][ids]):
        fail(f"dynamic: {len(ids)} ids exported, {held.rows} held, or their rows differ")
    tables = [{"name": "emb", "dynamic": "true", "min_count": 3, "evict_after_steps": 4},
              SGD_TABLES[1]]
    bounded = run(cluster, spec(tmp, "make_sparse", 2, tables, name="bounded"))
    out = weights(cluster, tmp, bounded)
    b = {t.name: t for t in bounded.metrics.tables}["emb"]
    if not (b.rows_filtered > 0 and b.rows_evicted > 0 and b.rows < held.rows
            and len(out["emb.ids"]) == b.rows):
        fail(f"bounded: filtered {b.rows_filtered}, evicted {b.rows_evicted}, "
             f"{b.rows} rows held ({held.rows} unbounded), {len(out['emb.ids'])} exported")
    print(f"dynamic: 2 shards, bit for bit as the direct table; {len(ids)} ids exported with "
          f"their rows; min_count 3 + evict_after_steps 4: {b.rows_filtered} pulls filtered, "
          f"{b.rows_evicted} rows evicted, {b.rows} held of {held.rows}")


def lost(cluster, tmp):
    """A shard killed mid-job: the job is placed again on the shards left
    from the coordinator's last checkpoint, each range loading the rows
    its slot now owns from the table files the shards wrote
    (--table_dir); it SUCCEEDS with no worker restarted, bit for bit as
    the same job undisturbed (dense parameters and tables)."""
    base = f"{tmp}/lost"
    os.makedirs(base)
    c = Cluster(base, shards=3,
                server_args=[f"--state_dir={base}/state", "--checkpoint_interval_s=0.2"],
                shard_args=[f"--table_dir={base}/tables"])
    try:
        w = c.python_worker("w")
        tables = [dict(t, optimizer=f"{{type: adagrad, lr: {TABLE_LR}}}") for t in SGD_TABLES]
        steps = 400
        calm = run(c, spec(tmp, "make_sparse", 2, tables, steps=steps, name="calm", epochs=3), "w")
        want = weights(c, tmp, calm)  # its tables are on its shards: before the kill
        job = c.client.submit(spec(tmp, "make_sparse", 2, tables, steps=steps, name="hit",
                                   epochs=3))
        victim = None
        for _ in range(600):
            j = c.client.status(job.id)
            if j.metrics.step >= steps // 3 and glob.glob(f"{base}/tables/{job.id}/*.tbl"):
                shards = c.client._call("ListShards", pb.ListShardsRequest,
                                        pb.ListShardsResponse)(pb.ListShardsRequest(), timeout=10)
                held = {s.address for s in shards.shards for r in s.ranges
                        if r.job_id == job.id}
                victim = next(i for i, p in enumerate(c.shards)
                              if any(f"--advertise={a}" in p.args for a in held))
                break
            time.sleep(0.05)
        if victim is None:
            fail("the job did not reach a third of its steps with a table checkpoint")
        killed_at = c.client.status(job.id).metrics.step
        c.shards[victim].kill()
        job = c.client.wait(job.id, timeout=300)
        if job.state != pb.SUCCEEDED:
            fail(f"after the kill: {pb.JobState.Name(job.state)}: {job.message}\n" + c.log("w"))
        if w.poll() is not None:
            fail("the worker process died")
        history = c.client._call("GetJobHistory", pb.GetJobRequest, pb.JobHistory)(
            pb.GetJobRequest(job_id=job.id), timeout=10)
        events = [e.text for e in history.events]
        resumed = [e for e in events if "starts again from the checkpoint of step" in e]
        if not resumed:
            fail(f"no resumption from a checkpoint in {events}")
        got = weights(c, tmp, job)
        differ = [n for n in want if not torch.equal(want[n], got[n])]
        if differ:
            fail(f"after the shard loss {differ} differ from the undisturbed job")
        # The shards drop an ended job at their next heartbeat's answer.
        for _ in range(100):
            if not os.path.exists(f"{base}/tables/{job.id}"):
                break
            time.sleep(0.1)
        else:
            fail("the ended job's table files are still there after 10 s")
        print(f"lost: shard killed at step {killed_at}; {resumed[0]!r}; SUCCEEDED with every "
              f"tensor (tables too) bit for bit the undisturbed job's")
    finally:
        c.stop()


def history(c, job_id):
    """The job's events, oldest first."""
    h = c.client._call("GetJobHistory", pb.GetJobRequest, pb.JobHistory)(
        pb.GetJobRequest(job_id=job_id), timeout=10)
    return [e.text for e in h.events]


def table_maps(base, job_id):
    """The placements (map versions) whose table files the job has."""
    names = glob.glob(f"{base}/tables/{job_id}/*.tbl")
    return {os.path.basename(n).split("-")[0] for n in names}


def reach(c, job_id, step, base, older, what):
    """Waits until the job is at `step` or past it with a table checkpoint
    of a placement not in `older`; its step then."""
    for _ in range(1200):
        j = c.client.status(job_id)
        if j.state != pb.RUNNING:
            fail(f"{what}: the job is {pb.JobState.Name(j.state)}: {j.message}\n"
                 + c.log("w"))
        if j.metrics.step >= step and table_maps(base, job_id) - older:
            return j.metrics.step
        time.sleep(0.05)
    fail(f"{what}: the job did not reach step {step} with a table checkpoint of "
         f"its placement in 60 s")


def respawn(cluster, tmp):
    """A shard killed -9 and started again on its port, twice in one DLRM
    job on two shards (coordinator --state_dir, shards --table_dir): at
    about a third of the steps, started again 1 s later (within the 2 s
    lease, as a rule: the job is placed again on the restarted one as soon
    as the dead one is lost, and the worker's calls of the old placement
    meet the restored ranges at the old address), and at about two thirds,
    started again 3 s later (past the lease: the job waits for its second
    shard). Each time the job rolls back to its last checkpoint, tables
    from the shards' files, and the runner of the old placement ends
    without failing the job. It SUCCEEDS, no worker restarted, with the
    undisturbed job's test AUC and loss exactly."""
    base = f"{tmp}/respawn"
    os.makedirs(base)
    write_dlrm(tmp)
    c = Cluster(base, shards=2,
                server_args=[f"--state_dir={base}/state", "--checkpoint_interval_s=0.2"],
                shard_args=[f"--table_dir={base}/tables"])
    try:
        w = c.python_worker("w")
        steps, batch, epochs = 192, 64, 3  # CLICKS' 4096 samples: 64 steps an epoch
        calm = run(c, dlrm_job(tmp, "respawn-calm", CLICKS, steps, batch, "make_model",
                               epochs), "w")
        job = c.client.submit(dlrm_job(tmp, "respawn-hit", CLICKS, steps, batch,
                                       "make_model", epochs))
        kills, older = [], set()
        for n, (at, delay) in enumerate(((steps // 3, 1.0), (2 * steps // 3, 3.0))):
            kills.append(reach(c, job.id, at, base, older, f"kill {n + 1}"))
            older = table_maps(base, job.id)
            victim = c.shards[1]
            victim.kill()
            victim.wait()
            time.sleep(delay)
            c.shards[1] = c.start(f"shard1-again{n + 1}", victim.args)
            placed = 0
            for _ in range(600):  # placed again on both shards
                placed = sum("placed again on 2 parameter shards" in e
                             for e in history(c, job.id))
                if placed > n:
                    break
                time.sleep(0.05)
            else:
                fail(f"kill {n + 1}: the job was not placed again in 30 s\n"
                     + c.log("server"))
        job = c.client.wait(job.id, timeout=300)
        if job.state != pb.SUCCEEDED:
            fail(f"after the kills at steps {kills}: {pb.JobState.Name(job.state)}: "
                 f"{job.message}\n" + c.log("w"))
        if w.poll() is not None:
            fail("the worker process died")
        resumed = [e for e in history(c, job.id)
                   if "starts again from the checkpoint of step" in e]
        if len(resumed) != 2:
            fail(f"two roll-backs to a checkpoint expected: {resumed}")
        if (job.metrics.test_auc != calm.metrics.test_auc
                or job.metrics.test_loss != calm.metrics.test_loss):
            fail(f"after the kills: AUC {job.metrics.test_auc!r} loss "
                 f"{job.metrics.test_loss!r}; undisturbed AUC {calm.metrics.test_auc!r} "
                 f"loss {calm.metrics.test_loss!r}")
        print(f"respawn: shard killed -9 and restarted on its port at steps {kills}, "
              f"rolled back to steps {[int(r.rsplit(' ', 1)[-1]) for r in resumed]}; "
              f"SUCCEEDED with the undisturbed AUC {job.metrics.test_auc:.6f} and test "
              f"loss exactly")
    finally:
        c.stop()


def restart(cluster, tmp):
    """An ended job's tables after a coordinator restart (--state_dir): the
    restarted coordinator finds the shards that keep them by the addresses
    the job's file names, and `tally fetch` gives the tables as before."""
    base = f"{tmp}/restart"
    os.makedirs(base)
    c = Cluster(base, shards=2, server_args=[f"--state_dir={base}/state"])
    try:
        c.python_worker("w")
        job = run(c, spec(tmp, "make_sparse", 2, SGD_TABLES, name="kept"), "w")
        before = weights(c, tmp, job)
        # The ended job's file is written by the checkpoint loop once its
        # ranges retired (the fetch waited for that): give it its round.
        time.sleep(1.0)
        server = c.procs[0]
        server.kill()
        server.wait()
        c.procs[0] = c.start("server-again", server.args)
        again = tally.Client(c.server)
        live = 0
        for _ in range(200):  # the server up, the shards registered again
            try:
                shards = again._call("ListShards", pb.ListShardsRequest,
                                     pb.ListShardsResponse)(pb.ListShardsRequest(), timeout=5)
                live = sum(s.live for s in shards.shards)
                if live == 2:
                    break
            except tally.RpcError:  # the old connection closing, the new not up
                pass
            time.sleep(0.1)
        if live != 2:
            fail(f"{live} shards registered again after 20 s\n" + c.log("server-again"))
        state = pb.JobState.Name(again.status(job.id).state)
        if state != "SUCCEEDED":
            fail(f"after the restart {job.id} is {state}")
        out = f"{tmp}/kept-again.safetensors"
        again.fetch(job.id, out)
        after = tally.load_state_dict(out)
        if sorted(after) != sorted(before) or \
                any(not torch.equal(after[n], before[n]) for n in before):
            fail(f"after the restart the file has {sorted(after)}, before {sorted(before)}")
        print(f"restart: after a coordinator restart {job.id}'s {len(after)} tensors (the "
              f"tables' from the shards that kept them) are the same")
    finally:
        c.stop()


def errors(cluster, tmp):
    job = cluster.client.submit(spec(tmp, "make_small", 1, [{"name": "emb", "ids": "direct"}],
                                     name="outside"))
    job = cluster.client.wait(job.id, timeout=120)
    if job.state != pb.FAILED or "the model's step: table emb: id " not in job.message \
            or not job.message.endswith("is outside its 100 rows (ids: direct)"):
        fail(f"an id outside a direct table: {pb.JobState.Name(job.state)} {job.message!r}")
    print(f"errors: outside the table: FAILED {job.message[-120:]!r}")
    for tables, want in (([{"name": "nope"}], "the model has no module 'nope'"),
                         ([{"name": "mix"}], "not an nn.Embedding"),
                         ([{"name": "emb", "dim": 8}], "dim is 8, the module 'emb' has 16")):
        try:
            cluster.client.submit(spec(tmp, "make_sparse", 1, tables, name="bad"))
            fail(f"{tables} was accepted")
        except (ModelError, SubmitError) as e:
            if want not in str(e):
                fail(f"{tables}: {e}")
    try:
        cluster.client.submit(spec(tmp, "make_sparse", 1,
                                   [{"name": "emb", "dynamic": "true", "num_embeddings": 256}],
                                   name="dynamic"))
        fail("a dynamic table with num_embeddings was accepted")
    except tally.InvalidArgument as e:  # the coordinator's
        if "model.embeddings[0].num_embeddings: is for a fixed table" not in e.details:
            fail(f"dynamic: {e}")
    run(cluster, spec(tmp, "make_sparse", 2, SGD_TABLES, steps=5, name="after"))
    print("errors: bad tables refused at submit; the next job SUCCEEDED")


PHASES = {"equal": equal, "two": two, "hybrid": hybrid, "modes": modes, "adagrad": adagrad, "adam": adam, "dlrm": dlrm, "criteo": criteo,
          "dynamic": dynamic, "lost": lost, "respawn": respawn, "restart": restart,
          "errors": errors}


def main():
    if not os.path.exists(CORPUS):
        print(f"SKIP: no {CORPUS}")
        sys.exit(77)
    wanted = sys.argv[2:] or list(PHASES)
    tmp = tempfile.mkdtemp(prefix="tally-sparse-")
    with open(f"{tmp}/model.py", "w") as f:
        f.write(MODEL)
    os.makedirs(f"{tmp}/batches")
    cluster = Cluster(tmp, shards=3)
    try:
        # It records the batches of make_recorded's job (adagrad).
        cluster.python_worker("pyworker", record=f"{tmp}/batches")
        # A second worker for two-worker jobs; it records too, so either
        # may take a recorded one-worker job.
        cluster.python_worker("pyworker2", record=f"{tmp}/batches")
        for name in wanted:
            PHASES[name](cluster, tmp)
    finally:
        cluster.stop()
    shutil.rmtree(tmp, ignore_errors=True)
    print("PASS")


if __name__ == "__main__":
    main()
