"""The Python worker's engine: the submitter's torch.nn.Module, replicated
over the worker's devices with PyTorch's own torch.nn.parallel.

The native job runner (tally._native, over worker/) calls step() and
evaluate() and reads the flat vectors this engine lends it, as
tally.engine_contract.Engine says:

  params  float32[num_params]: replica 0's parameters are views into it
          (on the CPU), so a pull writes straight into the module;
  grads   float32[num_params]: replica 0's .grad are views into it, and the
          other replicas' gradients are added to it in rank order.

A step: every other replica copies replica 0's weights (replicate); the
batch is cut along dimension 0 into micro-batches whose sizes differ by at
most one (scatter, as the native engine does); each replica runs forward,
the loss (scaled so the sum over replicas is the batch's mean) and backward
on its own thread (torch.nn.parallel.parallel_apply on GPUs; PyTorch's
needs CUDA, so CPU replicas get plain threads); the gradients are reduced
into grads in rank order.

Buffers (BatchNorm's running statistics) are replica 0's, as in
nn.DataParallel: every other replica starts each step from a copy of
them, normalises its own micro-batch, and what it updates is dropped.
Across workers they follow DDP's broadcast_buffers: before a step, the
native runner loads the job's buffer region (the lowest live rank's after
the last step) into replica 0 (load_buffers), and pushes replica 0's
after it (buffers).

Building the module and its layout (tally.model) and the tables whose
rows live on the shards (tally.tables) have modules of their own; their
names are importable from here too.
"""
from __future__ import annotations

import copy
import sys
import threading
import traceback
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch.nn.parallel import parallel_apply

from tally.engine_contract import Buffer, Job, Param  # noqa: F401 - Buffer, Param: re-exported
from tally.errors import LayoutError, ModelError
from tally.model import (DTYPES, check_layout, cut_traceback,  # noqa: F401 - DTYPES: re-exported
                         layout_of, load_module, state_of)
from tally.model_files import ModelFiles
from tally.tables import ShardedEmbedding, TableHub, swap_tables

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from tally import _native

__all__ = [
    "EVAL_BATCH", "LOSSES", "LayoutError", "ModelError", "ModelFiles",
    "ShardedEmbedding", "TorchEngine", "check_layout", "layout_of", "load_module",
    "make_engine", "runtime", "state_of", "swap_tables",
]

LOSSES = ("cross_entropy", "mse", "model", "binary_cross_entropy")
EVAL_BATCH = 1024


class _Step(torch.nn.Module):
    """One replica's part of a step: forward, loss, backward; returns the
    summed loss and the correct predictions of its micro-batch. A module,
    so that torch.nn.parallel.parallel_apply runs it on the replica's
    device."""

    def __init__(self, model: torch.nn.Module, loss: str, batch: int) -> None:
        """A replica's step.

        Args:
            model: the replica.
            loss: one of LOSSES.
            batch: the whole batch's samples (each micro-batch's loss is
                divided by it).
        """
        super().__init__()
        self.model, self.loss, self.batch = model, loss, batch

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[float, int]:
        """Forward, loss (scaled so that the replicas' sum is the batch's
        mean) and backward on a micro-batch.

        Args:
            x: its inputs, on the replica's device.
            y: its labels, there too.

        Returns:
            The micro-batch's summed loss and its correct predictions; the
            gradients are in the replica's .grad.

        Raises:
            ModelError: the loss is not a scalar.
        """
        n = x.shape[0]
        loss: torch.Tensor
        correct: int
        if self.loss == "model":
            mean = self.model(x, y)
            loss, correct = mean * (n / self.batch), 0
        else:
            loss, correct = _loss_sum(self.loss, self.model(x), y, self.batch)
        if loss.dim() != 0:
            raise ModelError(f"the loss is not a scalar (shape {list(loss.shape)})")
        loss.backward()
        return float(loss) * self.batch, correct


