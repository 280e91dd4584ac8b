"""Edge probes of an inference / deployment user: a trained DiffusionGPT, DiffusionViT or graph transformer
served in eval mode under ``torch.inference_mode``, in half precision, reloaded from ``torch.save`` (whole module
and ``state_dict`` with ``weights_only=True``), copied, pickled, exported, compiled, dynamically quantized and
sampled from, each against the straightforward path (equal tokens, equal or close logits, float64 references)."""

from __future__ import annotations

import copy
import io
import pickle
import warnings

import pytest
import torch
from torch import nn

from diffusionformer.models import DiffusionGPT, DiffusionViT, GPTConfig, ViTConfig
from diffusionformer.nn import DiffusionAttention
from diffusionformer.nn._weights import _stored_weight
from diffusionformer.operators import list_operators, operator_class

pytestmark = [pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")]

#: the operators that hold no floating-point tensor of their own (no learned parameter, no fixed float constant)
PARAMETER_FREE = ["value-residual(lam=1.0)", "neutreno(lam=0.6)", "grand-nl(t=1.0, steps=2, method='rk4')",
                  "ppr-exact(alpha=0.2)"]


def _spec(name: str, count: int = 1) -> str:
    kw = operator_class(name).example_kwargs
    args = "(" + ", ".join(f"{k}={v!r}" for k, v in kw.items()) + ")" if kw else ""
    return f"attention:{count},{name}{args}:{count}"


def _gpt(heads, **kw) -> DiffusionGPT:
    torch.manual_seed(0)
    config = dict(vocab_size=13, block_size=8, n_layer=2, n_head=2, n_embd=16, heads=heads)
    config.update(kw)
    return DiffusionGPT(GPTConfig(**config)).eval()


def _idx(b: int = 2, t: int = 8) -> torch.Tensor:
    return torch.randint(0, 13, (b, t), generator=torch.Generator().manual_seed(1))


def _quantize(model: nn.Module, dtype: torch.dtype = torch.qint8) -> nn.Module:
    quantize = getattr(torch.ao.quantization, "quantize_dynamic", None)
    if quantize is None or torch.backends.quantized.engine == "none":
        pytest.skip("torch.ao.quantization.quantize_dynamic is not available in this torch build")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation
        return quantize(copy.deepcopy(model), {nn.Linear}, dtype=dtype)


# ----------------------------------------------------------------------------------- quantize_dynamic
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("qdtype", [torch.qint8, torch.float16], ids=["qint8", "float16"])
@pytest.mark.parametrize("op", PARAMETER_FREE)
def test_bug_quantized_model_of_parameter_free_operators_runs(op, qdtype):
    """Bug: after ``torch.ao.quantization.quantize_dynamic(model, {nn.Linear})`` a DiffusionGPT whose layers hold only
    parameter-free operators (``value-residual``, ``neutreno``, ``grand-nl``, ``ppr-exact``: no learned parameter,
    no fixed float constant) failed at its first forward with "TypeError: Linear has no tensor 'weight' and no
    floating-point parameter or buffer to read the device and dtype from": the layer read its device and dtype from
    ``qkv`` (a quantized Linear, whose ``weight`` is a method), then from its own tensors, and held none. A quantized
    module now gives float32 on its packed weight's device (the precision it computes in); the quantized model's
    logits follow the float model's, and it decodes with and without the KV cache."""
    model = _gpt(f"{op}:2", n_head=2, n_embd=16)
    idx = _idx()
    with torch.no_grad():
        want = model(idx)[0]
    quantized = _quantize(model, qdtype)
    with torch.inference_mode():
        got = quantized(idx)[0]  # raised
    assert got.dtype == torch.float32 and (got - want).abs().max() < 0.05
    for use_cache in (False, True):
        out = quantized.generate(idx[:, :3], 4, temperature=0, use_cache=use_cache)
        assert out.shape == (2, 7) and torch.equal(out[:, :3], idx[:, :3])


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("op", PARAMETER_FREE)
def test_bug_quantized_layer_of_parameter_free_operators_runs_dense_and_sparse(op):
    """Bug: the same for a bare ``DiffusionAttention`` of parameter-free heads without ``qk_norm`` (no LayerNorm to
    read either): dense, masked and sparse forwards of the quantized layer raised the TypeError; now they follow the
    float layer to quantization error."""
    torch.manual_seed(0)
    layer = DiffusionAttention(16, 2, heads=op).eval()
    x, ei = torch.randn(5, 16), torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])
    xd = torch.randn(2, 5, 16)
    mask = torch.ones(5, 5, dtype=torch.bool).tril()
    sparse = op.split("(")[0] not in ("ppr-exact",)  # the exact PPR solve needs a dense P
    with torch.no_grad():
        ref_dense, ref_mask = layer(xd), layer(xd, attn_mask=mask)
        ref_sparse = layer(x, edge_index=ei) if sparse else None
        quantized = _quantize(nn.Sequential(layer))[0]
        assert callable(quantized.qkv.weight)
        assert _stored_weight(quantized.qkv, owner=quantized).dtype == torch.float32  # raised
        assert (quantized(xd) - ref_dense).abs().max() < 0.05  # raised
        assert (quantized(xd, attn_mask=mask) - ref_mask).abs().max() < 0.05
        if sparse:
            assert (quantized(x, edge_index=ei) - ref_sparse).abs().max() < 0.05


