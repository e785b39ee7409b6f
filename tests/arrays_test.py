#!/usr/bin/python3
"""Datasets from the user's files: NumPy arrays (dataset.name: arrays) and
CSV tables (dataset.name: csv), written here by NumPy and trained by a C++
worker.

  same data    the MLP example for 30 steps on the IDX files and on the same
               images and labels as .npy (uint8 images [n, 1, 28, 28],
               int64 labels): the fetched weights are bit for bit the same
               (the same samples, converted alike, in the same order);
  filled in    the Python client fills dataset.shape and train_size from
               the files' headers;
  formats      the same arrays as an uncompressed .npz, a .safetensors
               file and a glob of three .npy shards train to the same
               weights bit for bit; without a test split each job ends
               saying so (no test figures as zeros: the job's metrics,
               `tally status`, the worker's last line); a compressed .npz (refused at submit,
               and by the worker past the client) and a glob that matches
               nothing fail naming the file;
  refused      labels beyond dataset.classes at submit (the client names
               the file), and a job whose files a worker cannot open fails
               with the worker's reason naming the file; the server and the
               worker go on to train the next job: the example
               (examples/fashion-mnist-npy, its export.py's files);
  csv          a CSV table trains to the weights of the same values as
               .npy arrays; a cell that is not a number fails its job
               naming file, line and column;
  hostile      paths a submitter names to take a worker down or read its
               files: /dev/zero, a link loop, a FIFO, a file outside the
               worker's --data_root (/etc/shadow), a link out of the root,
               a CSV whose label cell holds a secret, an image folder whose
               class holds a -> . and b -> .; each job FAILS naming the
               cause, no message quotes the file, and the same worker
               process trains the next job;
  bounded      a 1 GiB training set, 384 MiB of it read, trains on a worker
               held to 256 MiB (a cgroup), its anonymous memory under 3/4
               of that.

  arrays_test.py BUILD_DIR
"""
import gzip
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

BUILD = os.path.abspath(sys.argv[1])
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FMNIST = "/usr/share/datasets/fashion-mnist"
sys.path.insert(0, os.path.join(BUILD, "python"))
try:
    import numpy as np
    import tally
    from tally import tally_pb2 as pb
except ImportError as e:
    print(f"SKIP: {e}")
    sys.exit(77)


def fail(msg):
    raise SystemExit(f"FAIL: {msg}")


def idx(path):
    with gzip.open(path) as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * dims).reshape(shape)


