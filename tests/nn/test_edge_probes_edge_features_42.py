"""Edge probes: ``nn.edge_features.edge_feature_attention`` (dtypes of its inputs, half precision) and the TU reader's
edge labels (``data/tu.py``)."""

from __future__ import annotations

import copy
import os
import zipfile

import pytest
import torch

from diffusionformer.nn import DiffusionAttention
from diffusionformer.nn.edge_features import edge_feature_attention

_EI = torch.tensor([[0, 1, 2, 3, 4, 0, 2, 2, 4], [1, 2, 3, 4, 0, 2, 2, 0, 1]])  # a self-loop, a node with 3 in-edges


def _layer(heads: str = "heat(t=2.0, steps=6):2", seed: int = 0, dtype: torch.dtype = torch.float32):
    torch.manual_seed(seed)
    return DiffusionAttention(8, 2, heads=heads).to(dtype).eval()


def _rand(*shape, seed: int, dtype: torch.dtype = torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# ---------------------------------------------------------------------------- edge_feature_attention: dtypes
@pytest.mark.parametrize("key_dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_bug_edge_keys_of_another_float_dtype_are_cast_as_the_layer_casts_a_float_mask(key_dtype):
    """Bug: float64 ``edge_keys`` on a float32 layer were accepted without a word and promoted the scores: the
    weights came back float64 (``return_weights``) while the output was float32. Now the edge keys are cast to the
    dtype the scores are computed in (as a float ``attn_mask`` is), so the result is the one of the same keys given
    in the layer's dtype, and ``P`` has the dtype of the layer's own sparse intermediates."""
    layer = _layer()
    x, ek = _rand(5, 8, seed=1), _rand(_EI.shape[1], 8, seed=2).to(key_dtype)
    y, P = edge_feature_attention(layer, x, _EI, ek, return_weights=True)
    y32, P32 = edge_feature_attention(layer, x, _EI, ek.float(), return_weights=True)
    _, inter = layer(x, edge_index=_EI, return_intermediates=True)
    assert y.dtype == P.dtype == inter.attn_weights.dtype == torch.float32
    assert torch.equal(y, y32) and torch.equal(P, P32)
    # a float64 layer upcasts float32 keys: float64 throughout
    y64, P64 = edge_feature_attention(copy.deepcopy(layer).double(), x.double(), _EI, ek, return_weights=True)
    assert y64.dtype == P64.dtype == torch.float64


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.uint16, torch.uint32, torch.uint64])
def test_bug_edge_index_of_any_integer_dtype_is_taken_as_the_layer_takes_it(dtype):
    """Bug: ``edge_feature_attention`` refused a uint16/uint32 (or int16, uint8) ``edge_index`` ("must be an integer
    tensor (int64 or int32)") that the layer itself takes (``layer(x, edge_index=...)`` builds an
    ``AttentionGraph``, which casts any integer dtype to int64). Now it is taken the same way, with the result of the
    int64 edges; float and bool edges are still refused."""
    layer = _layer()
    x, ek = _rand(5, 8, seed=3), _rand(_EI.shape[1], 8, seed=4)
    want = edge_feature_attention(layer, x, _EI, ek, return_weights=True)
    got = edge_feature_attention(layer, x, _EI.to(dtype), ek, return_weights=True)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert torch.equal(layer(x, edge_index=_EI.to(dtype)), layer(x, edge_index=_EI))  # the layer's own contract
    for bad in (_EI.float(), _EI.bool()):
        with pytest.raises(TypeError, match=r"edge_index must be an integer tensor"):
            edge_feature_attention(layer, x, bad, ek)
    with pytest.raises(ValueError, match=r"edge_index values must lie in \[0, num_nodes=5\)"):
        edge_feature_attention(layer, x, (_EI + 1).to(dtype), ek)  # the bounds still checked after the cast


