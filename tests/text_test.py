#!/usr/bin/python3
"""Text corpora (dataset.name: text) trained by Python workers.

  split        a corpus of three files, byte-level, seq_len 16, on two
               Python workers for one epoch: every batch row the model is
               given is a window of seq_len + 1 bytes of the stream (inputs
               int64, labels its next bytes), and the two workers together
               see every training window exactly once; the client filled
               train_size in, and the workers agreed with it;
  vocabulary   a vocabulary file (with <unk>): the client's count of
               windows is the workers' (the job SUCCEEDS, which a
               disagreement would fail); without <unk>, a byte no token
               starts is refused at submit naming the file and the byte,
               and past the client the job FAILS naming them, while the
               server and the worker go on to train the next job;
  errors       a train_size the files do not hold and a glob that matches
               nothing, sent past the client, FAIL naming the numbers and
               the pattern; a model of layers on text is refused at submit;
  language     the example examples/text-lm (a byte-level transformer on
               the fortunes corpus) on one worker for 200 steps of
               64-byte windows (the example's are 128): its test
               loss is at least 0.7 nats below the test split's own byte
               unigram entropy (what a model of byte frequencies reaches).

  text_test.py BUILD_DIR [PHASE...]   (all phases when none named)
"""
import glob
import json
import math
import os
import shutil
import sys
import tempfile

import numpy as np

try:
    from cluster_util import Cluster, fail
    import torch  # noqa: F401 - the Python worker's
    import tally
    from tally import _native  # noqa: F401 - built with pybind11
    from tally import tally_pb2 as pb
except ImportError as e:
    print(f"SKIP: {e}")
    sys.exit(77)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORTUNES = "/usr/share/games/fortunes/*.u8"

# Records every training batch it is given (TALLY_RECORD), and learns a
# little: an embedding and a linear layer over it.
RECORDER = '''
import os
import numpy as np
import torch
from torch import nn

RECORD = os.environ.get("TALLY_RECORD")


class Bigram(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.head = nn.Linear(16, VOCAB)
        self.seen = 0

    def forward(self, x, y=None):
        assert x.dtype == torch.int64, x.dtype
        if RECORD and self.training:
            np.save(f"{RECORD}/x-{self.seen:04d}.npy", x.numpy())
            np.save(f"{RECORD}/y-{self.seen:04d}.npy", y.numpy())
            self.seen += 1
        out = self.head(self.embed(x))
        return nn.functional.cross_entropy(out.flatten(0, 1), y.flatten())


def make_model():
    return Bigram()
'''


def write_spec(tmp, name, dataset, model="model.py", loss="model", steps=0, workers=1,
               batch=8, lr=0.01, epochs=1):
    path = f"{tmp}/{name}.json"
    training = {"epochs": epochs, "batch_size": batch, "seed": 2, "workers": workers}
    if steps:
        training["max_steps"] = steps
    with open(path, "w") as f:
        json.dump({"name": name, "model": {"python": {"file": model}, "loss": loss},
                   "dataset": dataset, "training": training,
                   "optimizer": {"type": "adam", "lr": lr}}, f)
    return path


def write_model(tmp, vocab=256):
    with open(f"{tmp}/model.py", "w") as f:
        f.write(f"VOCAB = {vocab}\n" + RECORDER)


def raw_submit(c, path, update):
    """The spec at `path` as the client prepares it, its dataset then
    updated and sent past the client's checks (as from elsewhere): the job
    once it ends."""
    text = tally.client.prepare_spec(path)
    spec = json.loads(text)
    spec["dataset"].update(update)
    job = c._call("SubmitJob", pb.SubmitJobRequest, pb.SubmitJobResponse)(
        pb.SubmitJobRequest(spec=json.dumps(spec)), timeout=10).job
    return c.wait(job.id, timeout=120)


def run(c, path, want=pb.SUCCEEDED, timeout=300):
    job = c.wait(c.submit(path).id, timeout=timeout)
    if job.state != want:
        fail(f"{path}: {pb.JobState.Name(job.state)}, not {pb.JobState.Name(want)}: "
             f"{job.message}")
    return job


