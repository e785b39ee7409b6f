"""The Python worker's engine: the submitter's torch.nn.Module, replicated
over the worker's devices with PyTorch's own torch.nn.parallel.

The native job runner (tally._native, over worker/) calls step() and
evaluate() and reads the flat vectors whose addresses this engine gives:

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
"""
from __future__ import annotations

import copy
import sys
import threading
import traceback
import types
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

import torch
import torch.nn.functional as F
from torch.nn.parallel import parallel_apply

from tally.errors import LayoutError, ModelError
from tally.model_files import ModelFiles

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from tally import _native

__all__ = [
    "EVAL_BATCH", "JobDict", "LOSSES", "LayoutError", "ModelError", "ModelFiles",
    "ShardedEmbedding", "TorchEngine", "check_layout", "layout_of", "load_module",
    "make_engine", "runtime", "state_of", "swap_tables",
]

LOSSES = ("cross_entropy", "mse", "model", "binary_cross_entropy")
EVAL_BATCH = 1024

# A parameter as a job lists it: (name, shape).
Param = tuple[str, list[int]]
# A persistent buffer as a job lists it: (name, safetensors dtype, shape).
Buffer = tuple[str, str, list[int]]


class JobDict(TypedDict):
    """What the native worker's factory passes make_engine for each Python
    job (JobDict in python/tally/_native.cc): the parsed spec as plain
    values."""
    name: str
    file: str
    build: str
    code: str
    files: dict[str, str]        # a directory model's {path: text}, else empty
    loss: str                    # one of LOSSES
    seed: int
    clip_grad_norm: float
    batch_size: int
    input_shape: list[int]
    num_classes: int
    params: list[Param]
    buffers: list[Buffer]
    embeddings: list[dict[str, Any]]  # model.embeddings: name, dim, ids, salt, ...
    devices: list[str]           # "cpu" or "cuda:N", one a replica


def _cut(text: str, limit: int = 2000) -> str:
    return text if len(text) <= limit else "..." + text[-limit:]


def _import(code: str | None, file: str, build: str,
            files: ModelFiles | None) -> Callable[[], Any]:
    """The build function: `build` in the file's code, or for a
    directory (its ModelFiles), `module.function` (the module's path,
    dotted)."""
    if files is not None:
        module_name, _, fn_name = build.rpartition(".")
        if not module_name:
            raise ModelError(f"model.python.build: name the function as module.function "
                             f"(for {file}/net.py: net.make_model), not '{build}'")
        where = f"{file}/{module_name.replace('.', '/')}.py"
        try:
            mod = files.import_module(module_name)
        except BaseException:  # noqa: B902 - the user's code may raise anything
            raise ModelError(f"{where} does not import:\n" + _cut(traceback.format_exc()))
    else:
        assert code is not None, "a single file comes with its code"
        fn_name, where = build, file or "model.py"
        mod = types.ModuleType("tally_model")
        mod.__file__ = where
        try:
            exec(compile(code, mod.__file__, "exec"), mod.__dict__)
        except BaseException:  # noqa: B902
            raise ModelError(f"{where} does not import:\n" + _cut(traceback.format_exc()))
    fn = getattr(mod, fn_name, None)
    if not callable(fn):
        raise ModelError(f"{where} has no function '{fn_name}' (model.python.build)")
    return fn


def load_module(code: str | None, file: str, build: str, seed: int,
                files: ModelFiles | None = None) -> torch.nn.Module:
    """Runs the submitted file (or imports the submitted directory's
    module from `files`) and calls its build function under the job's seed.

    Args:
        code: the file's text (model.python.code); None for a directory.
        file: the file's or directory's name, for messages and tracebacks.
        build: the build function's name (model.python.build): a name in
            the file, or `module.function` in a directory.
        seed: torch.manual_seed's, before the build function runs.
        files: the directory's files, open; None for a single file.

    Returns:
        The module the build function returns.

    Raises:
        ModelError: the code does not import, has no such function, the
            function raises or returns something other than a torch.nn.Module.
    """
    fn = _import(code, file, build, files)
    torch.manual_seed(seed)
    try:
        module = fn()
    except BaseException:  # noqa: B902
        raise ModelError(f"{build}() raised:\n" + _cut(traceback.format_exc()))
    if not isinstance(module, torch.nn.Module):
        raise ModelError(f"{build}() returned {type(module).__name__}, not a torch.nn.Module")
    return module