def test_pin_a_module_holding_no_floating_tensor_is_still_named():
    """Pin: the quantized last resort reads only :mod:`torch.ao.nn.quantized` modules: another module without a
    floating-point tensor (nor a holder with one) is still the TypeError naming it, and a holder's tensor still comes
    before the quantized module's float32 (a float64 holder's dtype is kept, as before)."""
    with pytest.raises(TypeError, match=r"Identity has no tensor 'weight' and no floating-point parameter"):
        _stored_weight(nn.Identity(), owner=nn.ReLU())
    quantized = _quantize(nn.Sequential(nn.Linear(4, 4)))[0]
    assert _stored_weight(quantized, owner=nn.Linear(2, 2).double()).dtype == torch.float64


# ----------------------------------------------------------------------------------- what already holds
@pytest.mark.parametrize("name", list_operators())
def test_every_operator_serves_in_inference_mode_and_low_precision(name):
    """Every operator's GPT in ``eval()`` + ``inference_mode``: float32 equals the float64 model to 1e-5, bfloat16
    and float16 models (and bf16 autocast) stay in their dtype and near it, greedy KV-cache decoding in bfloat16
    gives the tokens of the uncached decoding, a ``weights_only=True`` state dict, a whole-module save, deepcopy and
    pickle give the same logits bit for bit."""
    model = _gpt(_spec(name))
    idx = _idx()
    with torch.no_grad():
        ref = copy.deepcopy(model).double()(idx)[0]
    with torch.inference_mode():
        logits = model(idx)[0]
        assert (logits.double() - ref).abs().max() < 1e-5
        for dtype, tol in ((torch.bfloat16, 0.03), (torch.float16, 0.005)):
            low = copy.deepcopy(model).to(dtype)(idx)[0]
            assert low.dtype == dtype and (low.double() - ref).abs().max() < tol, dtype
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert (model(idx)[0].double() - ref).abs().max() < 0.03
    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    assert torch.equal(bf16.generate(idx[:, :3], 7, temperature=0, use_cache=True),
                       bf16.generate(idx[:, :3], 7, temperature=0))
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    fresh = _gpt(_spec(name))
    with torch.no_grad():
        for p in fresh.parameters():
            p.add_(1.0)
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    copies = [fresh, torch.load(buf, weights_only=False), copy.deepcopy(model), pickle.loads(pickle.dumps(model))]
    with torch.no_grad():
        for other in copies:
            assert torch.equal(other.eval()(idx)[0], logits)


@pytest.mark.parametrize("name", list_operators())
def test_seeded_sampling_gives_the_same_tokens_with_and_without_the_cache(name):
    """Under one seed, ``generate`` with top-k and top-p gives the same tokens with the KV cache as without,
    also past ``block_size`` (the window slides) and for a batch of prompts."""
    model = _gpt(_spec(name))
    prompt = _idx(3, 3)
    outs = [model.generate(prompt, 10, top_k=6, top_p=0.9, use_cache=use_cache,
                           generator=torch.Generator().manual_seed(3)) for use_cache in (False, True)]
    assert outs[0].shape == (3, 13) and torch.equal(outs[0], outs[1])


