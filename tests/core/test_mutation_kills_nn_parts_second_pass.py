"""Tests written in a second-pass mutation-testing audit of the smaller layer modules: head
specifications (``nn/heads.py``: ``split_top_level``, ``parse_heads``, ``format_head_spec``,
``resolve_layer_heads``), rotary embeddings (``nn/rotary.py``), the edge features of the sparse
layer (``nn/edge_features.py``), the skipped placeholders (``nn/_skip.py``) and the block parts
(``nn/block.py``: ``make_norm``, ``Mlp``, ``LayerScale``, ``DropPath``, ``Block`` on dense tokens and
on sparse graphs).

Each test kills a mutant of the library code that the rest of the suite (including the earlier
audits ``tests/core/test_mutation_kills_nn_heads.py``, ``tests/core/test_mutation_kills_rival_operators.py``
and ``tests/models/test_mutation_kills_attention_gpt_second_pass.py``) let through; its docstring names
it (file and mutation). References are independent of the code under test: head layouts and error
messages written out by hand, rotations of channel pairs by explicit ``cos``/``sin`` in float64 numpy,
the edge-feature scores, per-target softmax and powers of ``P`` by explicit loops over the edges, and
the pre-norm block written out in float64 (LayerNorm / RMSNorm by their formulas, exact GELU, the
residual sums). Mutants judged equivalent are listed, with the reason, at the end of the file.
One test, whose docstring starts with "Bug:", pins a defect fixed with it: a read-only mapping or a
tuple of per-layer specs skipped the template filling and layer-key conversion of ``format_head_spec``.
CPU only, deterministic (seeded generators), no network, no files.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from diffusionformer.nn import DiffusionAttention
from diffusionformer.nn.heads import format_head_spec, parse_heads, resolve_layer_heads, split_top_level
from diffusionformer.operators import build_operator

f64 = torch.float64


def _t(*shape: int, seed: int) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=f64)


def _layout(groups) -> list[tuple[str, int, int]]:
    return [(g.operator.name, g.start, g.count) for g in groups]


# ---------------------------------------------------------------------------- heads.py: splitting and counts
def test_split_top_level_strips_items_and_keeps_braces_together():
    """Kills: heads.py ``split_top_level`` returning the parts unstripped; ``{`` / ``}`` not counted as brackets
    (a comma inside braces then splits the item)."""
    assert split_top_level(" attention:2 , heat(t=0.5, steps=2) :2 ") == ["attention:2", "heat(t=0.5, steps=2) :2"]
    assert split_top_level("a{1, 2},b[3, 4],c") == ["a{1, 2}", "b[3, 4]", "c"]
    assert split_top_level("x={1: (2, 3)}, y") == ["x={1: (2, 3)}", "y"]


def test_whitespace_and_empty_items_in_a_spec_are_ignored():
    """Kills: heads.py ``parse_heads`` keeping empty items (``items = split_top_level(heads)`` without the
    ``if it`` filter): a trailing comma or ``", ,"`` then reaches ``build_operator("")``."""
    assert _layout(parse_heads(" attention : 2 , laplacian : 2 ,", 4)) == [("attention", 0, 2), ("laplacian", 2, 2)]
    assert _layout(parse_heads("attention:1, ,heat(t=0.5):3", 4)) == [("attention", 0, 1), ("heat", 1, 3)]


def test_an_empty_spec_is_named_as_such():
    """Kills: heads.py ``parse_heads`` without the ``if not items`` check: an empty or blank spec then reports
    "assigns 0 heads" instead of naming the empty specification with an example."""
    for spec in ("", " , ", ","):
        with pytest.raises(ValueError, match=r"empty head specification; expected e.g. 'attention:6,laplacian:2'"):
            parse_heads(spec, 4)


def test_the_count_is_after_the_last_colon_outside_brackets():
    """Kills: heads.py ``_split_count`` scanning left to right (first colon instead of the last one) and
    ``_split_count`` without ``depth == 0`` (a colon inside the parentheses of an argument taken as the count)."""
    # 'laplacian:1' is the operator name (last colon is the count): unknown, with did-you-mean
    with pytest.raises(ValueError, match=r"unknown operator 'laplacian:1' \(did you mean 'laplacian'\?\)"):
        parse_heads("laplacian:1:3", 3)
    # the colon inside the quoted argument is not a count: grand gets the method and names it
    with pytest.raises(ValueError, match=r"unknown method 'rk:4' \(did you mean 'rk4'\?\)"):
        parse_heads("grand(method='rk:4')", 2)


def test_a_bad_count_is_named_stripped():
    """Kills: heads.py ``_split_count`` not stripping the count text (the message quotes ``' x'``) and the
    message shortened to "head count must be an integer" (it names the ``':'`` the count follows)."""
    with pytest.raises(ValueError, match=r"^head count after ':' must be an integer, got 'x' in 'laplacian: x'$"):
        parse_heads("attention:2, laplacian: x ", 4)
    with pytest.raises(ValueError, match=r"^head count after ':' must be an integer, got '2.5' in 'heat:2.5'$"):
        parse_heads("heat:2.5,attention:2", 4)


@pytest.mark.parametrize("bad", [0, -1, True, 2.0])
def test_num_heads_must_be_a_positive_int(bad):
    """Kills: heads.py ``parse_heads`` accepting ``num_heads = 0`` (``< 0`` instead of ``< 1``: ``"attention:0"``
    or ``[]`` was a layer of no heads) and ``num_heads=True`` (the bool check dropped: ``True`` is the int 1 and
    ``"attention:1"`` passed). With ``None`` the operator's own check answers the same, so specs are used too."""
    for spec in (None, "attention:1", "attention:0", [], ["attention"]):
        with pytest.raises(ValueError, match=r"num_heads must be a positive int, got " + re.escape(repr(bad))):
            parse_heads(spec, bad)


