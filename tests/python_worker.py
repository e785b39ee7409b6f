#!/usr/bin/env python3
"""A Tally worker daemon in Python, written from docs/cluster.md and
proto/tally.proto alone (numpy, grpcio and protobuf; no torch, nothing of
Tally's C++), so that the documentation cannot drift from what the servers
and tally-worker do.

    python3 tests/python_worker.py --server=HOST:PORT [--name=NAME] [--jobs=N]
    python3 tests/python_worker.py --self-test [--docs=docs/cluster.md]

As a daemon it registers with the coordinator, heartbeats from its own thread
every quarter lease, waits for an assignment and trains it by the documented
protocol against every shard of the job's shard map: a pull (clock,
min_version, max_wait_ms, the pending commit) from every shard, the step's
forward and backward pass of a Sequential of Linear/ReLU/Flatten layers in
numpy float32, softmax cross-entropy, the batch's mean gradient pushed to each
shard's range in chunks, the commit with the next pull; at the end it pulls
version total_steps, evaluates on the test set and sends ReportResult.
Plaintext only. `--jobs=N` exits after N jobs ended (0: never). It registers
with protocol_version WORKER_PROTOCOL_CURRENT, as any worker must; of what
that promises it follows host-relative shard-map addresses, and its test
gives it neither growing jobs nor tables.

--self-test checks the dataset code against the test vectors of
docs/cluster.md (read from the file, so a changed table is caught) and the
vectorised code against the Python reference snippets the docs give.
"""
import argparse
import ctypes
import ctypes.util
import gzip
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
M64 = (1 << 64) - 1
CHUNK_ELEMENTS = 262144          # 1 MiB of float32: the documented chunk size


def log(*args):
    print("python-worker:", *args, file=sys.stderr, flush=True)


# ------------------------------------------------ the generator (random.cc) --

def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


class Rng:
    """xoshiro256**, its state filled by feeding SplitMix64 its own output."""

    def __init__(self, seed):
        s, x = [], seed & M64
        for _ in range(4):
            x = splitmix64(x)
            s.append(x)
        self.s = s

    def next(self):
        s0, s1, s2, s3 = self.s
        r = (s1 * 5) & M64
        r = ((((r << 7) | (r >> 57)) & M64) * 9) & M64
        t = (s1 << 17) & M64
        s2 ^= s0
        s3 ^= s1
        s1 ^= s2
        s0 ^= s3
        s2 ^= t
        s3 = ((s3 << 45) | (s3 >> 19)) & M64
        self.s = [s0, s1, s2, s3]
        return r

    def below(self, n):
        return (self.next() * n) >> 64

    def normal(self):
        u1 = 1.0 - (self.next() >> 11) * 2.0 ** -53
        u2 = (self.next() >> 11) * 2.0 ** -53
        return f32(math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2))

    def normals(self, count):
        """`count` Normal() draws as float32, the generator inlined."""
        s0, s1, s2, s3 = self.s
        out = np.empty(count, dtype=np.float64)
        log_, cos_, sqrt_ = math.log, math.cos, math.sqrt
        two_pi, scale = 2.0 * math.pi, 2.0 ** -53
        for k in range(count):
            r = (s1 * 5) & M64
            u = ((((r << 7) | (r >> 57)) & M64) * 9) & M64
            t = (s1 << 17) & M64
            s2 ^= s0
            s3 ^= s1
            s1 ^= s2
            s0 ^= s3
            s2 ^= t
            s3 = ((s3 << 45) | (s3 >> 19)) & M64
            r = (s1 * 5) & M64
            v = ((((r << 7) | (r >> 57)) & M64) * 9) & M64
            t = (s1 << 17) & M64
            s2 ^= s0
            s3 ^= s1
            s1 ^= s2
            s0 ^= s3
            s2 ^= t
            s3 = ((s3 << 45) | (s3 >> 19)) & M64
            u1 = 1.0 - (u >> 11) * scale
            u2 = (v >> 11) * scale
            out[k] = sqrt_(-2.0 * log_(u1)) * cos_(two_pi * u2)
        self.s = [s0, s1, s2, s3]
        return out.astype(np.float32)   # float32(...) of the double product


def f32(v):
    return float(np.float32(v))


_libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
_libm.tanhf.restype = ctypes.c_float
_libm.tanhf.argtypes = [ctypes.c_float]


def tanhf(v):
    return _libm.tanhf(v)


_tanhf_array = np.frompyfunc(_libm.tanhf, 1, 1)


def tanhf_array(a):
    return np.asarray(_tanhf_array(a.astype(np.float32)), dtype=np.float32)


def epoch_order(n, seed, epoch):
    """EpochOrder: a Fisher-Yates shuffle of [0, n) for epoch `epoch`."""
    rng = Rng(splitmix64(seed & M64) ^ splitmix64((0x5EED0000 + epoch) & M64))
    perm = list(range(n))
    nxt = rng.next
    for i in range(n, 1, -1):
        j = (nxt() * i) >> 64
        perm[i - 1], perm[j] = perm[j], perm[i - 1]
    return np.array(perm, dtype=np.int64)


# -------------------------------------------------------------- datasets ----

class Dataset:
    def __init__(self, x, y, classes):
        self.x, self.y, self.classes = x, y, classes   # x: float32 [n, ...]


