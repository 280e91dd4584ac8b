"""Property-based tests (hypothesis): generated inputs give the float64 reference or a named error.

For heads strings, masks, ``edge_index`` tensors and TOML fragments, the contract is: either
the result agrees with an explicit float64 reference (and is finite), or the call raises a
``ValueError``/``TypeError`` whose message names the argument at fault. Never another
exception type, never a NaN.
"""

from __future__ import annotations

import math
import re
import tempfile
from pathlib import Path

import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from diffusionformer.nn import DiffusionAttention
from diffusionformer.ops.reference import dense_attention_reference, polynomial_reference

# modest and deterministic: CI stays fast, a slow CPU does not flake, nothing is written to disk
PROPS = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow])
D, H = 8, 4


def _reference(layer: DiffusionAttention, x: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """``out_proj(concat_h f_h(P_h) v_h)`` from explicit float64 matrices; ``x``: (B, N, D)."""
    B, N, _ = x.shape
    C = D // H
    q, k, v = (t.view(B, N, H, C).transpose(1, 2) for t in layer.qkv(x).chunk(3, dim=-1))
    P = dense_attention_reference(q, k, allowed=allowed)  # (B, H, N, N), zero rows where nothing is allowed
    outs = []
    for op, (s, c) in zip(layer.operators, layer._groups):
        if op.is_polynomial:
            outs.append(polynomial_reference(P[:, s : s + c], v[:, s : s + c], op.head_coefficients(c).detach()))
        else:  # heat-exact: the matrix exponential of the same (possibly zero-row) P
            eye = torch.eye(N, dtype=torch.float64)
            t = op.t.detach().double().view(1, c, 1, 1)
            outs.append(torch.linalg.matrix_exp(-t * (eye - P[:, s : s + c])) @ v[:, s : s + c])
    return layer.out_proj(torch.cat(outs, dim=1).transpose(1, 2).reshape(B, N, D))


def _named(exc: BaseException, *words: str) -> bool:
    text = str(exc).lower()
    return any(w.lower() in text for w in words)


# ----------------------------------------------------------------------------- heads strings
_NAMES = ["attention", "laplacian", "heat", "ppr", "polynomial", "heat-exact", "I-P", "laplacain", "bogus", ""]
_ARGS = st.one_of(
    st.just(""),
    st.sampled_from(["(t=0.5)", "(t=50, steps=4)", "(steps=2)", "(alpha=0.2, steps=3)", "(alpha=2)", "(t=nan)",
                     "(t=", "(learnable=True)", "(t=0.3, steps=2, method='euler')", "(steps=0)", "(x=1)",
                     "(t=1, steps=300)", "(1, 2)", "(init=[0.5, 0.5])"]),
    st.floats(-3, 60, allow_nan=False).map(lambda t: f"(t={t!r})"),
    st.builds(lambda a, k: f"(alpha={a!r}, steps={k})", st.floats(-0.5, 1.5, allow_nan=False), st.integers(-1, 6)),
)
_COUNT = st.one_of(st.just(""), st.integers(-2, 6).map(lambda n: f":{n}"), st.sampled_from([":x", ":{half}", ":", ": 2"]))
_HEAD = st.builds(lambda n, a, c: f"{n}{a}{c}", st.sampled_from(_NAMES), _ARGS, _COUNT)
_VALID_OPS = st.sampled_from(["attention", "laplacian", "I-P", "heat(t=0.5)", "heat(t=2.0, steps=6)",
                              "heat(t=0.4, steps=2, method='euler')", "heat(t=-0.3, steps=4)", "ppr(alpha=0.2, steps=3)",
                              "polynomial(steps=2, init=[0.2, 0.5, 0.3])", "heat-exact(t=0.4)", "heat(learnable=True)"])


@st.composite
def _fitting_spec(draw):
    """A layout whose counts add up to H (sometimes one part perturbed): mostly buildable."""
    cuts = sorted(draw(st.lists(st.integers(1, H - 1), max_size=2, unique=True)))
    counts = [b - a for a, b in zip([0, *cuts], [*cuts, H])]
    parts = [f"{draw(_VALID_OPS)}:{c}" for c in counts]
    if draw(st.integers(0, 3)) == 0:
        parts[draw(st.integers(0, len(parts) - 1))] = draw(_HEAD)
    return parts


@PROPS
@given(parts=st.one_of(_fitting_spec(), st.lists(_HEAD, min_size=1, max_size=4)), sep=st.sampled_from([",", ", ", ";"]))
def test_heads_strings_build_a_correct_layer_or_are_refused_by_name(parts, sep):
    spec = sep.join(parts)
    torch.manual_seed(0)
    try:
        layer = DiffusionAttention(D, H, heads=spec).double().eval()
    except (ValueError, TypeError) as exc:
        assert _named(exc, "head", "operator", "spec", "steps", "alpha", "t=", "t must", "tol", "argument", "init"), \
            f"{spec!r}: {exc}"
        event("refused")
        return
    event("built")
    x = torch.randn(2, 5, D, dtype=torch.float64)
    out = layer(x)
    assert torch.isfinite(out).all(), spec
    assert torch.allclose(out, _reference(layer, x, None), atol=1e-9), spec


# ----------------------------------------------------------------------------- masks
_LAYER_HEADS = "attention:1,laplacian:1,heat(t=0.7, steps=3):1,ppr(alpha=0.3, steps=2):1"


@st.composite
def _masks(draw):
    B, N = draw(st.integers(1, 3)), draw(st.integers(1, 5))
    kind = draw(st.sampled_from(["none", "bool", "wrong-shape", "int", "float-additive", "list"]))
    pad = None
    if draw(st.booleans()):
        pad = torch.tensor(draw(st.lists(st.booleans(), min_size=B * N, max_size=B * N))).view(B, N)
        if draw(st.integers(0, 9)) == 0:
            pad = pad.long()  # wrong dtype
    attn = None
    if kind in ("bool", "float-additive", "int"):
        shape = draw(st.sampled_from([(N, N), (B, 1, N, N), (B, H, N, N)]))
        bits = torch.tensor(draw(st.lists(st.booleans(), min_size=math.prod(shape), max_size=math.prod(shape)))).view(shape)
        attn = bits if kind == "bool" else (bits.long() if kind == "int" else torch.where(bits, 0.0, float("-inf")).double())
    elif kind == "wrong-shape":
        attn = torch.ones(N + 1, N, dtype=torch.bool)
    elif kind == "list":
        attn = [[True] * N] * N
    return B, N, pad, attn


@PROPS
@given(case=_masks(), causal=st.booleans(), backend=st.sampled_from(["sdpa", "matrix"]))
def test_masks_give_the_reference_or_a_named_error(case, causal, backend):
    B, N, pad, attn = case
    torch.manual_seed(1)
    layer = DiffusionAttention(D, H, heads=_LAYER_HEADS, causal=causal, backend=backend).double().eval()
    x = torch.randn(B, N, D, dtype=torch.float64)
    try:
        out = layer(x, key_padding_mask=pad, attn_mask=attn)
    except (ValueError, TypeError) as exc:
        assert _named(exc, "mask"), f"{exc}"
        event("refused")
        return
    event("computed")
    allowed = torch.ones(B, H, N, N, dtype=torch.bool)
    if pad is not None:
        allowed = allowed & ~pad[:, None, None, :]
    if attn is not None:
        allowed = allowed & (attn if attn.dtype == torch.bool else torch.isfinite(attn)).expand(B, H, N, N) \
            if attn.dim() == 4 else allowed & (attn if attn.dtype == torch.bool else torch.isfinite(attn))
    if causal:
        allowed = allowed & torch.ones(N, N, dtype=torch.bool).tril()
    assert torch.isfinite(out).all()
    assert torch.allclose(out, _reference(layer, x, allowed), atol=1e-9)


# ----------------------------------------------------------------------------- edge_index
@st.composite
def _edges(draw):
    N = draw(st.integers(1, 6))
    kind = draw(st.sampled_from(["valid", "valid", "valid", "out-of-range", "negative", "float", "shape", "int32", "empty"]))
    pairs = draw(st.lists(st.tuples(st.integers(0, N - 1), st.integers(0, N - 1)), max_size=3 * N, unique=True))
    ei = torch.tensor(pairs, dtype=torch.long).view(-1, 2).t().contiguous()
    if kind == "out-of-range":
        ei = torch.cat([ei, torch.tensor([[0], [N + draw(st.integers(0, 3))]])], dim=1)
    elif kind == "negative":
        ei = torch.cat([ei, torch.tensor([[-1], [0]])], dim=1)
    elif kind == "float":
        ei = ei.double()
    elif kind == "shape":
        ei = ei.t() if ei.shape[1] != 2 else ei.reshape(-1)
    elif kind == "int32":
        ei = ei.int()
    elif kind == "empty":
        ei = torch.zeros(2, 0, dtype=torch.long)
    return N, ei


@PROPS
@given(case=_edges())
def test_edge_index_gives_the_reference_or_a_named_error(case):
    N, ei = case
    torch.manual_seed(2)
    layer = DiffusionAttention(D, H, heads=_LAYER_HEADS).double().eval()
    x = torch.randn(N, D, dtype=torch.float64)
    try:
        out = layer(x, edge_index=ei)
    except (ValueError, TypeError) as exc:
        assert _named(exc, "edge_index", "edge"), f"{exc}"
        event("refused")
        return
    event("computed")
    allowed = torch.zeros(N, N, dtype=torch.bool)
    e = ei.long()
    allowed[e[1], e[0]] = True  # edge (source j, target i): i attends to j
    assert torch.isfinite(out).all()
    assert torch.allclose(out, _reference(layer, x[None], allowed)[0], atol=1e-9)


# ----------------------------------------------------------------------------- TOML fragments
_TASK_KEYS = {
    "name": ['"t"', '"u"', '""', '"a/b"'], "dataset": ['"digits"', '"digit"', "3"], "model": ['"vit-digits"', '"vit-digit"'],
    "metric": ['"test_acc"', '"test_ac"', "3"], "select_by": ['"val_acc"', '""', '"val_loss"'],
    "reach": ["{ val_acc = 0.9 }", '{ val_acc = "x" }', "{ val_acc = 0.9, test_acc = 1.0 }"],
    "folds": ["2", "1", '"2"'], "data_seed": ["0", "-1"], "eval_batch_size": ["64", "0"],
    "datset": ['"digits"'], "train": ["{ max_steps = 2 }", "{ max_step = 2 }", '{ max_steps = "2" }', "{ seed = 1 }"],
    "model_overrides": ["{ dim = 16, depth = 1, num_heads = 2 }", "{ dimm = 16 }", "{ depth = 0 }"],
    "dataset_options": ["{ val_fraction = 0.2 }", "{ bogus = 1 }", "{ val_fraction = 2.0 }"],
}
_OP_KEYS = {
    "name": ['"a"', '"b"', '""'], "heads": ['"attention:{half},laplacian:{half}"', '"attention:7"',
                                           '"heat(t=50, steps=4):{H}"', "3", '"laplacain:{H}"'],
    "laplacian_heads": ['"half"', '"most"', "1", "-1", "[1, 1]"], "model_overrides": ["{ dropout = 2.0 }", "{ dropout = 0.1 }"],
}
_TOP_KEYS = {"name": ['"frag"', '""'], "seeds": ["[0, 1]", "[0, 0]", '"0"', "[]"], "sedes": ["[0]"], "description": ['"x"']}
_REQUIRED = {"name", "dataset", "model"}


@st.composite
def _table(draw, keys, required=frozenset()):
    """A TOML table as lines: a valid base (the first value of each chosen key; required keys
    usually present), then up to two keys set to any value or dropped. Each key at most once."""
    valid_only = {"datset", "sedes", "laplacian_heads"}  # only ever added by a mutation (laplacian_heads: not with heads)
    table = {k: v[0] for k, v in keys.items() if k not in valid_only and (k in required or draw(st.booleans()))}
    for _ in range(draw(st.integers(0, 2))):
        k = draw(st.sampled_from(sorted(keys)))
        table[k] = draw(st.one_of(st.sampled_from(keys[k]), st.none()))
    return [f"{k} = {v}" for k, v in table.items() if v is not None]


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(top=_table(_TOP_KEYS, {"name", "seeds"}), tasks=st.lists(_table(_TASK_KEYS, _REQUIRED), min_size=1, max_size=2),
       ops=st.lists(_table(_OP_KEYS, {"name"}), min_size=1, max_size=2))
def test_toml_fragments_load_and_validate_or_name_the_key(top, tasks, ops):
    from diffusionformer.experiments import load_experiment_config
    from diffusionformer.experiments.validate import validate_experiment

    text = "\n".join(top) + "\n"
    for i, t in enumerate(tasks):  # the valid base names the second entry differently
        text += "[[tasks]]\n" + "\n".join(t).replace('name = "t"', f'name = "t{i}"') + "\n"
    for i, o in enumerate(ops):
        text += "[[operators]]\n" + "\n".join(o).replace('name = "a"', f'name = "a{i}"') + "\n"
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "frag.toml"
        path.write_text(text)
        try:
            cfg = load_experiment_config(path)
        except (ValueError, TypeError) as exc:
            words = {w for line in text.splitlines() for w in re.findall(r"[a-z_]+", line.split("=")[0])}
            words |= {"task", "operator", "seed", "name", "experiment", "config", "missing", "required", "key"}
            assert _named(exc, *words), f"{text}\n-> {exc}"
            event("refused")
            return
    event("loaded")
    problems = validate_experiment(cfg, load_data=False)  # a list of sentences, never an exception
    assert isinstance(problems, list) and all(isinstance(p, str) and p for p in problems)
