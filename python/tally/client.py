"""tally.Client: submit, watch, cancel and fetch jobs from Python, as the
`tally` CLI does, plus what only Python can do at submission: a job whose
model is Python code (model.python) is submitted with the file's text and
the module's parameter layout, found by building the module once here with
the job's seed. Errors in the model (a file that does not import, a missing
build function, a module without parameters, a forward that raises or whose
output the loss cannot take) are raised here, before anything is sent.

  with tally.Client("localhost:7070") as c:
      job = c.submit("examples/resnet.yaml")      # the Job message
      job = c.wait(job.id)                        # until it ends
      c.fetch(job.id, "resnet.safetensors")
  model.load_state_dict(tally.load_state_dict("resnet.safetensors"))

Every error is a tally.TallyError (tally/errors.py): SubmitError and
ModelError before anything is sent, an RpcError (NotFound, Unavailable, ...)
for a call that failed; grpc's own exceptions never leave the Client.
"""
from __future__ import annotations

import json
import os
import re
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

import grpc
from google.protobuf.message import DecodeError

from tally import tally_pb2 as pb
from tally.errors import FailedPrecondition, ModelError, RpcError, SubmitError, rpc_error

if TYPE_CHECKING:
    import numpy.typing as npt
    import torch

__all__ = [
    "Client", "SubmitError", "TERMINAL", "count_tokens", "list_image_folder",
    "load_state_dict", "prepare_spec", "read_vocabulary",
]

TERMINAL = (pb.SUCCEEDED, pb.FAILED, pb.CANCELLED)
MAX_MODEL_BYTES = 1 << 20  # the coordinator's default max_model_bytes
INPUT_SHAPES = {"fashion-mnist": (1, 28, 28)}

# One split's shards: (inputs, labels, (their names)) each.
Shards = list[tuple["npt.NDArray[Any]", "npt.NDArray[Any]", tuple[str, str]]]
# A vocabulary as the workers read it: {token: id}, <unk>'s id, the count.
Vocabulary = tuple[dict[bytes, int], "int | None", int]

_Response = TypeVar("_Response")


def _read_spec(path: str) -> Any:
    with open(path) as f:
        text = f.read()
    try:
        import yaml
        return yaml.safe_load(text)
    except ImportError:
        return json.loads(text)


def _sample_shape(dataset: dict[str, Any]) -> tuple[tuple[int, ...], int]:
    name = dataset.get("name")
    if name == "synthetic":  # the coordinator's defaults (docs/job-spec.md)
        return (int(dataset.get("features", 32)),), int(dataset.get("classes", 4))
    if name in ("arrays", "csv", "image_folder"):
        return tuple(int(d) for d in dataset.get("shape") or ()), int(dataset.get("classes", 0))
    if name == "text":
        return (int(dataset.get("seq_len", 128)),), int(dataset.get("vocab_size", 256))
    if name in ("clicks", "criteo"):  # int64 counts, then ids; a click or not
        return (int(dataset.get("integer_features", 13))
                + int(dataset.get("categorical_features", 26)),), 2
    if name in INPUT_SHAPES:
        return INPUT_SHAPES[name], 10
    raise SubmitError(f"dataset.name: unknown dataset '{name}'")


def _check_forward(module: torch.nn.Module, loss: str, shape: Sequence[int], classes: int,
                   tokens: bool = False, ids: bool = False) -> None:
    """A forward pass on two zero samples: the output the loss needs. With
    `tokens` (text), the samples are int64 ids and the labels one a token,
    and cross_entropy needs logits [2, seq_len, vocabulary]; with `ids`
    (clicks), the samples are int64 and the labels one a sample."""
    import torch
    from tally.engine import _cut
    import traceback
    x = torch.zeros((2,) + tuple(shape),
                    dtype=torch.long if tokens or ids else torch.float32)
    y = torch.zeros((2,) + (tuple(shape) if tokens else ()), dtype=torch.long)
    want = [2] + (list(shape) if tokens else []) + [classes]
    module.eval()  # BatchNorm's running statistics, untouched
    try:
        with torch.no_grad():
            out = module(x, y) if loss == "model" else module(x)
    except BaseException:  # noqa: B902
        raise ModelError("the module's forward raised on a batch of the dataset's "
                         f"samples {list(shape)}:\n" + _cut(traceback.format_exc()))
    if loss == "model":
        if not isinstance(out, torch.Tensor) or out.dim() != 0:
            raise ModelError("with loss: model, forward(x, y) must return the scalar loss")
    elif loss == "binary_cross_entropy":
        if not isinstance(out, torch.Tensor) or list(out.shape) not in ([2], [2, 1]):
            got = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise ModelError(f"the module returns {got} for 2 samples; binary_cross_entropy "
                             f"needs one logit a sample, [2] or [2, 1]")
    elif not isinstance(out, torch.Tensor) or list(out.shape) != want:
        got = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        what = "the vocabulary's tokens" if tokens else "classes"
        raise ModelError(f"the module returns {got} for 2 samples; {loss} needs "
                         f"{want} ({classes} {what})")