def test_sampling_edge_cases_equal_their_straightforward_path():
    """temperature 0, a tiny temperature, ``top_k=1`` and a tiny ``top_p`` are greedy decoding; ``top_k`` above the
    vocabulary and ``top_p=1`` are no filter; ``max_new_tokens=0`` returns a copy of the prompt; a prompt longer than
    ``block_size`` is cropped; a batch row decodes as the prompt alone; ``top_k=0`` and ``top_p=0`` are refused."""
    model = _gpt("attention:1,heat(t=0.7, steps=4, learnable=True):1")
    prompt = _idx(3, 5)

    def gen(p=prompt, n=5, **kw):
        return model.generate(p, n, generator=torch.Generator().manual_seed(7), **kw)

    greedy = gen(temperature=0)
    for kw in (dict(temperature=1e-300), dict(top_k=1), dict(top_p=1e-9), dict(temperature=float("inf"), top_k=1)):
        assert torch.equal(gen(**kw), greedy), kw
    assert torch.equal(gen(top_k=100), gen()) and torch.equal(gen(top_p=1.0), gen())
    same = gen(n=0)
    assert torch.equal(same, prompt) and same is not prompt
    long = _idx(2, 20)
    assert torch.equal(gen(long, temperature=0), torch.cat([long[:, :-8], gen(long[:, -8:], temperature=0)], 1)[:, :25])
    assert torch.equal(gen(temperature=0)[1:2], gen(prompt[1:2], temperature=0))
    with pytest.raises(ValueError, match="top_k=0 is how Hugging Face"):
        gen(top_k=0)
    with pytest.raises(ValueError, match=r"top_p must be a float in \(0, 1\]"):
        gen(top_p=0.0)


def test_meta_to_empty_and_reset_equals_a_model_built_anew():
    """``model.to(device="meta")``, ``to_empty`` and ``reset_parameters`` under the constructor's seed give the model
    built anew (tied head, fixed coefficient caches, rotary tables), bit for bit."""
    heads = "attention:1,laplacian:1,heat(t=0.5):1,ppr(alpha=0.2, steps=3, learnable=True):1"
    for kw in ({}, {"rope": True}):
        want = _gpt(heads, n_head=4, **kw)
        model = _gpt(heads, n_head=4, **kw).to(device="meta")
        model.to_empty(device="cpu")
        torch.manual_seed(0)
        model.reset_parameters()
        assert model.lm_head.weight is model.tok_emb.weight
        with torch.no_grad():
            assert torch.equal(model.eval()(_idx())[0], want(_idx())[0])


def test_export_with_a_dynamic_batch_and_sequence_length():
    """``torch.export.export`` (non-strict, torch's default) with a dynamic batch and a dynamic sequence length up
    to ``block_size`` gives the eager logits at other sizes; a longer sequence is refused by the exported guard."""
    model = _gpt("laplacian:1,heat(t=0.7, steps=3, learnable=True):1", n_layer=1, block_size=16)
    dims = ({0: torch.export.Dim("B", max=8), 1: torch.export.Dim("T", max=16)},)
    program = torch.export.export(model, (_idx(2, 6),), dynamic_shapes=dims)
    for b, t in ((1, 1), (3, 16), (2, 9)):
        x = _idx(b, t)
        with torch.no_grad():
            torch.testing.assert_close(program.module()(x)[0], model(x)[0], atol=1e-6, rtol=1e-6)
    with pytest.raises(Exception, match=r"<= 16"):
        program.module()(_idx(1, 17))


