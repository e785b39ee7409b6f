#!/usr/bin/python3
"""A submitter's own PyTorch module, trained by Python workers.

  equivalence  the ResNet example (BatchNorm, residual blocks) on one Python
               worker, bsp, SGD with momentum and clip_grad_norm, 20 steps
               on Fashion-MNIST: the fetched weights and buffers equal a
               plain PyTorch loop's (torch.optim.SGD after
               torch.nn.utils.clip_grad_norm_, which clips some of the
               steps), run on the same batches from the same initial
               weights, within 1e-5 relative; the export loads into
               a fresh module with strict=True, and PyTorch evaluating it
               measures the test loss and accuracy Tally reported;
  losses       loss: model (forward(x, y) returns the loss) and loss: mse
               train to the end and report a test loss, no accuracy;
  directory    a model given as a directory (net.py importing a package
               beside it), twice with modules of the same names: each job
               gets its own; before them, on the same worker, a directory
               with a torch.py: refused at submit naming the file, and
               sent anyway its job fails with that message while PyTorch
               stays the worker's for the jobs after it;
  errors       a file that does not import, a missing build function, a
               module without parameters, an output the loss cannot take:
               refused at submit by the client; a model that raises at its
               fourth step fails its job alone, and the server and the
               worker go on to train the next job;
  ddp          the ResNet on two Python workers against DistributedDataParallel
               (gloo, two ranks, broadcast_buffers=True) replaying each
               worker's batches from the same initial weights: the
               parameters and the buffers (rank 0's running statistics,
               which the shards' buffer region keeps) equal within 1e-5
               relative (the shard's mean of two gradients and DDP's
               all-reduce round alike);
  devices      cpu:2 (two replicas, parallel_apply) against cpu:1 on a model
               without BatchNorm or dropout, with tied weights: the same
               weights within 1e-5 after 20 steps, the tie exported once;
  cluster      the ResNet on two Python workers and two shard processes,
               one worker killed (SIGKILL) mid-job: a third takes its rank
               and the job SUCCEEDS;
  ranks        the ResNet with fixed ranks (training.ranks: 2): one Python
               worker holding both ranks, then two workers of a rank each,
               one killed (SIGKILL) mid-job so that the other computes its
               rank too: the fetched parameters and buffers are the same
               bytes;
  shared       a Python worker (a Python model) and a C++ worker (layers)
               at once on one shard: both map the memory it shares;
  capability   a C++ tally-worker is never given a Python model; the C++
               `tally submit` refuses one, naming the Python client.

The model file records each training batch it sees (TALLY_RECORD), so the
loop replays exactly the batches the worker's loader chose.

  python_model_test.py BUILD_DIR [PHASE...]   (all phases when none named)
"""
import glob
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
try:
    from cluster_util import BUILD, Cluster, fail, free_port
    import torch
    import torch.nn.functional as F
    import tally
    from tally import _native  # noqa: F401
    from tally import tally_pb2 as pb
    from tally.engine import ModelError
except ImportError as e:  # built without pybind11, or no python3-torch
    print(f"SKIP: {e}")
    sys.exit(77)

FMNIST = "/usr/share/datasets/fashion-mnist"
STEPS, BATCH, LR, MOMENTUM, SEED = 20, 32, 0.05, 0.9, 3
CLIP = 1.0  # the equivalence's clip_grad_norm

RECORDER = '''
import os as _os
import numpy as _np
_RECORD = _os.environ.get("TALLY_RECORD")


class _Recorded(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.seen = 0

    def forward(self, x):
        if _RECORD and self.training:
            _np.save(f"{_RECORD}/{self.seen:04d}.npy", x.numpy())
            # The buffers this step starts from (the job's buffer region).
            state = self.inner.state_dict()
            _np.save(f"{_RECORD}/buffers-{self.seen:04d}.npy", _np.concatenate(
                [t.numpy().ravel().astype(_np.float64) for k, t in state.items()
                 if "running_" in k]))
            self.seen += 1
        return self.inner(x)


def make_recorded():
    return _Recorded(make_model())
'''