# ---------------------------------------------------------------------------- edge_feature_attention: half precision
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_bug_half_precision_computes_as_the_layers_own_sparse_path(dtype):
    """Bug: in half precision ``edge_feature_attention`` computed the scores (q.k products and their sum), the heat
    coefficients and every power ``P^k v`` in bf16/fp16, while the layer's own sparse path
    (``ops.sparse._diffuse_sparse``) works in float32 and rounds once at the end: with zero edge keys (the layer's
    own graph) the two disagreed, and against a float64 reference the error was about 1.5x the layer's (heat,
    6 steps, bf16). Now it works in ``work_dtype`` as the layer does: zero keys give the layer's output."""
    N, D, E = 40, 16, 300
    torch.manual_seed(0)
    layer = DiffusionAttention(D, 2, heads="heat(t=2.0, steps=6):1,ppr(alpha=0.2, steps=5):1").eval()
    x = _rand(N, D, seed=5)
    ei = torch.randint(0, N, (2, E), generator=torch.Generator().manual_seed(6))
    half = copy.deepcopy(layer).to(dtype)
    zero = torch.zeros(E, D, dtype=dtype)
    y, P = edge_feature_attention(half, x.to(dtype), ei, zero, return_weights=True)
    y_layer, inter = half(x.to(dtype), edge_index=ei, return_intermediates=True)
    assert y.dtype == P.dtype == dtype
    torch.testing.assert_close(y, y_layer, rtol=0, atol=0)
    torch.testing.assert_close(P, inter.attn_weights, rtol=0, atol=0)
    # with edge keys: the float32 computation of the same half-precision q, k, v, keys and out_proj
    ek = (0.5 * _rand(E, D, seed=7)).to(dtype)
    got = edge_feature_attention(half, x.to(dtype), ei, ek)
    with torch.no_grad():
        q, k, v = (t.float() for t in half._project(x.to(dtype)))
        C = D // 2
        s = (q[ei[1]] * (k[ei[0]] + ek.float().view(E, 2, C))).sum(-1) * C**-0.5
        w = (s - s.max()).exp()  # (E, H); duplicate edges count twice, as in the sparse softmax
        Pe = w / torch.zeros(N, 2).index_add_(0, ei[1], w)[ei[1]]
        Pm = torch.zeros(2, N, N).index_put_((torch.arange(2)[:, None], ei[1], ei[0]), Pe.T, accumulate=True)
        c = half._coefficients().float()
        out, cur = c[:, 0, None, None] * v.transpose(0, 1), v.transpose(0, 1)
        for j in range(1, c.shape[1]):
            cur = Pm @ cur
            out = out + c[:, j, None, None] * cur
        want = half.out_proj(out.transpose(0, 1).reshape(N, D).to(dtype))
    # half an ulp of the largest output (the old half-precision loop was off by 1.8 (bf16) and 1.3 (fp16) of that)
    torch.testing.assert_close(got, want, rtol=0, atol=float(want.abs().max()) * torch.finfo(dtype).eps / 2)