def test_vit_serves_in_bfloat16_and_reloads_from_a_weights_only_state_dict():
    """A ViT of mixed heads: bfloat16 near float64, the ``weights_only=True`` state dict bit for bit."""
    torch.manual_seed(0)
    config = ViTConfig(input_size=(8, 8), patch_size=2, in_channels=2, num_classes=3, dim=16, depth=2, num_heads=4,
                       heads="attention:1,laplacian:1,heat(t=0.7, steps=3, learnable=True):1,ppr-exact(alpha=0.2):1")
    model = DiffusionViT(config).eval()
    x = torch.randn(3, 2, 8, 8, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        ref = copy.deepcopy(model).double()(x.double())
        low = copy.deepcopy(model).bfloat16()(x.bfloat16())
        out = model(x)
    assert low.dtype == torch.bfloat16 and (low.double() - ref).abs().max() < 0.03
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    torch.manual_seed(5)
    fresh = DiffusionViT(config).eval()
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    with torch.no_grad():
        assert torch.equal(fresh(x), out)


# ----------------------------------------------------------------------------------- torch.jit.trace
NON_POLYNOMIAL = [name for name in list_operators() if not operator_class(name).is_polynomial]


class _Logits(nn.Module):
    """``model(idx)[0]``: a traced module returns tensors only (GPT's ``(logits, None)`` holds a None)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(idx)[0]


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
@pytest.mark.filterwarnings("ignore:`torch.jit.trace:DeprecationWarning")  # deprecated in torch 2.13, still supported
@pytest.mark.parametrize("name", NON_POLYNOMIAL)
def test_bug_jit_trace_of_a_model_with_a_non_polynomial_operator(name):
    """Bug: ``torch.jit.trace`` of any module holding a non-polynomial operator (``heat-exact``, ``ppr-exact``, every
    context rival) failed before tracing with that operator's "NotImplementedError: ... is not a polynomial in P":
    torch asks ``hasattr`` of every name ``dir()`` lists on every submodule (``module_has_exports``), and such an
    operator's ``degree`` property raises, which ``hasattr`` does not catch. ``dir()`` of a non-polynomial operator
    no longer lists ``degree``; the traced GPT equals the eager one at another batch size and length."""
    model = _gpt(_spec(name), block_size=16)
    with torch.no_grad():
        traced = torch.jit.trace(_Logits(model), (_idx(2, 6),))  # raised
        x = _idx(3, 11)
        torch.testing.assert_close(traced(x), model(x)[0], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("name", list_operators())
def test_bug_degree_is_listed_only_where_it_exists(name):
    """Bug: ``dir()`` of a non-polynomial operator listed ``degree``, a property that raises NotImplementedError, so
    every tool that reads the names ``dir()`` lists (``hasattr``, ``inspect.getmembers``, torch.jit.trace) failed on
    it. Now ``degree`` is in ``dir()`` of a polynomial operator only; a non-polynomial one's property still raises its
    NotImplementedError with the reason when read (only the listing changed), and the rest of ``dir()`` is kept."""
    import inspect

    kw = operator_class(name).example_kwargs
    from diffusionformer.operators import build_operator

    op = build_operator(name, **kw)
    names = dir(op)
    assert {"coefficients", "spec_kwargs", "forward", "num_heads"} <= set(names)
    if op.is_polynomial:
        assert "degree" in names and isinstance(op.degree, int)
    else:
        assert "degree" not in names
        assert dict(inspect.getmembers(op))["num_heads"] == 1
        with pytest.raises(NotImplementedError, match=rf"^{name} |differential attention "):
            op.degree  # noqa: B018


def test_bug_rollout_function_called_with_a_model_and_an_input():
    """Bug: ``attention_rollout(model, x)`` (the function, called as the method is) printed the whole input tensor in
    "expected residual in (0, 1], got tensor([...])". Now a TypeError pointing at ``model.attention_rollout(x)``; a
    tensor ``residual`` is named by its shape."""
    from diffusionformer.models.vit import attention_rollout

    model = torch.nn.Linear(2, 2)
    x = torch.randn(2, 3, 8, 8)
    with pytest.raises(TypeError, match=r"got a Linear \(for a model's rollout of an input, call model\.attention_ro"):
        attention_rollout(model, x)
    P = torch.softmax(torch.randn(1, 2, 3, 3), -1)
    with pytest.raises(TypeError, match=r"residual a float in \(0, 1\], got a Tensor of shape \(2, 3, 8, 8\)$"):
        attention_rollout([P], x)