def idx(path):
    with gzip.open(path) if path.endswith(".gz") else open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * dims).reshape(shape)


def fashion(split):
    base = "train" if split == "train" else "t10k"
    x = idx(glob.glob(f"{FMNIST}/{base}-images-idx3-ubyte*")[0])
    y = idx(glob.glob(f"{FMNIST}/{base}-labels-idx1-ubyte*")[0])
    return x, y.astype(np.int64)


def spec(tmp, model_file, build="make_model", loss="cross_entropy", steps=STEPS,
         name="py", clip=0.0):
    path = f"{tmp}/{name}.yaml"
    with open(path, "w") as f:
        f.write(f"""name: {name}
model:
  python: {{file: {os.path.basename(model_file.rstrip('/'))}, build: {build}}}
  loss: {loss}
dataset: {{name: fashion-mnist}}
training: {{epochs: 1, batch_size: {BATCH}, max_steps: {steps}, seed: {SEED}, workers: 1}}
optimizer: {{type: sgd, lr: {LR}, momentum: {MOMENTUM}, clip_grad_norm: {clip}}}
""")
    return path


def reference(model_code, batches, labels_of, clip=0.0):
    """The plain PyTorch loop on the recorded batches (clipping the
    gradient's norm to `clip` when set); the model, and the steps clipped."""
    ns = {}
    exec(compile(model_code, "model.py", "exec"), ns)
    torch.manual_seed(SEED)
    model = ns["make_model"]()
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    clipped = 0
    for x in batches:
        y = labels_of(x)
        opt.zero_grad()
        F.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y)).backward()
        if clip > 0:
            clipped += float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip)) > clip
        opt.step()
    return model, clipped


def equivalence(cluster, tmp):
    with open(f"{ROOT}/examples/resnet/model.py") as f:
        code = f.read()
    model_file = f"{tmp}/resnet_recorded.py"
    with open(model_file, "w") as f:
        f.write(code + RECORDER)
    record = f"{tmp}/batches"
    os.mkdir(record)
    cluster.python_worker("pyworker", record=record)
    job = cluster.client.submit(spec(tmp, model_file, build="make_recorded", clip=CLIP))
    job = cluster.client.wait(job.id, timeout=300)
    if job.state != pb.SUCCEEDED:
        fail(f"{job.id} {pb.JobState.Name(job.state)}: {job.message}\n"
             + cluster.log("pyworker"))
    out = f"{tmp}/weights.safetensors"
    cluster.client.fetch(job.id, out)
    fetched = tally.load_state_dict(out)

    batches = [np.load(p) for p in sorted(glob.glob(f"{record}/[0-9]*.npy"))]
    if len(batches) != STEPS:
        fail(f"the worker trained {len(batches)} batches, not {STEPS}")
    train_x, train_y = fashion("train")
    where = {bytes(row): i for i, row in enumerate(train_x.reshape(len(train_x), -1))}

    def labels_of(x):
        keys = np.rint(x.reshape(len(x), -1) * 255).astype(np.uint8)
        return np.array([train_y[where[bytes(k)]] for k in keys])
    model, clipped = reference(code, batches, labels_of, clip=CLIP)
    if clipped == 0:
        fail(f"no step's gradient was over clip_grad_norm {CLIP}: clipping untested")
    worst = 0.0
    for name, t in model.state_dict().items():
        got = fetched["inner." + name]
        if got.dtype != t.dtype or list(got.shape) != list(t.shape):
            fail(f"{name}: exported {got.dtype} {list(got.shape)}, the loop has "
                 f"{t.dtype} {list(t.shape)}")
        err = float(((got.double() - t.double()).abs() / (t.double().abs() + 1e-3)).max()) \
            if t.numel() else 0.0
        worst = max(worst, err)
    print(f"equivalence: {len(fetched)} tensors (parameters and buffers), worst relative "
          f"difference {worst:.2e}; {clipped} of {STEPS} steps clipped")
    if worst > 1e-5:
        fail(f"weights differ from the plain PyTorch loop by {worst:.2e} (relative)")

    # The export restores a fresh module exactly, and PyTorch measures what
    # Tally reported (BatchNorm's running statistics decide the figures).
    ns = {}
    exec(compile(code + RECORDER, "model.py", "exec"), ns)
    fresh = ns["make_recorded"]()
    fresh.load_state_dict(fetched, strict=True)
    test_x, test_y = fashion("test")
    fresh.eval()
    with torch.no_grad():
        out = fresh(torch.from_numpy(test_x.astype(np.float32)[:, None] / 255))
        loss = float(F.cross_entropy(out, torch.from_numpy(test_y)))
        acc = float((out.argmax(1) == torch.from_numpy(test_y)).float().mean())
    m = job.metrics
    print(f"test: Tally loss {m.test_loss:.6f} accuracy {m.test_accuracy:.4f}; "
          f"PyTorch on the export: loss {loss:.6f} accuracy {acc:.4f}")
    if abs(m.test_loss - loss) > 1e-4 * max(1.0, loss) or abs(m.test_accuracy - acc) > 2e-4:
        fail("the test figures differ from PyTorch's on the exported model")


