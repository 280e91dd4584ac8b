"""Edge probes: the functional API (``diffusionformer.functional``) and batch splitting/moving (``train.batch``,
``train.shard_batch``).

Bug found:

* ``shard_batch`` rebuilt every mapping as a plain ``dict``: a ``UserDict`` batch with attribute access (a
  tokenizer's ``BatchEncoding``), an ``OrderedDict`` or a ``defaultdict`` lost its type once split for DDP or for
  gradient accumulation only, so ``task.loss`` reading ``batch.input_ids`` broke when ``grad_accum_steps > 1``
  (``to_device`` already kept the type).
"""

from __future__ import annotations

import collections
import random

import pytest
import torch

from diffusionformer.functional import diffuse_with_weights
from diffusionformer.train import shard_batch, to_device


class _Encoding(collections.UserDict):
    """A ``BatchEncoding``-like batch: items are also attributes."""

    def __getattr__(self, name):
        try:
            return self.data[name]
        except KeyError:
            raise AttributeError(name) from None


def test_bug_shard_batch_keeps_the_type_of_a_mapping_batch():
    """Bug: ``shard_batch`` rebuilt every mapping as a plain ``dict`` (a UserDict batch lost attribute access)."""
    enc = _Encoding(input_ids=torch.arange(6), mask=torch.ones(6, dtype=torch.bool))
    enc.tag = "kept"
    part = shard_batch(enc, 1, 3)
    assert type(part) is _Encoding and part.tag == "kept"
    assert torch.equal(part.input_ids, torch.tensor([2, 3]))
    assert torch.equal(enc.input_ids, torch.arange(6))  # the caller's batch is untouched
    od = shard_batch(collections.OrderedDict(b=torch.arange(4), a=torch.arange(4) * 10), 0, 2)
    assert type(od) is collections.OrderedDict and list(od) == ["b", "a"]
    dd = shard_batch(collections.defaultdict(list, x=torch.arange(4)), 1, 2)
    assert type(dd) is collections.defaultdict and dd.default_factory is list
    assert torch.equal(dd["x"], torch.tensor([2, 3]))


def test_pins_shard_batch_covers_every_row_once_in_order():
    """Hand-built expected shards: the ranks' parts of a nested batch, concatenated, are the batch (non-tensor leaves
    and 0-dim tensors shared, a non-contiguous tensor and an empty batch split the same way)."""
    x = torch.arange(24).reshape(4, 6).t()  # (6, 4), non-contiguous
    batch = {"x": x, "pair": (torch.arange(6), [torch.arange(6) * 2, "s"]), "n": 6, "t": torch.tensor(3.0),
             "empty": torch.zeros(0, 2)}
    parts = [shard_batch(batch, r, 3) for r in range(3)]
    assert torch.equal(torch.cat([p["x"] for p in parts]), x)
    assert [p["pair"][0].tolist() for p in parts] == [[0, 1], [2, 3], [4, 5]]
    assert [p["pair"][1][0].tolist() for p in parts] == [[0, 2], [4, 6], [8, 10]]
    assert all(p["n"] == 6 and p["pair"][1][1] == "s" and p["t"] is batch["t"] for p in parts)
    assert all(p["empty"].shape == (0, 2) for p in parts)
    with pytest.raises(ValueError, match="divisible by world_size=4"):
        shard_batch(batch, 0, 4)


def test_pins_to_device_leaves_the_callers_containers_alone():
    """``to_device`` rebuilds containers: the caller's dict, list and UserDict are not modified in place."""
    src = {"x": torch.ones(2), "l": [torch.zeros(1)], "u": _Encoding(y=torch.ones(1))}
    out = to_device(src, torch.device("meta"))
    assert out["x"].is_meta and out["l"][0].is_meta and out["u"].y.is_meta and type(out["u"]) is _Encoding
    assert not src["x"].is_meta and not src["l"][0].is_meta and not src["u"].y.is_meta


def _reference(q, k, v, coeffs, mask, causal):
    """``sum_k c_k P^k v`` in float64 with explicit matrices (zero rows for queries without a key)."""
    q, k, v = q.double(), k.double(), v.double()
    B, H, N, C = q.shape
    s = q @ k.transpose(-1, -2) * C ** -0.5
    allow = torch.ones(B, H, N, N, dtype=torch.bool)
    if causal:
        allow = allow & torch.ones(N, N, dtype=torch.bool).tril()
    if mask.dtype == torch.bool:
        allow = allow & mask
    else:
        s = s + mask.double()
    s = s.masked_fill(~allow, float("-inf"))
    ok = (s > float("-inf")).any(-1, keepdim=True)
    P = torch.softmax(s.masked_fill(~ok, 0.0), -1).masked_fill(~ok, 0.0)
    c = torch.as_tensor(coeffs, dtype=torch.float64).expand(H, -1)
    out = torch.zeros(B, H, N, v.shape[-1], dtype=torch.float64)
    for h in range(H):
        for j in range(c.shape[1]):
            out[:, h] += c[h, j] * torch.linalg.matrix_power(P[:, h], j) @ v[:, h]
    return out


@pytest.mark.parametrize("backend", ["auto", "sdpa", "matrix"])
def test_pins_diffuse_matches_explicit_matrices_on_broadcast_masks(backend):
    """Random broadcast masks (bool and float with -inf), causal folded in, non-contiguous q and v, static and tensor
    coefficients: ``diffuse`` against the float64 reference, on every dense back-end."""
    rng = random.Random(40)
    torch.manual_seed(40)
    for _ in range(30):
        B, H, N = rng.choice([1, 2]), rng.choice([1, 3]), rng.choice([1, 2, 5])
        q = torch.randn(B, N, H, 4).transpose(1, 2)
        k = torch.randn(B, H, N, 4)
        v = torch.randn(B, H, 3, N).transpose(-1, -2)
        shape = rng.choice([(N, N), (B, 1, 1, N), (1, H, N, N), (H, N, N), (B, 1, N, N)])
        mask = torch.rand(shape) < 0.6 if rng.random() < 0.5 else \
            torch.randn(shape).masked_fill(torch.rand(shape) < 0.3, float("-inf"))
        K = rng.choice([1, 2, 3])
        coeffs = [rng.uniform(-1, 1) for _ in range(K + 1)]
        if rng.random() < 0.5:
            coeffs = torch.tensor(coeffs)
        causal = rng.random() < 0.3
        out, _ = diffuse_with_weights(q, k, v, coeffs, attn_mask=mask, is_causal=causal, backend=backend)
        torch.testing.assert_close(out.double(), _reference(q, k, v, coeffs, mask, causal), atol=1e-5, rtol=1e-4)
