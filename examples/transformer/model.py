"""A small transformer that reads a 28x28 image as a sequence of 28 rows:
each row is a token (a linear embedding of its 28 pixels) with a learnt
position, two pre-norm encoder layers (self-attention and an MLP), and the
mean over the tokens to a linear classifier. Not a CNN: attention and
LayerNorm, no convolution. Tally builds it with make_model() on each Python
worker, with the job's seed (examples/transformer/job.yaml)."""
import torch
from torch import nn


class RowTransformer(nn.Module):
    def __init__(self, rows=28, cols=28, dim=64, heads=4, layers=2, classes=10):
        super().__init__()
        self.embed = nn.Linear(cols, dim)
        self.position = nn.Parameter(torch.zeros(1, rows, dim))
        nn.init.normal_(self.position, std=0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, dim_feedforward=2 * dim,
                                           dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        tokens = self.embed(x.flatten(1, 2)) + self.position  # [B, rows, dim]
        return self.head(self.norm(self.encoder(tokens)).mean(1))


def make_model():
    return RowTransformer()