DTYPES: dict[torch.dtype, str] = {
    torch.float32: "F32", torch.float64: "F64", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL"}


def layout_of(module: torch.nn.Module) -> list[Param]:
    """The parameters as a job lists them: (name, shape) in order."""
    return [(n, list(p.shape)) for n, p in module.named_parameters()]


def state_of(module: torch.nn.Module) -> tuple[list[Buffer], dict[str, str]]:
    """The rest of the module's state_dict.

    Returns:
        Its persistent buffers as (name, dtype, shape) in order, and the
        names that are another parameter's (tied weights) as {alias:
        parameter name}.

    Raises:
        ModelError: a buffer of a dtype Tally cannot keep.
    """
    names = {id(p): n for n, p in module.named_parameters()}
    buffers: list[Buffer] = []
    aliases: dict[str, str] = {}
    for key, t in module.state_dict(keep_vars=True).items():
        if isinstance(t, torch.nn.Parameter):
            if names.get(id(t), key) != key:
                aliases[key] = names[id(t)]
            continue
        if t.dtype not in DTYPES:
            raise ModelError(f"buffer {key} is {t.dtype}, which Tally cannot keep")
        buffers.append((key, DTYPES[t.dtype], list(t.shape)))
    return buffers, aliases


def check_layout(module: torch.nn.Module, expected: Sequence[tuple[str, Sequence[int]]]) -> None:
    """Checks the module's parameters against the job's.

    Args:
        module: the module built here.
        expected: the job's parameters, (name, shape) in order.

    Raises:
        ModelError: the module has no parameters.
        LayoutError: a parameter's name or shape, or their number, differs.
    """
    got = layout_of(module)
    if not got:
        raise ModelError("the module has no parameters to train")
    want = [(n, list(s)) for n, s in expected]
    if got == want:
        return
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            raise LayoutError(f"the module's parameter {i} is {g[0]} {g[1]}, the job's "
                              f"{w[0]} {w[1]}: the worker built another model")
    raise LayoutError(f"the module has {len(got)} parameters, the job {len(want)}")


class _TableHub:
    """What a job's ShardedEmbedding modules share: the native Rows (the
    job runner's tables, tally._native.Rows) and each replica's record of
    the rows a step pulled. Not copied with a replica (deepcopy)."""

    def __init__(self) -> None:
        self.rows: _native.Rows | None = None
        # Each replica's lookups of the step: (table, its unique rows, the
        # pulled values, a leaf whose .grad the backward pass fills).
        self.records: list[list[tuple[int, torch.Tensor, torch.Tensor]]] = []
        # The step's rows pulled before its forward pass (tables with
        # features): table -> (its sorted rows, their values).
        self.prefetched: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def __deepcopy__(self, memo: dict[int, Any]) -> _TableHub:
        return self

    def pull(self, table: int, rows: npt.NDArray[np.int64]) -> torch.Tensor:
        """The values of `rows` (sorted, unique) of `table`: from the
        step's prefetched rows where they are all there, else from the
        shards."""
        have = self.prefetched.get(table)
        if have is not None and len(rows):
            known, values = have
            at = torch.searchsorted(known, torch.from_numpy(rows)).clamp(max=len(known) - 1)
            if bool((known[at] == torch.from_numpy(rows)).all()):
                return values[at]
        if self.rows is None:
            raise ModelError("the job's tables are not reachable (no shard map yet)")
        return torch.from_numpy(self.rows.pull(table, rows))

    def prefetch(self, modules: Sequence[ShardedEmbedding], x: npt.NDArray[np.int64]) -> None:
        """Every table with features: the unique rows of its columns of the
        batch `x` (int64 [batch, width]), pulled at once."""
        asks: list[tuple[int, npt.NDArray[np.int64]]] = []
        tables: list[int] = []
        for m in modules:
            cols = m.features
            if not cols or m.index in tables:
                continue
            rows = m.rows_of(torch.from_numpy(x[:, cols]))
            asks.append((m.index, torch.unique(rows.reshape(-1), sorted=True).numpy()))
            tables.append(m.index)
        if not asks:
            return
        if self.rows is None:
            raise ModelError("the job's tables are not reachable (no shard map yet)")
        for (t, unique), values in zip(asks, self.rows.pull_tables(asks)):
            self.prefetched[t] = (torch.from_numpy(unique), torch.from_numpy(values))


class ShardedEmbedding(torch.nn.Module):
    """A table of model.embeddings, in place of the model's nn.Embedding or
    nn.EmbeddingBag of that name. Its forward takes what the module's
    takes; it maps the ids to rows (ids: hashed, with the table's salt; or
    direct), pulls the unique rows the batch touches from the shards that
    hold them, and looks them up as the module would in its own weight, so
    the step computes what the dense module computes. In training, the
    pulled rows are a leaf whose gradient the engine pushes after the
    backward pass."""

    def __init__(self, index: int, table: dict[str, Any],
                 original: torch.nn.Embedding | torch.nn.EmbeddingBag, hub: _TableHub) -> None:
        """Takes the place of `original` for the table `table`.

        Args:
            index: the table's index in model.embeddings.
            table: the table's spec (name, dim, num_embeddings, ids, salt,
                features, ...).
            original: the module it replaces; its pooling is kept.
            hub: what the job's tables share.
        """
        super().__init__()
        self.index, self.name = index, table["name"]
        self.dim, self.num = int(table["dim"]), int(table.get("num_embeddings") or 0)
        self.hashed = table.get("ids", "hashed") == "hashed"
        self.dynamic = table.get("ids") == "dynamic" or bool(table.get("dynamic"))
        self.salt = int(table["salt"]) if "salt" in table else None
        self.bag = isinstance(original, torch.nn.EmbeddingBag)
        self.mode = original.mode if isinstance(original, torch.nn.EmbeddingBag) else None
        self.include_last_offset = getattr(original, "include_last_offset", False)
        self.features = list(table.get("features") or [])
        self.hub = hub
        self.replica = 0

    def rows_of(self, ids: torch.Tensor) -> torch.Tensor:
        """The table's rows that `ids` map to, an int64 tensor of their shape.

        Raises:
            ModelError: an id outside a direct table's rows, or a hashed
                table without its salt.
        """
        ids = ids.detach().cpu().long()
        if self.dynamic:  # a row for each id, keyed by the id itself
            return ids
        if self.hashed:
            from tally import _native
            if self.salt is None:  # the job's tables always carry theirs
                raise ModelError(f"table {self.name}: a hashed table without its salt")
            return torch.from_numpy(_native.hash_rows(ids.numpy(), self.salt, self.num))
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.num):
            bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
            raise ModelError(f"table {self.name}: id {bad} is outside its {self.num} rows "
                             f"(ids: direct)")
        return ids

    def forward(self, input: torch.Tensor, offsets: torch.Tensor | None = None,
                per_sample_weights: torch.Tensor | None = None) -> torch.Tensor:
        rows = self.rows_of(input)
        unique, inverse = torch.unique(rows.reshape(-1), sorted=True, return_inverse=True)
        device = input.device
        weight = self.hub.pull(self.index, unique.numpy()).to(device)
        if self.training and torch.is_grad_enabled():
            weight.requires_grad_(True)  # a fresh tensor: the pull's own
            self.hub.records[self.replica].append((self.index, unique, weight))
        local = inverse.reshape(input.shape).to(device)
        if self.mode is None:  # an nn.Embedding's
            return F.embedding(local, weight)
        return F.embedding_bag(local, weight, offsets, mode=self.mode,
                               per_sample_weights=per_sample_weights,
                               include_last_offset=self.include_last_offset)

    def extra_repr(self) -> str:
        rows = "dynamic" if self.dynamic else self.num
        return f"{self.name}: {rows} x {self.dim} on the shards"


