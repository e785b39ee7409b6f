#!/usr/bin/python3
"""Loads Tally's exported weights into PyTorch and compares test accuracy.

usage: check_pytorch_load.py mlp|cnn WEIGHTS.safetensors SUMMARY.json
(SUMMARY: tally-worker's --summary_json, or `tally status JOB --json`)
Reads the safetensors file by hand (Debian has no safetensors package), the
way safetensors.torch.load_file would, then load_state_dict(strict=True).
"""
import json
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, __file__.rsplit("/", 2)[0] + "/bench")
from pytorch_train import load_idx, model_for, normalize  # noqa: E402


def load_file(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    body = data[8 + n:]
    out = {}
    for name, info in header.items():
        assert info["dtype"] == "F32", info
        b, e = info["data_offsets"]
        arr = np.frombuffer(body[b:e], dtype="<f4").reshape(info["shape"])
        out[name] = torch.from_numpy(arr.copy())
    return out


def main():
    kind, weights, summary = sys.argv[1:4]
    model = model_for(kind)
    model.load_state_dict(load_file(weights), strict=True)
    root = "/usr/share/datasets/fashion-mnist"
    x = normalize(load_idx(f"{root}/t10k-images-idx3-ubyte.gz", 0x803))
    y = load_idx(f"{root}/t10k-labels-idx1-ubyte.gz", 0x801)
    with torch.no_grad():
        acc = (model(x).argmax(1) == y).float().mean().item()
    doc = json.load(open(summary))
    # A tally-worker --summary_json file, or `tally status --json` output.
    want = doc["test_accuracy"] if "test_accuracy" in doc else doc["metrics"]["test_accuracy"]
    print(f"{kind}: PyTorch accuracy {acc:.4f}, Tally reported {want:.4f}")
    if abs(acc - want) > 0.002:
        sys.exit(f"{kind}: accuracies differ")


if __name__ == "__main__":
    main()