TIED = """import torch
from torch import nn


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(784, 32)
        self.a = nn.Linear(32, 32)
        self.b = nn.Linear(32, 32)
        self.b.weight = self.a.weight  # tied: one parameter, two names
        self.out = nn.Linear(32, 10)

    def forward(self, x):
        h = torch.relu(self.inp(x.flatten(1)))
        return self.out(torch.relu(self.b(torch.relu(self.a(h)))))


def make_model():
    return Tied()
"""


def _ddp_rank(rank, code, batches, labels, port, out):
    import torch.distributed as dist
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    ns = {}
    exec(compile(code, "model.py", "exec"), ns)
    torch.manual_seed(SEED)
    model = torch.nn.parallel.DistributedDataParallel(ns["make_model"](),
                                                      broadcast_buffers=True)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for x, y in zip(batches[rank], labels[rank]):
        opt.zero_grad()
        F.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y)).backward()
        opt.step()
    if rank == 0:
        torch.save(model.module.state_dict(), out)
    dist.destroy_process_group()


def ddp_phase(tmp):
    c = Cluster(tmp)
    try:
        with open(f"{ROOT}/examples/resnet/model.py") as f:
            code = f.read()
        path = f"{tmp}/resnet_recorded.py"
        with open(path, "w") as f:
            f.write(code + RECORDER)
        for name in ("d0", "d1"):
            os.makedirs(f"{tmp}/{name}", exist_ok=True)
            c.python_worker(name, record=f"{tmp}/{name}")
        text = open(spec(tmp, path, build="make_recorded", name="ddp")).read()
        with open(f"{tmp}/ddp.yaml", "w") as f:
            f.write(text.replace("workers: 1", "workers: 2"))
        job = c.client.wait(c.client.submit(f"{tmp}/ddp.yaml").id, timeout=300)
        if job.state != pb.SUCCEEDED:
            fail(f"two workers: {pb.JobState.Name(job.state)}: {job.message}")
        c.client.fetch(job.id, f"{tmp}/ddp.safetensors")
        fetched = tally.load_state_dict(f"{tmp}/ddp.safetensors")
        history = c.client._call("GetJobHistory", pb.GetJobRequest, pb.JobHistory)(
            pb.GetJobRequest(job_id=job.id), timeout=10)
    finally:
        c.stop()
    ranks = {}
    for e in history.events:
        m = re.search(r"\((d[01])\) joined as rank (\d)", e.text)
        if m:
            ranks[int(m.group(2))] = m.group(1)
    train_x, train_y = fashion("train")
    where = {bytes(row): i for i, row in enumerate(train_x.reshape(len(train_x), -1))}
    batches, labels = [], []
    for r in (0, 1):
        xs = [np.load(p) for p in sorted(glob.glob(f"{tmp}/{ranks[r]}/[0-9]*.npy"))]
        batches.append(xs)
        labels.append([np.array([train_y[where[bytes(k)]] for k in
                                 np.rint(x.reshape(len(x), -1) * 255).astype(np.uint8)])
                       for x in xs])
    if [len(b) for b in batches] != [STEPS, STEPS]:
        fail(f"the workers trained {[len(b) for b in batches]} batches")
    # Every step after the first starts from one buffer region on both
    # workers (rank 0's after the step before), not from each one's own.
    for t in range(1, STEPS):
        b0, b1 = (np.load(f"{tmp}/{ranks[r]}/buffers-{t:04d}.npy") for r in (0, 1))
        if not np.array_equal(b0, b1):
            fail(f"step {t}: the workers started from different buffers")
    out = f"{tmp}/ddp.pt"
    torch.multiprocessing.spawn(_ddp_rank, args=(code, batches, labels, free_port(), out),
                                nprocs=2, join=True)
    ddp = torch.load(out)
    worst = 0.0
    for name, p in ddp.items():
        got = fetched["inner." + name]
        if not p.is_floating_point():  # num_batches_tracked
            if not torch.equal(got, p):
                fail(f"{name}: {got} against DDP's {p}")
            continue
        worst = max(worst, float(((got - p).abs() / (p.abs() + 1e-3)).max()))
    print(f"two workers against DDP (gloo, two ranks, broadcast_buffers): worst relative "
          f"difference {worst:.2e} over {len(ddp)} tensors, parameters and buffers")
    if worst > 1e-5:
        fail(f"two workers differ from DDP by {worst:.2e}")