def tensors(path):
    """A .safetensors file's tensors (their entries and bytes), without its
    metadata (which names the job)."""
    with open(path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    return header, data[8 + n:]


def spec(tmp, name, dataset):
    path = f"{tmp}/{name}.json"
    with open(path, "w") as f:
        json.dump({"name": name,
                   "model": {"layers": ["flatten",
                                        {"linear": {"in_features": 784, "out_features": 64}},
                                        "relu",
                                        {"linear": {"in_features": 64, "out_features": 10}}]},
                   "dataset": dataset,
                   "training": {"epochs": 1, "batch_size": 32, "max_steps": 30, "seed": 5,
                                "workers": 1},
                   "optimizer": {"type": "sgd", "lr": 0.05, "momentum": 0.9}}, f)
    return path


def write_safetensors(path, arrays):
    kinds = {np.dtype(np.uint8): "U8", np.dtype(np.int64): "I64"}
    header, at = {}, 0
    for name, a in arrays.items():
        header[name] = {"dtype": kinds[a.dtype], "shape": list(a.shape),
                        "data_offsets": [at, at + a.nbytes]}
        at += a.nbytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        for a in arrays.values():
            f.write(np.ascontiguousarray(a).tobytes())


def raw_submit(c, path, dataset_update):
    """A spec sent as it is, past the client's checks (as from elsewhere)."""
    with open(path) as f:
        text = json.load(f)
    text["dataset"].update(dataset_update)
    job = c._call("SubmitJob", pb.SubmitJobRequest, pb.SubmitJobResponse)(
        pb.SubmitJobRequest(spec=json.dumps(text)), timeout=10).job
    return c.wait(job.id, timeout=60)


def no_test_split(tmp, server, job):
    """A job without a test split says so everywhere, with no zeros shown."""
    m = job.metrics
    if not m.no_test_split or m.test_accuracy != 0 or m.test_loss != 0:
        fail(f"{job.id} has no test split: metrics {m}")
    line = subprocess.run([f"{BUILD}/client/tally", f"--server={server}", "status", job.id],
                          capture_output=True, text=True, check=True).stdout
    if "no test split" not in line or "test accuracy" in line:
        fail(f"tally status of a job without a test split: {line!r}")
    with open(f"{tmp}/worker.log") as f:
        log = f.read()
    if f"{job.id} finished at step {m.step}: no test split" not in log:
        fail(f"the worker's last line for {job.id}: {log[-2000:]}")


def formats(tmp, server, c, x, y, want):
    np.savez(f"{tmp}/fm.npz", images=x, labels=y)
    write_safetensors(f"{tmp}/fm.safetensors", {"images": x, "labels": y})
    for i, (a, b) in enumerate(zip(np.array_split(x, 3), np.array_split(y, 3))):
        np.save(f"{tmp}/shard_x_{i}.npy", a)
        np.save(f"{tmp}/shard_y_{i}.npy", b)
    for name, train in (("npz", {"file": f"{tmp}/fm.npz", "inputs": "images",
                                 "labels": "labels"}),
                        ("safetensors", {"file": f"{tmp}/fm.safetensors", "inputs": "images",
                                         "labels": "labels"}),
                        ("glob", {"inputs": f"{tmp}/shard_x_*.npy",
                                  "labels": f"{tmp}/shard_y_*.npy"})):
        job = c.wait(c.submit(spec(tmp, name, {"name": "arrays", "classes": 10,
                                               "train": train})).id, timeout=300)
        if job.state != pb.SUCCEEDED:
            fail(f"{name}: {pb.JobState.Name(job.state)}: {job.message}")
        no_test_split(tmp, server, job)  # only `train` is given
        c.fetch(job.id, f"{tmp}/{name}.safetensors")
        if tensors(f"{tmp}/{name}.safetensors") != want:
            fail(f"the arrays as {name} trained other weights than as .npy")
        print(f"the same arrays as {name}: weights bit for bit the .npy job's")
    np.savez_compressed(f"{tmp}/small.npz", images=x[:100], labels=y[:100])
    squeezed = {"name": "arrays", "classes": 10,
                "train": {"file": f"{tmp}/small.npz", "inputs": "images", "labels": "labels"}}
    try:
        c.submit(spec(tmp, "squeezed", squeezed))
        fail("a compressed .npz was submitted")
    except tally.SubmitError as e:
        if "compressed (np.savez_compressed)" not in str(e):
            fail(f"a compressed .npz at submit: {e}")
    job = raw_submit(c, f"{tmp}/squeezed.json", {"shape": [1, 28, 28], "train_size": 100})
    if job.state != pb.FAILED or "small.npz[images]: compressed" not in job.message:
        fail(f"a compressed .npz on the worker: {pb.JobState.Name(job.state)}: {job.message}")
    print(f"a compressed .npz: refused at submit, and by the worker: {job.message}")
    none = {"name": "arrays", "classes": 10,
            "train": {"inputs": f"{tmp}/nothing_*.npy", "labels": f"{tmp}/shard_y_*.npy"}}
    job = raw_submit(c, spec(tmp, "none", none), {"shape": [1, 28, 28], "train_size": 100})
    if job.state != pb.FAILED or "nothing_*.npy: the pattern matches no file" not in job.message:
        fail(f"a glob that matches nothing: {pb.JobState.Name(job.state)}: {job.message}")
    print(f"a glob that matches nothing: FAILED: {job.message}")


def table(tmp, c):
    """The same table as CSV and as .npy arrays trains to the same weights
    (float32 values written as CSV with their 9 digits read back exactly);
    a cell that is not a number fails its job naming file, line and column."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(600, 5)).astype(np.float32)
    y = (x[:, 0] + 2 * x[:, 3] > 0).astype(np.int64) + (x[:, 1] > 1)
    np.save(f"{tmp}/tx.npy", x)
    np.save(f"{tmp}/ty.npy", y)
    with open(f"{tmp}/t.csv", "w") as f:
        f.write("f0,f1,target,f2,f3,f4\n")
        for row, label in zip(x, y):
            cells = [f"{v:.9g}" for v in row]
            f.write(",".join(cells[:2] + [str(label)] + cells[2:]) + "\n")
    model = {"layers": [{"linear": {"in_features": 5, "out_features": 16}}, "relu",
                        {"linear": {"in_features": 16, "out_features": 3}}]}
    got = {}
    for name, dataset in (("npy", {"name": "arrays", "classes": 3,
                                   "train": {"inputs": f"{tmp}/tx.npy",
                                             "labels": f"{tmp}/ty.npy"}}),
                          ("csv", {"name": "csv", "classes": 3, "label": "target",
                                   "train": f"{tmp}/t.csv"})):
        path = spec(tmp, f"table-{name}", dataset)
        with open(path) as f:
            text = json.load(f)
        text["model"] = model
        with open(path, "w") as f:
            json.dump(text, f)
        job = c.wait(c.submit(path).id, timeout=120)
        if job.state != pb.SUCCEEDED:
            fail(f"table as {name}: {pb.JobState.Name(job.state)}: {job.message}")
        c.fetch(job.id, f"{tmp}/table-{name}.safetensors")
        got[name] = tensors(f"{tmp}/table-{name}.safetensors")
    if got["csv"] != got["npy"]:
        fail("the CSV table trained other weights than the same .npy arrays")
    print("a CSV table: weights bit for bit those of the same .npy arrays")
    # The same file claimed with another shape, past the client (which would
    # refuse it): the worker, which has the table loaded, refuses it too.
    with open(f"{tmp}/table-csv.json") as f:
        text = json.load(f)
    text["dataset"].update(shape=[4], train_size=600)
    text["model"]["layers"][0]["linear"]["in_features"] = 4
    job = c._call("SubmitJob", pb.SubmitJobRequest, pb.SubmitJobResponse)(
        pb.SubmitJobRequest(spec=json.dumps(text)), timeout=10).job
    job = c.wait(job.id, timeout=60)
    if job.state != pb.FAILED or "600 rows of 5 features" not in job.message:
        fail(f"a table claimed with another shape: {pb.JobState.Name(job.state)}: "
             f"{job.message}")
    print(f"a table claimed with another shape: FAILED: {job.message}")
    with open(f"{tmp}/bad.csv", "w") as f:
        f.write("a,b,y\n1,2,0\n3,x4,1\n")
    bad = {"name": "csv", "classes": 2, "label": "y", "train": f"{tmp}/bad.csv",
           "shape": [2], "train_size": 2}
    path = spec(tmp, "badcell", bad)
    with open(path) as f:
        text = json.load(f)
    text["model"] = {"layers": [{"linear": {"in_features": 2, "out_features": 2}}]}
    with open(path, "w") as f:
        json.dump(text, f)
    job = c.wait(c.submit(path).id, timeout=60)
    if job.state != pb.FAILED or "bad.csv:3:2: not a number" not in job.message:
        fail(f"a bad cell: {pb.JobState.Name(job.state)}: {job.message}")
    print(f"a bad cell: FAILED: {job.message}")


def hostile(tmp, c, worker):
    secret = "root:$6$Zq7s3cr3t"
    os.symlink("loop", f"{tmp}/loop")
    os.mkfifo(f"{tmp}/fifo")
    os.symlink("/etc/passwd", f"{tmp}/escape.csv")
    with open(f"{tmp}/secret.csv", "w") as f:
        f.write(f"a,b,y\n1,2,0\n3,4,{secret}\n")
    os.makedirs(f"{tmp}/cyc/train/cat")
    os.symlink(".", f"{tmp}/cyc/train/cat/a")
    os.symlink(".", f"{tmp}/cyc/train/cat/b")
    csv = {"name": "csv", "classes": 2, "label": "y", "shape": [2], "train_size": 2}
    # /dev/zero is outside the roots here; inside them (--data_root=/) it is
    # refused as not a regular file (DataFileTest), as the FIFO is below.
    cases = [("devzero", dict(csv, train="/dev/zero"), "/dev/zero is outside this worker's"),
             ("loop", dict(csv, train=f"{tmp}/loop"), "a loop"),
             ("fifo", dict(csv, train=f"{tmp}/fifo"), "fifo: not a regular file"),
             ("shadow", dict(csv, train="/etc/shadow"),
              "/etc/shadow is outside this worker's data roots"),
             ("escape", dict(csv, train=f"{tmp}/escape.csv"), "is outside this worker's data"),
             ("secret", dict(csv, train=f"{tmp}/secret.csv"), "secret.csv:3:3: the label is not"),
             ("cycle", {"name": "image_folder", "train": f"{tmp}/cyc/train", "shape": [1, 28, 28],
                        "classes": 2, "train_size": 1}, "holds no .png")]
    for name, dataset, want in cases:
        path = spec(tmp, f"hostile-{name}", dataset)
        with open(path) as f:
            text = json.load(f)
        text["model"] = {"layers": ["flatten", {"linear": {"in_features": 784 if name == "cycle"
                                                           else 2, "out_features": 2}}]}
        job = c._call("SubmitJob", pb.SubmitJobRequest, pb.SubmitJobResponse)(
            pb.SubmitJobRequest(spec=json.dumps(text)), timeout=10).job
        job = c.wait(job.id, timeout=60)
        if job.state != pb.FAILED or want not in job.message:
            fail(f"hostile {name}: {pb.JobState.Name(job.state)}: {job.message}")
        if "s3cr3t" in job.message or "root:" in job.message:
            fail(f"hostile {name}: the message quotes the file: {job.message}")
        if worker.poll() is not None:
            fail(f"hostile {name}: the worker died (exit {worker.returncode})")
        print(f"hostile {name}: FAILED: {job.message}")


def bounded_memory(tmp, server, c):
    """A training set four times a worker's memory limit (a cgroup v1
    memory controller: 256 MiB) trains to the end: the worker maps the file
    and converts only what its batches take; its anonymous memory stays
    far below the set's size, its file pages are the kernel's to drop."""
    root = "/sys/fs/cgroup/memory"
    if os.geteuid() != 0 or not os.path.isdir(root):
        print("bounded memory: skipped (needs root and the cgroup v1 memory controller)")
        return
    limit = 256 << 20
    shape = (16, 64, 64)  # 64 KiB a sample
    n = (4 * limit) // (16 * 64 * 64)  # 1 GiB
    x = np.lib.format.open_memmap(f"{tmp}/big_x.npy", mode="w+", dtype=np.uint8,
                                  shape=(n,) + shape)
    rng = np.random.default_rng(1)
    block = rng.integers(0, 256, size=(256,) + shape, dtype=np.uint8)
    for i in range(0, n, 256):
        x[i:i + 256] = block[:min(256, n - i)]
    x.flush()
    del x
    np.save(f"{tmp}/big_y.npy", rng.integers(0, 10, size=n, dtype=np.int64))
    for f in ("big_x.npy", "big_y.npy"):  # out of the page cache: read anew
        fd = os.open(f"{tmp}/{f}", os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    cg = f"{root}/tally-arrays-{os.getpid()}"
    os.mkdir(cg)
    try:
        with open(f"{cg}/memory.limit_in_bytes", "w") as f:
            f.write(str(limit))

        def enter():
            with open(f"{cg}/cgroup.procs", "w") as f:
                f.write(str(os.getpid()))
        log = open(f"{tmp}/bounded.log", "w")
        w = subprocess.Popen([f"{BUILD}/worker/tally-worker", f"--server={server}",
                              "--devices=cpu:1", "--name=bounded", f"--data_root={tmp}"],
                             stdout=log,
                             stderr=subprocess.STDOUT, preexec_fn=enter)
        try:
            dataset = {"name": "arrays", "classes": 10,
                       "train": {"inputs": f"{tmp}/big_x.npy", "labels": f"{tmp}/big_y.npy"}}
            path = spec(tmp, "bounded", dataset)
            with open(path) as f:
                text = json.load(f)
            text["model"] = {"layers": ["flatten", {"linear": {"in_features": 16 * 64 * 64,
                                                               "out_features": 10}}]}
            # 96 batches of 64: 384 MiB of samples read, more than the limit.
            text["training"] = {"epochs": 1, "batch_size": 64, "max_steps": 96, "seed": 1,
                                "workers": 1}
            text["optimizer"] = {"type": "sgd", "lr": 0.001}
            with open(path, "w") as f:
                json.dump(text, f)
            job = c.submit(path)
            peak = {"RssAnon": 0, "RssFile": 0}
            while True:
                with open(f"/proc/{w.pid}/status") as f:
                    for line in f:
                        k, _, v = line.partition(":")
                        if k in peak:
                            peak[k] = max(peak[k], int(v.split()[0]) * 1024)
                job = c.status(job.id)
                if job.state in tally.client.TERMINAL:
                    break
                time.sleep(0.2)
        finally:
            w.kill()
            w.wait()
        if job.state != pb.SUCCEEDED:
            fail(f"a set of 4x the worker's memory: {pb.JobState.Name(job.state)}: "
                 f"{job.message}")
        # The batches in flight (16 MiB each in float32), the model and the
        # libraries: not the set (1 GiB) nor what was read (384 MiB).
        if peak["RssAnon"] > 3 * limit // 4:
            fail(f"the worker's anonymous memory peaked at {peak['RssAnon'] >> 20} MiB")
        print(f"bounded memory: a set of {n} samples ({(n * 16 * 64 * 64) >> 20} MiB), "
              f"{job.metrics.samples} of them ({(job.metrics.samples * 16 * 64 * 64) >> 20} "
              f"MiB) trained on a worker held to {limit >> 20} MiB; peak RssAnon "
              f"{peak['RssAnon'] >> 20} MiB, RssFile {peak['RssFile'] >> 20} MiB")
    finally:
        os.rmdir(cg)


def main():
    tmp = tempfile.mkdtemp(prefix="tally-arrays-")
    procs = []
    try:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        server = f"127.0.0.1:{port}"
        log = open(f"{tmp}/server.log", "w")
        procs.append(subprocess.Popen([f"{BUILD}/server/tally-server", f"--port={port}"],
                                      stdout=log, stderr=subprocess.STDOUT))
        wlog = open(f"{tmp}/worker.log", "w")
        procs.append(subprocess.Popen([f"{BUILD}/worker/tally-worker", f"--server={server}",
                                       "--devices=cpu:1", "--name=w",
                                       f"--data_root={tmp},{FMNIST}"],
                                      stdout=wlog, stderr=subprocess.STDOUT))
        c = tally.Client(server)
        x = idx(f"{FMNIST}/train-images-idx3-ubyte.gz")[:, None]
        y = idx(f"{FMNIST}/train-labels-idx1-ubyte.gz").astype(np.int64)
        tx = idx(f"{FMNIST}/t10k-images-idx3-ubyte.gz")[:, None]
        ty = idx(f"{FMNIST}/t10k-labels-idx1-ubyte.gz").astype(np.int64)
        for name, a in (("x", x), ("y", y), ("tx", tx), ("ty", ty)):
            np.save(f"{tmp}/{name}.npy", a)
        arrays = {"name": "arrays", "classes": 10,
                  "train": {"inputs": f"{tmp}/x.npy", "labels": f"{tmp}/y.npy"},
                  "test": {"inputs": f"{tmp}/tx.npy", "labels": f"{tmp}/ty.npy"}}
        filled = json.loads(tally.client.prepare_spec(spec(tmp, "probe", arrays)))["dataset"]
        if filled.get("shape") != [1, 28, 28] or filled.get("train_size") != 60000:
            fail(f"the client filled in {filled}")

        weights = {}
        for name, dataset in (("idx", {"name": "fashion-mnist"}), ("npy", arrays)):
            job = c.wait(c.submit(spec(tmp, name, dataset)).id, timeout=300)
            if job.state != pb.SUCCEEDED:
                fail(f"{name}: {pb.JobState.Name(job.state)}: {job.message}")
            c.fetch(job.id, f"{tmp}/{name}.safetensors")
            weights[name] = (tensors(f"{tmp}/{name}.safetensors"), job.metrics.test_accuracy)
        if weights["idx"] != weights["npy"]:
            fail(f"the .npy job differs from the IDX one: accuracy {weights['npy'][1]} "
                 f"against {weights['idx'][1]}")
        print(f"the same data as .npy: weights bit for bit the IDX job's (test accuracy "
              f"{weights['npy'][1]:.4f})")
        formats(tmp, server, c, x, y, weights["npy"][0])

        bad = dict(arrays, classes=5)
        try:
            c.submit(spec(tmp, "labels", bad))
            fail("labels beyond classes were submitted")
        except tally.SubmitError as e:
            if "y.npy: labels from 0 to 9; dataset.classes is 5" not in str(e):
                fail(f"labels beyond classes: {e}")
            print(f"refused at submit: {e}")

        away = dict(arrays, train={"inputs": f"{tmp}/gone.npy", "labels": f"{tmp}/y.npy"},
                    train_size=60000, shape=[1, 28, 28])
        job = c.wait(c.submit(spec(tmp, "away", away)).id, timeout=60)
        if job.state != pb.FAILED or "gone.npy: no such file" not in job.message:
            fail(f"files the worker cannot open: {pb.JobState.Name(job.state)}: {job.message}")
        print(f"files the worker cannot open: FAILED: {job.message}")
        hostile(tmp, c, procs[1])
        # The example: export.py's files, the CNN on them (a few steps).
        subprocess.run([sys.executable, f"{ROOT}/examples/fashion-mnist-npy/export.py",
                        f"{tmp}/example"], check=True, capture_output=True)
        with open(f"{ROOT}/examples/fashion-mnist-npy/job.yaml") as f:
            text = f.read().replace("/tmp/fashion-mnist-npy", f"{tmp}/example")
        with open(f"{tmp}/example.yaml", "w") as f:
            f.write(text.replace("epochs: 1,", "epochs: 1, max_steps: 20,"))
        job = c.wait(c.submit(f"{tmp}/example.yaml").id, timeout=300)
        if job.state != pb.SUCCEEDED:
            fail(f"the example after it: {pb.JobState.Name(job.state)}: {job.message}")
        print(f"examples/fashion-mnist-npy: SUCCEEDED, test accuracy "
              f"{job.metrics.test_accuracy:.4f} after 20 steps")
        table(tmp, c)
        procs[1].kill()  # the next job is the memory-bound worker's alone
        procs[1].wait()
        bounded_memory(tmp, server, c)
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    print("ok")


if __name__ == "__main__":
    main()