def split(tmp):
    """Two workers, one epoch: every window once, each row a window."""
    rng = np.random.default_rng(4)
    parts = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in (1000, 1717, 900)]
    for i, p in enumerate(parts):
        with open(f"{tmp}/part-{i}.txt", "wb") as f:
            f.write(p)
    stream = np.frombuffer(b"".join(parts), np.uint8).astype(np.int64)
    seq = 16
    train_tokens = math.floor((1.0 - 0.1) * len(stream))  # as the workers cut it
    windows = stream[:train_tokens // (seq + 1) * (seq + 1)].reshape(-1, seq + 1)
    write_model(tmp)
    records = [f"{tmp}/rec{r}" for r in range(2)]
    c = Cluster(tmp)
    try:
        for r, where in enumerate(records):
            os.makedirs(where)
            c.python_worker(f"worker{r}", record=where)
        path = write_spec(tmp, "split", {"name": "text", "train": f"{tmp}/part-*.txt",
                                          "seq_len": seq, "test_fraction": 0.1},
                          workers=2, batch=8)
        job = run(c.client, path)
        if not job.metrics.test_loss > 0 or job.loss != "model":
            fail(f"split: test loss {job.metrics.test_loss}, loss {job.loss}")
    finally:
        c.stop()
    with open(path) as f:
        if json.load(f)["dataset"].get("train_size") is not None:
            fail("the spec file was changed")
    rows = []
    for where in records:
        for xf in sorted(glob.glob(f"{where}/x-*.npy")):
            x, y = np.load(xf), np.load(xf.replace("/x-", "/y-"))
            if x.dtype != np.int64 or y.dtype != np.int64 or x.shape[1] != seq:
                fail(f"{xf}: inputs {x.dtype} {x.shape}, labels {y.dtype}")
            for xr, yr in zip(x, y):
                if not np.array_equal(xr[1:], yr[:-1]):
                    fail(f"{xf}: labels are not the inputs shifted by one")
                rows.append(np.concatenate([xr, yr[-1:]]))
    got = sorted(map(bytes, np.array(rows, np.uint8)))
    want = sorted(map(bytes, windows.astype(np.uint8)))
    if got != want:
        fail(f"the workers saw {len(got)} windows, {len(set(got))} distinct; the training "
             f"split holds {len(want)}")
    print(f"split: two workers saw each of the {len(want)} training windows once "
          f"(byte-level, three files), test loss {job.metrics.test_loss:.4f}")


def vocabulary(tmp):
    """A vocabulary file: counts agree; an untokenizable byte is named."""
    words = ["the", "cat", "sat", "on", "mat", "a", "dog", " ", ".", "\\n"]
    with open(f"{tmp}/vocab.txt", "w") as f:
        f.write("\n".join(words + ["<unk>"]) + "\n")
    with open(f"{tmp}/strict.txt", "w") as f:
        f.write("\n".join(words) + "\n")
    rng = np.random.default_rng(1)
    text = " ".join(rng.choice(["the cat sat.", "a dog sat on the mat.", "the mat!"], 400))
    with open(f"{tmp}/story.txt", "w") as f:
        f.write(text + "\n")
    write_model(tmp, vocab=len(words) + 1)
    c = Cluster(tmp)
    try:
        c.python_worker("vocab")
        path = write_spec(tmp, "vocab", {"name": "text", "train": f"{tmp}/story.txt",
                                          "vocab": f"{tmp}/vocab.txt", "seq_len": 8})
        job = run(c.client, path)
        print(f"vocabulary: the client's count of windows is the worker's "
              f"({job.metrics.total_steps} steps), test loss {job.metrics.test_loss:.4f}")
        write_model(tmp, vocab=len(words))
        strict = write_spec(tmp, "strict", {"name": "text", "train": f"{tmp}/story.txt",
                                             "vocab": f"{tmp}/strict.txt", "seq_len": 8})
        at = text.index("!")
        try:
            c.client.submit(strict)
            fail("a byte no token starts was submitted")
        except tally.SubmitError as e:
            if f"story.txt: byte {at} starts no token" not in str(e):
                fail(f"submit error: {e}")
            print(f"refused at submit: {e}")
        job = raw_submit(c.client, path, {"vocab": f"{tmp}/strict.txt", "vocab_size": len(words)})
        if job.state != pb.FAILED or f"story.txt: byte {at} starts no token" not in job.message:
            fail(f"past the client: {pb.JobState.Name(job.state)}: {job.message}")
        print(f"past the client: FAILED: {job.message[:160]}")
        write_model(tmp, vocab=len(words) + 1)
        run(c.client, path)  # the server and the worker go on
    finally:
        c.stop()


def errors(tmp):
    """Counts and globs past the client; layers refused at submit."""
    with open(f"{tmp}/corpus.txt", "wb") as f:
        f.write(bytes(range(256)) * 8)  # 2048 bytes: 1843 train, 108 windows
    write_model(tmp)
    c = Cluster(tmp)
    try:
        c.python_worker("errors")
        path = write_spec(tmp, "errors", {"name": "text", "train": f"{tmp}/corpus.txt",
                                           "seq_len": 16}, steps=3)
        job = raw_submit(c.client, path, {"train_size": 500})
        want = "hold 108 training windows of 17 tokens (1843 tokens); the job was " \
               "submitted with dataset.train_size 500"
        if job.state != pb.FAILED or want not in job.message:
            fail(f"train_size: {pb.JobState.Name(job.state)}: {job.message}")
        print(f"train_size the files do not hold: FAILED: ...{want}")
        job = raw_submit(c.client, path, {"train": f"{tmp}/none-*.txt"})
        if job.state != pb.FAILED or "none-*.txt: the pattern matches no file" not in \
                job.message:
            fail(f"glob: {pb.JobState.Name(job.state)}: {job.message}")
        print(f"a glob that matches nothing: FAILED: {job.message[:120]}")
        with open(f"{tmp}/layers.json", "w") as f:
            json.dump({"model": {"preset": "mlp"},
                       "dataset": {"name": "text", "train": f"{tmp}/corpus.txt"}}, f)
        try:
            c.client.submit(f"{tmp}/layers.json")
            fail("a model of layers on text was submitted")
        except tally.InvalidArgument as e:  # the coordinator's
            if "train it with a Python model" not in e.details:
                fail(f"layers on text: {e}")
            print(f"layers on text: INVALID_ARGUMENT: {e.details[:100]}")
        run(c.client, path)  # and the next job trains
    finally:
        c.stop()


def language(tmp):
    """The example's model on the fortunes corpus beats byte frequencies."""
    if not glob.glob(FORTUNES):
        fail(f"{FORTUNES}: the fortunes package is not installed")
    example = f"{ROOT}/examples/text-lm"
    shutil.copy(f"{example}/model.py", f"{tmp}/lm.py")
    import yaml
    with open(f"{example}/job.yaml") as f:
        spec = yaml.safe_load(f)
    spec["model"]["python"]["file"] = "lm.py"
    spec["training"].update({"workers": 1, "max_steps": 200})
    spec["dataset"]["seq_len"] = 64
    with open(f"{tmp}/lm.json", "w") as f:
        json.dump(spec, f)
    data = b"".join(open(p, "rb").read() for p in sorted(glob.glob(FORTUNES)))
    test = np.frombuffer(data, np.uint8)[math.floor(
        (1.0 - spec["dataset"]["test_fraction"]) * len(data)):]
    counts = np.bincount(test, minlength=256).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    entropy = float(-(p * np.log(p)).sum())
    c = Cluster(tmp)
    try:
        c.python_worker("lm")
        job = run(c.client, f"{tmp}/lm.json", timeout=900)
    finally:
        c.stop()
    loss = job.metrics.test_loss
    print(f"language: test loss {loss:.4f} nats a byte after 200 steps; the test split's "
          f"unigram entropy {entropy:.4f}; {entropy - loss:.3f} below it")
    if job.loss != "token_cross_entropy" or not loss <= entropy - 0.7:
        fail(f"the language model's test loss {loss:.4f} is not 0.7 below {entropy:.4f}")


def main():
    only = set(sys.argv[2:])
    for name, phase in (("split", split), ("vocabulary", vocabulary), ("errors", errors),
                        ("language", language)):
        if only and name not in only:
            continue
        tmp = tempfile.mkdtemp(prefix=f"tally-text-{name}-")
        try:
            phase(tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    print("ok")


if __name__ == "__main__":
    main()