def run_devices(tmp, devices):
    c = Cluster(tmp)
    try:
        c.python_worker(f"w{devices[-1]}", devices=devices)
        path = f"{tmp}/tied.py"
        with open(path, "w") as f:
            f.write(TIED)
        job = c.client.wait(c.client.submit(spec(tmp, path, name="tied")).id, timeout=300)
        if job.state != pb.SUCCEEDED:
            fail(f"tied on {devices}: {pb.JobState.Name(job.state)}: {job.message}")
        out = f"{tmp}/tied-{devices[-1]}.safetensors"
        c.client.fetch(job.id, out)
        return tally.load_state_dict(out)
    finally:
        c.stop()


def devices_phase(tmp):
    one, two = run_devices(tmp, "cpu:1"), run_devices(tmp, "cpu:2")
    worst = max(float(((one[n] - two[n]).abs() / (one[n].abs() + 1e-3)).max()) for n in one)
    print(f"cpu:2 against cpu:1: worst relative difference {worst:.2e}")
    if worst > 1e-5:
        fail(f"cpu:2 and cpu:1 differ by {worst:.2e}")
    ns = {}
    exec(compile(TIED, "tied.py", "exec"), ns)
    fresh = ns["make_model"]()
    fresh.load_state_dict(two, strict=True)
    if fresh.b.weight is not fresh.a.weight or not torch.equal(fresh.a.weight, two["a.weight"]):
        fail("the tied weights did not come back tied")


def expect_submit_error(cluster, tmp, code, want, build="make_model", loss="cross_entropy"):
    path = f"{tmp}/bad.py"
    with open(path, "w") as f:
        f.write(code)
    try:
        cluster.client.submit(spec(tmp, path, build=build, loss=loss, name="bad"))
    except (ModelError, tally.SubmitError) as e:
        if not re.search(want, str(e)):
            fail(f"submit error '{e}' does not say '{want}'")
        print(f"refused at submit: {str(e).splitlines()[0]}")
        return
    fail(f"a model that should be refused ({want}) was submitted")