def _read(where: str) -> str:
    """A model file's text."""
    try:
        with open(where, "rb") as f:
            code = f.read()
    except OSError as e:
        raise SubmitError(f"model.python.file: cannot read {where}: {e.strerror}")
    if len(code) > MAX_MODEL_BYTES:
        raise SubmitError(f"model.python.file: {where} is {len(code)} bytes, over the "
                          f"limit of {MAX_MODEL_BYTES} (max_model_bytes)")
    return code.decode("utf-8")


def _pack(root: str) -> dict[str, str]:
    """A model directory's .py files, {relative path: text}, in path
    order (hidden directories and __pycache__ left out)."""
    files: dict[str, str] = {}
    total = 0
    for d, dirs, names in os.walk(root):
        dirs[:] = sorted(x for x in dirs if not x.startswith(".") and x != "__pycache__")
        for name in sorted(names):
            if not name.endswith(".py"):
                continue
            rel = os.path.relpath(os.path.join(d, name), root).replace(os.sep, "/")
            files[rel] = _read(os.path.join(d, name))
            total += len(files[rel].encode("utf-8"))
    if not files:
        raise SubmitError(f"model.python.file: {root} holds no .py file")
    if total > MAX_MODEL_BYTES:
        raise SubmitError(f"model.python.file: {root}'s .py files are {total} bytes, over "
                          f"the limit of {MAX_MODEL_BYTES} (max_model_bytes)")
    return files


SAFETENSORS_DTYPES = {"BOOL": "|b1", "U8": "|u1", "I8": "|i1", "U16": "<u2", "I16": "<i2",
                      "U32": "<u4", "I32": "<i4", "U64": "<u8", "I64": "<i8", "F16": "<f2",
                      "F32": "<f4", "F64": "<f8"}


def _expand(path: str) -> list[str]:
    """The files a path names, as the workers expand it: itself, or a glob's
    matches sorted (none: an error)."""
    import glob
    if not any(c in path for c in "*?["):
        return [path]
    found = sorted(glob.glob(path))
    if not found:
        raise SubmitError(f"{path}: the pattern matches no file")
    return found


def _map_array(path: str, key: str, labels: bool = False) -> npt.NDArray[Any]:
    """The array `key` of a .npz or .safetensors file, or a .npy file,
    memory-mapped (nothing read but its header)."""
    import numpy as np
    if path.endswith(".npz"):
        import zipfile
        with zipfile.ZipFile(path) as z:
            try:
                info = z.getinfo(key + ".npy")
            except KeyError:
                raise SubmitError(f"{path}: no array '{key}' (it holds "
                                  f"{', '.join(n[:-4] for n in z.namelist())})")
            if info.compress_type != zipfile.ZIP_STORED:
                raise SubmitError(f"{path}[{key}]: compressed (np.savez_compressed), so it "
                                  f"cannot be mapped: save it with np.savez")
            with z.open(info) as f:
                version = np.lib.format.read_magic(f)
                read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                        else np.lib.format.read_array_header_2_0)
                shape, fortran, dtype = read(f)
                array_at = f.tell()  # in the member, after the .npy header
        with open(path, "rb") as f:
            f.seek(info.header_offset + 26)
            n, extra = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2), "little")
        offset = info.header_offset + 30 + n + extra + array_at
        if fortran:
            raise SubmitError(f"{path}[{key}]: Fortran order")
        return np.memmap(path, dtype, "r", offset, shape) if np.prod(shape) else \
            np.zeros(shape, dtype)
    if path.endswith(".safetensors"):
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
        if key not in header:
            raise SubmitError(f"{path}: no tensor '{key}' (it holds "
                              f"{', '.join(k for k in header if k != '__metadata__')})")
        t = header[key]
        dtype = SAFETENSORS_DTYPES.get(t["dtype"], "<u2" if t["dtype"] == "BF16" else None)
        if dtype is None or (labels and t["dtype"] == "BF16"):
            raise SubmitError(f"{path}[{key}]: dtype {t['dtype']} is not one the workers "
                              f"read{' for labels (integers)' if labels else ''}")
        shape = tuple(t["shape"])
        return np.memmap(path, dtype, "r", 8 + n + t["data_offsets"][0],
                         shape) if np.prod(shape) else np.zeros(shape, dtype)
    return np.load(path, mmap_mode="r")


def _split_shards(split: dict[str, Any]) -> Shards | None:
    """(inputs, labels, names) of each shard of one split; None when its
    files are not on this machine."""
    file, inputs, labels = split.get("file"), split.get("inputs"), split.get("labels")
    if not (inputs and labels):
        return None
    if file:
        paths = _expand(file) if any(c in file for c in "*?[") or os.path.exists(file) else []
        return [(_map_array(p, inputs), _map_array(p, labels, True), (f"{p}[{inputs}]",
                                                                f"{p}[{labels}]"))
                for p in paths] or None
    if not any(c in inputs for c in "*?[") and not os.path.exists(inputs):
        return None
    ins, labs = _expand(inputs), _expand(labels)
    if len(ins) != len(labs):
        raise SubmitError(f"{inputs} matches {len(ins)} files, {labels} {len(labs)}")
    return [(_map_array(i, ""), _map_array(l, "", True), (i, l)) for i, l in zip(ins, labs)]


