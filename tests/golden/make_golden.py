#!/usr/bin/python3
"""Writes the PyTorch golden fixtures the C++ tests compare against.

Run with Debian's python3-torch:  /usr/bin/python3 tests/golden/make_golden.py
Each fixture is a small .safetensors file (written here by hand, so the
safetensors package is not needed) holding inputs, parameters and PyTorch's
outputs and gradients for one fixed case. Labels are stored as float32.
"""
import json
import os
import struct

import torch
from torch import nn

OUT = os.path.dirname(os.path.abspath(__file__))


def save(name, tensors):
    header, blobs, offset = {}, [], 0
    for key in sorted(tensors):
        t = tensors[key].detach().to(torch.float32).contiguous()
        raw = t.numpy().tobytes()
        header[key] = {"dtype": "F32", "shape": list(t.shape),
                       "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":"))
    text += " " * (-len(text) % 8)
    with open(os.path.join(OUT, name + ".safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text.encode())
        for b in blobs:
            f.write(b)


def layer_case(name, layer, x_shape):
    x = torch.randn(*x_shape, requires_grad=True)
    y = layer(x)
    dy = torch.randn_like(y)
    y.backward(dy)
    t = {"x": x, "y": y, "dy": dy, "dx": x.grad}
    for pname, p in layer.named_parameters():
        t[pname] = p
        t["d" + pname] = p.grad
    save(name, t)


def optimizer_case(name, make_opt, steps=3, n=10):
    p = torch.randn(n, requires_grad=True)
    t = {"p0": p.detach().clone()}
    opt = make_opt([p])
    for s in range(steps):
        g = torch.randn(n)
        p.grad = g.clone()
        opt.step()
        t[f"g{s}"] = g
        t[f"p{s + 1}"] = p.detach().clone()
    save(name, t)


def main():
    torch.manual_seed(1234)
    layer_case("linear", nn.Linear(5, 3), (4, 5))
    layer_case("conv2d_s1p0", nn.Conv2d(2, 3, 3), (2, 2, 6, 6))
    layer_case("conv2d_s2p1", nn.Conv2d(2, 4, 3, stride=2, padding=1), (2, 2, 7, 7))
    layer_case("maxpool2d_k2", nn.MaxPool2d(2), (2, 3, 6, 6))
    layer_case("maxpool2d_k3s2p1", nn.MaxPool2d(3, stride=2, padding=1), (2, 2, 7, 7))
    layer_case("relu", nn.ReLU(), (4, 6))

    logits = torch.randn(6, 5, requires_grad=True)
    labels = torch.tensor([0, 4, 2, 2, 1, 3])
    loss = nn.CrossEntropyLoss()(logits, labels)
    loss.backward()
    save("cross_entropy", {"logits": logits, "labels": labels.float(),
                           "loss": loss.reshape(1), "dlogits": logits.grad})

    optimizer_case("sgd_plain", lambda p: torch.optim.SGD(p, lr=0.1))
    optimizer_case("sgd_momentum", lambda p: torch.optim.SGD(
        p, lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01))
    optimizer_case("sgd_nesterov", lambda p: torch.optim.SGD(
        p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01))
    optimizer_case("adam", lambda p: torch.optim.Adam(
        p, lr=0.01, betas=(0.8, 0.99), weight_decay=0.1))
    optimizer_case("adamw", lambda p: torch.optim.AdamW(
        p, lr=0.01, betas=(0.9, 0.999), weight_decay=0.1))

    # A whole model: checks the state_dict order of the flat layout too.
    model = nn.Sequential(nn.Conv2d(1, 3, 3), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(27, 5))
    x = torch.randn(4, 1, 8, 8)
    labels = torch.tensor([1, 0, 4, 2])
    logits = model(x)
    loss = nn.CrossEntropyLoss()(logits, labels)
    loss.backward()
    t = {"x": x, "labels": labels.float(), "logits": logits,
         "loss": loss.reshape(1)}
    for pname, p in model.named_parameters():
        t["param." + pname] = p
        t["grad." + pname] = p.grad
    save("model_cnn", t)


if __name__ == "__main__":
    main()