def _loss_sum(kind: str, out: torch.Tensor, y: torch.Tensor,
              batch: int = 1) -> tuple[torch.Tensor, int]:
    """The summed loss of a micro-batch's samples, divided by `batch`, and
    its correct predictions.

    Args:
        kind: cross_entropy, mse or binary_cross_entropy (LOSSES but model,
            whose module returns its loss itself).
        out: the module's output for the micro-batch.
        y: its labels, [n] (a class each) or, for text, [n, T] (the next
            tokens): then out is [n, T, vocab], each sample's loss is the
            mean over its tokens, and nothing is counted as correct
            (accuracy is a classifier's).
        batch: the divisor (the whole batch's samples).

    Returns:
        The loss (a scalar tensor, for backward) and the correct count.

    Raises:
        ModelError: binary_cross_entropy's output is not one logit a sample.
    """
    if y.dim() > 1:
        tokens = y.shape[1]
        loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1),
                               reduction="sum") / (batch * tokens)
        return loss, 0
    if kind == "cross_entropy":
        loss = F.cross_entropy(out, y, reduction="sum") / batch
        return loss, int((out.argmax(1) == y).sum())
    if kind == "binary_cross_entropy":
        logit = _one_logit(out)
        loss = F.binary_cross_entropy_with_logits(logit, y.to(logit.dtype),
                                                  reduction="sum") / batch
        return loss, int(((logit > 0).long() == y).sum())
    # mse against the one-hot label, mean over the outputs
    target = F.one_hot(y, out.shape[1]).to(out.dtype)
    return F.mse_loss(out, target, reduction="sum") / (batch * out.shape[1]), 0


def _one_logit(out: torch.Tensor) -> torch.Tensor:
    """binary_cross_entropy's output as one logit a sample.

    Args:
        out: the module's output, [n] or [n, 1].

    Returns:
        The logits, [n].

    Raises:
        ModelError: `out` is neither [n] nor [n, 1].
    """
    if out.dim() == 2 and out.shape[1] == 1:
        out = out[:, 0]
    if out.dim() != 1:
        raise ModelError(f"binary_cross_entropy takes one logit a sample, [batch] or "
                         f"[batch, 1]; the module returned {list(out.shape)}")
    return out


def _flat_views(module: torch.nn.Module, flat: torch.Tensor, grads: torch.Tensor) -> None:
    """Points each parameter (and its .grad) at its slice of the flat
    vectors, copying the values in."""
    off = 0
    for p in module.parameters():
        n = p.numel()
        flat[off:off + n].copy_(p.data.reshape(-1))
        p.data = flat[off:off + n].view_as(p)
        p.grad = grads[off:off + n].view_as(p)
        off += n


