"""What the native worker (tally._native, python/tally/_native.cc) and a
Python engine promise each other.

For each job whose model is Python code, the native worker calls the
factory it was given (tally.engine.make_engine) with a Job: the parsed
spec, made in one place (JobOf in _native.cc). The factory returns an
Engine, which the native job runner drives from one thread at a time:

  - it reads num_params and replicas once, and keeps `params` and `grads`
    (float32 [num_params], host memory) for the job's life: a pull writes
    the job's weights into `params`, and a push reads the step's gradient
    from `grads`, without a copy;
  - each step, it calls step(x, y, seed) (and load_buffers before, buffers
    after, for a model with buffers); attach_rows lends the job's tables;
  - each evaluation, it calls evaluate(x, y), or evaluate(x, y,
    scores_out=True) on a test split it gathers in pieces.

An exception from the engine fails the job's step with its message;
tally.errors.LayoutError from the factory bars this worker alone from the
job (another may build the job's module), and tally.errors.ModelError
from step names what is wrong without a traceback.

This module imports neither torch nor the extension: the client and the
type checker read it on machines without them.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from tally import _native

__all__ = ["Buffer", "Engine", "Job", "Param", "Table"]

# A parameter as a job lists it: (name, shape).
Param = tuple[str, list[int]]
# A persistent buffer as a job lists it: (name, safetensors dtype, shape).
Buffer = tuple[str, str, list[int]]


@dataclass(frozen=True)
class Table:
    """One table of model.embeddings, as the coordinator checked it."""
    name: str            # the module path of the model's nn.Embedding(Bag)
    dim: int
    num_embeddings: int  # rows of a fixed table; 0 for a dynamic one
    ids: str             # "hashed", "direct" or "dynamic"
    combiner: str        # "", "sum" or "mean"
    salt: int            # a hashed table's (TableSalt of its name)
    features: list[int]  # the input columns it looks up; empty: none

    def as_spec(self) -> dict[str, Any]:
        """The table as model.embeddings lists it, a copy of its own (what
        tally.tables.swap_tables takes, and fills in).

        Returns:
            {name, dim, num_embeddings, ids, combiner, salt, features}.
        """
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Job:
    """What the native worker hands the factory for each Python job: the
    spec as the coordinator parsed and checked it, and this worker's
    devices."""
    name: str
    file: str                  # model.python.file, as the submitter named it
    build: str                 # model.python.build
    code: str                  # a single file's text; "" for a directory
    files: dict[str, str]      # a directory's {relative path: text}; else empty
    loss: str                  # cross_entropy, mse, model or binary_cross_entropy
    seed: int                  # training.seed
    clip_grad_norm: float      # 0: none
    batch_size: int            # per worker
    input_shape: list[int]     # one sample's
    num_classes: int
    params: list[Param]        # the module's parameters, in order
    buffers: list[Buffer]      # its persistent buffers, in state_dict order
    embeddings: list[Table]    # model.embeddings, in order
    devices: list[str]         # "cpu" or "cuda:N", one a replica


class Engine(Protocol):
    """What the native job runner (PyEngine in _native.cc) reads and calls
    on the object the factory returns. Called from one thread at a time."""

    num_params: int  # the flat vector's length
    replicas: int    # devices the step is spread over

    @property
    def params(self) -> npt.NDArray[np.float32]:
        """float32 [num_params], C-contiguous and writable, in host memory
        that stays where it is for the job's life: the weights the next
        step runs with (the runner writes each pull into it)."""

    @property
    def grads(self) -> npt.NDArray[np.float32]:
        """float32 [num_params], as `params`: the last step's gradient,
        summed over the replicas (the runner pushes it)."""

    def step(self, x: npt.NDArray[Any], y: npt.NDArray[Any], seed: int) -> tuple[float, int]:
        """One step on the worker's batch.

        Args:
            x: the inputs, [batch, ...] (float32, or int64 ids).
            y: the labels, [batch] or, for text, [batch, seq_len].
            seed: the step's seed.

        Returns:
            The loss summed over the batch's samples, and the correct
            predictions; the gradient is in `grads`.

        Raises:
            ModelError: the model's step failed (the job's step fails).
        """

    def evaluate(self, x: npt.NDArray[Any], y: npt.NDArray[Any], scores_out: bool = False
                 ) -> tuple[float, int] | tuple[float, int, float | npt.NDArray[np.float64]]:
        """The model's figures over some samples.

        Args:
            x: the samples, [n, ...].
            y: their labels.
            scores_out: for binary cross-entropy, each sample's score in
                place of the AUC (the runner takes the AUC of a whole split
                it gathered in pieces).

        Returns:
            (loss sum, correct), and for binary cross-entropy a third: the
            AUC, or with scores_out each sample's score (float64 [n]).
        """

    def buffers(self) -> bytes:
        """The persistent buffers.

        Returns:
            Their bytes, one after another in the job's order.
        """

    def load_buffers(self, data: bytes) -> None:
        """The persistent buffers from their bytes.

        Args:
            data: the bytes, as buffers() gives them.

        Raises:
            ModelError: `data` is not the buffers' size.
        """

    def attach_rows(self, rows: _native.Rows | None) -> None:
        """The job's tables, lent by the runner.

        Args:
            rows: the tables; None once the runner is done with them.
        """
