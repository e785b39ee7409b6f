#!/usr/bin/python3
"""Image folders (dataset.name: image_folder) trained by a C++ worker.

  same data    3000 Fashion-MNIST images as PNGs (examples/fashion-mnist-png/
               export.py) and the same images and labels as .npy arrays in
               the folder's order: the MLP's weights after 30 steps are bit
               for bit the same (PNG decoded exactly, the same samples in the
               same order); the Python client filled in classes and
               train_size, and the worker's metrics count the bytes read and
               the loader's wait;
  bad files    a PNG that does not decode fails its job naming the file; with
               skip_bad the job succeeds, another image in its place, counted
               in the worker's metrics; a folder whose count disagrees with
               the job's train_size fails naming both numbers; the server
               and the worker go on to the next job;
  fingerprint  a worker whose folder holds other files at the same path (a
               mount namespace: one image rewritten, the counts the same)
               takes a dead member's slot in a running two-worker job and is
               refused, the job's message naming both fingerprints (needs
               root and unshare; skipped without);
  jpeg         RGB JPEGs of 40x36 cropped to 32x32, normalised, augmented
               (random crop after padding, flips) and decoded on two threads
               train a classifier of their colours (needs python3-pil to
               write them; skipped without).

  image_folder_test.py BUILD_DIR
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

BUILD = os.path.abspath(sys.argv[1])
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(BUILD, "python"))
sys.path.insert(0, os.path.join(ROOT, "examples", "fashion-mnist-png"))
try:
    import numpy as np
    import tally
    from tally import tally_pb2 as pb
    from export import png
except ImportError as e:
    print(f"SKIP: {e}")
    sys.exit(77)


def fail(msg):
    raise SystemExit(f"FAIL: {msg}")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def tensors(path):
    """A .safetensors file's tensors without its metadata (the job's name)."""
    with open(path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    return header, data[8 + n:]


def spec(tmp, name, dataset, model=None, steps=30):
    path = f"{tmp}/{name}.json"
    model = model or {"layers": ["flatten",
                                 {"linear": {"in_features": 784, "out_features": 64}},
                                 "relu",
                                 {"linear": {"in_features": 64, "out_features": 10}}]}
    with open(path, "w") as f:
        json.dump({"name": name, "model": model, "dataset": dataset,
                   "training": {"epochs": 1, "batch_size": 32, "max_steps": steps,
                                "seed": 5, "workers": 1},
                   "optimizer": {"type": "sgd", "lr": 0.05, "momentum": 0.9}}, f)
    return path


def metric(port, name):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    for line in text.decode().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.split()[-1])
    fail(f"the worker's metrics have no {name}")


def run(c, path, want=pb.SUCCEEDED, timeout=300):
    job = c.wait(c.submit(path).id, timeout=timeout)
    if job.state != want:
        fail(f"{os.path.basename(path)}: {pb.JobState.Name(job.state)}: {job.message}")
    return job


def same_data(tmp, c, metrics_port):
    subprocess.run([sys.executable, f"{ROOT}/examples/fashion-mnist-png/export.py",
                    f"{tmp}/png", "--limit", "3000"], check=True, capture_output=True)
    classes, files, labels = tally.client.list_image_folder(f"{tmp}/png/train")
    # The folder's order as arrays: each file's pixels as the IDX holds them.
    x = np.stack([decode_gray(f) for f in files])[:, None]
    np.save(f"{tmp}/x.npy", x)
    np.save(f"{tmp}/y.npy", np.array(labels, np.int64))
    folder = {"name": "image_folder", "train": f"{tmp}/png/train",
              "test": f"{tmp}/png/test", "shape": [1, 28, 28]}
    filled = json.loads(tally.client.prepare_spec(spec(tmp, "probe", folder)))["dataset"]
    if filled.get("classes") != 10 or filled.get("train_size") != 3000:
        fail(f"the client filled in {filled}")
    arrays = {"name": "arrays", "classes": 10,
              "train": {"inputs": f"{tmp}/x.npy", "labels": f"{tmp}/y.npy"}}
    got = {}
    for name, dataset in (("npy", arrays), ("png", folder)):
        job = run(c, spec(tmp, name, dataset))
        c.fetch(job.id, f"{tmp}/{name}.safetensors")
        got[name] = tensors(f"{tmp}/{name}.safetensors")
    if got["png"] != got["npy"]:
        fail("the image folder trained other weights than the same .npy arrays")
    read = metric(metrics_port, "tally_worker_loader_read_bytes_total")
    waits = metric(metrics_port, "tally_worker_loader_wait_seconds_count")
    if read <= 0 or waits < 60:
        fail(f"the loader's metrics: {read} bytes read, {waits} waits")
    print(f"an image folder: weights bit for bit those of the same .npy arrays; "
          f"the worker read {read / 1e6:.1f} MB, {waits:.0f} loader waits counted")
    return folder


def decode_gray(path):
    """A grayscale PNG export.py wrote (one IDAT, filter 0 on every row)."""
    import zlib
    with open(path, "rb") as f:
        data = f.read()
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    at, idat = 8, b""
    while at < len(data):
        n = int.from_bytes(data[at:at + 4], "big")
        if data[at + 4:at + 8] == b"IDAT":
            idat += data[at + 8:at + 8 + n]
        at += 12 + n
    rows = zlib.decompress(idat)
    return np.frombuffer(b"".join(rows[r * (width + 1) + 1:(r + 1) * (width + 1)]
                                  for r in range(height)), np.uint8).reshape(height, width)


def bad_files(tmp, c, metrics_port, folder):
    shutil.copytree(f"{tmp}/png/train", f"{tmp}/bad")
    with open(f"{tmp}/bad/3-dress/00001-broken.png", "wb") as f:
        f.write(png(28, 28, bytes(28 * 28))[:60])  # cut inside its data
    bad = dict(folder, train=f"{tmp}/bad", train_size=3001, classes=10)
    bad.pop("test")
    job = run(c, spec(tmp, "bad", bad), want=pb.FAILED, timeout=120)
    if "00001-broken.png: does not decode" not in job.message:
        fail(f"an image that does not decode: {job.message}")
    print(f"an image that does not decode: FAILED: {job.message}")
    before = metric(metrics_port, "tally_worker_loader_substituted_total")
    # Every sample, so the broken one is met.
    job = run(c, spec(tmp, "skip", dict(bad, skip_bad=True), steps=94))
    after = metric(metrics_port, "tally_worker_loader_substituted_total")
    if after - before != 1:
        fail(f"skip_bad: {after - before} substitutions counted, not 1")
    print(f"skip_bad: SUCCEEDED ({job.metrics.samples} samples), 1 substitution counted")
    wrong = dict(folder, classes=10, train_size=2999)
    job = c._call("SubmitJob", pb.SubmitJobRequest, pb.SubmitJobResponse)(
        pb.SubmitJobRequest(spec=json.dumps(json.load(open(spec(tmp, "wrong", wrong))))),
        timeout=10).job
    job = c.wait(job.id, timeout=60)
    if job.state != pb.FAILED or "holds 3000 images in 10 classes" not in job.message \
            or "submitted with 2999" not in job.message:
        fail(f"a count the worker disagrees with: {pb.JobState.Name(job.state)}: "
             f"{job.message}")
    print(f"a folder whose count disagrees: FAILED: {job.message}")


def jpeg(tmp, c):
    try:
        from PIL import Image
    except ImportError:
        print("jpeg: skipped (python3-pil writes the JPEGs)")
        return
    rng = np.random.default_rng(2)
    colours = {"blue": (30, 40, 200), "green": (40, 180, 50), "red": (210, 40, 30)}
    for split, n in (("train", 60), ("test", 20)):
        for name, rgb in colours.items():
            os.makedirs(f"{tmp}/jpg/{split}/{name}", exist_ok=True)
            for i in range(n):
                noise = rng.integers(-40, 40, size=(36, 40, 3))
                pixels = np.clip(np.array(rgb) + noise, 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(f"{tmp}/jpg/{split}/{name}/{i:03d}.jpg",
                                             quality=90)
    dataset = {"name": "image_folder", "train": f"{tmp}/jpg/train", "test": f"{tmp}/jpg/test",
               "shape": [3, 32, 32], "resize": "crop", "mean": [0.5, 0.5, 0.5],
               "std": [0.25, 0.25, 0.25], "augment": {"crop_padding": 4, "hflip": True},
               "threads": 2}
    model = {"layers": ["flatten", {"linear": {"in_features": 3 * 32 * 32, "out_features": 3}}]}
    job = run(c, spec(tmp, "jpeg", dataset, model=model, steps=40))
    if job.metrics.test_accuracy < 0.9:
        fail(f"jpeg: test accuracy {job.metrics.test_accuracy} on three colours")
    print(f"jpeg: 40x36 RGB cropped to 32x32, augmented, two threads: test accuracy "
          f"{job.metrics.test_accuracy:.3f}")


def fingerprint(tmp, c, server, folder):
    if os.geteuid() != 0 or not shutil.which("unshare"):
        print("fingerprint: skipped (needs root and unshare for a mount namespace)")
        return
    shutil.copytree(f"{tmp}/png/train", f"{tmp}/other")
    first = sorted(os.listdir(f"{tmp}/other/0-tshirt-top"))[0]
    with open(f"{tmp}/other/0-tshirt-top/{first}", "wb") as f:
        f.write(png(28, 28, bytes(range(28)) * 28))
    procs = []

    def worker(name, bind=None):
        cmd = [f"{BUILD}/worker/tally-worker", f"--server={server}", "--devices=cpu:1",
               f"--name={name}", f"--data_root={tmp}"]
        if bind:
            cmd = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                   'mount --bind "$0" "$1" && shift && exec "$@"', bind,
                   f"{tmp}/png/train"] + cmd
        log = open(f"{tmp}/{name}.log", "w")
        procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))
        return procs[-1]
    try:
        second = worker("right")
        path = f"{tmp}/two.json"
        with open(path, "w") as f:
            json.dump({"name": "two", "dataset": folder,
                       "model": {"layers": ["flatten", {"linear": {"in_features": 784,
                                                                   "out_features": 10}}]},
                       "training": {"epochs": 200, "batch_size": 32, "seed": 1, "workers": 2},
                       "optimizer": {"type": "sgd", "lr": 0.01}}, f)
        job = c.submit(path)
        while c.status(job.id).metrics.step < 20:
            time.sleep(0.1)
        second.kill()  # its slot falls vacant when its lease ends
        worker("other", bind=f"{tmp}/other")
        deadline = time.time() + 60
        while "differ from the job's" not in c.status(job.id).message:
            if time.time() > deadline:
                fail(f"a worker with other files: {c.status(job.id)}")
            time.sleep(0.2)
        message = c.status(job.id).message
        c.cancel(job.id)
        print(f"a worker with other files: refused: {message}")
    finally:
        for p in procs:
            p.kill()
            p.wait()


def main():
    tmp = tempfile.mkdtemp(prefix="tally-images-")
    procs = []
    try:
        port, metrics_port = free_port(), free_port()
        server = f"127.0.0.1:{port}"
        log = open(f"{tmp}/server.log", "w")
        procs.append(subprocess.Popen([f"{BUILD}/server/tally-server", f"--port={port}",
                                       "--lease_timeout_ms=2000"],
                                      stdout=log, stderr=subprocess.STDOUT))
        wlog = open(f"{tmp}/worker.log", "w")
        procs.append(subprocess.Popen([f"{BUILD}/worker/tally-worker", f"--server={server}",
                                       "--devices=cpu:1", "--name=w", f"--data_root={tmp}",
                                       f"--metrics_port={metrics_port}"],
                                      stdout=wlog, stderr=subprocess.STDOUT))
        c = tally.Client(server)
        time.sleep(0.5)
        folder = same_data(tmp, c, metrics_port)
        bad_files(tmp, c, metrics_port, folder)
        jpeg(tmp, c)
        wlog.flush()
        with open(f"{tmp}/worker.log") as f:
            if "skip_bad: another image in place of" not in f.read():
                fail("the worker did not log the image it skipped")
        fingerprint(tmp, c, server, folder)
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    print("ok")


if __name__ == "__main__":
    main()
