"""prepare_spec: a job spec as the coordinator takes it. What only Python
can do at submission is done here: a job whose model is Python code
(model.python) gets the file's text (or a directory's files) and the
module's parameter layout, found by building the module once here with the
job's seed; a dataset's files here fill in its shape and size
(tally.datasets). Errors in the model (a file that does not import, a
missing build function, a module without parameters, a forward that raises
or whose output the loss cannot take) are raised here, before anything is
sent. PyTorch is imported only for a Python model.
"""
from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tally.datasets import FILLERS
from tally.errors import ModelError, SubmitError

if TYPE_CHECKING:
    import torch

__all__ = ["INPUT_SHAPES", "MAX_MODEL_BYTES", "prepare_spec"]

MAX_MODEL_BYTES = 1 << 20  # the coordinator's default max_model_bytes
INPUT_SHAPES = {"fashion-mnist": (1, 28, 28)}


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
    import traceback

    import torch

    from tally.model import cut_traceback
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
                         f"samples {list(shape)}:\n" + cut_traceback(traceback.format_exc()))
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
    fill = FILLERS.get(named) if isinstance(named, str) else None
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
    from tally.model import layout_of, load_module, state_of
    from tally.model_files import ModelFiles
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
        from tally.tables import swap_tables
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