def _fill_arrays(dataset: dict[str, Any]) -> None:
    """An arrays dataset whose files this machine can read (the workers'
    paths, on a shared mount or here): its shape and train_size filled in
    from the headers (.npy, .npz, .safetensors; every shard of a glob),
    checked against what the spec says, and its labels against its
    classes. Files not here are left to the workers."""
    train = dataset.get("train") or {}
    splits = [("train", train)] + ([("test", dataset["test"])] if dataset.get("test") else [])
    for name, split in splits:
        try:
            shards = _split_shards(split) if isinstance(split, dict) else None
        except (ValueError, OSError) as e:
            raise SubmitError(f"dataset.{name}: {e}")
        if shards is None:
            continue
        total = 0
        for x, y, (inputs, labels) in shards:
            _check_shard(dataset, x, y, inputs, labels)
            total += len(x)
        if name == "train" and dataset.setdefault("train_size", total) != total:
            raise SubmitError(f"dataset.train_size is {dataset['train_size']}; the training "
                              f"files hold {total} samples")


def _check_shard(dataset: dict[str, Any], x: npt.NDArray[Any], y: npt.NDArray[Any],
                 inputs: str, labels: str) -> None:
    if x.ndim < 2 or y.ndim != 1 or len(x) != len(y):
        raise SubmitError(f"{inputs} is {list(x.shape)}, {labels} {list(y.shape)}: inputs "
                          f"[n, ...] and labels [n] are needed")
    for path, a, kinds in ((inputs, x, "biuf"), (labels, y, "biu")):
        if a.dtype.kind not in kinds or a.dtype.byteorder == ">" or not a.flags.c_contiguous:
            raise SubmitError(f"{path}: {a.dtype} "
                              f"{'(Fortran order) ' if not a.flags.c_contiguous else ''}"
                              f"is not what the workers read: "
                              f"{'integer labels' if a is y else 'little-endian numbers'}"
                              f" in C order")
    shape = list(x.shape[1:])
    if dataset.setdefault("shape", shape) != shape:
        raise SubmitError(f"dataset.shape is {dataset['shape']}; {inputs} holds samples "
                          f"of {shape}")
    classes = int(dataset.get("classes", 0))
    if classes and len(y) and not (0 <= int(y.min()) and int(y.max()) < classes):
        raise SubmitError(f"{labels}: labels from {int(y.min())} to {int(y.max())}; "
                          f"dataset.classes is {classes}")


IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg")


def list_image_folder(root: str) -> tuple[list[str], list[str], list[int]]:
    """An image folder as the workers list it (common/data/image_folder.h):
    the class directories sorted by name, and each class's .png, .jpg and
    .jpeg files at any depth, sorted by path.

    Args:
        root: the folder, a directory per class.

    Returns:
        (classes, files, labels): the class names, every image's path, and
        each image's class index.

    Raises:
        OSError: `root` cannot be listed.
    """
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    files: list[str] = []
    labels: list[int] = []
    for label, c in enumerate(classes):
        mine: list[str] = []
        for where, _, names in os.walk(os.path.join(root, c), followlinks=True):
            mine += [os.path.join(where, n) for n in names
                     if os.path.splitext(n)[1].lower() in IMAGE_EXTENSIONS]
        mine.sort()
        files += mine
        labels += [label] * len(mine)
    return classes, files, labels


def _fill_image_folder(dataset: dict[str, Any]) -> None:
    """An image folder this machine can see: its classes and train_size
    filled in from the directories and checked against what the spec says."""
    train = dataset.get("train")
    if not (isinstance(train, str) and os.path.isdir(train)):
        return
    classes, files, _ = list_image_folder(train)
    if not classes:
        raise SubmitError(f"dataset.train: {train} holds no class directory")
    for key, value in (("classes", len(classes)), ("train_size", len(files))):
        if dataset.setdefault(key, value) != value:
            raise SubmitError(f"dataset.{key} is {dataset[key]}; {train} holds {len(files)} "
                              f"images in {len(classes)} class directories")


def _trim(cell: str) -> str:
    """A cell as the workers read it: spaces around it and one pair of
    double quotes taken away."""
    cell = cell.lstrip(" \t").rstrip(" \t\r")
    if len(cell) >= 2 and cell[0] == cell[-1] == '"':
        cell = cell[1:-1]
    return cell


NUMBER = re.compile(r"^-?[0-9]+(\.[0-9]*)?([eE][+-]?[0-9]+)?$")