def losses(cluster, tmp):
    head = "import torch\nfrom torch import nn\nimport torch.nn.functional as F\n"
    own = f"{tmp}/own_loss.py"
    with open(own, "w") as f:
        f.write(head + """
class WithLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(784, 10)

    def forward(self, x, y):
        assert y.dtype == torch.int64, y.dtype
        return F.cross_entropy(self.fc(x.flatten(1)), y)


def make_model():
    return WithLoss()
""")
    mse = f"{tmp}/mse.py"
    with open(mse, "w") as f:
        f.write(head + "def make_model():\n    return nn.Sequential(nn.Flatten(), "
                "nn.Linear(784, 10))\n")
    for path, loss in ((own, "model"), (mse, "mse")):
        job = cluster.client.submit(spec(tmp, path, loss=loss, steps=10, name=loss))
        # Followed as it changes (Client.watch): steps go up, the last is
        # the end.
        seen = [(j.state, j.metrics.step) for j in cluster.client.watch(job.id, timeout=120)]
        job = cluster.client.status(job.id)
        if seen[-1] != (job.state, job.metrics.step) or \
                [s for _, s in seen] != sorted(s for _, s in seen):
            fail(f"watch of {job.id}: {seen}")
        m = job.metrics
        if job.state != pb.SUCCEEDED or not m.test_loss > 0 or m.test_accuracy != 0 \
                or job.loss != loss:
            fail(f"loss {loss}: {pb.JobState.Name(job.state)} test loss {m.test_loss} "
                 f"accuracy {m.test_accuracy} loss {job.loss!r}: {job.message}")
        # `tally status` shows the test loss, and no accuracy, for it.
        line = subprocess.run([f"{BUILD}/client/tally", f"--server={cluster.server}",
                               "status", job.id], capture_output=True, text=True,
                              timeout=60).stdout
        if "test loss" not in line or "acc" in line:
            fail(f"tally status of a {loss} job: {line}")
        print(f"loss {loss}: SUCCEEDED, test loss {m.test_loss:.4f}, watched through "
              f"{len(seen)} updates; {line.strip()}")


def shadowing(cluster, tmp):
    """A model directory with a torch.py: refused at submit by the client,
    naming the file; sent anyway (its spec made by hand, as the C++ `tally
    submit` would send it), its job fails on the worker with the same
    message, and PyTorch stays the worker's for the jobs after it."""
    root = f"{tmp}/shadow"
    os.makedirs(root, exist_ok=True)
    with open(f"{root}/net.py", "w") as f:
        f.write("import torch\nfrom torch import nn\ndef make_model():\n"
                "    return nn.Sequential(nn.Flatten(), nn.Linear(784, 10))\n")
    path = spec(tmp, f"{root}/", build="net.make_model", steps=5, name="shadow")
    text = tally.prepare_spec(path)  # without torch.py: the layout
    with open(f"{root}/torch.py", "w") as f:
        f.write("cuda = None\n")
    try:
        cluster.client.submit(path)
        fail("a model directory with torch.py was submitted")
    except (ModelError, tally.SubmitError) as e:
        if "torch.py takes the name of the module 'torch'" not in str(e):
            fail(f"submit error '{e}' does not name torch.py")
        print(f"refused at submit: {str(e).splitlines()[0][:120]}")
    sent = json.loads(text)
    sent["model"]["python"]["files"]["torch.py"] = "cuda = None\n"
    rpc = cluster.client._call("SubmitJob", pb.SubmitJobRequest, pb.SubmitJobResponse)
    job = rpc(pb.SubmitJobRequest(spec=json.dumps(sent)), timeout=30).job
    job = cluster.client.wait(job.id, timeout=120)
    if job.state != pb.FAILED or "torch.py takes the name" not in job.message:
        fail(f"the torch.py job: {pb.JobState.Name(job.state)}: {job.message}")
    print(f"a torch.py sent anyway: FAILED: {job.message.splitlines()[0][:120]}")