def test_a_single_shared_instance_serves_every_head():
    """Kills: heads.py ``parse_heads`` accepting an instance given alone only when built for all heads
    (``heads.num_heads != num_heads``): the documented shared operator with ``num_heads=1`` is one group over
    every head, the same object."""
    op = build_operator("laplacian")
    groups = parse_heads(op, 4)
    assert len(groups) == 1 and groups[0].operator is op and (groups[0].start, groups[0].count) == (0, 4)
    per_head = build_operator("heat(learnable=True)", num_heads=4)
    assert [(g.operator is per_head, g.start, g.count) for g in parse_heads(per_head, 4)] == [(True, 0, 4)]


def test_counts_over_the_head_total_are_refused():
    """Kills: heads.py ``parse_heads`` checking ``start < num_heads`` only (too few heads): counts adding up to
    more than ``H`` must be refused too, naming the sum."""
    with pytest.raises(ValueError, match=r"head specification 'heat:2,attention:3' assigns 5 heads but the layer "
                                         r"has num_heads=4"):
        parse_heads("heat:2,attention:3", 4)
    with pytest.raises(ValueError, match=r"assigns 5 heads but the layer has num_heads=4"):
        parse_heads("attention:5", 4)


def test_a_per_head_list_longer_than_the_layer_is_refused():
    """Kills: heads.py ``parse_heads`` checking a per-head list with ``len(heads) < num_heads`` only: a list of
    five operators for four heads silently dropped its last entry."""
    with pytest.raises(ValueError, match=r"a per-head list must have num_heads=4 entries, got 5"):
        parse_heads(["attention", "attention", "laplacian", "laplacian", "heat"], 4)


def test_a_closing_brace_without_a_template_reaches_the_operator_lookup():
    """Kills: heads.py ``format_head_spec`` formatting strings without ``{`` too (the ``"{" not in heads`` shortcut
    dropped): ``"}"`` alone is then a ``str.format`` error about templates and ``"}}"`` turns into ``"}"``;
    strings without a template are returned unchanged."""
    assert format_head_spec("attention:4}}", 4) == "attention:4}}"
    with pytest.raises(ValueError, match=r"unknown operator 'attention:4}' \(did you mean 'attention'"):
        parse_heads("attention:4}", 4)


@pytest.mark.parametrize("spec", ["attention:{h}", "attention:{0}", "attention:{H", "laplacian:{half!x}"])
def test_every_malformed_template_names_the_known_ones(spec):
    """Kills: heads.py ``format_head_spec`` catching only ``KeyError`` and ``IndexError`` (an unclosed ``{H``
    or a bad conversion then escapes as ``str.format``'s bare message) or only ``KeyError`` and ``ValueError``
    (``{0}`` escapes as an IndexError)."""
    with pytest.raises(ValueError, match=r"only the templates \{H\} and \{half\} are known"):
        format_head_spec(spec, 4)
    with pytest.raises(ValueError, match=r"only the templates \{H\} and \{half\} are known"):
        resolve_layer_heads(2, 4, heads=[None, spec])


# ---------------------------------------------------------------------------- block.py: the pre-norm block by hand
def _randomise(module: nn.Module, seed: int) -> nn.Module:
    """Every parameter drawn at random (norm weights and LayerScale gains too, so that swapped parts show)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=g, dtype=p.dtype) + (1.0 if p.dim() == 1 else 0.0))
    return module


def _layer_norm(x: Tensor, w: Tensor | None, b: Tensor | None, eps: float = 1e-5) -> Tensor:
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    y = (x - mu) / torch.sqrt(var + eps)
    return y * (1 if w is None else w) + (0 if b is None else b)


def _rms_norm(x: Tensor, w: Tensor) -> Tensor:
    """``RMSNorm(eps=None)``: ``eps`` is the dtype's machine epsilon."""
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + torch.finfo(x.dtype).eps) * w