def make_synthetic(train_size, test_size, features, classes, hidden, seed):
    """MakeSynthetic, vectorised over samples, float32-exact as documented."""
    rng = Rng(seed)
    root = np.float32(math.sqrt(np.float32(features)))
    w1 = (rng.normals(hidden * features) / root).astype(np.float32)
    w1 = w1.reshape(hidden, features)
    w2 = rng.normals(classes * hidden).reshape(classes, hidden)

    def make(n):
        x = rng.normals(n * features).reshape(n, features)
        a = np.zeros((n, hidden), dtype=np.float32)
        for i in range(features):     # float32 sums in index order, no FMA
            a = a + x[:, i:i + 1] * w1[:, i][None, :]
        h = tanhf_array(a)
        z = np.zeros((n, classes), dtype=np.float32)
        for j in range(hidden):
            z = z + h[:, j:j + 1] * w2[:, j][None, :]
        return x, np.argmax(z, axis=1).astype(np.int64)   # the first largest

    train = make(train_size)
    test = make(test_size)
    return (Dataset(train[0], train[1], classes),
            Dataset(test[0], test[1], classes))


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    if raw[0] != 0 or raw[1] != 0 or raw[2] != 8:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes")
    dims = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load_fashion_mnist(root, normalize):
    def find(name):
        for candidate in (name + ".gz", name):
            p = os.path.join(root, candidate)
            if os.path.exists(p):
                return p
        raise FileNotFoundError(os.path.join(root, name + ".gz"))

    def part(images, labels):
        x = read_idx(find(images)).astype(np.float32) / np.float32(255.0)
        if normalize:
            x = (x - np.float32(0.2860)) * np.float32(1.0 / np.float32(0.3530))
        x = x.reshape(x.shape[0], 1, 28, 28).astype(np.float32)
        y = read_idx(find(labels)).astype(np.int64)
        return Dataset(x, y, 10)

    return (part("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
            part("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"))


_datasets = {}
_datasets_lock = threading.Lock()


def load_datasets(spec):
    d = spec.dataset
    key = json.dumps(d, sort_keys=True)
    with _datasets_lock:
        if key not in _datasets:
            if d["name"] == "synthetic":
                _datasets[key] = make_synthetic(
                    d["train_size"], d["test_size"], d["features"], d["classes"],
                    d["teacher_hidden"], d["seed"])
            elif d["name"] == "fashion-mnist":
                _datasets[key] = load_fashion_mnist(d["root"], d["normalize"])
            else:
                raise ValueError(f"dataset.name: unknown dataset {d['name']!r}")
        return _datasets[key]


# ------------------------------------------------------ a YAML subset ----
# The assignment carries the spec as it was submitted, YAML or JSON. This is
# enough YAML for job specs (block and flow mappings and sequences, plain and
# quoted scalars, comments) without a YAML library.

def _scalar(text, quoted=False):
    if quoted:
        return text
    t = text.strip()
    if t in ("", "~", "null", "Null", "NULL"):
        return None
    if t in ("true", "True", "TRUE"):
        return True
    if t in ("false", "False", "FALSE"):
        return False
    if re.fullmatch(r"[-+]?[0-9]+", t):
        return int(t)
    if re.fullmatch(r"0x[0-9a-fA-F]+", t):
        return int(t, 16)
    if re.fullmatch(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?", t):
        return float(t)
    if re.fullmatch(r"[-+]?\.(inf|Inf|INF)", t):
        return float(t.replace(".", "").lower())
    if t in (".nan", ".NaN", ".NAN"):
        return float("nan")
    return t


def _quoted(s, i):
    q = s[i]
    i += 1
    out = []
    while i < len(s):
        c = s[i]
        if q == "'" and c == "'":
            if i + 1 < len(s) and s[i + 1] == "'":
                out.append("'")
                i += 2
                continue
            return "".join(out), i + 1
        if q == '"' and c == "\\" and i + 1 < len(s):
            out.append({"n": "\n", "t": "\t"}.get(s[i + 1], s[i + 1]))
            i += 2
            continue
        if q == '"' and c == '"':
            return "".join(out), i + 1
        out.append(c)
        i += 1
    raise ValueError("unterminated quoted scalar")


def _flow(s, i, stops):
    while i < len(s) and s[i] in " \t":
        i += 1
    if i >= len(s):
        return None, i
    c = s[i]
    if c == "{" or c == "[":
        close = "}" if c == "{" else "]"
        out = {} if c == "{" else []
        i += 1
        while True:
            while i < len(s) and s[i] in " \t":
                i += 1
            if i < len(s) and s[i] == close:
                return out, i + 1
            if c == "{":
                key, i = _flow(s, i, ":,}")
                while i < len(s) and s[i] in " \t":
                    i += 1
                value = None
                if i < len(s) and s[i] == ":":
                    value, i = _flow(s, i + 1, ",}")
                out[key] = value
            else:
                value, i = _flow(s, i, ",]")
                out.append(value)
            while i < len(s) and s[i] in " \t":
                i += 1
            if i < len(s) and s[i] == ",":
                i += 1
            elif i < len(s) and s[i] == close:
                return out, i + 1
            else:
                raise ValueError(f"bad flow collection: {s!r}")
    if c in "\"'":
        v, i = _quoted(s, i)
        return v, i
    j = i
    while j < len(s) and s[j] not in stops:
        if s[j] == ":" and ":" in stops and (j + 1 >= len(s) or s[j + 1] in " \t,}]"):
            break
        j += 1
    return _scalar(s[i:j]), j


def _strip_comment(line):
    q = None
    for i, c in enumerate(line):
        if q:
            if c == q:
                q = None
        elif c in "\"'" and (i == 0 or line[:i].rstrip()[-1:] in ("", ":", "-", "[", "{", ",")):
            q = c
        elif c == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i].rstrip()
    return line.rstrip()


_KEY = re.compile(r"""^("(?:[^"\\]|\\.)*"|'(?:[^']|'')*'|[^\s"'{}\[\],#:-][^:]*?|-[^\s:][^:]*?)\s*:(?:\s+(.*)|$)""")


def _balanced(text):
    depth, q = 0, None
    for c in text:
        if q:
            if c == q:
                q = None
        elif c in "\"'":
            q = c
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
    return depth <= 0


def _block(lines, i, indent):
    text = lines[i][1]
    if text == "-" or text.startswith("- "):
        seq = []
        while i < len(lines) and lines[i][0] == indent and (
                lines[i][1] == "-" or lines[i][1].startswith("- ")):
            rest = lines[i][1][1:].lstrip()
            if not rest:
                i += 1
                if i < len(lines) and lines[i][0] > indent:
                    v, i = _block(lines, i, lines[i][0])
                else:
                    v = None
            else:
                col = indent + len(lines[i][1]) - len(rest)
                lines[i] = (col, rest)
                v, i = _block(lines, i, col)
            seq.append(v)
        return seq, i
    if _KEY.match(text):
        out = {}
        while i < len(lines) and lines[i][0] == indent:
            m = _KEY.match(lines[i][1])
            if not m:
                raise ValueError(f"line {lines[i][1]!r}: expected a key")
            key = m.group(1)
            if key[0] in "\"'":
                key = _quoted(key, 0)[0]
            rest = m.group(2) or ""
            i += 1
            if rest == "":
                if i < len(lines) and (lines[i][0] > indent or (
                        lines[i][0] == indent and (lines[i][1] == "-" or lines[i][1].startswith("- ")))):
                    v, i = _block(lines, i, lines[i][0])
                else:
                    v = None
            else:
                while not _balanced(rest) and i < len(lines):
                    rest += " " + lines[i][1]
                    i += 1
                v, end = _flow(rest, 0, "")
                if rest[end:].strip():
                    raise ValueError(f"trailing text after a value: {rest!r}")
            out[key] = v
        return out, i
    rest = text
    i += 1
    while not _balanced(rest) and i < len(lines):
        rest += " " + lines[i][1]
        i += 1
    return _flow(rest, 0, "")[0], i


def parse_yaml(text):
    try:
        return json.loads(text)
    except ValueError:
        pass
    lines = []
    for raw in text.splitlines():
        line = _strip_comment(raw.replace("\t", "  "))
        if not line.strip() or line.strip() in ("---", "..."):
            continue
        lines.append((len(line) - len(line.lstrip(" ")), line.strip()))
    if not lines:
        return None
    value, i = _block(lines, 0, lines[0][0])
    if i != len(lines):
        raise ValueError(f"cannot read the spec from line {lines[i][1]!r}")
    return value


# --------------------------------------------------------------- the spec ----

class Unsupported(Exception):
    """The job asks for what this worker cannot do (reported, ok: false)."""


class Spec:
    def __init__(self, text):
        d = parse_yaml(text) or {}
        ds = dict(d.get("dataset") or {})
        name = ds.get("name", "")
        if name == "synthetic":
            defaults = {"train_size": 4096, "test_size": 1024, "features": 32,
                        "classes": 4, "teacher_hidden": 16, "seed": 1}
            for k, v in defaults.items():
                ds.setdefault(k, v)
            self.sample_shape = [ds["features"]]
            classes = ds["classes"]
        elif name == "fashion-mnist":
            ds.setdefault("root", "")
            ds.setdefault("normalize", False)
            self.sample_shape = [1, 28, 28]
            classes = 10
        else:
            raise Unsupported(f"dataset.name: {name!r} is not a dataset this worker knows")
        self.dataset = ds
        t = d.get("training") or {}
        self.epochs = int(t.get("epochs", 1))
        self.batch_size = int(t.get("batch_size", 64))
        self.max_steps = int(t.get("max_steps", 0))
        self.seed = int(t.get("seed", 0))
        self.workers = int(t.get("workers", 1))
        self.wire_dtype = t.get("wire_dtype", "float32")
        c = t.get("consistency") or {}
        self.mode = c.get("mode", "bsp")
        self.staleness = int(c.get("staleness", 0) or 0)
        model = d.get("model") or {}
        if model.get("layers"):
            layers = []
            for item in model["layers"]:
                if isinstance(item, str):
                    layers.append((item, {}))
                elif isinstance(item, dict) and len(item) == 1:
                    (k, v), = item.items()
                    layers.append((k, dict(v or {})))
                else:
                    raise Unsupported(f"model.layers: cannot read {item!r}")
        elif model.get("preset") == "mlp":
            n = int(np.prod(self.sample_shape))
            layers = [("flatten", {}),
                      ("linear", {"in_features": n, "out_features": 256}), ("relu", {}),
                      ("linear", {"in_features": 256, "out_features": 128}), ("relu", {}),
                      ("linear", {"in_features": 128, "out_features": classes})]
        else:
            raise Unsupported(f"model: {model!r} is not a model this worker can train")
        self.layers = layers


def schedule_of(spec, train_size, world):
    """The documented schedule: (steps_per_epoch, total_steps)."""
    per_rank = -(-train_size // world)
    spe = max(1, -(-per_rank // spec.batch_size))
    total = spe * spec.epochs
    if spec.mode == "async":
        total *= world
    if spec.max_steps > 0:
        total = min(total, spec.max_steps)
    return spe, total


# -------------------------------------------------------------- the model ----

class Model:
    """A Sequential of Linear, ReLU, Flatten (and Dropout with p = 0) layers;
    parameters in one flat float32 vector in state_dict order."""

    def __init__(self, layers, sample_shape):
        self.layers = []
        shape = list(sample_shape)
        offset = 0
        for index, (kind, args) in enumerate(layers):
            if kind == "linear":
                fin, fout = int(args["in_features"]), int(args["out_features"])
                bias = bool(args.get("bias", True))
                if len(shape) != 1 or shape[0] != fin:
                    raise Unsupported(f"model.layers[{index}] (linear): input {shape}")
                w_at = offset
                offset += fin * fout
                b_at = offset if bias else None
                offset += fout if bias else 0
                self.layers.append(("linear", (w_at, fin, fout, b_at)))
                shape = [fout]
            elif kind == "relu":
                self.layers.append(("relu", None))
            elif kind == "flatten":
                self.layers.append(("flatten", None))
                shape = [int(np.prod(shape))]
            elif kind == "dropout" and float(args.get("p", 0.5)) == 0.0:
                pass
            else:
                raise Unsupported(f"model.layers[{index}]: this worker cannot run {kind}")
        self.num_params = offset
        self.classes = shape[0]

    def forward(self, w, x, keep):
        acts = []
        for kind, a in self.layers:
            if keep:
                acts.append(x)
            if kind == "linear":
                w_at, fin, fout, b_at = a
                x = x @ w[w_at:w_at + fin * fout].reshape(fout, fin).T
                if b_at is not None:
                    x = x + w[b_at:b_at + fout]
            elif kind == "relu":
                x = np.maximum(x, np.float32(0))
            else:
                x = x.reshape(x.shape[0], -1)
        return x, acts

    def step(self, w, x, y):
        """Mean gradient, loss sum and correct count of one batch."""
        z, acts = self.forward(w, x, True)
        n = x.shape[0]
        losses, correct, p = softmax_ce(z, y)
        d = p
        d[np.arange(n), y] -= np.float32(1)
        d /= np.float32(n)
        grad = np.zeros(self.num_params, dtype=np.float32)
        for (kind, a), inp in zip(reversed(self.layers), reversed(acts)):
            if kind == "linear":
                w_at, fin, fout, b_at = a
                grad[w_at:w_at + fin * fout] = (d.T @ inp).reshape(-1)
                if b_at is not None:
                    grad[b_at:b_at + fout] = d.sum(axis=0)
                d = d @ w[w_at:w_at + fin * fout].reshape(fout, fin)
            elif kind == "relu":
                d = d * (inp > 0)
            else:
                d = d.reshape(inp.shape)
        return grad, float(np.sum(losses, dtype=np.float64)), correct

    def evaluate(self, w, data):
        loss, correct = 0.0, 0
        for b in range(0, len(data.y), 1000):
            z, _ = self.forward(w, data.x[b:b + 1000], False)
            losses, c, _ = softmax_ce(z, data.y[b:b + 1000])
            loss += float(np.sum(losses, dtype=np.float64))
            correct += c
        return correct, loss


def softmax_ce(z, y):
    """Per-sample log(sum exp(z - max z)) + max z - z_label, the correct
    count (first largest logit), and the softmax."""
    m = z.max(axis=1, keepdims=True)
    e = np.exp(z - m)
    s = e.sum(axis=1, keepdims=True)
    n = z.shape[0]
    losses = np.log(s)[:, 0] + m[:, 0] - z[np.arange(n), y]
    correct = int(np.sum(np.argmax(z, axis=1) == y))
    return losses, correct, (e / s).astype(np.float32)


def to_bf16(v):
    """float32 -> the top 16 bits, rounded to nearest even (NaN kept NaN)."""
    bits = v.astype("<f4").view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = np.isnan(v)
    rounded[nan] = (bits[nan] >> 16) | 0x40
    return rounded.astype("<u2")


def from_bf16(raw):
    return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)


# ------------------------------------------------------------ the worker ----

class Rpc(Exception):
    """A failed call: its code, and the ErrorDetail's reason and step."""

    def __init__(self, code, reason, step, message):
        super().__init__(f"{code.name}{'+' + reason if reason else ''}: {message}")
        self.code, self.reason, self.step, self.message = code, reason, step, message


class Leave(Exception):
    """The job is no longer this runner's to train."""


RETRYABLE = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "NOT_FOUND", "RESOURCE_EXHAUSTED")
NOT_OURS = ("JOB_ENDED", "NOT_A_MEMBER", "REGISTER_AGAIN")


def load_protos(proto_dir):
    out = tempfile.mkdtemp(prefix="tally-pb-")
    r = subprocess.run(["protoc", f"--proto_path={proto_dir}", f"--python_out={out}",
                        "tally.proto"], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"protoc: {r.stderr.strip()}")
    sys.path.insert(0, out)
    try:
        import tally_pb2  # noqa: E402
    finally:
        sys.path.remove(out)
        shutil.rmtree(out, ignore_errors=True)
    return tally_pb2


class Worker:
    def __init__(self, args, pb, grpc):
        self.args, self.pb, self.grpc = args, pb, grpc
        self.server = args.server
        self.channels = {}
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.reg = None                 # (worker_id, incarnation, lease_ms)
        self.runner = None
        self.finished = set()           # (job, incarnation, map version) ended
        self.jobs_ended = 0
        self.times = (0.0, 0.0, 0.0)
        ch = self.channel("")
        self.register_rpc = self.method(ch, "WorkerService/RegisterWorker",
                                        pb.RegisterWorkerRequest, pb.RegisterWorkerResponse)
        self.heartbeat_rpc = self.method(ch, "WorkerService/Heartbeat",
                                         pb.HeartbeatRequest, pb.HeartbeatResponse)
        self.report_rpc = self.method(ch, "WorkerService/ReportResult",
                                      pb.ReportResultRequest, pb.ReportResultResponse)

    def channel(self, address):
        # A shard map's address (docs/cluster.md): empty, the coordinator's
        # own; ":port", that port on the coordinator's host.
        if address.startswith(":"):
            address = self.server.rsplit(":", 1)[0] + address
        address = address or self.server
        with self.lock:
            if address not in self.channels:
                self.channels[address] = self.grpc.insecure_channel(
                    address, options=[("grpc.max_receive_message_length", 8 << 20)])
            return self.channels[address]

    def method(self, channel, name, req, resp, kind="unary_unary"):
        return getattr(channel, kind)(f"/tally.v1.{name}",
                                      request_serializer=req.SerializeToString,
                                      response_deserializer=resp.FromString)

    def error(self, e):
        """grpc.RpcError -> Rpc, with the ErrorDetail of the status trailer."""
        reason, step = "", 0
        try:
            for key, value in e.trailing_metadata() or ():
                if key == "grpc-status-details-bin":
                    status = self.pb.RpcStatus.FromString(value)
                    for any_ in status.details:
                        if any_.type_url.endswith("/tally.v1.ErrorDetail"):
                            d = self.pb.ErrorDetail.FromString(any_.value)
                            reason = self.pb.ErrorReason.Name(d.reason)
                            step = d.step
        except Exception:  # noqa: BLE001 -- a call that never reached a server
            pass
        if reason == "ERROR_REASON_UNSPECIFIED":
            reason = ""
        return Rpc(e.code(), reason, step, e.details() or "")

    # ---- registration and heartbeats ----

    def register(self):
        backoff = 0.1
        while not self.stopped.is_set():
            try:
                # The worker protocol it speaks (docs/cluster.md, "Which
                # workers a coordinator takes"): the generated constant.
                r = self.register_rpc(self.pb.RegisterWorkerRequest(
                    name=self.args.name, devices="cpu:1",
                    protocol_version=self.pb.WORKER_PROTOCOL_CURRENT), timeout=10)
            except self.grpc.RpcError as e:
                err = self.error(e)
                if (err.code.name in ("UNAUTHENTICATED", "PERMISSION_DENIED", "INVALID_ARGUMENT")
                        or err.reason == "PROTOCOL_TOO_OLD"):
                    raise SystemExit(f"python-worker: cannot register: {err}")
                log(f"register: {err}; retrying")
                self.stopped.wait(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            with self.lock:
                self.reg = (r.worker_id, r.incarnation, r.lease_ms or 3000)
            log(f"registered as {r.worker_id} (incarnation {r.incarnation}, lease {r.lease_ms} ms)")
            return

    def heartbeat_loop(self):
        while not self.stopped.is_set():
            with self.lock:
                worker_id, incarnation, lease_ms = self.reg
                runner = self.runner
                job = runner.job_id if runner is not None and runner.is_alive() else ""
                compute, wait, push = self.times
            req = self.pb.HeartbeatRequest(worker_id=worker_id, incarnation=incarnation,
                                           job_id=job, compute_seconds=compute,
                                           wait_seconds=wait, push_seconds=push)
            period = min(max(lease_ms / 4.0, 50.0), 1000.0) / 1000.0
            began = time.monotonic()
            try:
                resp = self.heartbeat_rpc(req, timeout=max(lease_ms / 2000.0, 0.2))
            except self.grpc.RpcError as e:
                err = self.error(e)
                if err.reason == "REGISTER_AGAIN" or err.code.name == "NOT_FOUND":
                    log(f"lease lost ({err}); registering again")
                    self.drop_runner("registering again")
                    self.register()
                    continue
                log(f"heartbeat: {err}")
            else:
                self.on_assignment(resp.assignment if resp.HasField("assignment") else None,
                                   incarnation)
            self.stopped.wait(max(0.0, period - (time.monotonic() - began)))

    def drop_runner(self, why):
        with self.lock:
            runner, self.runner = self.runner, None
        if runner is not None and runner.is_alive():
            runner.cancel(why)

    def on_assignment(self, a, incarnation):
        with self.lock:
            runner = self.runner
            if runner is not None and runner.is_alive():
                if a is not None and runner.key == (a.job_id, incarnation, a.shard_map.version):
                    return
                # No longer assigned, or a new shard map: this runner stops,
                # and a new one starts on the new map (or none).
                runner.cancel("no longer assigned" if a is None else "new assignment or shard map")
                self.runner = None
                return
            if a is None:
                return
            key = (a.job_id, incarnation, a.shard_map.version)
            if key in self.finished:
                return
            reg = self.reg
            if reg[1] != incarnation:
                return
            self.runner = JobRunner(self, a, reg, key)
            self.runner.start()

    def runner_ended(self, runner, counts):
        with self.lock:
            self.finished.add(runner.key)
            if counts:
                self.jobs_ended += 1
                if self.args.jobs and self.jobs_ended >= self.args.jobs:
                    self.stopped.set()

    def run(self):
        self.register()
        hb = threading.Thread(target=self.heartbeat_loop, daemon=True)
        hb.start()
        try:
            while not self.stopped.is_set():
                self.stopped.wait(0.2)
        except KeyboardInterrupt:
            pass
        self.stopped.set()
        self.drop_runner("stopping")
        hb.join(timeout=5)


class JobRunner(threading.Thread):
    def __init__(self, worker, a, reg, key):
        super().__init__(daemon=True)
        self.w, self.pb, self.grpc = worker, worker.pb, worker.grpc
        self.a, self.key = a, key
        self.job_id = a.job_id
        # The placement it runs on, named in every push, pull and failure
        # report: a later placement's shard answers NOT_FOUND (a stale
        # map), and the coordinator does not fail the job on our word.
        self.map_version = a.shard_map.version
        self.worker_id, self.incarnation = reg[0], reg[1]
        self.cancelled = threading.Event()
        self.why = ""
        self.backoff = 0.1
        self.times = [0.0, 0.0, 0.0]

    def cancel(self, why):
        self.why = why
        self.cancelled.set()

    def check(self):
        if self.cancelled.is_set():
            raise Leave(self.why)

    def sleep_backoff(self):
        self.cancelled.wait(self.backoff)
        self.backoff = min(self.backoff * 2, 5.0)
        self.check()

    def smooth(self, i, seconds):
        self.times[i] = seconds if self.times[i] == 0 else 0.9 * self.times[i] + 0.1 * seconds
        with self.w.lock:
            self.w.times = tuple(self.times)

    def run(self):
        counts = True
        try:
            self.train()
        except Leave as e:
            log(f"{self.job_id}: left the job ({e})")
            counts = False
        except Rpc as e:
            if e.reason in NOT_OURS:
                log(f"{self.job_id}: left the job ({e})")
                counts = e.reason == "JOB_ENDED"
            else:
                log(f"{self.job_id}: {e}")
                self.report_failure(str(e), e.reason)
        except Unsupported as e:
            log(f"{self.job_id}: {e}")
            self.report_failure(f"python worker: {e}", "")
        except Exception as e:  # noqa: BLE001 -- said to the coordinator
            traceback.print_exc()
            self.report_failure(f"python worker: {e!r}", "")
        self.w.runner_ended(self, counts)

    def report_failure(self, message, reason):
        req = self.pb.ReportResultRequest(
            worker_id=self.worker_id, incarnation=self.incarnation, job_id=self.job_id,
            ok=False, message=message, map_version=self.map_version,
            reason=self.pb.ErrorReason.Value(reason) if reason else 0)
        try:
            self.w.report_rpc(req, timeout=10)
        except self.grpc.RpcError as e:
            log(f"{self.job_id}: report failed: {self.w.error(e)}")

    # ---- the job ----

    def train(self):
        pb, a = self.pb, self.a
        spec = Spec(a.spec)
        self.spec = spec
        self.world = max(1, a.world)
        self.rank = a.rank
        log(f"assigned {a.job_id} as rank {a.rank} of {a.world} "
            f"({len(a.shard_map.shards)} shard(s), map version {a.shard_map.version})")
        self.model = Model(spec.layers, spec.sample_shape)
        train, test = load_datasets(spec)
        self.check()
        self.train_set, self.test_set = train, test
        n_train = len(train.y)
        self.spe, self.total = schedule_of(spec, n_train, self.world)
        s = a.schedule
        if a.HasField("schedule") and (s.train_size != n_train or s.total_steps != self.total
                                       or s.steps_per_epoch != self.spe):
            raise Rpc(self.grpc.StatusCode.FAILED_PRECONDITION, "SCHEDULE_MISMATCH", 0,
                      f"its training set has {n_train} samples ({self.total} steps) where "
                      f"the job expects {s.train_size} ({s.total_steps} steps)")
        n = self.model.num_params
        self.shards = list(a.shard_map.shards)
        if not self.shards:
            self.shards = [pb.ShardMap.Entry(address="", offset=0, count=n)]
        if sum(e.count for e in self.shards) != n:
            raise Unsupported(f"the shard map covers {sum(e.count for e in self.shards)} "
                              f"parameters, the model has {n}")
        self.dtype = pb.BFLOAT16 if spec.wire_dtype == "bfloat16" else pb.FLOAT32
        self.pulls, self.pushes = [], []
        for e in self.shards:
            ch = self.w.channel(e.address)
            self.pulls.append(self.w.method(ch, "ParameterService/PullWeights",
                                            pb.PullRequest, pb.PullResponse, "unary_stream"))
            self.pushes.append(self.w.method(ch, "ParameterService/PushGradients",
                                             pb.PushRequest, pb.PushResponse, "stream_unary"))
        self.pool = ThreadPoolExecutor(max_workers=len(self.shards))
        self.weights = np.zeros(n, dtype=np.float32)
        self.orders = {}
        try:
            version = self.loop()
        finally:
            self.pool.shutdown(wait=False)
        self.finish(version)

    def batch(self, step):
        """Indices of this rank's batch of `step` (empty: no batch)."""
        epoch, k = divmod(step, self.spe)
        if epoch not in self.orders:
            self.orders = {epoch: epoch_order(len(self.train_set.y), self.spec.seed, epoch)}
        mine = self.orders[epoch][self.rank::self.world]
        b = self.spec.batch_size
        return mine[k * b:(k + 1) * b]

    def loop(self):
        spec = self.spec
        sync = spec.mode != "async"
        clock, commit, held, min_version = 0, None, None, 0
        started = False
        while True:
            self.check()
            at_least = self.total if sync and clock >= self.total else min_version
            began = time.monotonic()
            try:
                version = self.pull(clock, at_least, commit)
            except Rpc as e:
                if e.reason == "PUSH_AGAIN":
                    log(f"{self.job_id} step {e.step}: pull: {e}")
                    if held is not None and held[0] == e.step:
                        commit, clock, min_version = self.push_step(held)
                    else:
                        commit, clock = None, e.step
                    continue
                if e.code.name in RETRYABLE or e.code.name == "ABORTED":
                    self.sleep_backoff()
                    continue
                raise
            self.smooth(1, time.monotonic() - began)
            self.backoff = 0.1
            commit, min_version = None, 0
            if version >= self.total:
                return version
            if spec.mode == "async" and not started:
                clock = max(clock, version // self.world)
            started = True
            step = clock if spec.mode == "async" else max(clock, version)
            began = time.monotonic()
            idx = self.batch(step)
            if len(idx):
                grad, loss_sum, correct = self.model.step(
                    self.weights, self.train_set.x[idx], self.train_set.y[idx])
            else:
                grad, loss_sum, correct = None, 0.0, 0
            self.smooth(0, time.monotonic() - began)
            held = (step, version, len(idx), loss_sum, correct, grad)
            began = time.monotonic()
            commit, clock, min_version = self.push_step(held)
            self.smooth(2, time.monotonic() - began)
            if step % 50 == 0:
                log(f"{self.job_id} step {step + 1}/{self.total} loss "
                    f"{loss_sum / max(1, len(idx)):.4f}")

    # ---- pulls ----

    def pull(self, clock, min_version, commit):
        """Pulls from every shard in parallel into self.weights; returns the
        version (the oldest; in bsp every shard's must be the same)."""
        req = self.pb.PullRequest(
            job_id=self.job_id, worker_id=self.worker_id, incarnation=self.incarnation,
            min_version=min_version, max_wait_ms=5000, chunk_elements=CHUNK_ELEMENTS,
            total_steps=self.total, steps_per_epoch=self.spe, dtype=self.dtype, clock=clock,
            map_version=self.map_version)
        if commit is not None:
            req.commit.CopyFrom(commit)
        futures = [self.pool.submit(self.pull_one, i, req) for i in range(len(self.shards))]
        results, errors = [], []
        for f in futures:
            try:
                results.append(f.result())
            except Rpc as e:
                errors.append(e)
        if errors:
            order = ["JOB_ENDED", "NOT_A_MEMBER", "REGISTER_AGAIN", "SCHEDULE_MISMATCH", "PUSH_AGAIN"]
            errors.sort(key=lambda e: order.index(e.reason) if e.reason in order else len(order))
            raise errors[0]
        versions = [v for v, _ in results]
        if self.spec.mode == "bsp" and len(set(versions)) > 1:
            raise Rpc(self.grpc.StatusCode.ABORTED, "", 0,
                      f"shards sent different versions {versions}")
        return min(versions)

    def pull_one(self, i, req):
        entry = self.shards[i]
        while True:
            self.check()
            version, total, got = None, None, 0
            try:
                for resp in self.pulls[i](req, timeout=5 + 30):
                    c = resp.chunk
                    if c.offset < entry.offset or c.offset + c.count > entry.offset + entry.count:
                        raise Unsupported(f"a pulled chunk [{c.offset}, +{c.count}) lies "
                                          f"outside the shard's range")
                    if c.dtype == self.pb.BFLOAT16:
                        values = from_bf16(c.data)
                    else:
                        values = np.frombuffer(c.data, dtype="<f4")
                    if len(values) != c.count:
                        raise Unsupported("a pulled chunk's bytes do not match its count")
                    self.weights[c.offset:c.offset + c.count] = values
                    version, total = resp.version, resp.total_steps
                    got += c.count
            except self.grpc.RpcError as e:
                err = self.w.error(e)
                if err.code.name in RETRYABLE:
                    # max_wait_ms ran out, the shard is away or busy: the
                    # same pull again (a commit already recorded is ignored).
                    self.cancelled.wait(0.05 if err.code.name == "DEADLINE_EXCEEDED" else 0.2)
                    continue
                raise err
            if got != entry.count:
                raise Unsupported(f"shard {i} sent {got} of its {entry.count} values")
            return version, total

    # ---- pushes ----

    def push_step(self, held):
        """Pushes `held` to every shard until each answered; returns (commit,
        next clock, min_version for the next pull)."""
        step = held[0]
        pending = list(range(len(self.shards)))
        answers = {}
        backoff = 0.1
        while pending:
            self.check()
            futures = {i: self.pool.submit(self.push_one, i, held) for i in pending}
            again, wait = [], False
            for i, f in futures.items():
                try:
                    f.result()
                    answers[i] = "ok"
                except Rpc as e:
                    # The reason first, then the code: STEP_NOT_OPEN and
                    # JOIN_LATER came with FAILED_PRECONDITION from servers
                    # of earlier releases, with ABORTED now.
                    if e.reason in NOT_OURS:
                        raise
                    if e.reason in ("NON_FINITE", "STALE_GRADIENT"):
                        log(f"{self.job_id} step {step}: push refused: {e}")
                        answers[i] = "refused"
                    elif e.reason == "PUSH_AGAIN":
                        again.append(i)           # at once
                    elif e.reason in ("STEP_CLOSED", "STEP_NOT_OPEN", "JOIN_LATER"):
                        answers[i] = e
                    elif e.code.name == "INVALID_ARGUMENT":
                        log(f"{self.job_id} step {step}: push refused: {e}")
                        answers[i] = "refused"
                    elif e.code.name in RETRYABLE or e.code.name == "CANCELLED":
                        again.append(i)
                        wait = True
                    else:
                        raise
            pending = again
            if pending and wait:
                self.cancelled.wait(backoff)
                backoff = min(backoff * 2, 5.0)
        for want in ("JOIN_LATER", "STEP_NOT_OPEN", "STEP_CLOSED"):
            for e in answers.values():
                if isinstance(e, Rpc) and e.reason == want:
                    log(f"{self.job_id} step {step}: push: {e}")
                    if want == "JOIN_LATER":
                        return None, e.step, e.step
                    if want == "STEP_NOT_OPEN":
                        return None, step, 0
                    return None, step + 1, 0
        contributed = all(v == "ok" for v in answers.values())
        return self.pb.StepCommit(step=step, contributed=contributed), step + 1, 0

    def push_one(self, i, held):
        step, base, samples, loss_sum, correct, grad = held
        entry = self.shards[i]
        header = self.pb.PushHeader(
            job_id=self.job_id, worker_id=self.worker_id, incarnation=self.incarnation,
            map_version=self.map_version, step=step, base_version=base, samples=samples,
            loss_sum=loss_sum, correct=correct)

        def messages():
            if samples == 0 or grad is None:
                yield self.pb.PushRequest(header=header)   # no chunks
                return
            first = True
            end = entry.offset + entry.count
            for at in range(entry.offset, end, CHUNK_ELEMENTS):
                count = min(CHUNK_ELEMENTS, end - at)
                part = grad[at:at + count]
                data = to_bf16(part).tobytes() if self.dtype == self.pb.BFLOAT16 \
                    else part.astype("<f4").tobytes()
                msg = self.pb.PushRequest(chunk=self.pb.TensorChunk(
                    offset=at, count=count, data=data, dtype=self.dtype))
                if first:
                    msg.header.CopyFrom(header)
                    first = False
                yield msg
            if first:   # an empty range
                yield self.pb.PushRequest(header=header)

        try:
            return self.pushes[i](messages(), timeout=30)
        except self.grpc.RpcError as e:
            raise self.w.error(e)

    # ---- the end ----

    def finish(self, version):
        correct, loss = self.model.evaluate(self.weights, self.test_set)
        n = len(self.test_set.y)
        req = self.pb.ReportResultRequest(worker_id=self.worker_id, incarnation=self.incarnation,
                                          job_id=self.job_id, ok=True, steps=version)
        if n > 0:
            req.test_accuracy = correct / n
            req.test_loss = loss / n
        log(f"{self.job_id} finished at step {version}: test accuracy "
            f"{req.test_accuracy!r}, loss {req.test_loss!r}")
        give_up = time.monotonic() + 30
        backoff = 0.1
        while True:
            try:
                self.w.report_rpc(req, timeout=10)
                return
            except self.grpc.RpcError as e:
                err = self.w.error(e)
                # NOT_FOUND (an unknown job) is not retried; UNAVAILABLE +
                # NOT_FINISHED is, for a few seconds at most in practice.
                if err.code.name not in ("UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED") \
                        or time.monotonic() > give_up:
                    raise err
                log(f"{self.job_id}: report: {err}; retrying")
            self.cancelled.wait(backoff)
            backoff = min(backoff * 2, 5.0)


# ------------------------------------------------------------- self-test ----

def self_test(docs_path):
    """The documented test vectors, read from docs/cluster.md, and the docs'
    Python snippets against the vectorised code here."""
    with open(docs_path) as f:
        doc = f.read()
    failures = []

    def row(label):
        for line in doc.splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) >= 2 and cells[0].startswith(label):
                return cells[1]
        failures.append(f"{docs_path}: no table row {label!r}")
        return None

    def numbers(cell):
        return [int(v, 0) for v in re.findall(r"0x[0-9a-f]+|-?\d+", cell or "")]

    def check(what, got, want):
        if want is not None and list(got) != list(want):
            failures.append(f"{what}: computed {list(got)}, docs say {list(want)}")

    check("SplitMix64(0), SplitMix64(1)", [splitmix64(0), splitmix64(1)],
          numbers(row("`SplitMix64(0)`"))[-2:])
    r = Rng(1)
    check("Rng(1) first three Next()", [r.next() for _ in range(3)],
          numbers(row("`Rng(1)`: first three"))[-3:])
    check("epoch 0 generator seed", [splitmix64(1) ^ splitmix64(0x5EED0000)],
          numbers(row("epoch 0 generator seed"))[-1:])
    vectors = [
        ("`EpochOrder(60000, seed 1, epoch 0)[:10]`", 60000, 1, 0),
        ("`EpochOrder(60000, seed 1, epoch 1)[:10]`", 60000, 1, 1),
        ("`EpochOrder(60000, seed 0, epoch 0)[:10]`", 60000, 0, 0),
        ("`EpochOrder(8192, seed 1, epoch 0)[:10]`", 8192, 1, 0),
    ]
    orders = {}
    for label, n, seed, epoch in vectors:
        orders[(n, seed, epoch)] = epoch_order(n, seed, epoch)
        check(label, orders[(n, seed, epoch)][:10], numbers(row(label))[-10:])
    ranks = row("the same, ranks 0 and 1 of 2")
    if ranks is not None:
        halves = ranks.split(" and ")
        p = orders[(60000, 1, 0)]
        check("rank 0 of 2 [:5]", p[0::2][:5], numbers(halves[0]))
        check("rank 1 of 2 [:5]", p[1::2][:5], numbers(halves[1]))
        if sorted(p.tolist()) != list(range(60000)):
            failures.append("EpochOrder(60000) is not a permutation")

    t0 = time.monotonic()
    train, test = make_synthetic(8192, 1024, 32, 4, 16, 1)
    seconds = time.monotonic() - t0
    floats = [float(v) for v in re.findall(r"-?\d+\.\d+", row("training input 0, first 8 floats") or "")]
    got = train.x[0, :8]
    if len(floats) != 8 or any(np.float32(v) != g for v, g in zip(floats, got)):
        failures.append(f"training input 0: computed {got.tolist()}, docs say {floats}")
    bits = numbers(row("the same as float32 bits"))
    check("training input 0 as float32 bits", got.view(np.uint32).tolist(), bits)
    check("first 5 training labels", train.y[:5], numbers(row("first 5 training labels")))
    check("training labels per class", np.bincount(train.y, minlength=4),
          numbers(row("training labels per class")))
    check("first 5 test labels", test.y[:5], numbers(row("first 5 test labels")))
    d_train, _ = make_synthetic(4096, 1024, 32, 4, 16, 1)
    if not (np.array_equal(d_train.x[0], train.x[0]) and np.array_equal(d_train.y[:5], train.y[:5])):
        failures.append("the defaults' first input and labels differ from the example's")

    # The docs' own Python (the shuffle and MakeSynthetic) against this code.
    snippets = re.findall(r"```python\n(.*?)```", doc, re.S)
    ns = {"Rng": Rng, "splitmix64": splitmix64, "f32": f32, "tanhf": tanhf, "sqrt": math.sqrt}
    for name in ("epoch_order", "make_synthetic"):
        code = [s for s in snippets if f"def {name}(" in s]
        if not code:
            failures.append(f"{docs_path}: no Python snippet defining {name}")
            continue
        exec(code[0], ns)  # noqa: S102 -- the documentation's reference code
    if "epoch_order" in ns:
        for n, seed, epoch in ((1000, 1, 0), (777, 5, 3)):
            check(f"docs' epoch_order({n}, {seed}, {epoch})", epoch_order(n, seed, epoch),
                  ns["epoch_order"](n, seed, epoch))
    if "make_synthetic" in ns:
        for args in ((40, 12, 32, 4, 16, 1), (30, 7, 5, 3, 6, 9)):
            (rx, ry), (sx, sy) = ns["make_synthetic"](*args)
            tr, te = make_synthetic(*args)
            same = (np.array_equal(np.array(rx, dtype=np.float32), tr.x)
                    and np.array_equal(np.array(sx, dtype=np.float32), te.x)
                    and list(ry) == tr.y.tolist() and list(sy) == te.y.tolist())
            if not same:
                failures.append(f"docs' make_synthetic{args} differs from the vectorised one")
        if floats and [f32(v) for v in ns["make_synthetic"](1, 0, 32, 4, 16, 1)[0][0][0][:8]] != \
                [float(v) for v in train.x[0, :8]]:
            failures.append("docs' make_synthetic: training input 0 differs")

    # The YAML subset against the examples (and PyYAML, where there is one).
    for name in sorted(os.listdir(os.path.join(ROOT, "examples"))):
        if not name.endswith(".yaml"):
            continue
        with open(os.path.join(ROOT, "examples", name)) as f:
            text = f.read()
        mine = parse_yaml(text)
        try:
            import yaml
            if mine != yaml.safe_load(text):
                failures.append(f"examples/{name}: the YAML subset reads {mine}, PyYAML {yaml.safe_load(text)}")
        except ImportError:
            pass
        if not isinstance(mine, dict) or "model" not in mine:
            failures.append(f"examples/{name}: not read as a spec")

    # One numeric gradient check of the model's backward pass.
    model = Model([("flatten", {}), ("linear", {"in_features": 6, "out_features": 5}), ("relu", {}),
                   ("linear", {"in_features": 5, "out_features": 3, "bias": False})], [2, 3])
    g = np.random.default_rng(0)
    w = g.standard_normal(model.num_params).astype(np.float32)
    x = g.standard_normal((4, 2, 3)).astype(np.float32)
    y = np.array([0, 2, 1, 2])
    grad, loss_sum, _ = model.step(w, x, y)
    for k in (0, 7, 33, model.num_params - 1):
        e = np.zeros_like(w, dtype=np.float64)
        e[k] = 1e-3

        def mean_loss(v):
            z, _ = model.forward(v.astype(np.float32), x, False)
            return float(np.mean(softmax_ce(z.astype(np.float64), y)[0]))
        num = (mean_loss(w + e) - mean_loss(w - e)) / 2e-3
        if abs(num - grad[k]) > 2e-3 + 1e-2 * abs(num):
            failures.append(f"gradient check: parameter {k}: {grad[k]} vs numeric {num}")

    for f in failures:
        print("FAIL:", f)
    if failures:
        return 1
    print(f"python_worker self-test: ok (test vectors of {os.path.relpath(docs_path, ROOT)}, "
          f"the docs' Python snippets, synthetic 8192+1024 in {seconds:.1f} s)")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", default="localhost:7070", help="coordinator HOST:PORT")
    p.add_argument("--name", default="python-worker")
    p.add_argument("--jobs", type=int, default=0, help="exit after N jobs ended (0: never)")
    p.add_argument("--proto_dir", default=os.path.join(ROOT, "proto"))
    p.add_argument("--self-test", action="store_true")
    p.add_argument("--docs", default=os.path.join(ROOT, "docs", "cluster.md"))
    args = p.parse_args()
    if args.self_test:
        return self_test(args.docs)
    import grpc
    pb = load_protos(args.proto_dir)
    Worker(args, pb, grpc).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