def test_bug_edge_feature_attention_under_autocast_follows_the_layer():
    """Bug: under CPU bf16 autocast (as a GraphBlock with ``edge_dim`` runs in mixed precision) the projections are
    bf16 and the scores, coefficients and powers were computed in bf16, while the layer's own sparse path works in
    float32: zero edge keys did not give the layer's output. Now they give it exactly, in its dtype."""
    layer = _layer()
    x = _rand(5, 8, seed=8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, P = edge_feature_attention(layer, x, _EI, torch.zeros(_EI.shape[1], 8), return_weights=True)
        y_layer, inter = layer(x, edge_index=_EI, return_intermediates=True)
    assert y.dtype == y_layer.dtype and P.dtype == inter.attn_weights.dtype
    torch.testing.assert_close(y, y_layer, rtol=0, atol=0)
    torch.testing.assert_close(P, inter.attn_weights, rtol=0, atol=0)


# ---------------------------------------------------------------------------- TU edge labels
def _write_tu(path, name, *, edge_labels=True, duplicate=None, self_loop_twice=False):
    """20 graphs (triangles of TU label 1, 4-paths of -1), each edge in both directions with edge label ``t % 2``
    (``t`` the edge's number in its graph); ``duplicate`` = index of an A.txt line written a second time (with its
    label) right after it."""
    edges, elab, ind, glab = [], [], [], []
    node = 1
    for g in range(20):
        n = 3 if g % 2 == 0 else 4
        ids = list(range(node, node + n))
        pairs = [(0, 1), (1, 2), (2, 0)] if n == 3 else [(0, 1), (1, 2), (2, 3)]
        for t, (a, b) in enumerate(pairs):
            edges += [(ids[a], ids[b]), (ids[b], ids[a])]
            elab += [t % 2, t % 2]
        ind += [g + 1] * n
        glab.append(1 if n == 3 else -1)
        node += n
    if self_loop_twice:
        edges += [(1, 1), (1, 1)]
        elab += [0, 1]
    if duplicate is not None:
        edges.insert(duplicate + 1, edges[duplicate])
        elab.insert(duplicate + 1, elab[duplicate])
    files = {"A": "\n".join(f"{a}, {b}" for a, b in edges), "graph_indicator": "\n".join(map(str, ind)),
             "graph_labels": "\n".join(map(str, glab))}
    if edge_labels:
        files["edge_labels"] = "\n".join(map(str, elab))
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        for part, text in files.items():
            zf.writestr(f"{name}/{name}_{part}.txt", text + "\n")
    return path


@pytest.fixture()
def tu_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DIFFUSIONFORMER_CACHE", str(tmp_path / "cache"))
    return tmp_path / "root"


def test_bug_a_duplicate_edge_with_edge_labels_is_refused_naming_its_lines(tu_cache):
    """Bug: PyG's TU reader (``read_tu_data``, used by ``load_tu``) coalesces ``edge_index`` with ``reduce="sum"``:
    an edge listed twice in ``MUTAG_A.txt`` became one edge whose one-hot edge label was summed into ``[2, 0]``
    (two-hot for two labels), without a word. Now the archive is refused naming the two lines (nothing is
    extracted); the same archive without the duplicate gives one-hot labels."""
    from diffusionformer.data import CorruptDataError, load_dataset

    _write_tu(tu_cache / "tudataset" / "MUTAG.zip", "MUTAG", duplicate=2)  # line 3 (2, 3) written again as line 4
    with pytest.raises(CorruptDataError, match=r"lines 3 and 4 of MUTAG_A\.txt both give the edge \(2, 3\), and the "
                                               r"edges are labelled \(MUTAG_edge_labels\.txt\)"):
        load_dataset("mutag", root=tu_cache, verify=False)
    raw = tu_cache.parent / "cache" / "tudataset" / "MUTAG" / "raw"
    assert not raw.is_dir() or not any(raw.iterdir())

    _write_tu(tu_cache / "tudataset" / "MUTAG.zip", "MUTAG")
    data = load_dataset("mutag", root=tu_cache, verify=False)
    g = data.dataset[0]  # the first triangle: edge t has label t % 2, in both directions
    assert g.edge_attr.sum(1).tolist() == [1.0] * 6
    labels = {(int(a), int(b)): int(r.argmax()) for (a, b), r in zip(g.edge_index.t(), g.edge_attr)}
    assert labels == {(0, 1): 0, (1, 0): 0, (1, 2): 1, (2, 1): 1, (2, 0): 0, (0, 2): 0}


def test_pins_duplicates_without_edge_labels_and_labelled_self_loops_are_left_to_pyg(tu_cache):
    """Pins: IMDB-like archives (no edge labels) that list an edge twice still load, the duplicate merged into one
    edge; a self-loop listed twice with edge labels is dropped by PyG with its labels (not refused)."""
    from diffusionformer.data import load_dataset

    _write_tu(tu_cache / "tudataset" / "IMDB-BINARY.zip", "IMDB-BINARY", edge_labels=False, duplicate=0)
    data = load_dataset("imdb-binary", root=tu_cache, verify=False)
    assert data.dataset[0].edge_index.shape == (2, 6)  # the triangle, the duplicate of (1, 2) merged
    _write_tu(tu_cache / "tudataset" / "MUTAG.zip", "MUTAG", self_loop_twice=True)
    g = load_dataset("mutag", root=tu_cache, verify=False).dataset[0]
    assert g.edge_index.shape == (2, 6) and g.edge_attr.sum(1).tolist() == [1.0] * 6


def _staged_mutag_root():
    """The staged data root holding MUTAG.zip ($DIFFUSIONFORMER_DATA or <repo>/../shared/data, as tests/data)."""
    from pathlib import Path

    candidates = [Path(os.environ["DIFFUSIONFORMER_DATA"])] if os.environ.get("DIFFUSIONFORMER_DATA") else []
    candidates.append(Path(__file__).resolve().parents[2].parent / "shared" / "data")
    return next((p for p in candidates if (p / "tudataset" / "MUTAG.zip").is_file()), None)


# read once, at collection: a test run later must not depend on what other tests left in os.environ
_STAGED_MUTAG_ROOT = _staged_mutag_root()


@pytest.mark.skipif(_STAGED_MUTAG_ROOT is None, reason="needs the staged MUTAG.zip")
def test_pins_the_staged_mutag_edge_labels_stay_one_hot(tmp_path, monkeypatch):
    """Pins: the staged MUTAG (edge labels, no duplicate edges) passes the duplicate check and its edge_attr is
    one-hot on every edge."""
    from diffusionformer.data import load_dataset

    monkeypatch.setenv("DIFFUSIONFORMER_CACHE", str(tmp_path / "cache"))
    data = load_dataset("mutag", root=_STAGED_MUTAG_ROOT)
    ea = data.dataset._data.edge_attr
    assert ea.shape[1] == 4 and torch.equal(ea.sum(1), torch.ones(ea.shape[0]))


def test_bug_sparse_edge_keys_are_refused_naming_the_argument():
    """Bug: a torch.sparse ``edge_keys`` passed the shape check and failed in torch's "reshape is not implemented for
    sparse tensors", naming no argument."""
    from diffusionformer.nn import DiffusionAttention
    from diffusionformer.nn.edge_features import edge_feature_attention

    torch.manual_seed(0)
    layer = DiffusionAttention(8, 2, "heat:2")
    x = torch.randn(3, 8)
    edges = torch.tensor([[0, 1, 2], [1, 2, 0]])
    keys = torch.randn(3, 8)
    with pytest.raises(TypeError, match=r"edge_keys must be a dense \(strided\) tensor.*edge_keys.to_dense\(\)"):
        edge_feature_attention(layer, x, edges, keys.to_sparse())
    assert edge_feature_attention(layer, x, edges, keys).shape == (3, 8)

