"""Edge probes of ``torch.compile`` support: layers, models, value checks and the trainer's compile option.

Every compile uses dynamo's ``aot_eager`` back-end (dynamo capture and AOT autograd, no C++ code
generation) with ``fullgraph=True`` where the docs claim one graph, so a graph break is an error.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import pytest
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend

from diffusionformer import DiffusionAttention, list_operators
from diffusionformer.models.gpt import DiffusionGPT, GPTConfig
from diffusionformer.nn.heads import parse_heads
from diffusionformer.operators import operator_class
from diffusionformer.train import TrainConfig, Trainer, load_checkpoint, seed_everything

pytestmark = [pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`"),
              pytest.mark.usefixtures("fresh_dynamo")]  # tests/ops/conftest.py


def _out_and_grads(fn, model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    x.grad = None
    y = fn(x)
    (y * torch.linspace(-1.0, 1.0, y.numel(), dtype=y.dtype).view_as(y)).sum().backward()
    grads = {"x": x.grad.clone(), **{n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}}
    return y.detach(), grads


def _assert_compiles_like_eager(model: nn.Module, x: torch.Tensor) -> None:
    want, want_grads = _out_and_grads(model, model, x)
    counter = CompileCounterWithBackend("aot_eager")
    got, got_grads = _out_and_grads(torch.compile(model, fullgraph=True, backend=counter), model, x)
    assert counter.frame_count == 1
    torch.testing.assert_close(got, want)
    assert got_grads.keys() == want_grads.keys() and len(want_grads) > 1
    for name, g in want_grads.items():
        torch.testing.assert_close(got_grads[name], g, msg=lambda m: f"gradient of {name}: {m}")


class _Call(nn.Module):
    """A layer called with fixed keyword arguments (a mask, an edge_index)."""

    def __init__(self, layer: DiffusionAttention, **kwargs) -> None:
        super().__init__()
        self.layer = layer
        self.kwargs = kwargs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x, **self.kwargs)


_STATELESS = [n for n in list_operators() if not operator_class(n).needs_layer_state]


@pytest.mark.slow
@pytest.mark.parametrize("name", _STATELESS)
def test_every_operator_with_an_attn_mask_compiles_like_eager(name, example_spec):
    # the existing registry test covers causal and key padding; an explicit bool attn_mask goes another way
    torch.manual_seed(0)
    keep = torch.rand(5, 5, generator=torch.Generator().manual_seed(0)) > 0.4
    keep.fill_diagonal_(True)
    layer = DiffusionAttention(16, 2, f"attention:1,{example_spec(name)}:1").double()
    _assert_compiles_like_eager(_Call(layer, attn_mask=keep), torch.randn(2, 5, 16, dtype=torch.float64,
                                                                          requires_grad=True))


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in _STATELESS if operator_class(n).supports_sparse])
def test_every_sparse_operator_non_causal_compiles_like_eager(name, example_spec):
    torch.manual_seed(0)
    edge_index = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 2, 5, 1, 3, 0], [1, 2, 3, 4, 5, 6, 0, 0, 2, 6, 3, 0]])
    layer = DiffusionAttention(16, 2, f"attention:1,{example_spec(name)}:1").double()
    _assert_compiles_like_eager(_Call(layer, edge_index=edge_index), torch.randn(7, 16, dtype=torch.float64,
                                                                                 requires_grad=True))


def test_float_mask_rotary_gqa_layer_compiles_like_eager():
    from diffusionformer.nn.rotary import RotaryEmbedding

    torch.manual_seed(1)
    mask = torch.zeros(6, 6, dtype=torch.float64).masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(2), float("-inf"))
    layer = DiffusionAttention(16, 4, "attention:1,laplacian:1,heat(t=0.5, steps=3, learnable=True):1,"
                               "ppr-exact(alpha=0.2):1", rotary=RotaryEmbedding(4), num_kv_heads=2, qk_norm=True)
    _assert_compiles_like_eager(_Call(layer.double(), attn_mask=mask),
                                torch.randn(2, 6, 16, dtype=torch.float64, requires_grad=True))


def test_no_recompile_when_values_change_and_one_for_new_lengths():
    torch.manual_seed(2)
    layer = DiffusionAttention(16, 2, "laplacian:1,heat(t=0.5, steps=2, learnable=True):1", causal=True).double()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(layer, fullgraph=True, backend=counter)
    for n in (5, 6, 7, 9):  # the second length makes the graph dynamic in N; later ones reuse it
        x = torch.randn(2, n, 16, dtype=torch.float64)
        torch.testing.assert_close(compiled(x), layer(x))
    with torch.no_grad():
        layer.operators[1].t.mul_(3.0)  # a new value of a learned parameter: no guard on it
    torch.testing.assert_close(compiled(x), layer(x))
    assert counter.frame_count == 2


def test_value_checks_raise_in_eager_mode_and_are_skipped_compiled():
    # documented (ops._checks.checks_values): a NaN in a float attn_mask is a ValueError in eager mode on CPU;
    # compiled, there is no host read and the NaN flows through
    layer = DiffusionAttention(8, 2, "attention:1,heat(t=0.5, steps=2):1").double()
    x = torch.randn(1, 4, 8, dtype=torch.float64)
    mask = torch.zeros(4, 4, dtype=torch.float64)
    mask[1, 0] = float("nan")
    with pytest.raises(ValueError, match="float attn_mask"):
        layer(x, attn_mask=mask)
    out = torch.compile(_Call(layer, attn_mask=mask), fullgraph=True, backend="aot_eager")(x)
    assert torch.isnan(out).any()


@pytest.mark.parametrize("new", ["laplacian", "heat-exact(t=0.5, learnable=True)"])
def test_bug_replaced_operator_breaks_the_compiled_graph(new):
    """Bug: replacing an operator of a layer compiled with ``fullgraph=True`` (``layer.operators[i] = op``, which the
    layer documents to refresh its plan) made the next compiled call fail: ``_refresh_plan`` computed the highest
    degree with ``max(..., default=0)``, a keyword dynamo refuses (``Unsupported: invalid call to builtin op
    handler``), a graph break. Now ``max((0, *degrees))``, as the engine already does."""
    torch.manual_seed(3)
    layer = DiffusionAttention(16, 2, "attention:1,heat(t=0.5, steps=2):1").double()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x), layer(x))
    layer.operators[1] = parse_heads(f"{new}:1", 1)[0].operator.double()
    torch.testing.assert_close(compiled(x), layer(x))
    assert layer.head_operator_names[1] == new.split("(")[0]


def test_gpt_compiled_generate_equals_eager():
    # generate is not forward: the compiled wrapper hands it to the model itself (no compile, same tokens)
    torch.manual_seed(4)
    model = DiffusionGPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=3, n_embd=24,
                                   heads="attention:1,laplacian:1,heat(t=0.5, steps=3, learnable=True):1")).double()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter)
    idx = torch.randint(0, 11, (2, 3))
    for use_cache in (False, True):
        got = compiled.generate(idx, 6, temperature=0.0, use_cache=use_cache)
        assert torch.equal(got, model.generate(idx, 6, temperature=0.0, use_cache=use_cache))
    assert counter.frame_count == 0


class _AttnRegressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(3, 8)
        self.attn = DiffusionAttention(8, 2, "laplacian:1,heat(t=0.5, steps=2, learnable=True):1", causal=True)
        self.out = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        return self.out(h + self.attn(h)).squeeze(-1)


class _Stop(Exception):
    pass


class _SumTask:
    """Regress the sum of 3 features per token; ``stop_at`` raises at that step (a kill)."""

    def __init__(self, stop_at: int | None = None) -> None:
        self.stop_at = stop_at

    def train_batch(self, step, generator, batch_size):
        if step == self.stop_at:
            raise _Stop(step)
        x = torch.randn(batch_size, 4, 3, generator=generator)
        return {"x": x, "y": x.sum(-1)}

    def loss(self, model, batch):
        return F.mse_loss(model(batch["x"]), batch["y"]), {}

    def evaluate(self, model, max_batches):
        x = torch.randn(4, 4, 3, generator=torch.Generator().manual_seed(5))
        return {"loss": F.mse_loss(model(x), x.sum(-1)).item()}


def _config(**overrides) -> TrainConfig:
    base = dict(max_steps=5, batch_size=4, lr=1e-2, warmup_steps=1, eval_interval=0, log_interval=1,
                checkpoint_interval=2, seed=0, device="cpu", progress=False)
    return TrainConfig(**{**base, **overrides})


def _train(out, wrap: bool, *, stop_at=None, resume=False, compile_option=False) -> _AttnRegressor:
    seed_everything(7 if resume else 0)  # a resumed run's weights must come from the checkpoint
    model = _AttnRegressor()
    given = torch.compile(model, backend="aot_eager") if wrap else model
    try:
        Trainer(given, _SumTask(stop_at), _config(compile=compile_option), out, resume=resume).fit()
    except _Stop:
        pass
    return model


def _assert_same_weights(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        torch.testing.assert_close(sa[k], sb[k], rtol=0, atol=0, msg=k)


def test_compile_option_resumes_into_an_uncompiled_run_and_back(tmp_path, monkeypatch):
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kw: real_compile(model, backend="aot_eager"))
    reference = _train(tmp_path / "ref", False)
    for first, then in ((True, False), (False, True)):
        out = tmp_path / f"{first}-{then}"
        _train(out, False, stop_at=3, compile_option=first)
        assert list(load_checkpoint(out / "checkpoint.pt")["model"]) == list(reference.state_dict())
        _assert_same_weights(_train(out, False, resume=True, compile_option=then), reference)


def test_bug_trainer_saves_the_model_inside_a_compile_wrapper(tmp_path):
    """Bug: a model handed to the Trainer already compiled (``Trainer(torch.compile(model), ...)``) was saved as the
    wrapper: every checkpoint entry was named ``_orig_mod.<name>`` and the model record named
    ``OptimizedModule``, so the run could not be resumed into the model itself (ValueError "written by a different
    model") nor a ``compile=True`` / plain checkpoint into a compiled one (unexpected keys). The trainer now keeps
    the model inside the wrapper for checkpoints, resume and evaluation, and trains through the wrapper."""
    reference = _train(tmp_path / "ref", False)
    out = tmp_path / "wrapped"
    _train(out, True, stop_at=3)
    ckpt = load_checkpoint(out / "checkpoint.pt")
    assert list(ckpt["model"]) == list(reference.state_dict())
    assert ckpt["model_record"]["class"].endswith("_AttnRegressor")
    _assert_same_weights(_train(out, False, resume=True), reference)  # wrapped run -> the model itself
    out = tmp_path / "plain"
    _train(out, False, stop_at=3)
    _assert_same_weights(_train(out, True, resume=True), reference)  # plain run -> a wrapped model
