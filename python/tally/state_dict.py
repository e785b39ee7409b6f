"""load_state_dict: a .safetensors file that `tally fetch` or Client.fetch
wrote, as PyTorch's module.load_state_dict takes it.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["DTYPES", "load_state_dict"]

DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64",
          "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
          "BOOL": "bool"}


def load_state_dict(path: str) -> dict[str, torch.Tensor]:
    """A .safetensors file as {name: torch.Tensor} (what `tally fetch` and
    Client.fetch write), for module.load_state_dict(..., strict=True): the
    parameters, the buffers of a Python model, and tied weights under each
    of their names (stored once, their aliases in the metadata).

    Args:
        path: the .safetensors file.

    Returns:
        {name: tensor}, with the file's dtypes and shapes.

    Raises:
        OSError: the file cannot be read.
        ValueError: it is not a safetensors file (its header does not parse).
        KeyError: a dtype PyTorch's safetensors files do not use.
    """
    import struct
    import torch
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = memoryview(data)[8 + n:]
    aliases = json.loads((header.get("__metadata__") or {}).get("aliases", "{}"))
    out: dict[str, torch.Tensor] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        dtype = getattr(torch, DTYPES[info["dtype"]])
        t = torch.frombuffer(bytearray(body[begin:end]), dtype=dtype) if end > begin else \
            torch.empty(0, dtype=dtype)
        out[name] = t.reshape(info["shape"])
    for alias, name in aliases.items():  # tied weights: stored once
        out[alias] = out[name]
    return out
