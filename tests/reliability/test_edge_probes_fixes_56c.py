"""Small fixes of sitting 56 (helper 56p): an old pickled layer's plan, a blank LOCAL_RANK of a caller's group, the
CSR back-end's refusal under ``make_fx``/``linearize``, exact Euler binomials."""

from __future__ import annotations

import io
import math
import pickle

import pytest
import torch
import torch.distributed as dist
from torch.func import linearize
from torch.fx.experimental.proxy_tensor import make_fx

from diffusionformer.functional import diffuse_sparse
from diffusionformer.nn import DiffusionAttention
from diffusionformer.operators.heat import _euler_table
from diffusionformer.train.distributed import dist_env, init_distributed

#: learned and fixed operators: the layer's coefficients are built from segments (``_coefficient_segments``)
_MIXED = "heat(learnable=True, steps=2):1,attention:1,heat(t=0.5, steps=3):1,polynomial(steps=2):1"


@pytest.mark.parametrize("via", ["pickle", "torch.save"])
def test_bug_a_layer_pickled_before_the_coefficient_segments_rebuilds_its_plan(via):
    """Bug: a whole layer (or model) pickled by ``torch.save(model)`` before commit 55f6773 has no
    ``_coefficient_segments``; its plan was remade only when the operators differed from ``_plan_key``, so a layer
    with learned and fixed operators raised AttributeError at its first call after loading."""
    torch.manual_seed(0)
    layer = DiffusionAttention(16, 4, _MIXED)
    x = torch.randn(2, 5, 16)
    expected = layer(x, is_causal=True)
    old = DiffusionAttention(16, 4, _MIXED)
    old.load_state_dict(layer.state_dict())
    del old.__dict__["_coefficient_segments"]  # as the old pickle wrote it
    if via == "pickle":
        loaded = pickle.loads(pickle.dumps(old))
    else:
        buffer = io.BytesIO()
        torch.save(old, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=False)
    torch.testing.assert_close(loaded(x, is_causal=True), expected, rtol=0, atol=0)
    torch.testing.assert_close(loaded.coefficients(), layer.coefficients(), rtol=0, atol=0)


def test_bug_a_blank_local_rank_of_a_one_process_group_is_unset(monkeypatch):
    """Bug: ``dist_env()`` reads a blank ``LOCAL_RANK`` of a one-process run as unset, but ``init_distributed`` with a
    process group the caller had initialised refused it ("expected LOCAL_RANK an int >= 0"): the two disagreed on one
    run. With several processes a blank one is still refused (it picks each process's device)."""
    monkeypatch.setenv("LOCAL_RANK", " ")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    assert dist_env() is None  # one process: the blank LOCAL_RANK is unset
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        ctx = init_distributed("cpu")
        assert (ctx.rank, ctx.world_size, ctx.local_rank, ctx.owns_group) == (0, 1, 0, False)
        monkeypatch.setattr(dist, "get_world_size", lambda *a, **k: 2)  # a group of two, as rank 0 sees it
        with pytest.raises(ValueError, match=r"expected LOCAL_RANK an int >= 0 .*got LOCAL_RANK=' '"):
            init_distributed("cpu")
    finally:
        monkeypatch.undo()
        dist.destroy_process_group()


def _sparse_call(backend):
    torch.manual_seed(0)
    q, k, v = (torch.randn(4, 2, 3) for _ in range(3))
    edge_index = torch.tensor([[0, 1, 2, 3, 0, 1], [0, 1, 2, 3, 1, 2]])
    return (lambda q: diffuse_sparse(q, k, v, edge_index, [[0.5, 0.3, 0.2]] * 2, backend=backend)), q


@pytest.mark.filterwarnings("ignore:Attempted to insert a get_attr Node")  # torch's const folding in linearize
def test_bug_csr_refusals_under_make_fx_and_linearize_say_what_is_true():
    """Bug: the refusal of ``backend="csr"`` under ``make_fx`` said "(torch.func.linearize traces with it)", but under
    ``linearize`` the forward-mode AD refusal fires first (linearize traces inside a ``forward_ad.dual_level``), so a
    linearize user never saw that text, and the forward-mode message did not name linearize."""
    f, q = _sparse_call("csr")
    with pytest.raises(ValueError, match=r"backend='csr' cannot run while make_fx traces") as info:
        make_fx(f)(q)
    assert "linearize" not in str(info.value)
    with pytest.raises(ValueError, match=r"backend='csr' cannot run under forward-mode AD .*linearize.*'native'"):
        linearize(f, q)
    g, _ = _sparse_call("auto")  # the remedy it names runs
    primal, _ = linearize(g, q)
    torch.testing.assert_close(primal, f(q))


def _float_or_inf(n: int) -> float:
    try:
        return float(n)  # correctly rounded
    except OverflowError:
        return math.inf


@pytest.mark.parametrize("K", [60, 200, 1000, 1100])
def test_bug_euler_binomials_are_exact(K):
    """Bug: the Euler heat binomials came from ``exp(lgamma)``, rounded: exact for small ``K`` only, about 1e-12
    relative off at ``K = 1000``. They are the exact integers rounded once to float64 where that fits a float, and
    ``inf`` past it (``K = 1100``), as ``exp(lgamma)`` overflowed before."""
    _, binom = _euler_table(K, torch.device("cpu"))
    assert binom.dtype == torch.float64
    assert binom.tolist() == [_float_or_inf(math.comb(K, k)) for k in range(K + 1)]
    k = torch.arange(K + 1, dtype=torch.float64)
    before = torch.exp(math.lgamma(K + 1) - torch.lgamma(k + 1) - torch.lgamma(K - k + 1)).round()
    assert torch.equal(binom.isinf(), before.isinf()) and (K < 1100 or binom.isinf().any())