def _submodule(module: torch.nn.Module, name: str) -> torch.nn.Module | None:
    """The submodule `name` (dotted) of `module`; None where there is none."""
    try:
        return module.get_submodule(name)
    except AttributeError:
        return None


def swap_tables(module: torch.nn.Module, tables: Sequence[dict[str, Any]],
                hub: _TableHub | None = None) -> list[str]:
    """Replaces each table's module (named by model.embeddings) with a
    ShardedEmbedding. The modules' weights leave the module's parameters
    (they live on the shards).

    Args:
        module: the model, changed in place.
        tables: model.embeddings; each table's dim, num_embeddings and
            combiner are filled in from its module where they are left out,
            and checked where they are given.
        hub: what the tables share on a worker; None: one of their own.

    Returns:
        The names of the modules swapped, in order.

    Raises:
        ModelError: a table names no module, or one that is not an
            nn.Embedding or nn.EmbeddingBag, or one with options a table on
            the shards lacks, or the spec's figures are not the module's.
    """
    swapped: list[str] = []
    for i, t in enumerate(tables):
        name = t.get("name")
        if not isinstance(name, str) or (original := _submodule(module, name)) is None:
            raise ModelError(f"model.embeddings[{i}]: the model has no module '{name}'")
        if not isinstance(original, (torch.nn.Embedding, torch.nn.EmbeddingBag)):
            raise ModelError(f"model.embeddings[{i}]: '{name}' is a "
                             f"{type(original).__name__}, not an nn.Embedding or "
                             f"nn.EmbeddingBag")
        unsupported = [a for a in ("padding_idx", "max_norm") if getattr(original, a) is not None]
        if getattr(original, "scale_grad_by_freq", False):
            unsupported.append("scale_grad_by_freq")
        if unsupported:
            raise ModelError(f"model.embeddings[{i}]: '{name}' has {', '.join(unsupported)}, "
                             f"which a table on the shards does not support")
        rows, dim = original.weight.shape
        mode = original.mode if isinstance(original, torch.nn.EmbeddingBag) else ""
        if mode not in ("", "sum", "mean"):
            raise ModelError(f"model.embeddings[{i}]: '{name}' pools by {mode}; a table "
                             f"pools by sum or mean")
        # A dynamic table's rows are keyed by id: the module's row count
        # is not the table's.
        dynamic = t.get("ids") == "dynamic" or t.get("dynamic") in (True, "true")
        checked = (("dim", dim), ("combiner", mode)) if dynamic else \
            (("dim", dim), ("num_embeddings", rows), ("combiner", mode))
        for key, have in checked:
            if t.get(key) in (None, ""):
                t[key] = have
            elif t[key] != have:
                raise ModelError(f"model.embeddings[{i}].{key} is {t[key]}, the module "
                                 f"'{name}' has {have!r}")
        parent_name, _, leaf = name.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        setattr(parent, leaf, ShardedEmbedding(i, t, original, hub or _TableHub()))
        swapped.append(name)
    return swapped


