"""Fix-ups of small, already-found defects (unclear errors, numpy numbers, a lossy operator spec).

Probed and fixed:

* ``diffusionformer.testing`` graph helpers: ``complete_edge_index(-1)`` raised torch's bare RuntimeError and
  ``dense_allowed_from_edges`` a bare IndexError for an out-of-range node (and took float edges); both now check
  through the package's ``graph._checks.check_int`` and ``ops.sparse.check_edge_index``.
* ``assert_same_checkpoint_weights(key="nokey")`` raised a bare ``KeyError('nokey')``; it now names the file, the key
  and the entries present.
* ``init_distributed("cdua")`` / ``resolve_device`` raised torch's RuntimeError listing every device type; now a
  ValueError naming ``TrainConfig.device`` with a "did you mean" (one helper shared with ``TrainConfig``).
* ``shard_batch`` refused a numpy-int ``rank``/``world_size``; numpy ints are read as ints, bools stay refused.
* ``center_sharpen`` / ``dino_loss`` with a 0-dim centre raised a bare IndexError; now a ValueError naming its shape.
* ``DifferentialOperator(head_dim=C).spec()`` left out ``head_dim``: ``build_operator(op.spec())`` was unbound, and a
  strict ``load_state_dict`` of the standalone operator's state failed. A head_dim given to the constructor now
  travels with the spec; one bound by a layer does not (layer specs are unchanged).
* ``is_causal=np.bool_(True)`` gave "is_causal must be a bool, got bool" at six sites; one shared
  ``ops._checks._check_is_causal`` now names the full type and the value (numpy bools still refused).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from diffusionformer.models.dino import center_sharpen, dino_loss
from diffusionformer.nn import DiffusionAttention
from diffusionformer.operators import DifferentialOperator, build_operator
from diffusionformer.ops import _checks
from diffusionformer.ops.dense import diffuse
from diffusionformer.ops.rivals import RivalContext
from diffusionformer.ops.sparse import diffuse_sparse
from diffusionformer.ops.triton.attention import polynomial_attention
from diffusionformer.ops.uniform_map import uniform_mean
from diffusionformer.testing import assert_same_checkpoint_weights, complete_edge_index, dense_allowed_from_edges
from diffusionformer.train import TrainConfig
from diffusionformer.train.distributed import init_distributed, shard_batch


# ---------------------------------------------------------------------------- testing.graphs
def test_bug_complete_edge_index_names_a_bad_num_nodes():
    """Bug: ``complete_edge_index(-1)`` raised torch's bare RuntimeError from ``torch.arange`` and ``True`` built a
    one-node graph; both now name ``num_nodes``."""
    with pytest.raises(ValueError, match=r"^num_nodes must be >= 0, got -1$"):
        complete_edge_index(-1)
    with pytest.raises(TypeError, match=r"^num_nodes must be an int, got bool"):
        complete_edge_index(True)
    assert complete_edge_index(np.int64(2)).tolist() == [[0, 1, 0, 1], [0, 0, 1, 1]]  # hand-written
    assert complete_edge_index(0).shape == (2, 0)


def test_bug_dense_allowed_from_edges_checks_its_edges():
    """Bug: an out-of-range node gave a bare ``IndexError: index 5 is out of bounds`` and float edges were used as
    indices; now a ValueError naming ``edge_index`` and ``num_nodes``, and a TypeError naming the dtype."""
    with pytest.raises(ValueError, match=r"^edge_index values must lie in \[0, num_nodes=2\), got range \[0, 5\]$"):
        dense_allowed_from_edges(torch.tensor([[0], [5]]), 2)
    with pytest.raises(TypeError, match=r"^edge_index must be an integer tensor \(int64 or int32\), got torch.float32"):
        dense_allowed_from_edges(torch.tensor([[0.0], [1.0]]), 2)
    got = dense_allowed_from_edges(torch.tensor([[0, 2], [1, 0]], dtype=torch.int32), 3)
    want = torch.zeros(3, 3, dtype=torch.bool)
    want[1, 0] = want[0, 2] = True  # edge j -> i sets [i, j]
    assert torch.equal(got, want)


# ---------------------------------------------------------------------------- testing.faults
def test_bug_assert_same_checkpoint_weights_names_a_missing_key(tmp_path):
    """Bug: a ``key`` missing from a checkpoint raised a bare ``KeyError('nokey')``: now the message names the key,
    the file and the entries it holds."""
    a = tmp_path / "a.pt"
    torch.save({"model": {"w": torch.ones(2)}, "step": 3}, a)
    assert_same_checkpoint_weights(a, a)  # the documented default key still works
    with pytest.raises(KeyError, match=r"has no entry 'nokey'; it holds \['model', 'step'\]") as info:
        assert_same_checkpoint_weights(a, a, key="nokey")
    assert str(a) in str(info.value)


# ---------------------------------------------------------------------------- train.distributed
@pytest.mark.parametrize("call", [lambda d: init_distributed(d), lambda d: TrainConfig(device=d)],
                         ids=["init_distributed", "TrainConfig"])
def test_bug_misspelt_device_is_a_value_error_with_did_you_mean(call, monkeypatch):
    """Bug: ``init_distributed("cdua")`` raised torch's RuntimeError listing every device type without naming the
    argument; now a ValueError naming ``TrainConfig.device`` with "did you mean 'cuda'" (TrainConfig says the same)."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ValueError, match=r"^TrainConfig\.device: .*got 'cdua' \(did you mean 'cuda'\?\)$"):
        call("cdua")
    with pytest.raises(ValueError, match=r"got 'xyzzy'$"):  # nothing close: no hint
        call("xyzzy")