class TorchEngine:
    """The engine of one Python job on this worker: the module replicated
    over the worker's devices, stepped and evaluated by the native job
    runner (tally._native's PyEngine) as tally.engine_contract.Engine
    says. Not thread-safe: the runner calls it from one thread at a time."""

    def __init__(self, job: Job) -> None:
        """Builds the module as the job says and checks it against the job.

        Args:
            job: the job, as the native worker passes it.

        Raises:
            ModelError: an unknown loss, or a module that cannot be built.
            LayoutError: the module built here is not the job's.
        """
        self._files: ModelFiles | None = None
        if job.loss not in LOSSES:
            raise ModelError(f"unknown loss {job.loss}")
        self.loss = job.loss
        self.clip = job.clip_grad_norm
        self._intra = torch.get_num_threads()  # as the worker set it
        self._seen_threads: set[int] = set()
        self.devices = [torch.device(d) for d in job.devices] or [torch.device("cpu")]
        self._files = ModelFiles(job.files) if job.files else None
        try:
            self._build(job)
        except BaseException:
            self.close()
            raise

    def _build(self, job: Job) -> None:
        """The module and its replicas, checked against the job's layout."""
        module = load_module(job.code, job.file, job.build, job.seed, self._files)
        self.hub = TableHub()
        self.tables: list[dict[str, Any]] = [t.as_spec() for t in job.embeddings]
        swap_tables(module, self.tables, self.hub)
        check_layout(module, job.params)
        buffers, _ = state_of(module)
        want = [(n, d, list(s)) for n, d, s in job.buffers]
        if buffers != want:
            raise LayoutError(f"the module's buffers {[b[0] for b in buffers][:8]} are not the "
                             f"job's {[b[0] for b in want][:8]}: the worker built another model")
        self.buffer_names = [b[0] for b in buffers]
        self.num_params = sum(p.numel() for p in module.parameters())
        self.replicas = len(self.devices)
        # Replica r >= 1: a copy on its device, with its own flat vectors.
        models = [module] + [copy.deepcopy(module).to(d) for d in self.devices[1:]]
        module.to(self.devices[0])
        self.flats: list[torch.Tensor] = []
        self.grad_flats: list[torch.Tensor] = []
        for model, device in zip(models, self.devices):
            flat = torch.zeros(self.num_params, dtype=torch.float32, device=device)
            grad = torch.zeros(self.num_params, dtype=torch.float32, device=device)
            _flat_views(model, flat, grad)
            model.train()
            self.flats.append(flat)
            self.grad_flats.append(grad)
        self.models = models
        for r, model in enumerate(models):
            for m in model.modules():
                if isinstance(m, ShardedEmbedding):
                    m.replica = r
        self.buffer_bytes = sum(t.numel() * t.element_size() for t in self._buffers_of(0))
        # What the native side reads and writes: host memory, lent to it as
        # NumPy views (the Engine's params and grads).
        if self.devices[0].type == "cpu":
            self._params, self._grads = self.flats[0], self.grad_flats[0]
        else:
            self._params = self.flats[0].cpu().pin_memory()
            self._grads = torch.zeros(self.num_params).pin_memory()
        self.params: npt.NDArray[np.float32] = self._params.numpy()
        self.grads: npt.NDArray[np.float32] = self._grads.numpy()

    def _apply(self, steps: list[_Step],
               inputs: list[tuple[torch.Tensor, torch.Tensor]]) -> list[tuple[float, int]]:
        """Each replica's step on its own thread. On GPUs that is PyTorch's
        parallel_apply (with its streams); PyTorch's needs CUDA, so CPU
        replicas get the same from threads here."""
        if len(steps) == 1:
            return [steps[0](*inputs[0])]
        if all(d.type == "cuda" for d in self.devices[:len(steps)]):
            return parallel_apply(steps, inputs, devices=self.devices[:len(steps)])
        results: list[Any] = [None] * len(steps)
        errors: list[BaseException | None] = [None] * len(steps)

        def run(r: int) -> None:
            try:
                results[r] = steps[r](*inputs[r])
            except BaseException as e:  # noqa: B902 - re-raised below
                errors[r] = e
        threads = [threading.Thread(target=run, args=(r,)) for r in range(len(steps))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for e in errors:
            if e is not None:
                raise e
        return results

    def attach_rows(self, rows: _native.Rows | None) -> None:
        """The job runner's tables (tally._native.Rows), or None once it is
        done with them.

        Args:
            rows: the tables; None: none from now on.
        """
        self.hub.rows = rows

    def _buffers_of(self, r: int) -> list[torch.Tensor]:
        """Replica r's buffer tensors, in the job's order, as the module
        holds them now (a module may assign a buffer anew)."""
        state = self.models[r].state_dict(keep_vars=True)
        return [state[n] for n in self.buffer_names]

    def close(self) -> None:
        """The job is over: a directory model's files and modules go (twice
        is harmless)."""
        if self._files is not None:
            self._files.close()
            self._files = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit, os may be gone
            pass

    @staticmethod
    def split(batch: int, replicas: int) -> list[int]:
        """The micro-batches' sizes.

        Args:
            batch: the batch's samples.
            replicas: the replicas it may be cut over.

        Returns:
            At most `replicas` sizes summing to `batch`, differing by at
            most one, the larger first.
        """
        used = min(batch, replicas)
        return [batch // used + (1 if r < batch % used else 0) for r in range(used)]

    def _threads(self) -> None:
        """PyTorch's intra-op count is per OpenMP thread: the native runner's
        thread that calls step() gets the process's count too."""
        me = threading.get_ident()
        if me not in self._seen_threads:
            torch.set_num_threads(self._intra)
            self._seen_threads.add(me)

    def step(self, x: npt.NDArray[Any], y: npt.NDArray[Any], seed: int) -> tuple[float, int]:
        """One step on this worker's batch: forward, loss and backward on
        every replica, the gradients reduced into the grads vector (and the
        tables' row gradients pushed).

        Args:
            x: the batch's inputs (float32, or int64 ids), [batch, ...].
            y: its labels, [batch] or, for text, [batch, seq_len].
            seed: torch.manual_seed's for the step.

        Returns:
            The summed loss over the batch's samples and the correct
            predictions.

        Raises:
            ModelError: the model's step raised (its traceback in the
                message), or its loss is not a scalar.
        """
        self._threads()
        torch.manual_seed(seed)
        xt = torch.from_numpy(x)
        yt = torch.from_numpy(y).long()
        batch = xt.shape[0]
        sizes = self.split(batch, self.replicas)
        with torch.no_grad():
            for r in range(len(sizes)):
                if r > 0 or self.devices[0].type != "cpu":
                    self.flats[r].copy_(self._params, non_blocking=True)
                self.grad_flats[r].zero_()
                if r > 0 and self.buffer_names:
                    for mine, first in zip(self._buffers_of(r), self._buffers_of(0)):
                        mine.copy_(first, non_blocking=True)
        steps = [_Step(self.models[r], self.loss, batch) for r in range(len(sizes))]
        self.hub.records = [[] for _ in range(len(sizes))]
        self.hub.prefetched = {}  # never an earlier step's rows
        if self.tables and xt.dim() == 2 and xt.dtype == torch.int64:
            self.hub.prefetch([m for m in self.models[0].modules()
                               if isinstance(m, ShardedEmbedding)], xt.numpy())
        inputs = [(xs.to(d, non_blocking=True), ys.to(d, non_blocking=True))
                  for xs, ys, d in zip(torch.split(xt, sizes), torch.split(yt, sizes),
                                       self.devices)]
        try:
            results = self._apply(steps, inputs)
        except ModelError:
            raise
        except BaseException as e:  # noqa: B902
            raise ModelError("the model's step raised:\n" + cut_traceback(
                "".join(traceback.format_exception(type(e), e, e.__traceback__))))
        # Reduce in rank order into replica 0's gradient, then to the host.
        for r in range(1, len(sizes)):
            self.grad_flats[0].add_(self.grad_flats[r].to(self.devices[0]))
        if self.clip > 0:
            # This worker's batch's gradient, as a plain loop clips it.
            torch.nn.utils.clip_grad_norm_(self.models[0].parameters(), self.clip)
        if self.devices[0].type != "cpu":
            self._grads.copy_(self.grad_flats[0])
        if self.tables:
            try:
                if not self.hub.push(self.tables, len(sizes), batch):
                    self._grads[0] = float("nan")  # the shards refuse the step
            finally:
                self.hub.records = []
                self.hub.prefetched = {}
        return (sum(r[0] for r in results), sum(r[1] for r in results))

    def buffers(self) -> bytes:
        """Replica 0's persistent buffers.

        Returns:
            Their bytes, one after another in the job's order.
        """
        state = self.models[0].state_dict()
        out = []
        for name in self.buffer_names:
            t = state[name].detach().cpu().contiguous()
            if t.dtype == torch.bfloat16:
                t = t.view(torch.int16)
            out.append(t.numpy().tobytes())
        return b"".join(out)

    @torch.no_grad()
    def load_buffers(self, data: bytes) -> None:
        """Replica 0's persistent buffers from their bytes.

        Args:
            data: the bytes, as buffers() gives them.

        Raises:
            ModelError: `data` is not the buffers' size.
        """
        if len(data) != self.buffer_bytes:
            raise ModelError(f"the job's buffers are {len(data)} bytes, the module's "
                             f"{self.buffer_bytes}")
        raw, at = bytearray(data), 0
        for t in self._buffers_of(0):
            n = t.numel() * t.element_size()
            if n == 0:
                continue
            # A copy of its own: aligned for the tensor's dtype.
            src = torch.frombuffer(raw, dtype=torch.uint8, count=n, offset=at).clone()
            t.copy_(src.view(t.dtype).view(t.shape).to(t.device))
            at += n

    @torch.no_grad()
    def evaluate(self, x: npt.NDArray[Any], y: npt.NDArray[Any],
                 scores_out: bool = False
                 ) -> tuple[float, int] | tuple[float, int, float | npt.NDArray[np.float64]]:
        """The model's figures over some samples.

        Args:
            x: the samples, [n, ...].
            y: their labels, [n] or, for text, [n, seq_len].
            scores_out: for binary cross-entropy, give the scores instead
                of their AUC.

        Returns:
            (loss sum, correct), and for binary cross-entropy a third: the
            AUC of their scores, or with scores_out the scores themselves
            (float64), for a caller that evaluates a split in pieces and
            takes the AUC of all of them at once.
        """
        self._threads()
        model, device = self.models[0], self.devices[0]
        if device.type != "cpu":
            self.flats[0].copy_(self._params)
        model.eval()
        loss_sum, correct = 0.0, 0
        scores: list[torch.Tensor] = []
        try:
            for i in range(0, x.shape[0], EVAL_BATCH):
                # A copy: the worker keeps its test set across jobs, and a
                # forward may write into its input.
                xb = torch.from_numpy(x[i:i + EVAL_BATCH].copy()).to(device)
                yb = torch.from_numpy(y[i:i + EVAL_BATCH]).long().to(device)
                n = xb.shape[0]
                if self.loss == "model":
                    loss_sum += float(model(xb, yb)) * n
                    continue
                out = model(xb)
                loss, right = _loss_sum(self.loss, out, yb)
                loss_sum += float(loss)
                correct += right
                if self.loss == "binary_cross_entropy":
                    scores.append(_one_logit(out).double().cpu())
        finally:
            model.train()
        if self.loss == "binary_cross_entropy" and scores and scores_out:
            return loss_sum, correct, torch.cat(scores).numpy()
        if self.loss == "binary_cross_entropy" and scores:
            # Over the whole split at once: AUCs of parts cannot be averaged.
            from tally import _native
            return loss_sum, correct, _native.auc(torch.cat(scores).tolist(),
                                                  y.astype("int64").tolist())
        return loss_sum, correct


def make_engine(job: Job) -> TorchEngine:
    """The factory the native worker calls for each Python job.

    Args:
        job: the job, as the native worker hands it over.

    Returns:
        The job's engine (a tally.engine_contract.Engine).

    Raises:
        ModelError, LayoutError: as TorchEngine does.
    """
    return TorchEngine(job)


def runtime() -> str:
    """What this worker offers, as it registers.

    Returns:
        Python's, PyTorch's and CUDA's versions, e.g. "Python 3.11.2,
        PyTorch 1.13.1, CPU".
    """
    cuda = f"CUDA {torch.version.cuda}" if torch.cuda.is_available() else "CPU"
    return (f"Python {sys.version.split()[0]}, PyTorch {torch.__version__.split('+')[0]}, "
            f"{cuda}")