class _Step(torch.nn.Module):
    """One replica's part of a step: forward, loss, backward; returns the
    summed loss and the correct predictions of its micro-batch."""

    def __init__(self, model: torch.nn.Module, loss: str, batch: int) -> None:
        super().__init__()
        self.model, self.loss, self.batch = model, loss, batch

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[float, int]:
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
    its correct predictions. Labels y are [n] (a class each) or, for text,
    [n, T] (the next tokens): then out is [n, T, vocab], each sample's loss
    is the mean over its tokens, and nothing is counted as correct
    (accuracy is a classifier's)."""
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
    """binary_cross_entropy's output: one logit a sample ([n] or [n, 1])."""
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
    runner (tally._native's PyEngine), which reads num_params, replicas,
    params_ptr and grads_ptr, and calls step, evaluate, buffers,
    load_buffers and attach_rows. Not thread-safe: the runner calls it from
    one thread at a time."""

    def __init__(self, job: JobDict) -> None:
        """Builds the module as the job says and checks it against the job.

        Args:
            job: the job, as the native worker passes it.

        Raises:
            ModelError: an unknown loss, or a module that cannot be built.
            LayoutError: the module built here is not the job's.
        """
        self._files: ModelFiles | None = None
        if job["loss"] not in LOSSES:
            raise ModelError(f"unknown loss {job['loss']}")
        self.loss = job["loss"]
        self.clip = job.get("clip_grad_norm", 0.0)
        self._intra = torch.get_num_threads()  # as the worker set it
        self._seen_threads: set[int] = set()
        self.devices = [torch.device(d) for d in job["devices"]] or [torch.device("cpu")]
        files = job.get("files") or {}
        self._files = ModelFiles(files) if files else None
        try:
            self._build(job)
        except BaseException:
            self.close()
            raise

    def _build(self, job: JobDict) -> None:
        """The module and its replicas, checked against the job's layout."""
        module = load_module(job["code"], job["file"], job["build"], job["seed"], self._files)
        self.hub = _TableHub()
        self.tables: list[dict[str, Any]] = job.get("embeddings") or []
        swap_tables(module, self.tables, self.hub)
        check_layout(module, job["params"])
        buffers, _ = state_of(module)
        want = [(n, d, list(s)) for n, d, s in job.get("buffers", [])]
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
        # What the native side reads and writes: host memory.
        if self.devices[0].type == "cpu":
            self.params, self.grads = self.flats[0], self.grad_flats[0]
        else:
            self.params = self.flats[0].cpu().pin_memory()
            self.grads = torch.zeros(self.num_params).pin_memory()
        self.params_ptr: int = self.params.data_ptr()
        self.grads_ptr: int = self.grads.data_ptr()

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
        done with them."""
        self.hub.rows = rows

    def _push_rows(self, used: int, batch: int) -> None:
        """The step's row gradients, summed per row over every lookup and
        replica (in rank order), to the shards; a non-finite one makes the
        dense gradient non-finite too, so the shards refuse the whole step."""
        blocks: list[tuple[int, npt.NDArray[np.int64], npt.NDArray[np.float32]]] = []
        for t, table in enumerate(self.tables):
            rows: list[torch.Tensor] = []
            grads: list[torch.Tensor] = []
            for r in range(used):
                for index, unique, weight in self.hub.records[r]:
                    if index != t:
                        continue
                    rows.append(unique)
                    grads.append(weight.grad.cpu() if weight.grad is not None
                                 else torch.zeros(weight.shape))
            if not rows:
                continue
            if len(rows) == 1:
                u, g = rows[0], grads[0]
            else:
                u, inverse = torch.unique(torch.cat(rows), sorted=True, return_inverse=True)
                g = torch.zeros(len(u), int(table["dim"])).index_add_(0, inverse, torch.cat(grads))
            if not bool(torch.isfinite(g).all()):
                self.grads[0] = float("nan")
                return
            blocks.append((t, u.numpy(), g.contiguous().numpy()))
        if blocks:
            if self.hub.rows is None:
                raise ModelError("the job's tables are not reachable (no shard map yet)")
            self.hub.rows.push(batch, blocks)

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
        """The micro-batches' sizes: `batch` cut over at most `replicas`,
        differing by at most one, the larger first."""
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
                    self.flats[r].copy_(self.params, non_blocking=True)
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
            raise ModelError("the model's step raised:\n" + _cut(
                "".join(traceback.format_exception(type(e), e, e.__traceback__))))
        # Reduce in rank order into replica 0's gradient, then to the host.
        for r in range(1, len(sizes)):
            self.grad_flats[0].add_(self.grad_flats[r].to(self.devices[0]))
        if self.clip > 0:
            # This worker's batch's gradient, as a plain loop clips it.
            torch.nn.utils.clip_grad_norm_(self.models[0].parameters(), self.clip)
        if self.devices[0].type != "cpu":
            self.grads.copy_(self.grad_flats[0])
        if self.tables:
            try:
                self._push_rows(len(sizes), batch)
            finally:
                self.hub.records = []
                self.hub.prefetched = {}
        return (sum(r[0] for r in results), sum(r[1] for r in results))

    def buffers(self) -> bytes:
        """Replica 0's persistent buffers, their bytes in the job's order."""
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
        """Replica 0's persistent buffers from their bytes in the job's
        order (as buffers() gives them).

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
        """The model's figures over the samples `x` with labels `y`.

        Returns:
            (loss sum, correct), and for binary cross-entropy a third: the
            AUC of their scores, or with scores_out the scores themselves
            (float64), for a caller that evaluates a split in pieces and
            takes the AUC of all of them at once.
        """
        self._threads()
        model, device = self.models[0], self.devices[0]
        if device.type != "cpu":
            self.flats[0].copy_(self.params)
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


def make_engine(job: JobDict) -> TorchEngine:
    """The factory the native worker calls for each Python job.

    Raises:
        ModelError, LayoutError: as TorchEngine does.
    """
    return TorchEngine(job)


def runtime() -> str:
    """What this worker offers, as it registers ("Python 3.11.2, PyTorch
    1.13.1, CPU")."""
    cuda = f"CUDA {torch.version.cuda}" if torch.cuda.is_available() else "CPU"
    return (f"Python {sys.version.split()[0]}, PyTorch {torch.__version__.split('+')[0]}, "
            f"{cuda}")