def test_init_distributed_cpu_is_a_single_process(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    ctx = init_distributed("cpu")
    assert (ctx.rank, ctx.world_size, ctx.device, ctx.owns_group) == (0, 1, torch.device("cpu"), False)


def test_bug_shard_batch_takes_numpy_int_rank_and_world_size():
    """Bug: ``shard_batch(batch, np.int64(1), np.int64(3))`` (a rank from a numpy grid) raised "expected rank an
    int, got int64"; numpy ints are now read as the ints they equal, and bools (numpy's too) stay refused."""
    batch = {"x": torch.arange(6), "n": 3}
    got = shard_batch(batch, np.int64(1), np.int32(3))
    assert torch.equal(got["x"], torch.tensor([2, 3])) and got["n"] == 3  # rows [1*6/3, 2*6/3)
    assert torch.equal(shard_batch(torch.arange(4), np.int64(0), np.int64(1)), torch.arange(4))
    for bad in (True, np.True_):
        with pytest.raises(TypeError, match=r"^shard_batch: expected rank an int, got bool"):
            shard_batch(batch, bad, 2)


# ---------------------------------------------------------------------------- models.dino
def test_bug_zero_dim_centre_names_its_shape():
    """Bug: a 0-dim centre raised a bare ``IndexError: tuple index out of range`` from ``center.shape[-1]`` in
    ``center_sharpen`` and ``dino_loss``; now a ValueError naming the centre's shape."""
    with pytest.raises(ValueError, match=r"^center must have shape \(K,\) or \(1, K\), got \(\)$"):
        center_sharpen(torch.zeros(2, 3), torch.tensor(0.0), 0.5)
    with pytest.raises(ValueError, match=r"^center must have shape \(K,\) or \(1, K\), got \(\)$"):
        dino_loss(torch.zeros(3, 2, 4), torch.zeros(2, 2, 4), torch.tensor(0.0), 0.1, 0.04)
    # (1, K) still works: softmax((g - c) / t) by hand
    g, c = torch.tensor([[1.0, 2.0, 0.0]]), torch.tensor([[0.5, 0.0, 0.0]])
    e = torch.exp((g - c) / 0.5)
    torch.testing.assert_close(center_sharpen(g, c, 0.5), e / e.sum())


# ---------------------------------------------------------------------------- operators.differential
def test_bug_standalone_differential_spec_round_trips_its_state():
    """Bug: ``DifferentialOperator(head_dim=8).spec()`` was ``"differential(depth=2)"``: ``build_operator`` of it was
    unbound (no parameters), so a strict ``load_state_dict`` of the operator's state failed, against spec()'s
    "an equivalent operator". A head_dim given to the constructor now travels with the spec."""
    op = DifferentialOperator(head_dim=8, depth=2)
    with torch.no_grad():
        for p in op.parameters():
            p.add_(0.25)
    assert op.spec() == "differential(depth=2, head_dim=8)"
    rebuilt = build_operator(op.spec())
    rebuilt.load_state_dict(op.state_dict(), strict=True)
    assert rebuilt.spec() == op.spec()
    got, want = dict(rebuilt.named_parameters()), dict(op.named_parameters())
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_layer_bound_differential_spec_is_unchanged():
    """A head width bound by the layer stays out of the spec (``heads_spec`` fits any width), and the layer rebuilt
    from it loads the state strictly."""
    layer = DiffusionAttention(16, 2, "differential:2")
    assert layer.heads_spec() == "differential:2"
    DiffusionAttention(16, 2, layer.heads_spec()).load_state_dict(layer.state_dict(), strict=True)


# ---------------------------------------------------------------------------- is_causal
def _is_causal_sites():
    q4 = torch.randn(1, 2, 3, 4)
    q3 = torch.randn(3, 2, 4)
    ei = torch.tensor([[0, 1], [1, 2]])
    c = torch.tensor([0.0, 1.0])
    return {
        "ops.dense": lambda f: diffuse(q4, q4, q4, c, is_causal=f),
        "ops.sparse": lambda f: diffuse_sparse(q3, q3, q3, ei, c, is_causal=f),
        "ops.rivals": lambda f: RivalContext.sparse(q3, q3, q3, ei, is_causal=f),
        "ops.uniform_map": lambda f: uniform_mean(q4, is_causal=f),
        "ops.triton": lambda f: polynomial_attention(q4, q4, q4, c, is_causal=f),
        "nn.attention": lambda f: DiffusionAttention(8, 2).graph_from_arguments(torch.zeros(1, 3, 8), is_causal=f),
    }


@pytest.mark.parametrize("site", sorted(_is_causal_sites()))
def test_bug_numpy_bool_is_causal_names_its_full_type(site):
    """Bug: ``is_causal=np.bool_(True)`` was refused with "is_causal must be a bool, got bool", which reads as a
    contradiction; every site now names the full type and the value (numpy bools stay refused, ints as before)."""
    call = _is_causal_sites()[site]
    with pytest.raises(TypeError, match=r"^is_causal must be a bool, got numpy\.bool_? \(np\.True_\)$"):
        call(np.bool_(True))
    with pytest.raises(TypeError, match=r"^is_causal must be a bool, got int \(1\)$"):
        call(1)
    if site != "ops.triton":  # the kernel itself may need a GPU or the Triton interpreter
        call(True)  # a Python bool still runs


def test_is_causal_check_is_one_shared_helper():
    """The six sites share ``ops._checks._check_is_causal``: no site keeps a twin of the check."""
    import importlib
    import inspect

    for mod in ("ops.dense", "ops.sparse", "ops.rivals", "ops.uniform_map", "ops.triton.attention", "nn.attention"):
        module = importlib.import_module(f"diffusionformer.{mod}")
        assert module._check_is_causal is _checks._check_is_causal
        assert "is_causal must be a bool" not in inspect.getsource(module)