def _fill_csv(dataset: dict[str, Any]) -> None:
    """A csv dataset whose training file this machine can read: its shape
    (the feature columns) and train_size (the rows) filled in and checked,
    and its labels against its classes, reading the file as the workers do
    (common/data/csv.h); cells that are not numbers are left for the
    workers to name."""
    train = dataset.get("train")
    if not (train and os.path.exists(train)):
        return
    with open(train, encoding="utf-8", errors="replace") as f:
        lines = f.read().split("\n")
    while lines and not _trim(lines[-1]):
        lines.pop()
    if not lines:
        raise SubmitError(f"{train}: no header row")
    header = [_trim(c) for c in lines[0].split(",")]
    if len(set(header)) != len(header):
        raise SubmitError(f"{train}: two columns of one name in {header}")
    label = dataset.get("label")
    if label not in header:
        raise SubmitError(f"{train}: the header has no column '{label}' (dataset.label)")
    features = dataset.get("features") or [c for c in header if c != label]
    if label in features:
        raise SubmitError(f"dataset.features: '{label}' is the label, not a feature")
    shape = [len(features)]
    if dataset.setdefault("shape", shape) != shape:
        raise SubmitError(f"dataset.shape is {dataset['shape']}; {train} has {shape[0]} "
                          "feature columns")
    rows = len(lines) - 1
    if dataset.setdefault("train_size", rows) != rows:
        raise SubmitError(f"dataset.train_size is {dataset['train_size']}; {train} has "
                          f"{rows} rows")
    classes, at = int(dataset.get("classes", 0)), header.index(label)
    for line, text in enumerate(lines[1:], start=2):
        cells = text.split(",")
        cell = _trim(cells[at]) if len(cells) == len(header) else ""
        if classes and NUMBER.match(cell) and not (
                float(cell).is_integer() and 0 <= float(cell) < classes):
            raise SubmitError(f"{train}:{line}:{at + 1}: label '{cell}' is not an integer "
                              f"in [0, {classes}) (dataset.classes)")


ESCAPES = {"n": b"\n", "r": b"\r", "t": b"\t", "s": b" ", "\\": b"\\"}


def read_vocabulary(path: str) -> Vocabulary:
    """A vocabulary file as the workers read it (common/data/text.h): one
    token a line, escapes \\n \\r \\t \\s \\\\ \\xHH.

    Args:
        path: the vocabulary file.

    Returns:
        ({token bytes: id}, the id of <unk> or None, the count of tokens).

    Raises:
        OSError: the file cannot be read.
        SubmitError: a line is not a token (empty, a bad escape, twice).
    """
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    tokens: dict[bytes, int] = {}
    unknown: int | None = None
    for n, line in enumerate(lines, start=1):
        if not line:
            raise SubmitError(f"{path}:{n}: an empty line (a token has at least one byte)")
        out, i = b"", 0
        while i < len(line):
            c = line[i:i + 1]
            if c != b"\\":
                out, i = out + c, i + 1
                continue
            e = line[i + 1:i + 2].decode("latin-1")
            if e == "x":
                digits = line[i + 2:i + 4]
                if len(digits) != 2 or any(d not in b"0123456789abcdefABCDEF" for d in digits):
                    raise SubmitError(f"{path}:{n}: \\x needs two hex digits")
                out, i = out + bytes([int(digits, 16)]), i + 4
                continue
            if e not in ESCAPES:
                raise SubmitError(f"{path}:{n}: unknown escape \\{e}")
            out, i = out + ESCAPES[e], i + 2
        if out == b"<unk>":
            unknown = n - 1
        elif out in tokens:
            raise SubmitError(f"{path}:{n}: the token of line {tokens[out] + 1} again")
        else:
            tokens[out] = n - 1
    if not lines:
        raise SubmitError(f"{path}: no tokens")
    return tokens, unknown, len(lines)


def count_tokens(data: bytes, name: str, vocabulary: Vocabulary) -> int:
    """The tokens of `data` as the workers tokenize it: the longest token
    that matches at each place.

    Args:
        data: the text.
        name: its file's name, for the message.
        vocabulary: what read_vocabulary returns.

    Returns:
        The count of tokens.

    Raises:
        SubmitError: a byte starts no token and the vocabulary has no <unk>.
    """
    tokens, unknown, _ = vocabulary
    longest = max(len(t) for t in tokens) if tokens else 0
    at, n = 0, 0
    while at < len(data):
        for k in range(min(longest, len(data) - at), 0, -1):
            if data[at:at + k] in tokens:
                at += k
                break
        else:
            if unknown is None:
                raise SubmitError(f"{name}: byte {at} starts no token of "
                                  f"the vocabulary, which has no <unk>")
            at += 1
        n += 1
    return n


