"""Fresh-eyes review of the torch.func and long-sequence commits (helper 53r): edge probes."""

from __future__ import annotations

import torch

from diffusionformer.nn import Block, DropPath


def test_drop_path_draws_per_sample_under_vmap_on_an_unbatched_input():
    """Bug: ``DropPath`` drew its mask out of place under ``vmap(randomness="different")`` only when its input was
    batched; Monte Carlo samples of one input (``vmap(lambda _: model(x), randomness="different")(torch.arange(n))``,
    as ``nn.Dropout`` allows) reach the first block's ``DropPath`` with an unbatched tensor, and its in-place
    ``bernoulli_`` raised torch's "Cannot ask for different inplace randomness on an unbatched tensor". Now any
    running vmap level takes the out-of-place draw: one mask per sample."""
    torch.manual_seed(0)
    dp = DropPath(0.5).train()
    x = torch.ones(8, 3, 4)
    y = torch.func.vmap(lambda _: dp(x), randomness="different")(torch.arange(6))
    assert y.shape == (6, 8, 3, 4)
    assert set(y.unique().tolist()) <= {0.0, 2.0}
    assert not all(torch.equal(y[0], y[i]) for i in range(1, 6))  # different masks (2**-40 chance of a false fail)
    same = torch.func.vmap(lambda _: dp(x), randomness="same")(torch.arange(6))
    assert all(torch.equal(same[0], same[i]) for i in range(1, 6))
    # a block in training mode: Monte Carlo samples of one batch
    blk = Block(16, 2, drop_path=0.5).train()
    xb = torch.randn(4, 5, 16)
    out = torch.func.vmap(lambda _: blk(xb), randomness="different")(torch.arange(3))
    assert out.shape == (3, 4, 5, 16) and torch.isfinite(out).all()
    # outside vmap and under torch.func.grad the in-place draw is kept (the bits loss.backward() draws)
    torch.manual_seed(1)
    a = dp(x)
    torch.manual_seed(1)
    b = torch.empty(8, 1, 1).bernoulli_(0.5) * x / 0.5
    assert torch.equal(a, b)