def _norm(kind: str, mod: nn.Module, x: Tensor) -> Tensor:
    return _layer_norm(x, mod.weight, mod.bias) if kind == "layernorm" else _rms_norm(x, mod.weight)


def _gelu(h: Tensor) -> Tensor:
    return 0.5 * h * (1 + torch.erf(h / math.sqrt(2)))


def _rope_np(x: np.ndarray, positions: np.ndarray, base: float = 10000.0) -> np.ndarray:
    """``(N, H, C)``: pair ``(x_2i, x_2i+1)`` at position ``m`` rotated by ``m base^(-2i/C)`` (explicit 2x2
    rotations)."""
    out = np.empty_like(x)
    C = x.shape[-1]
    for n, m in enumerate(positions):
        for i in range(C // 2):
            th = float(m) * base ** (-2 * i / C)
            a, b = x[n, :, 2 * i], x[n, :, 2 * i + 1]
            out[n, :, 2 * i] = math.cos(th) * a - math.sin(th) * b
            out[n, :, 2 * i + 1] = math.sin(th) * a + math.cos(th) * b
    return out


def _attention_by_hand(blk, x: Tensor, *, qk_norm=False, rope=False, edges=None, positions=None) -> Tensor:
    """The attention sublayer of ``blk`` on ``x`` ``(N, D)`` (one sample): q/k/v from the ``qkv`` weights, q/k
    LayerNorm by formula, RoPE by explicit rotations, softmax over all keys (dense) or over the incoming edges
    ``j -> i`` (sparse) by explicit loops, then the output projection."""
    att = blk.attn
    N, D = x.shape
    H, C = att.num_heads, att.head_dim
    qkv = x @ att.qkv.weight.T + (att.qkv.bias if att.qkv.bias is not None else 0)
    q, k, v = (qkv[:, i * D : (i + 1) * D].reshape(N, H, C) for i in range(3))
    if qk_norm:  # the test's own flags, not the layer's modules
        q = _layer_norm(q, att.q_norm.weight, att.q_norm.bias)
        k = _layer_norm(k, att.k_norm.weight, att.k_norm.bias)
    if rope:
        pos = np.arange(N) if positions is None else positions.numpy()
        q = torch.from_numpy(_rope_np(q.detach().numpy(), pos))
        k = torch.from_numpy(_rope_np(k.detach().numpy(), pos))
    out = torch.zeros(N, H, C, dtype=f64)
    for h in range(H):
        for i in range(N):
            keys = list(range(N)) if edges is None else [j for j, t in edges if t == i]
            if not keys:
                continue
            s = torch.stack([q[i, h] @ k[j, h] for j in keys]) / math.sqrt(C)
            p = torch.exp(s - s.max())
            p = p / p.sum()
            out[i, h] = sum(p[n] * v[j, h] for n, j in enumerate(keys))
    return out.reshape(N, D) @ att.out_proj.weight.T + (att.out_proj.bias if att.out_proj.bias is not None else 0)


def _block_by_hand(blk, norm: str, x: Tensor, **kw) -> Tensor:
    """``x + g1 * Attn(Norm1 x)``, then ``+ g2 * W2 gelu(W1 Norm2 x + b1) + b2`` (pre-norm, LayerScale gains)."""
    g1, g2 = blk.ls1.gamma, blk.ls2.gamma  # both blocks tested here have LayerScale on
    x = x + g1 * _attention_by_hand(blk, _norm(norm, blk.norm1, x), **kw)
    h = _gelu(_norm(norm, blk.norm2, x) @ blk.mlp.fc1.weight.T + blk.mlp.fc1.bias)
    return x + g2 * (h @ blk.mlp.fc2.weight.T + blk.mlp.fc2.bias)


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_dense_block_with_layer_scale_qk_norm_and_rotary_equals_the_hand_forward(norm):
    """Kills: block.py ``Block.forward`` feeding the attention ``x`` instead of ``norm1(x)`` or the MLP ``norm1(x)``
    instead of ``norm2(x)``; ``norm2`` always a LayerNorm; LayerScale skipped when on (``if is_noop(ls1)``), ``ls2``
    dropped or replaced by ``ls1``; ``LayerScale`` adding ``gamma``; the attention built without ``rotary`` or
    without ``qk_norm``; ``attn_kwargs`` (here ``positions=``) not passed on; ``make_norm`` building a LayerNorm
    without affine parameters or an RMSNorm with ``eps=1e-5`` (not the dtype's epsilon)."""
    from diffusionformer.nn import Block
    from diffusionformer.nn.rotary import RotaryEmbedding

    torch.manual_seed(0)
    blk = _randomise(Block(8, 2, layer_scale=0.1, qk_norm=True, rotary=RotaryEmbedding(4), norm_layer=norm,
                           mlp_ratio=2.0).double(), seed=1).eval()
    assert not torch.equal(blk.ls1.gamma, blk.ls2.gamma)
    x = _t(1, 5, 8, seed=2)
    got = blk(x)
    want = _block_by_hand(blk, norm, x[0], qk_norm=True, rope=True)
    torch.testing.assert_close(got[0], want, rtol=1e-10, atol=1e-10)
    pos = torch.tensor([4, 1, 9, 2, 7])
    got = blk(x, positions=pos)
    want = _block_by_hand(blk, norm, x[0], qk_norm=True, rope=True, positions=pos)
    torch.testing.assert_close(got[0], want, rtol=1e-10, atol=1e-10)


def test_block_on_a_sparse_graph_equals_the_hand_forward():
    """Kills: block.py ``Block.forward`` not passing ``attn_kwargs`` (``edge_index=``) to the attention, and the
    sparse path of the block checked against softmax over each node's incoming edges by explicit loops."""
    from diffusionformer.nn import Block

    blk = _randomise(Block(8, 2, layer_scale=0.5, norm_layer="rmsnorm", mlp_ratio=1.5).double(), seed=3).eval()
    edges = [(1, 0), (2, 0), (3, 1), (0, 2), (2, 3), (4, 3), (0, 4), (3, 3)]
    ei = torch.tensor(edges).T
    x = _t(5, 8, seed=4)
    torch.testing.assert_close(blk(x, edge_index=ei), _block_by_hand(blk, "rmsnorm", x, edges=edges),
                               rtol=1e-10, atol=1e-10)


# ---------------------------------------------------------------------------- heads.py: per-layer layouts
@pytest.mark.parametrize("key", [True, 1.0, 1.5])
def test_layer_keys_that_are_not_integers_are_refused(key):
    """Kills: heads.py ``_layer_key`` without the bool check (``{True: spec}`` was layer 1) and taking ``int(key)``
    of every key (``{1.5: spec}`` silently truncated to layer 1); TOML's string keys ``"1"`` stay accepted."""
    msg = r"heads given as a dict maps layer indices to specs .* got the key " + re.escape(repr(key))
    with pytest.raises(ValueError, match=msg):
        resolve_layer_heads(3, 4, heads={key: "laplacian:4"})
    assert resolve_layer_heads(3, 4, heads={"1": "laplacian:4"}) == [None, "laplacian:4", None]


def test_only_lowercase_half_is_the_half_count():
    """Kills: heads.py ``laplacian_count`` accepting other spellings of ``"half"`` (only ``"half"`` is documented;
    a list entry ``"Half"`` must reach the per-layer check)."""
    assert resolve_layer_heads(2, 6, laplacian_heads=[0, "half"]) == [None, "attention:3,laplacian:3"]
    with pytest.raises(ValueError, match=r"laplacian_heads\[1\] must be an int in \[0, 6\], got 'Half'"):
        resolve_layer_heads(2, 6, laplacian_heads=[0, "Half"])


@pytest.mark.parametrize("bad", [True, 0, 2.0])
def test_num_layers_must_be_a_positive_int(bad):
    """Kills: heads.py ``resolve_layer_heads`` without the bool check on ``num_layers`` (``True`` is the int 1 and
    gave a one-layer layout)."""
    with pytest.raises(ValueError, match=r"num_layers must be a positive int, got " + repr(bad)):
        resolve_layer_heads(bad, 4, heads="laplacian:4")


def test_laplacian_heads_as_a_tuple_or_of_the_wrong_length():
    """Kills: heads.py ``resolve_layer_heads`` passing a tuple ``laplacian_heads`` on unconverted (its ``"half"``
    entries are then not replaced); the length check ``len(counts) < num_layers`` (a longer list silently
    truncated); the per-layer bool check dropped (``True`` gave the spec ``"attention:3,laplacian:True"``)."""
    assert resolve_layer_heads(2, 4, laplacian_heads=(1, "half")) == ["attention:3,laplacian:1",
                                                                      "attention:2,laplacian:2"]
    with pytest.raises(ValueError, match=r"laplacian_heads lists 3 layers, the model has 2"):
        resolve_layer_heads(2, 4, laplacian_heads=[1, 1, 1])
    with pytest.raises(ValueError, match=r"laplacian_heads\[1\] must be an int in \[0, 4\], got True"):
        resolve_layer_heads(2, 4, laplacian_heads=[0, True])
    with pytest.raises(ValueError, match=r"laplacian_heads\[0\] must be an int in \[0, 4\], got -1"):
        resolve_layer_heads(2, 4, laplacian_heads=-1)


def test_bug_a_read_only_mapping_or_tuple_of_layers_is_read_like_a_dict_or_list():
    """Bug: heads.py ``format_head_spec`` filled templates and converted layer keys only in a ``dict`` or a
    ``list``: a read-only ``MappingProxyType`` kept its string keys (``{"1": spec}`` was refused as "layer
    index '1' out of range", ``{True: spec}`` was layer 1) and a per-layer tuple kept its ``{H}`` templates.
    Any mapping is now read like a dict (keys through ``_layer_key``), a tuple like a list."""
    from types import MappingProxyType

    assert resolve_layer_heads(3, 4, heads=MappingProxyType({-1: "laplacian:4"})) == [None, None, "laplacian:4"]
    assert resolve_layer_heads(3, 4, heads=MappingProxyType({"1": "laplacian:{half}"})) == [None, "laplacian:2", None]
    assert resolve_layer_heads(2, 4, heads=("laplacian:{H}", None)) == ["laplacian:4", None]
    with pytest.raises(ValueError, match=r"heads given as a dict maps layer indices to specs .* got the key True$"):
        resolve_layer_heads(3, 4, heads=MappingProxyType({True: "laplacian:4"}))
    with pytest.raises(ValueError, match=r"layer index 3 out of range for 3 layers"):
        resolve_layer_heads(3, 4, heads=MappingProxyType({3: "laplacian:4"}))


def test_a_per_layer_tuple_becomes_a_list_of_the_right_length():
    """Kills: heads.py ``resolve_layer_heads`` returning a per-layer sequence as given (``return heads``: a tuple
    stays a tuple, not the documented list) and checking its length with ``<`` only (a longer list silently
    loses its last specs)."""
    got = resolve_layer_heads(2, 4, heads=("laplacian:4", None))
    assert type(got) is list and got == ["laplacian:4", None]
    with pytest.raises(ValueError, match=r"a per-layer heads list must have 2 entries \(one per layer\), got 3"):
        resolve_layer_heads(2, 4, heads=[None, None, "laplacian:4"])


def test_an_unsupported_per_layer_heads_type_is_a_type_error():
    """Kills: heads.py ``resolve_layer_heads`` raising ValueError for a ``heads`` of an unsupported type (the
    documented error for a wrong type is a TypeError naming it)."""
    with pytest.raises(TypeError, match=r"heads must be None, a spec string, a per-layer list or a dict, got int"):
        resolve_layer_heads(2, 4, heads=3)


def test_a_head_group_stops_after_its_last_head():
    """Kills: heads.py ``HeadGroup.stop`` as ``start + count - 1`` (the last head, not the exclusive end that
    slices ``heads[start:stop]`` expect)."""
    groups = parse_heads("attention:3,laplacian:1,heat(t=0.5):2", 6)
    assert [(g.start, g.stop) for g in groups] == [(0, 3), (3, 4), (4, 6)]


# ---------------------------------------------------------------------------- rotary.py
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rotary_keeps_the_input_dtype_with_float64_angles(dtype):
    """Kills: rotary.py ``apply_rotary`` not casting ``cos`` to the input's dtype (float64 ``cos`` times a float32
    ``x`` promotes the rotated queries to float64); values: the explicit rotation of the rounded input."""
    C, N = 6, 5
    x = _t(N, 2, C, seed=5).to(dtype)
    pos = torch.arange(3, 3 + N)
    from diffusionformer.nn.rotary import RotaryEmbedding

    got = RotaryEmbedding(C)(x, pos)
    assert got.dtype == dtype and got.shape == x.shape
    want = _rope_np(x.double().numpy(), pos.numpy())
    tol = {torch.float32: 1e-6, torch.bfloat16: 3e-2, torch.float16: 4e-3}[dtype]
    np.testing.assert_allclose(got.double().numpy(), want, atol=tol * 4, rtol=tol)


def test_apply_rotary_refuses_angles_of_the_wrong_width():
    """Kills: rotary.py ``apply_rotary`` checking only the number of angle rows (angles with ``C/2 + 1`` columns
    then fail in a broadcast with a bare RuntimeError instead of the named shape)."""
    from diffusionformer.nn.rotary import apply_rotary

    with pytest.raises(ValueError, match=r"apply_rotary: expected angles of shape \(N, C/2\) = \(3, 2\), got \(3, 3\)"):
        apply_rotary(torch.zeros(3, 1, 4), torch.zeros(3, 3))
    with pytest.raises(ValueError, match=r"apply_rotary: expected angles of shape \(N, C/2\) = \(3, 2\), got \(3, 1\)"):
        apply_rotary(torch.zeros(3, 1, 4), torch.zeros(3, 1))


def test_rotary_default_positions_follow_the_input_device():
    """Kills: rotary.py ``forward`` building the default positions without ``x.device`` and ``default_positions``
    ignoring its ``device`` (CPU positions for a tensor elsewhere). Checked on the ``meta`` device, which any
    CPU-only run has: CPU angles cannot be combined with meta queries."""
    from diffusionformer.nn.rotary import RotaryEmbedding

    rope = RotaryEmbedding(4)
    assert rope.default_positions(3, torch.device("meta")).device.type == "meta"
    y = rope(torch.empty(2, 3, 1, 4, device="meta"))
    assert y.device.type == "meta" and y.shape == (2, 3, 1, 4)


def test_rotary_2d_frequencies_and_positions_are_float64_at_large_positions():
    """Kills: rotary.py ``RotaryEmbedding2D.angles`` casting the positions to float32 (``20000001 -> 2e7``,
    ``3.3`` rounded) and ``RotaryEmbedding2D.inv_freq`` in float32 (``100 ** -0.5`` rounded to ``0.10000000149``: at
    row/column 10^6 the angle is off by ~1e-3); reference: explicit rotations with float64 frequencies."""
    from diffusionformer.nn.rotary import RotaryEmbedding2D

    C = 8
    pos = torch.tensor([[1_000_000.0, 3.3], [7.0, 20_000_001.0]], dtype=f64)  # not float32 numbers
    x = _t(2, 1, C, seed=6)
    theta = [100.0 ** (-2 * i / (C // 2)) for i in range(C // 4)]
    got = RotaryEmbedding2D(C)(x, pos).numpy()
    want = np.empty_like(got)
    for n, (r, c) in enumerate(pos.tolist()):
        angles = [r * th for th in theta] + [c * th for th in theta]
        for i, th in enumerate(angles):
            a, b = x[n, 0, 2 * i].item(), x[n, 0, 2 * i + 1].item()
            want[n, 0, 2 * i] = math.cos(th) * a - math.sin(th) * b
            want[n, 0, 2 * i + 1] = math.sin(th) * a + math.cos(th) * b
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-8)


def test_rotary_stores_a_python_float_base_and_shows_it():
    """Kills: rotary.py ``self.base = base`` without ``float()`` (an int base stays an int, a numpy base a numpy
    scalar, and the repr shows ``base=10``); ``extra_repr`` without the base."""
    from diffusionformer.nn.rotary import RotaryEmbedding, RotaryEmbedding2D

    for base in (10, np.float32(10.0), np.int64(10)):
        rope = RotaryEmbedding(4, base=base)
        assert type(rope.base) is float and rope.base == 10.0
        assert repr(rope) == "RotaryEmbedding(head_dim=4, base=10.0)"
    assert repr(RotaryEmbedding2D(8)) == "RotaryEmbedding2D(head_dim=8, base=100.0)"
    assert repr(RotaryEmbedding(6)) == "RotaryEmbedding(head_dim=6, base=10000.0)"


def test_rotary_2d_needs_explicit_positions_and_says_how_many_coordinates():
    """Kills: rotary.py ``RotaryEmbedding2D.default_positions`` returning ``0..N-1`` (the call then fails later with
    the shape message instead of asking for ``(N, 2)`` rows and columns); the class attributes ``ndim`` (position
    coordinates: 1 for sequences, 2 for grids) swapped."""
    from diffusionformer.nn.rotary import RotaryEmbedding, RotaryEmbedding2D

    with pytest.raises(ValueError, match=r"^RotaryEmbedding2D: expected explicit \(N, 2\) positions \(row, column\), "
                                         r"got none$"):
        RotaryEmbedding2D(8)(torch.zeros(3, 1, 8))
    assert (RotaryEmbedding.ndim, RotaryEmbedding2D.ndim) == (1, 2)
    assert (RotaryEmbedding(4).ndim, RotaryEmbedding2D(4).ndim) == (1, 2)


# ---------------------------------------------------------------------------- block.py: options one by one
def test_layer_scale_of_zero_switches_both_branches_off():
    """Kills: block.py ``Block`` building LayerScale only for a truthy ``layer_scale`` (``if layer_scale``):
    ``layer_scale=0.0`` is a LayerScale initialised at zero (CaiT-style), so the block starts as the identity."""
    from diffusionformer.nn import Block
    from diffusionformer.nn.block import LayerScale

    blk = Block(8, 2, layer_scale=0.0).double().eval()
    assert type(blk.ls1) is LayerScale and type(blk.ls2) is LayerScale
    x = _t(2, 4, 8, seed=7)
    torch.testing.assert_close(blk(x), x, rtol=0, atol=0)


def test_layer_scale_defaults_and_refuses_bools_and_non_finite_values():
    """Kills: block.py ``LayerScale`` default ``init`` changed from CaiT's ``1e-5``; the bool check dropped
    (``True`` is the number 1); the finiteness check dropped (``inf`` / ``nan`` gains)."""
    from diffusionformer.nn.block import LayerScale

    assert torch.equal(LayerScale(3).gamma.data, torch.full((3,), 1e-5))
    for bad in (True, float("inf"), float("nan"), "0.1"):
        with pytest.raises(ValueError, match=r"LayerScale: init \(layer_scale\) must be a finite float, got "):
            LayerScale(3, bad)
    from diffusionformer.nn import Block

    with pytest.raises(ValueError, match=r"init \(layer_scale\) must be a finite float, got inf"):
        Block(8, 2, layer_scale=float("inf"))


def test_mlp_width_and_bias_options():
    """Kills: block.py ``Mlp`` default hidden width other than ``4 D``; the bool check on ``hidden_dim`` dropped
    (``True`` is one hidden unit); ``fc2`` always with a bias; ``Block`` building its MLP with ``bias=True``
    whatever ``bias``."""
    from diffusionformer.nn import Block
    from diffusionformer.nn.block import Mlp

    assert (Mlp(8).fc1.out_features, Mlp(8).fc2.in_features) == (32, 32)
    with pytest.raises(ValueError, match=r"Mlp: hidden_dim must be a positive int or None, got True"):
        Mlp(8, True)
    m = Mlp(8, 16, bias=False)
    assert m.fc1.bias is None and m.fc2.bias is None
    blk = Block(8, 2, bias=False, mlp_ratio=3.0)
    assert blk.mlp.fc1.bias is None and blk.mlp.fc2.bias is None and blk.mlp.fc1.out_features == 24


def test_an_infinite_mlp_ratio_is_named():
    """Kills: block.py ``Block`` without the ``mlp_ratio < inf`` bound: ``int(dim * inf)`` then fails with a bare
    OverflowError instead of the named ValueError."""
    from diffusionformer.nn import Block

    with pytest.raises(ValueError, match=r"mlp_ratio must be positive and finite .* got inf for dim=8"):
        Block(8, 2, mlp_ratio=float("inf"))


def test_norm_of_a_wrong_type_is_a_type_error():
    """Kills: block.py ``make_norm`` raising ValueError for a norm that is neither a string nor a callable (the
    documented error for a wrong type is a TypeError naming it; an unknown name stays a ValueError)."""
    from diffusionformer.nn.block import make_norm

    with pytest.raises(TypeError, match=r"norm must be 'layernorm', 'rmsnorm' or a callable, got int"):
        make_norm(3, 8)
    with pytest.raises(ValueError, match=r"unknown norm 'batchnorm'"):
        make_norm("batchnorm", 8)


def test_drop_path_shows_its_probability():
    """Kills: block.py ``DropPath.extra_repr`` emptied (the rate no longer shows in the model's repr)."""
    from diffusionformer.nn.block import DropPath

    assert repr(DropPath(0.25)) == "DropPath(p=0.25)"


class _Zero(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return torch.zeros_like(x)


def test_block_dropout_acts_after_the_attention_projection():
    """Kills: block.py ``Block.forward`` without ``drop1`` on the attention branch (nanoGPT's ``resid_dropout``);
    reference: with the MLP branch zero, every entry of ``y - x`` is 0 or twice the eval-mode attention branch."""
    from diffusionformer.nn import Block

    torch.manual_seed(0)
    blk = Block(8, 2, dropout=0.5, mlp_layer=lambda d: _Zero()).double()
    x = _t(2, 6, 8, seed=8)
    a = blk.eval()(x) - x
    torch.manual_seed(1)
    d = blk.train()(x) - x
    dropped = d == 0
    torch.testing.assert_close(d[~dropped], 2 * a[~dropped], rtol=1e-12, atol=1e-12)
    assert 0.25 < dropped.double().mean().item() < 0.75


@pytest.mark.parametrize("branch", ["attn", "mlp"])
def test_block_drop_path_drops_whole_samples_of_each_branch(branch):
    """Kills: block.py ``Block.forward`` adding the attention branch (``x = x + y``) or the MLP branch
    (``return x + y``) without its stochastic depth; reference: with the other branch zero, each sample's
    ``y - x`` is either 0 or twice the eval-mode branch (``p = 0.5``), and both happen."""
    from diffusionformer.nn import Block

    torch.manual_seed(0)
    blk = _randomise(Block(8, 2, drop_path=0.5, layer_scale=1.0).double(), seed=9)
    with torch.no_grad():
        (blk.ls2 if branch == "attn" else blk.ls1).gamma.zero_()
    x = _t(16, 3, 8, seed=10)
    ref = blk.eval()(x) - x
    torch.manual_seed(2)
    d = blk.train()(x) - x
    kept = set()
    for b in range(16):
        if bool((d[b] == 0).all()):
            kept.add(False)
        else:
            torch.testing.assert_close(d[b], 2 * ref[b], rtol=1e-12, atol=1e-12)
            kept.add(True)
    assert kept == {True, False}


# ---------------------------------------------------------------------------- _skip.py
def test_a_subclass_of_identity_is_called():
    """Kills: _skip.py ``is_noop`` testing ``isinstance(m, nn.Identity)`` instead of ``type(m) is nn.Identity``: a
    user's ``Identity`` subclass with its own forward (here doubling) put in place of ``ls1`` must run."""
    from diffusionformer.nn import Block
    from diffusionformer.nn._skip import is_noop

    class _Twice(nn.Identity):
        def forward(self, x: Tensor) -> Tensor:
            return 2 * x

    assert not is_noop(_Twice())
    torch.manual_seed(0)
    blk = Block(8, 2, mlp_layer=lambda d: _Zero()).double().eval()
    x = _t(1, 4, 8, seed=11)
    a = blk(x) - x
    blk.ls1 = _Twice()
    torch.testing.assert_close(blk(x) - x, 2 * a, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["full_backward", "full_backward_pre"])
def test_identities_with_backward_hooks_are_not_skipped(kind):
    """Kills: _skip.py ``is_noop`` ignoring the module's own backward hooks or backward pre-hooks (the check cut to
    the forward hooks): a backward hook on ``ls1`` must see the gradient of the attention branch."""
    from diffusionformer.nn import Block
    from diffusionformer.nn._skip import is_noop

    blk = Block(8, 2).double()
    seen: list[tuple[int, ...]] = []
    register = getattr(blk.ls1, f"register_{kind}_hook")
    register(lambda mod, *grads: seen.append(tuple(grads[-1][0].shape)) and None)
    assert not is_noop(blk.ls1)
    x = _t(2, 3, 8, seed=12).requires_grad_()
    blk(x).sum().backward()
    assert seen == [(2, 3, 8)]


@pytest.mark.parametrize("kind", ["forward_pre", "full_backward", "full_backward_pre"])
def test_global_hooks_of_every_kind_see_the_skipped_identities(kind):
    """Kills: _skip.py ``is_noop`` ignoring the global forward pre-hooks (``register_module_forward_pre_hook``) or
    the global backward hooks and backward pre-hooks (both dropped from the check)."""
    from diffusionformer.nn._skip import is_noop

    module = nn.modules.module
    handle = getattr(module, f"register_module_{kind}_hook")(lambda *args: None)
    try:
        assert not is_noop(nn.Identity())
    finally:
        handle.remove()
    assert is_noop(nn.Identity())


# ---------------------------------------------------------------------------- edge_features.py
def test_edge_keys_with_the_right_size_but_another_shape_are_refused():
    """Kills: edge_features.py checking only the number of rows of ``edge_keys`` (``shape[0] != E``): ``(E, H, C)``
    edge keys, which reshape silently, or ``(E, D + 1)`` ones (a bare reshape error) must get the named shape."""
    from diffusionformer.nn.edge_features import edge_feature_attention

    layer = DiffusionAttention(4, 2).double()
    ei = torch.tensor([[1, 2, 3, 0, 2, 4, 0], [0, 0, 1, 2, 3, 3, 4]])
    x = _t(5, 4, seed=13)
    for bad in ((7, 2, 2), (7, 5)):
        msg = r"edge_keys: expected shape \(E, D\) = \(7, 4\), got " + re.escape(repr(bad))
        with pytest.raises(ValueError, match=msg):
            edge_feature_attention(layer, x, ei, torch.zeros(*bad, dtype=f64))


# ---------------------------------------------------------------------------- equivalent mutants
# 117 mutants were applied, one at a time (53 in heads.py, 18 in rotary.py, 11 in edge_features.py, 5 in _skip.py,
# 30 in block.py); 57 were killed by the existing suite, 57 more by this file. The three below are equivalent:
# - heads.py ``_split_count`` returning ``item[:i]`` unstripped: the name goes to ``build_operator``, whose spec
#   regex strips the surrounding whitespace, so the operator, its arguments and every message are the same.
# - heads.py ``parse_heads`` grouping a run of consecutive heads by ``heads[h + run] == entry`` instead of ``is``:
#   operators are ``nn.Module`` objects without ``__eq__``, so ``==`` is identity.
# - block.py ``make_norm`` ``callable(norm) and not isinstance(norm, str)`` -> ``callable(norm)``: a ``str`` is
#   never callable, so the second half never changes the branch taken.
# - heads.py ``resolve_layer_heads`` without the bool check on a mapping's layer keys: since ``format_head_spec``
#   reads every mapping's keys through ``_layer_key`` (the fix pinned by the "Bug:" test above), a bool key is
#   refused there first. The check was the kill of this audit before that fix; it is kept as a second guard.
# Considered and not applied: ``{``/``}`` dropped from the brackets of ``_split_count``. A brace left after
# ``format_head_spec`` is either inside an operator's parentheses (depth already positive: the same colon is the
# count) or comes from an escaped ``{{``/``}}`` in a name, which is an unknown operator either way.
