"""A DLRM-style click model (Naumov et al., 2019): a bottom MLP over the
log-counts, an embedding bag per categorical feature, the pairwise dot
products of every pair of vectors, a top MLP, binary cross-entropy.

The tables are ordinary nn.EmbeddingBag modules: job.yaml names them in
model.embeddings, so their rows live on the shards and each step moves only
the rows its batch touches. The same file trains in a plain PyTorch loop.
"""
import torch
from torch import nn

INTEGER, CATEGORICAL, ROWS, DIM = 13, 26, 20000, 16


def mlp(sizes):
    layers = []
    for a, b in zip(sizes, sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


class DLRM(nn.Module):
    def __init__(self, rows=ROWS, dim=DIM):
        super().__init__()
        self.bottom = mlp([INTEGER, 64, dim])
        self.tables = nn.ModuleList(
            [nn.EmbeddingBag(rows, dim, mode="sum") for _ in range(CATEGORICAL)])
        pairs = (CATEGORICAL + 1) * CATEGORICAL // 2
        self.top = mlp([dim + pairs, 64, 1])
        i, j = torch.tril_indices(CATEGORICAL + 1, CATEGORICAL + 1, -1)
        self.register_buffer("pair_i", i, persistent=False)
        self.register_buffer("pair_j", j, persistent=False)

    def forward(self, x):
        """x: int64 [batch, 13 + 26], the counts then the ids; the click
        logit of each sample (loss: binary_cross_entropy)."""
        dense = self.bottom(torch.log1p(x[:, :INTEGER].clamp(min=0).float()))
        pooled = [t(x[:, INTEGER + k:INTEGER + k + 1]) for k, t in enumerate(self.tables)]
        vectors = torch.stack([dense] + pooled, dim=1)       # [B, 27, dim]
        dots = torch.bmm(vectors, vectors.transpose(1, 2))  # [B, 27, 27]
        interaction = dots[:, self.pair_i, self.pair_j]      # [B, 351]
        return self.top(torch.cat([dense, interaction], dim=1)).squeeze(1)


def make_model():
    return DLRM()
