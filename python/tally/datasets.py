"""A dataset's files read here, at submission, as the workers will read
them: the spec's shape, size and classes filled in from them where the
spec leaves them out, and checked where it states them, so that a job
whose data the workers cannot train is refused before it is sent. Files
that are not on this machine are left to the workers.

FILLERS maps dataset.name to its filler (arrays, csv, image_folder, text,
criteo); list_image_folder, read_vocabulary and count_tokens read as the
workers do (common/data/).
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tally.errors import SubmitError

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = [
    "ESCAPES", "FILLERS", "IMAGE_EXTENSIONS", "NUMBER", "SAFETENSORS_DTYPES", "Shards",
    "Vocabulary", "count_tokens", "list_image_folder", "read_vocabulary",
]

# One split's shards: (inputs, labels, (their names)) each.
Shards = list[tuple["npt.NDArray[Any]", "npt.NDArray[Any]", tuple[str, str]]]
# A vocabulary as the workers read it: {token: id}, <unk>'s id, the count.
Vocabulary = tuple[dict[bytes, int], "int | None", int]


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
FILLERS: dict[str, Callable[[dict[str, Any]], None]] = {
    "arrays": _fill_arrays, "csv": _fill_csv, "image_folder": _fill_image_folder,
    "text": _fill_text, "criteo": _fill_criteo}