def directory(cluster, tmp):
    """A model given as a directory: its files import each other; a second
    directory with modules of the same names gets its own, not the first
    job's (the worker forgets a job's modules). First a directory with a
    torch.py (shadowing), on the same worker: the two after it train."""
    shadowing(cluster, tmp)
    for name, hidden in (("pkg1", 16), ("pkg2", 24)):
        root = f"{tmp}/{name}"
        os.makedirs(f"{root}/parts", exist_ok=True)
        with open(f"{root}/parts/__init__.py", "w") as f:
            f.write("")
        with open(f"{root}/parts/blocks.py", "w") as f:
            f.write(f"from torch import nn\nHIDDEN = {hidden}\n"
                    "def block(n_in, n_out):\n"
                    "    return nn.Sequential(nn.Linear(n_in, HIDDEN), nn.ReLU(), "
                    "nn.Linear(HIDDEN, n_out))\n")
        with open(f"{root}/net.py", "w") as f:
            f.write("from torch import nn\nfrom parts.blocks import block\n"
                    "def make_model():\n    return nn.Sequential(nn.Flatten(), block(784, 10))\n")
        path = spec(tmp, f"{root}/", build="net.make_model", steps=5, name=name)
        job = cluster.client.wait(cluster.client.submit(path).id, timeout=120)
        if job.state != pb.SUCCEEDED or job.num_params != 784 * hidden + hidden + hidden * 10 + 10:
            fail(f"directory {name}: {pb.JobState.Name(job.state)} {job.num_params} "
                 f"parameters: {job.message}")
    print(f"a model directory: two of them, modules of the same names, SUCCEEDED")


def errors(cluster, tmp):
    head = "import torch\nfrom torch import nn\n"
    expect_submit_error(cluster, tmp, "import no_such_module\n", "does not import")
    expect_submit_error(cluster, tmp, head + "def other(): pass\n", "no function 'make_model'")
    expect_submit_error(cluster, tmp, head + "def make_model():\n    return nn.ReLU()\n",
                        "no parameters")
    expect_submit_error(cluster, tmp, head + "def make_model():\n    return nn.Linear(3, 10)\n",
                        "forward raised")
    expect_submit_error(cluster, tmp,
                        head + "def make_model():\n    return nn.Sequential(nn.Flatten(), "
                        "nn.Linear(784, 7))\n", r"returns \[2, 7\]")
    # Raises at its fourth training step: the job fails with the traceback.
    raising = f"{tmp}/raising.py"
    with open(raising, "w") as f:
        f.write(head + """
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(784, 10)
        self.calls = 0

    def forward(self, x):
        if self.training:
            self.calls += 1
            if self.calls == 4:
                raise RuntimeError("deliberate failure at step 4")
        return self.fc(x.flatten(1))


def make_model():
    return Net()
""")
    job = cluster.client.submit(spec(tmp, raising, name="raising"))
    job = cluster.client.wait(job.id, timeout=120)
    if job.state != pb.FAILED or "deliberate failure at step 4" not in job.message:
        fail(f"the raising model's job: {pb.JobState.Name(job.state)}: {job.message}")
    print(f"a model that raises mid-job: FAILED: {job.message.splitlines()[0][:100]}")
    # The worker and the server go on: a good job after it succeeds.
    good = f"{tmp}/good.py"
    with open(good, "w") as f:
        f.write(head + "def make_model():\n    return nn.Sequential(nn.Flatten(), "
                "nn.Linear(784, 10))\n")
    job = cluster.client.wait(cluster.client.submit(spec(tmp, good, steps=5, name="good")).id,
                              timeout=120)
    if job.state != pb.SUCCEEDED:
        fail(f"the job after a failed one: {pb.JobState.Name(job.state)}: {job.message}")


