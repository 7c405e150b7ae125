"""Small models, batches and a finite-difference gradient the engine tests share."""
import torch
import torch.nn.functional as F
from torch import nn


class TinyTransformer(nn.Module):
    def __init__(self, vocab=20, dim=16):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.layer = nn.TransformerEncoderLayer(dim, 2, 32, dropout=0.1, batch_first=True)
        self.out = nn.Linear(dim, vocab)

    def forward(self, tokens):
        return self.out(self.layer(self.emb(tokens)))


def lm_loss(model, tokens):
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def token_batches(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 20, (8, 12), generator=g) for _ in range(n)]


def central_differences(f, base, h=1e-6):
    """The gradient of the scalar function ``f`` at the vector ``base`` by central differences."""
    fd = torch.zeros_like(base)
    for i in range(base.numel()):
        e = torch.zeros_like(base)
        e[i] = h
        fd[i] = (f(base + e) - f(base - e)) / (2 * h)
    return fd