def _paths(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else list(value or [])


def _fill_text(dataset: dict[str, Any]) -> None:
    """A text corpus this machine can read: its vocab_size and train_size
    (the training windows) filled in and checked, counting tokens as the
    workers do. A vocabulary's train_size, when the spec states it, is
    left to the workers to check (tokenizing here runs at about 2 MB/s)."""
    import math
    train = _paths(dataset.get("train"))
    if not train or not all(any(c in p for c in "*?[") or os.path.exists(p) for p in train):
        return
    files = [f for p in train for f in _expand(p)]
    vocab = dataset.get("vocab", "bytes")
    vocabulary = None
    if vocab != "bytes":
        if not os.path.exists(vocab):
            return
        vocabulary = read_vocabulary(vocab)
        size = vocabulary[2]
        if dataset.setdefault("vocab_size", size) != size:
            raise SubmitError(f"dataset.vocab_size is {dataset['vocab_size']}; {vocab} "
                              f"holds {size} tokens")
    if vocabulary is not None and dataset.get("train_size"):
        return  # stated: counting runs at about 2 MB/s here; each worker checks it
    total = 0
    for f in files:
        if vocabulary is None:
            total += os.path.getsize(f)
        else:
            with open(f, "rb") as text:
                total += count_tokens(text.read(), f, vocabulary)
    fraction = 0.0 if dataset.get("test") else dataset.get("test_fraction", 0.1)
    seq_len = dataset.get("seq_len", 128)
    if not isinstance(fraction, (int, float)) or not 0 <= fraction < 1:
        raise SubmitError(f"dataset.test_fraction: must be in [0, 1), got {fraction!r}")
    if not isinstance(seq_len, int) or not 1 <= seq_len <= 65536:
        raise SubmitError(f"dataset.seq_len: must be an integer in [1, 65536], got {seq_len!r}")
    windows = math.floor((1.0 - fraction) * total) // (seq_len + 1)
    if dataset.setdefault("train_size", windows) != windows:
        raise SubmitError(f"dataset.train_size is {dataset['train_size']}; the training "
                          f"files hold {windows} windows")
    if windows == 0:
        raise SubmitError(f"dataset.train: {', '.join(train)} hold {total} tokens, "
                          f"not one window of seq_len + 1")


def _count_lines(path: str) -> int:
    """Lines of a file as the workers count them: its newlines, and one
    more for a last line without one."""
    n, last = 0, b"\n"
    with open(path, "rb") as f:
        while True:
            chunk = f.read(1 << 24)
            if not chunk:
                break
            n += chunk.count(b"\n")
            last = chunk[-1:]
    return n + (last != b"\n")


def _fill_criteo(dataset: dict[str, Any]) -> None:
    """Criteo logs this machine can read: train_size (the training lines)
    filled in and checked, counting lines as the workers do (they check
    every line's fields)."""
    import math
    train = _paths(dataset.get("train"))
    if not train or not all(any(c in p for c in "*?[") or os.path.exists(p) for p in train):
        return
    total = sum(_count_lines(f) for p in train for f in _expand(p))
    fraction = 0.0 if dataset.get("test") else dataset.get("test_fraction", 0.1)
    if not isinstance(fraction, (int, float)) or not 0 <= fraction < 1:
        raise SubmitError(f"dataset.test_fraction: must be in [0, 1), got {fraction!r}")
    lines = math.floor((1.0 - fraction) * total)
    if dataset.setdefault("train_size", lines) != lines:
        raise SubmitError(f"dataset.train_size is {dataset['train_size']}; the training "
                          f"files hold {lines} lines")
    if lines == 0:
        raise SubmitError(f"dataset.train: {', '.join(train)} hold no training line")


# The datasets whose files the client reads to fill in the spec.
_DATASET_FILLERS: dict[str, Callable[[dict[str, Any]], None]] = {
    "arrays": _fill_arrays, "csv": _fill_csv, "image_folder": _fill_image_folder,
    "text": _fill_text, "criteo": _fill_criteo}


def prepare_spec(path: str) -> str:
    """The spec at `path` as the coordinator takes it: a Python model's code
    and parameter layout filled in, and a dataset's shape and size from its
    files when they are here (arrays, csv, image_folder, text, criteo).

    Args:
        path: the spec, YAML (JSON without PyYAML).

    Returns:
        The spec's text: as it is, or as JSON where something was filled in.

    Raises:
        OSError: the spec cannot be read.
        SubmitError: the spec or its data are not what the workers take.
        ModelError: a Python model does not build, has no parameters, or
            its forward pass does not give what the loss takes.
    """
    spec = _read_spec(path)
    found = spec.get("dataset") if isinstance(spec, dict) else None
    dataset: dict[str, Any] = found if isinstance(found, dict) else {}
    named = dataset.get("name")
    fill = _DATASET_FILLERS.get(named) if isinstance(named, str) else None
    if fill is not None:
        fill(dataset)
    model = spec.get("model") if isinstance(spec, dict) else None
    if not isinstance(model, dict) or not isinstance(model.get("python"), dict):
        if fill is not None:
            return json.dumps(spec)
        with open(path) as f:
            return f.read()
    _fill_python_model(path, spec, model, named)
    return json.dumps(spec)


def _fill_python_model(path: str, spec: dict[str, Any], model: dict[str, Any],
                       named: Any) -> None:
    """Builds model.python's module here (seeded as the job's) and writes
    its code or files, parameter layout, buffers and aliases into the spec;
    raises as prepare_spec says."""
    py = model["python"]
    from tally.engine import ModelFiles, load_module, layout_of, state_of
    file = py.get("file")
    if not file:
        raise SubmitError("model.python.file: name the model's Python file or directory")
    where = os.path.join(os.path.dirname(os.path.abspath(path)), file)
    file = file.rstrip("/")
    code, files = (None, _pack(where)) if os.path.isdir(where) else (_read(where), None)
    build = py.get("build", "make_model")
    seed = int((spec.get("training") or {}).get("seed", 0))
    packed = ModelFiles(files) if files else None
    try:
        module = load_module(code, file, build, seed, packed)
    finally:
        if packed is not None:
            packed.close()
    if not layout_of(module):
        raise ModelError("the module has no parameters to train")
    shape, classes = _sample_shape(spec.get("dataset") or {})
    _check_forward(module, model.get("loss", "cross_entropy"), shape, classes,
                   tokens=named == "text", ids=named in ("clicks", "criteo"))
    tables = model.get("embeddings")
    if tables is not None:
        if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
            raise SubmitError("model.embeddings: a list of tables, each a mapping")
        from tally.engine import swap_tables
        # Their weights live on the shards, not in the flat vector.
        swap_tables(module, tables)
    layout = layout_of(module)
    if not layout:
        raise ModelError("the module has no parameters to train besides its tables")
    if files:
        py["files"] = files
    else:
        py["code"] = code
    py["build"] = build
    py["params"] = [{"name": n, "shape": s} for n, s in layout]
    buffers, aliases = state_of(module)
    py["buffers"] = [{"name": n, "dtype": d, "shape": s} for n, d, s in buffers]
    if aliases:
        py["aliases"] = aliases


def _rpc_error(e: grpc.RpcError) -> RpcError:
    """A failed call as Tally's exception: its code and message, and the
    tally.v1.ErrorDetail (reason, step) the server put in the status
    trailer (grpc-status-details-bin: an RpcStatus, which is
    google.rpc.Status on the wire; proto/tally.proto)."""
    # An error raised by the channel is a grpc.Call too; one raised
    # elsewhere (an interceptor) may lack what a Call has.
    if not isinstance(e, grpc.Call):
        return rpc_error(grpc.StatusCode.UNKNOWN, str(e))
    code, details = e.code(), e.details() or ""
    reason: str | None = None
    step = 0
    for key, value in e.trailing_metadata() or ():
        if key != "grpc-status-details-bin":
            continue
        try:
            found = [pb.ErrorDetail.FromString(d.value)
                     for d in pb.RpcStatus.FromString(value).details
                     if d.type_url.endswith("/tally.v1.ErrorDetail")]
        except DecodeError:  # not Tally's: the code and message say it all
            continue
        for detail in found:
            step = detail.step
            if detail.reason == pb.ERROR_REASON_UNSPECIFIED:
                reason = None
            elif detail.reason in pb.ErrorReason.values():
                reason = pb.ErrorReason.Name(detail.reason)
            else:  # a reason newer than this client: its number
                reason = str(detail.reason)
    return rpc_error(code, details, reason, step)


class Client:
    """Tally's JobService from Python: submit, status, wait, watch, cancel,
    fetch, list_jobs, shards, history and health, as the `tally` CLI does
    them (python3 -m tally is that CLI over this class). A context manager: leaving the
    `with` block closes the channel (close()).

    Every call has a deadline (`timeout` seconds; watch's its own). A call
    that fails raises an RpcError of the class its code calls for (see
    tally.errors); grpc's own exceptions do not leave the Client.

    Thread-safe as gRPC channels are: calls from several threads share the
    one channel.
    """

    def __init__(self, server: str = "localhost:7070", tls_ca: str | None = None,
                 tls_cert: str | None = None, tls_key: str | None = None,
                 token_file: str | None = None, timeout: float = 30.0) -> None:
        """Opens a channel to the coordinator.

        Args:
            server: the coordinator, host:port.
            tls_ca: the CA certificate (PEM) that signed the server's; TLS
                when given, else plaintext.
            tls_cert: this client's certificate (PEM), for mutual TLS.
            tls_key: its private key (PEM).
            token_file: a file holding a bearer token (TLS only).
            timeout: each call's deadline, in seconds.

        Raises:
            ValueError: a token without TLS (it is never sent in
                plaintext), or tls_ca without tls_cert and tls_key.
            OSError: a certificate, key or token file cannot be read.
        """
        self.timeout = timeout
        if token_file and not tls_ca:
            raise ValueError("a token needs TLS (tls_ca, tls_cert, tls_key): a bearer "
                             "token is never sent in plaintext")
        self.metadata: list[tuple[str, str]] = []
        if token_file:
            with open(token_file) as f:
                self.metadata = [("authorization", "Bearer " + f.read().strip())]
        opts = [("grpc.max_receive_message_length", 8 << 20)]
        if tls_ca:
            if not (tls_cert and tls_key):
                raise ValueError("TLS needs all of tls_ca, tls_cert and tls_key (mTLS: every "
                                 "program presents its own certificate)")

            def read(p: str) -> bytes:
                with open(p, "rb") as f:
                    return f.read()
            creds = grpc.ssl_channel_credentials(read(tls_ca), read(tls_key), read(tls_cert))
            self.channel = grpc.secure_channel(server, creds, options=opts)
        else:
            self.channel = grpc.insecure_channel(server, options=opts)
        self._closed = False

    def close(self) -> None:
        """Closes the channel; calls in flight are cancelled. Twice is
        harmless; a call afterwards raises ValueError."""
        if not self._closed:
            self._closed = True
            self.channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    @overload
    def _call(self, method: str, request_type: type[Any], response_type: type[_Response],
              kind: Literal["unary_unary"] = ...) -> Callable[..., _Response]: ...

    @overload
    def _call(self, method: str, request_type: type[Any], response_type: type[_Response],
              kind: Literal["unary_stream"]) -> Callable[..., Iterator[_Response]]: ...

    def _call(self, method: str, request_type: type[Any], response_type: type[Any],
              kind: str = "unary_unary") -> Callable[..., Any]:
        """The JobService method `method`, as a function of its request
        (and grpc's keyword arguments: timeout, metadata, wait_for_ready)
        that raises RpcError for a failed call. The timeout is the
        Client's and the metadata its token unless given.

        Raises:
            ValueError: the Client is closed.
        """
        if self._closed:
            raise ValueError("the Client is closed")
        rpc = getattr(self.channel, kind)(f"/tally.v1.JobService/{method}",
                                          request_serializer=request_type.SerializeToString,
                                          response_deserializer=response_type.FromString)

        def unary(request: Any, **kwargs: Any) -> Any:
            kwargs.setdefault("timeout", self.timeout)
            kwargs.setdefault("metadata", self.metadata)
            try:
                return rpc(request, **kwargs)
            except grpc.RpcError as e:
                raise _rpc_error(e) from e

        def stream(request: Any, **kwargs: Any) -> Iterator[Any]:
            kwargs.setdefault("timeout", self.timeout)
            kwargs.setdefault("metadata", self.metadata)
            try:
                yield from rpc(request, **kwargs)
            except grpc.RpcError as e:
                raise _rpc_error(e) from e
        return stream if kind == "unary_stream" else unary

    def submit(self, path: str) -> pb.Job:
        """Submits the job spec at `path`, prepared as prepare_spec does.

        Returns:
            The Job as queued.

        Raises:
            OSError: the spec or a file it names cannot be read.
            SubmitError: the spec or its data are refused here, before
                anything is sent.
            ModelError: a Python model cannot be built or run here.
            InvalidArgument: the coordinator refused a field (named).
            ResourceExhausted: too many jobs wait already.
            PermissionDenied: the token may not submit.
            Unavailable: the coordinator cannot be reached.
        """
        text = prepare_spec(path)
        rpc = self._call("SubmitJob", pb.SubmitJobRequest, pb.SubmitJobResponse)
        return rpc(pb.SubmitJobRequest(spec=text)).job

    def status(self, job_id: str) -> pb.Job:
        """The job as it is now.

        Raises:
            NotFound: no such job.
            PermissionDenied: another submitter's job.
            Unavailable: the coordinator cannot be reached.
        """
        rpc = self._call("GetJob", pb.GetJobRequest, pb.Job)
        return rpc(pb.GetJobRequest(job_id=job_id))

    def wait(self, job_id: str, timeout: float | None = None, poll: float = 0.5) -> pb.Job:
        """The job once it has ended, polled every `poll` seconds. A job
        that FAILED or was CANCELLED is returned as one that SUCCEEDED is:
        its state says which.

        Args:
            job_id: the job.
            timeout: seconds to wait at most; then the job as it is. None:
                until it ends.
            poll: seconds between two looks.

        Raises:
            NotFound, PermissionDenied, Unavailable: as status() does.
        """
        end = None if timeout is None else time.time() + timeout
        while True:
            job = self.status(job_id)
            if job.state in TERMINAL or (end is not None and time.time() > end):
                return job
            time.sleep(poll)

    def watch(self, job_id: str, timeout: float = 24 * 3600) -> Iterator[pb.Job]:
        """The job as it changes (WatchJob), from now until it has ended: a
        generator of Job messages whose last one is terminal. A job that
        ended already gives that one message.

        Args:
            job_id: the job.
            timeout: the stream's deadline, in seconds.

        Raises:
            NotFound: no such job.
            PermissionDenied: another submitter's job.
            Unavailable: the coordinator cannot be reached, or `timeout`
                passed (code DEADLINE_EXCEEDED).
        """
        rpc = self._call("WatchJob", pb.WatchJobRequest, pb.Job, "unary_stream")
        try:
            for job in rpc(pb.WatchJobRequest(job_id=job_id), timeout=timeout):
                yield job
                if job.state in TERMINAL:
                    return
        except FailedPrecondition:
            yield self.status(job_id)  # ended before the stream began

    def cancel(self, job_id: str) -> pb.Job:
        """Cancels the job.

        Returns:
            The job, CANCELLED.

        Raises:
            NotFound: no such job.
            FailedPrecondition: it has ended already (reason JOB_ENDED).
            PermissionDenied: the token may not cancel it.
            Unavailable: the coordinator cannot be reached.
        """
        rpc = self._call("CancelJob", pb.CancelJobRequest, pb.Job)
        return rpc(pb.CancelJobRequest(job_id=job_id))

    def fetch(self, job_id: str, path: str, timeout: float | None = None) -> int:
        """Writes the job's weights (safetensors) to `path`: streamed to
        `path`.part (a job's tables may be larger than this machine's
        memory), renamed into place once whole, so that `path` is never a
        partial file. A Python model's file without its buffers (which
        load_state_dict with strict=True refuses) is written with a warning
        saying why.

        Args:
            job_id: the job.
            path: the file to write.
            timeout: the stream's deadline, in seconds; None: 30 times the
                Client's (as `tally fetch` gives a file's stream; a job's
                tables may be gigabytes).

        Returns:
            The file's size in bytes.

        Raises:
            OSError: `path` cannot be written.
            NotFound: no such job.
            FailedPrecondition: it has no weights yet (JOB_NOT_STARTED).
            PermissionDenied: another submitter's job.
            Unavailable: the coordinator cannot be reached.
        """
        rpc = self._call("FetchWeights", pb.FetchWeightsRequest, pb.FileChunk, "unary_stream")
        n = 0
        note = ""
        part = path + ".part"
        try:
            with open(part, "wb") as f:
                for chunk in rpc(pb.FetchWeightsRequest(job_id=job_id),
                                 timeout=30 * self.timeout if timeout is None else timeout):
                    f.write(chunk.data)
                    n += len(chunk.data)
                    note = note or chunk.buffers_note
                f.flush()
                os.fsync(f.fileno())
            os.replace(part, path)
        except BaseException:
            if os.path.exists(part):
                os.remove(part)
            raise
        if note:
            warnings.warn(f"{path} has no buffers of the model: {note}", stacklevel=2)
        return n

    def list_jobs(self, omit_spec: bool = False, page_size: int = 500) -> Iterator[pb.Job]:
        """Every job the caller may see, a page at a time (ListJobs with
        its page tokens).

        Args:
            omit_spec: leave each Job's spec empty (smaller pages).
            page_size: jobs a page (the server takes at most 1000).

        Raises:
            PermissionDenied: the token may not list jobs.
            Unavailable: the coordinator cannot be reached.
        """
        rpc = self._call("ListJobs", pb.ListJobsRequest, pb.ListJobsResponse)
        request = pb.ListJobsRequest(omit_spec=omit_spec, page_size=page_size)
        while True:
            page = rpc(request)
            yield from page.jobs
            if not page.next_page_token:
                return
            request.page_token = page.next_page_token

    def shards(self) -> list[pb.ShardInfo]:
        """The parameter shards and the ranges of jobs each holds.

        Raises:
            PermissionDenied: the token may not see the shards.
            Unavailable: the coordinator cannot be reached.
        """
        rpc = self._call("ListShards", pb.ListShardsRequest, pb.ListShardsResponse)
        return list(rpc(pb.ListShardsRequest()).shards)

    def history(self, job_id: str) -> pb.JobHistory:
        """The job's curve (at most 1000 points) and its last 200 events.

        Raises:
            NotFound: no such job.
            PermissionDenied: another submitter's job.
            Unavailable: the coordinator cannot be reached.
        """
        rpc = self._call("GetJobHistory", pb.GetJobRequest, pb.JobHistory)
        return rpc(pb.GetJobRequest(job_id=job_id))

    def health(self, service: str = "") -> str:
        """The grpc.health.v1 check of `service` ("": the server itself).

        Returns:
            The status's name: "SERVING", "NOT_SERVING", "UNKNOWN" or
            "SERVICE_UNKNOWN" (a number a newer server may send, as text).

        Raises:
            NotFound: no such service.
            Unavailable: the server cannot be reached.
            ValueError: the Client is closed.
        """
        if self._closed:
            raise ValueError("the Client is closed")
        # grpc.health.v1's two messages by hand (the package carries no
        # health_pb2): HealthCheckRequest{string service = 1} and
        # HealthCheckResponse{ServingStatus status = 1}.
        name = service.encode("utf-8")
        request = b"\x0a" + _varint(len(name)) + name if name else b""
        rpc = self.channel.unary_unary("/grpc.health.v1.Health/Check")
        try:
            reply = rpc(request, timeout=self.timeout, metadata=self.metadata)
        except grpc.RpcError as e:
            raise _rpc_error(e) from e
        status = _field_one_varint(reply)
        return _SERVING_STATUS.get(status, str(status))


def resolve_shard_address(coordinator: str, address: str) -> str:
    """Where a shard named in a shard map or by ListShards is reached, for
    a client of the coordinator at `coordinator`: "host:port" as it is;
    ":port" on the coordinator's host (the coordinator's own shard, which
    listens apart from its control plane); empty, the coordinator itself.
    As ResolveShardAddress in proto/transport.cc."""
    if not address:
        return coordinator
    if not address.startswith(":"):
        return address
    colon = coordinator.rfind(":")
    return (coordinator[:colon] if colon >= 0 else coordinator) + address


_SERVING_STATUS = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


def _varint(n: int) -> bytes:
    """`n` (not negative) as a protobuf varint."""
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    """The varint at data[at:] and where it ends.

    Raises:
        DecodeError: it runs past the end.
    """
    value = shift = 0
    while True:
        if at >= len(data):
            raise DecodeError("a truncated varint")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def _field_one_varint(data: bytes) -> int:
    """Field 1 (a varint) of a serialized message; 0 where it is absent
    (proto3's default). Other fields are skipped by their wire type.

    Raises:
        DecodeError: the bytes are not a message.
    """
    value, at = 0, 0
    while at < len(data):
        tag, at = _read_varint(data, at)
        wire = tag & 7
        if wire == 0:
            v, at = _read_varint(data, at)
            if tag >> 3 == 1:
                value = v
        elif wire in (1, 5):
            at += 8 if wire == 1 else 4
        elif wire == 2:
            size, at = _read_varint(data, at)
            at += size
        else:
            raise DecodeError(f"wire type {wire}")
    return value


DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64",
          "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
          "BOOL": "bool"}


def load_state_dict(path: str) -> dict[str, torch.Tensor]:
    """A .safetensors file as {name: torch.Tensor} (what `tally fetch` and
    Client.fetch write), for module.load_state_dict(..., strict=True): the
    parameters, the buffers of a Python model, and tied weights under each
    of their names (stored once, their aliases in the metadata).

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