def cluster_phase(tmp):
    c = Cluster(tmp, shards=2)
    try:
        workers = {f"k{i}": c.python_worker(f"k{i}") for i in range(3)}
        path = f"{tmp}/resnet.py"
        shutil.copy(f"{ROOT}/examples/resnet/model.py", path)
        text = open(spec(tmp, path, steps=60, name="killed")).read()
        text = text.replace("workers: 1", "workers: 2, shards: 2")
        with open(f"{tmp}/killed.yaml", "w") as f:
            f.write(text)
        job = c.client.submit(f"{tmp}/killed.yaml")
        victim = None
        for _ in range(600):
            j = c.client.status(job.id)
            if j.metrics.step >= 5 and j.metrics.progress:
                victim = j.metrics.progress[-1].name
                break
            time.sleep(0.1)
        if victim is None:
            fail(f"the job did not reach step 5: {j.message}\n" + c.log("k0"))
        workers[victim].kill()
        print(f"cluster: killed {victim} at step {j.metrics.step}")
        j = c.client.wait(job.id, timeout=300)
        if j.state != pb.SUCCEEDED:
            fail(f"after a worker was killed: {pb.JobState.Name(j.state)}: {j.message}")
        history = c.client._call("GetJobHistory", pb.GetJobRequest, pb.JobHistory)(
            pb.GetJobRequest(job_id=job.id), timeout=10)
        joined = [e.text for e in history.events if "joined as rank" in e.text]
        print(f"cluster: SUCCEEDED at step {j.metrics.step}, test accuracy "
              f"{j.metrics.test_accuracy:.4f}; {'; '.join(joined)}")
        if len(joined) != 3:
            fail(f"three workers should have joined (two, then the spare): {joined}")
    finally:
        c.stop()


def ranks_run(tmp, name, workers, kill):
    """The ResNet with training.ranks: 2 on `workers` Python workers (one
    killed at step 5 when `kill`); its fetched tensors."""
    c = Cluster(f"{tmp}", shards=2)
    try:
        procs = {f"{name}{i}": c.python_worker(f"{name}{i}") for i in range(workers)}
        path = f"{tmp}/resnet.py"
        shutil.copy(f"{ROOT}/examples/resnet/model.py", path)
        text = open(spec(tmp, path, steps=30, name=name)).read()
        text = text.replace("workers: 1", f"ranks: 2, workers: {workers}, shards: 2")
        with open(f"{tmp}/{name}.yaml", "w") as f:
            f.write(text)
        job = c.client.submit(f"{tmp}/{name}.yaml")
        if kill:
            for _ in range(600):
                j = c.client.status(job.id)
                if j.metrics.step >= 5 and len(j.metrics.progress) == 2:
                    break
                time.sleep(0.1)
            victim = j.metrics.progress[-1].name
            procs[victim].kill()
            print(f"ranks: killed {victim} (rank 1) at step {j.metrics.step}")
        j = c.client.wait(job.id, timeout=300)
        if j.state != pb.SUCCEEDED:
            fail(f"{name}: {pb.JobState.Name(j.state)}: {j.message}")
        out = f"{tmp}/{name}.safetensors"
        c.client.fetch(job.id, out)
        return tally.load_state_dict(out)
    finally:
        c.stop()


def ranks_phase(tmp):
    one = ranks_run(tmp, "both", 1, kill=False)
    two = ranks_run(tmp, "split", 2, kill=True)
    if one.keys() != two.keys():
        fail("the two runs exported different tensors")
    differ = [n for n in one if one[n].numpy().tobytes() != two[n].numpy().tobytes()]
    if differ:
        fail(f"two ranks on one worker and on two (one killed) differ in {differ}")
    print(f"ranks: {len(one)} tensors, parameters and buffers, byte-identical on one "
          f"worker holding both ranks and on two with one killed")


