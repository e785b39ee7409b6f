"""tally._native (python/tally/_native.cc, pybind11): the Python worker's
native core. The worker daemon, the job runner and the parameter client are
Tally's C++ ones; Python brings the model alone (tally.engine), on the
contract of tally.engine_contract: the factory takes a Job and returns an
Engine."""
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from tally.engine_contract import Engine, Job

class Rows:
    """A job's embedding tables as the engine reaches them, lent by the job
    runner for as long as it trains the job. Each call blocks without the
    GIL; a failed one raises RuntimeError (the runner keeps its status)."""
    def pull(self, table: int, rows: npt.ArrayLike) -> npt.NDArray[np.float32]:
        """The values of `rows` (int64) of `table`: float32 [n, dim]."""
    def pull_tables(self, asks: list[tuple[int, npt.NDArray[Any]]]
                    ) -> list[npt.NDArray[np.float32]]:
        """[(table, rows)] -> the values of each, in one message a shard."""
    def push(self, samples: int,
             blocks: list[tuple[int, npt.NDArray[Any], npt.NDArray[Any]]]) -> None:
        """The step's row gradients, [(table, rows, float32 [n, dim])]."""

def hash_rows(ids: npt.ArrayLike, salt: int, num_embeddings: int) -> npt.NDArray[np.int64]:
    """The rows of a hashed table (ids: hashed) that `ids` map to."""
def make_clicks(train_size: int, test_size: int, integer_features: int = 13,
                categorical_features: int = 26, cardinality: int = 10000,
                zipf: float = 1.05, seed: int = 1
                ) -> tuple[tuple[npt.NDArray[np.int64], npt.NDArray[np.int32]],
                           tuple[npt.NDArray[np.int64], npt.NDArray[np.int32]],
                           npt.NDArray[np.float64]]:
    """dataset.name: clicks as the workers make it: ((train_x, train_y),
    (test_x, test_y), the teacher's click probability of each test sample)."""
def auc(scores: Sequence[float], labels: Sequence[int]) -> float:
    """The ROC AUC of scores for 0/1 labels, over all of them at once."""
def table_salt(name: str) -> int:
    """The salt of the table `name` (ids: hashed)."""
def init_table(name: str, num_embeddings: int, dim: int, seed: int, init: str = "normal",
               scale: float = 1.0) -> npt.NDArray[np.float32]:
    """A whole table's initial rows, as the shards make them."""

class Worker:
    """The worker daemon on a thread of its own (start, wait, stop, result)."""
    def __init__(self, server: str, devices: str, name: str, python_runtime: str,
                 factory: Callable[[Job], Engine], tls_ca: str = "", tls_cert: str = "",
                 tls_key: str = "", token_file: str = "", verbose: bool = True,
                 data_root: list[str] = ...) -> None:
        """The daemon, not started yet. `factory` is called, on the daemon's
        thread with the GIL, for each job whose model is Python code; what
        it raises fails the job's assignment on this worker
        (tally.errors.LayoutError: this worker alone).

        Raises:
            ValueError: bad devices, data roots or TLS files.
        """
    def start(self) -> None: ...
    def wait(self, seconds: float) -> bool:
        """Whether the daemon ended within `seconds`."""
    def stop(self) -> None: ...
    def result(self) -> str:
        """The daemon's end: "" when it stopped as asked, else why."""
