"""A model's embedding tables whose rows live on the shards
(model.embeddings): each table's nn.Embedding or nn.EmbeddingBag is swapped
for a ShardedEmbedding, which pulls the rows a batch touches from the
shards and records them, so that the engine pushes their gradients after
the backward pass. The client swaps them too, at submission, so that the
layout it sends leaves the tables out of the flat vector.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from tally.errors import ModelError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from tally import _native

__all__ = ["ShardedEmbedding", "TableHub", "swap_tables"]


class TableHub:
    """What a job's ShardedEmbedding modules share: the native Rows (the
    job runner's tables, tally._native.Rows) and each replica's record of
    the rows a step pulled. Not copied with a replica (deepcopy). Not
    thread-safe: the engine that owns it guards it (each replica appends
    to its own record only)."""

    def __init__(self) -> None:
        """A hub without tables to reach yet (attach them to `rows`)."""
        self.rows: _native.Rows | None = None
        # Each replica's lookups of the step: (table, its unique rows, the
        # pulled values, a leaf whose .grad the backward pass fills).
        self.records: list[list[tuple[int, torch.Tensor, torch.Tensor]]] = []
        # The step's rows pulled before its forward pass (tables with
        # features): table -> (its sorted rows, their values).
        self.prefetched: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def __deepcopy__(self, memo: dict[int, Any]) -> TableHub:
        return self

    def pull(self, table: int, rows: npt.NDArray[np.int64]) -> torch.Tensor:
        """The values of rows of a table: from the step's prefetched rows
        where they are all there, else from the shards.

        Args:
            table: the table's index in model.embeddings.
            rows: the rows, sorted and unique.

        Returns:
            float32 [len(rows), dim].

        Raises:
            ModelError: the job's tables are not reachable yet.
            RuntimeError: the shards' pull failed (tally._native.Rows).
        """
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
        batch, pulled at once, for pull() to find.

        Args:
            modules: the model's ShardedEmbedding modules.
            x: the batch, int64 [batch, width].

        Raises:
            ModelError: as pull(), or an id outside a direct table.
            RuntimeError: as pull().
        """
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

    def push(self, tables: Sequence[dict[str, Any]], used: int, batch: int) -> bool:
        """The step's row gradients, summed per row over every lookup and
        replica (in rank order), to the shards.

        Args:
            tables: model.embeddings, in order (each table's dim).
            used: the replicas the step ran on.
            batch: the step's samples.

        Returns:
            False, with nothing pushed, when a gradient is not finite (the
            engine then makes the dense gradient non-finite too, so that the
            shards refuse the whole step); else True.

        Raises:
            ModelError: the job's tables are not reachable yet.
            RuntimeError: the shards' push failed (tally._native.Rows).
        """
        blocks: list[tuple[int, npt.NDArray[np.int64], npt.NDArray[np.float32]]] = []
        for t, table in enumerate(tables):
            rows: list[torch.Tensor] = []
            grads: list[torch.Tensor] = []
            for r in range(used):
                for index, unique, weight in self.records[r]:
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
                return False
            blocks.append((t, u.numpy(), g.contiguous().numpy()))
        if blocks:
            if self.rows is None:
                raise ModelError("the job's tables are not reachable (no shard map yet)")
            self.rows.push(batch, blocks)
        return True


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
                 original: torch.nn.Embedding | torch.nn.EmbeddingBag, hub: TableHub) -> None:
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
        """The table's rows that ids map to.

        Args:
            ids: the ids, as the module takes them.

        Returns:
            The rows, an int64 tensor of the ids' shape, on the CPU.

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
        """The lookup the replaced module would make, on the pulled rows.

        Args:
            input: the ids (with offsets, or [bags, n], for a bag).
            offsets: an nn.EmbeddingBag's bag starts, as it takes them.
            per_sample_weights: an nn.EmbeddingBag's, as it takes them.

        Returns:
            The embeddings, as the replaced module returns them.

        Raises:
            ModelError: as rows_of() and TableHub.pull() do.
        """
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
        """What print(model) says of the table."""
        rows = "dynamic" if self.dynamic else self.num
        return f"{self.name}: {rows} x {self.dim} on the shards"


def _submodule(module: torch.nn.Module, name: str) -> torch.nn.Module | None:
    """The submodule `name` (dotted) of `module`; None where there is none."""
    try:
        return module.get_submodule(name)
    except AttributeError:
        return None


def swap_tables(module: torch.nn.Module, tables: Sequence[dict[str, Any]],
                hub: TableHub | None = None) -> list[str]:
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
        setattr(parent, leaf, ShardedEmbedding(i, t, original, hub or TableHub()))
        swapped.append(name)
    return swapped