def shared_phase(tmp):
    """A Python worker (a Python model) and a C++ worker (a model of
    layers) train at once on one machine's one shard: both push and pull
    through memory the shard shares (their processes map its region), the
    Python worker through the same C++ client the C++ worker uses."""
    c = Cluster(tmp)
    try:
        py = c.python_worker("pyshared")
        small = f"{tmp}/small.py"
        with open(small, "w") as f:
            f.write("from torch import nn\ndef make_model():\n    return nn.Sequential("
                    "nn.Flatten(), nn.Linear(784, 64), nn.ReLU(), nn.Linear(64, 10))\n")
        pyjob = c.client.submit(spec(tmp, small, steps=400, name="pyshared"))
        for _ in range(300):
            if c.client.status(pyjob.id).state != pb.PENDING:
                break
            time.sleep(0.1)
        # Now only the C++ worker is free for the model of layers.
        cpp = c.start("cppshared", [f"{BUILD}/worker/tally-worker", f"--server={c.server}",
                                    "--devices=cpu:1", "--name=cppshared"])
        with open(f"{tmp}/layers.yaml", "w") as f:
            f.write("name: layers\nmodel: {layers: [flatten, {linear: {in_features: 784, "
                    "out_features: 10}}]}\ndataset: {name: fashion-mnist}\n"
                    "training: {epochs: 1, batch_size: 32, max_steps: 400, workers: 1}\n")
        cppjob = c.client.submit(f"{tmp}/layers.yaml")
        mapped = {"python": False, "c++": False}
        while True:
            for who, p in (("python", py), ("c++", cpp)):
                try:
                    with open(f"/proc/{p.pid}/maps") as f:
                        mapped[who] |= "memfd:tally-shared" in f.read()
                except OSError:
                    pass
            jobs = [c.client.status(j.id) for j in (pyjob, cppjob)]
            if all(j.state in tally.client.TERMINAL for j in jobs):
                break
            time.sleep(0.05)
        for j in jobs:
            if j.state != pb.SUCCEEDED:
                fail(f"{j.name}: {pb.JobState.Name(j.state)}: {j.message}")
        if not all(mapped.values()):
            fail(f"shared memory mapped by the workers: {mapped}")
        print("a Python and a C++ worker on one shard: both through its shared memory")
    finally:
        c.stop()


def capability(cluster, tmp):
    """A C++ worker alone: the Python job waits, saying why, untouched."""
    c = Cluster(tmp)
    try:
        c.start("cppworker", [f"{BUILD}/worker/tally-worker", f"--server={c.server}",
                              "--devices=cpu:1", "--name=cpp"])
        for _ in range(100):  # registered, and heartbeating
            if "registered with" in c.log("cppworker"):
                break
            time.sleep(0.1)
        else:
            fail("the C++ worker did not register: " + c.log("cppworker"))
        good = f"{tmp}/capability.py"
        with open(good, "w") as f:
            f.write("from torch import nn\ndef make_model():\n    return nn.Sequential("
                    "nn.Flatten(), nn.Linear(784, 10))\n")
        job = c.client.submit(spec(tmp, good, steps=5, name="waiting"))
        time.sleep(2)  # several heartbeats of the idle C++ worker
        job = c.client.status(job.id)
        if "assigned" in c.log("cppworker"):
            fail("the C++ worker was given a Python model: " + c.log("cppworker"))
        if job.state != pb.PENDING or "Python workers" not in job.message:
            fail(f"a Python job with only a C++ worker: {pb.JobState.Name(job.state)}: "
                 f"{job.message}")
        print(f"with a C++ worker only: PENDING: {job.message}")
        # The C++ client sends the spec as written: refused, naming the
        # Python client, which fills in the code and layout.
        r = subprocess.run([f"{BUILD}/client/tally", f"--server={c.server}", "submit",
                            spec(tmp, good, steps=5, name="cpp-client")],
                           capture_output=True, text=True, timeout=60)
        if r.returncode == 0 or "python3 -m tally submit" not in r.stderr:
            fail(f"tally submit of a Python model: {r.returncode}: {r.stdout}{r.stderr}")
        print(f"tally submit (C++) of a Python model: {r.stderr.strip()}")
    finally:
        c.stop()


def main():
    # The phases named after BUILD_DIR (none: all); losses and errors use
    # the worker that equivalence starts.
    only = set(sys.argv[2:])
    tmp = tempfile.mkdtemp(prefix="tally-pymodel-")
    cluster = Cluster(tmp)
    try:
        for name, phase in (("equivalence", equivalence), ("losses", losses),
                            ("directory", directory), ("errors", errors)):
            if not only or name in only:
                phase(cluster, tmp)
        cluster.stop()
        for name, phase in (("ddp", ddp_phase), ("devices", devices_phase),
                            ("cluster", cluster_phase), ("ranks", ranks_phase),
                            ("shared", shared_phase)):
            if not only or name in only:
                phase(tmp)
        if not only or "capability" in only:
            capability(cluster, tmp)
    finally:
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print("ok")


if __name__ == "__main__":
    main()
