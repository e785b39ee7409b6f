#!/usr/bin/python3
"""An arrays dataset (dataset.name: arrays): Fashion-MNIST written as .npy
files by NumPy, trained by a C++ worker that maps them.

  same data    the MLP example for 30 steps on the IDX files and on the same
               images and labels as .npy (uint8 images [n, 1, 28, 28],
               int64 labels): the fetched weights are bit for bit the same
               (the same samples, converted alike, in the same order);
  filled in    the Python client fills dataset.shape and train_size from
               the files' headers;
  refused      labels beyond dataset.classes at submit (the client names
               the file), and a job whose files a worker cannot open fails
               with the worker's reason naming the file; the server and the
               worker go on to train the next job: the example
               (examples/fashion-mnist-npy, its export.py's files).

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
                                       "--devices=cpu:1", "--name=w"],
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
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    print("ok")


if __name__ == "__main__":
    main()
