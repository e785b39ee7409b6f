"""A byte-level language model: a small causal transformer (GPT-style,
pre-norm) that reads a window of bytes and predicts each next byte.
Tally's text dataset hands it int64 token ids [batch, seq_len] and the next
token of each; with loss: cross_entropy the module returns logits
[batch, seq_len, 256] and the loss is the mean over the tokens (nats a
byte). Built on each Python worker by make_model() with the job's seed
(examples/text-lm/job.yaml)."""
import torch
from torch import nn


class ByteTransformer(nn.Module):
    def __init__(self, vocab=256, seq_len=128, dim=128, heads=4, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.position = nn.Parameter(torch.zeros(1, seq_len, dim))
        nn.init.normal_(self.position, std=0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, dim_feedforward=4 * dim,
                                           dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)
        # Each position sees itself and the ones before it (not state_dict).
        causal = torch.full((seq_len, seq_len), float("-inf")).triu(1)
        self.register_buffer("causal", causal, persistent=False)

    def forward(self, x):
        t = x.shape[1]
        h = self.embed(x) + self.position[:, :t]
        h = self.blocks(h, mask=self.causal[:t, :t])
        return self.head(self.norm(h))


def make_model():
    return ByteTransformer()
