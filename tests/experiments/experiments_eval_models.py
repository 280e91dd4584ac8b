"""Tiny models and a classification split for the tests of the task adapters' evaluation loops
(tests/experiments/test_eval_host_reads.py, tests/reliability/test_mutation_kills_sitting53b.py).

Imported by the test modules (``tests/experiments/conftest.py`` and ``tests/reliability/conftest.py`` put this
folder on ``sys.path``: pytest runs with ``--import-mode=importlib``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from diffusionformer.data.base import ClassificationData


class Signal(nn.Module):
    """Logits of a flattened ``(3, 2)`` signal over 3 classes."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 3)

    def forward(self, x):
        return self.lin(x.flatten(1))


class LM(nn.Module):
    """A bigram language model: ``(logits, loss)``, the loss ignoring targets of -100."""

    def __init__(self, V=5):
        super().__init__()
        self.emb = nn.Embedding(V, V)

    def forward(self, x, y=None):
        logits = self.emb(x)
        return logits, None if y is None else F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100)


class GraphSum(nn.Module):
    """Graph logits by a sum readout sized by ``num_graphs`` (no host read)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x, edge_index, batch, num_graphs):
        return torch.zeros(num_graphs, 2).index_add_(0, batch, self.lin(x))


def signals(n):
    """Three splits of ``n`` random ``(3, 2)`` signals with labels in 0..2, seeded by ``n``."""
    g = torch.Generator().manual_seed(n)
    x, y = torch.randn(3 * n, 3, 2, generator=g), torch.randint(0, 3, (3 * n,), generator=g)
    splits = [t for i in range(3) for t in (x[i * n : (i + 1) * n], y[i * n : (i + 1) * n])]
    return ClassificationData("s", "sequence", *splits, 3, (3, 2))
