#!/usr/bin/python3
"""Writes Fashion-MNIST (Debian's dataset-fashion-mnist IDX files) as the
.npy arrays job.yaml trains on: uint8 images [n, 1, 28, 28] and int64
labels [n], train and test.

    python3 examples/fashion-mnist-npy/export.py [OUT_DIR]   (default /tmp/fashion-mnist-npy)
"""
import gzip
import os
import sys

import numpy as np

ROOT = "/usr/share/datasets/fashion-mnist"


def idx(name):
    with gzip.open(os.path.join(ROOT, name)) as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * dims).reshape(shape)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "/tmp/fashion-mnist-npy"
    os.makedirs(out, exist_ok=True)
    for split, prefix in (("train", "train"), ("test", "t10k")):
        x = idx(f"{prefix}-images-idx3-ubyte.gz")[:, None]
        y = idx(f"{prefix}-labels-idx1-ubyte.gz").astype(np.int64)
        np.save(os.path.join(out, f"x_{split}.npy"), x)
        np.save(os.path.join(out, f"y_{split}.npy"), y)
        print(f"{out}/x_{split}.npy {list(x.shape)} uint8, y_{split}.npy {list(y.shape)} int64")


if __name__ == "__main__":
    main()
