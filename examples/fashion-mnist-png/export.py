#!/usr/bin/python3
"""Writes Fashion-MNIST (Debian's dataset-fashion-mnist IDX files) as the
image folder job.yaml trains on: a directory per class, one 28x28 grayscale
PNG per image, train and test:

    OUT/train/0-tshirt-top/00000.png ... OUT/train/9-ankle-boot/59999.png
    OUT/test/...

Class directories sort in label order (the workers number classes by
name); files are named by their index in the IDX file. The PNGs are
written with zlib alone (no imaging library needed).

    python3 examples/fashion-mnist-png/export.py [OUT_DIR] [--limit N]
    (default /tmp/fashion-mnist-png; --limit: the first N images of each split)
"""
import argparse
import gzip
import os
import struct
import zlib

ROOT = "/usr/share/datasets/fashion-mnist"
CLASSES = ["0-tshirt-top", "1-trouser", "2-pullover", "3-dress", "4-coat",
           "5-sandal", "6-shirt", "7-sneaker", "8-bag", "9-ankle-boot"]


def idx(name):
    """An IDX file's dimensions and its bytes of data."""
    with gzip.open(os.path.join(ROOT, name)) as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return shape, data[4 + 4 * dims:]


def png(width, height, gray):
    """An 8-bit grayscale PNG of `gray` (rows top to bottom)."""
    def chunk(kind, body):
        return (struct.pack(">I", len(body)) + kind + body +
                struct.pack(">I", zlib.crc32(kind + body) & 0xffffffff))
    rows = b"".join(b"\0" + gray[r * width:(r + 1) * width] for r in range(height))
    return (b"\x89PNG\r\n\x1a\n" +
            chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(rows, 6)) + chunk(b"IEND", b""))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", nargs="?", default="/tmp/fashion-mnist-png")
    p.add_argument("--limit", type=int, default=0)
    args = p.parse_args()
    for split, prefix in (("train", "train"), ("test", "t10k")):
        (n, rows, cols), pixels = idx(f"{prefix}-images-idx3-ubyte.gz")
        _, labels = idx(f"{prefix}-labels-idx1-ubyte.gz")
        n = min(n, args.limit) if args.limit > 0 else n
        for c in CLASSES:
            os.makedirs(os.path.join(args.out, split, c), exist_ok=True)
        size = rows * cols
        for i in range(n):
            path = os.path.join(args.out, split, CLASSES[labels[i]], f"{i:05d}.png")
            with open(path, "wb") as f:
                f.write(png(cols, rows, pixels[i * size:(i + 1) * size]))
        print(f"{args.out}/{split}: {n} PNGs of {cols}x{rows} in {len(CLASSES)} classes")


if __name__ == "__main__":
    main()
