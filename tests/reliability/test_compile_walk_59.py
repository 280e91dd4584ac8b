"""Walk of a performance engineer with ``torch.compile`` on CPU (dynamo's ``aot_eager`` back-end: capture and AOT
autograd, no C++ code generation), in float64 against eager mode: a compiled decoding step and blocks compiled one by
one recompiled per step / per layer (two Python ints fixed to their values), and performance.md's claim that
compiling warns about the engine's ``lru_cache`` helpers, which it no longer does.

Checked and found as documented (no test added here, the suite already pins them): ``fullgraph=True`` of the layer
with every head kind, GPT, ViT and the graph transformer; outputs and gradients equal to eager; one recompile (then a
dynamic graph) when the batch or the sequence length changes; dropout on ``P`` under compile drawing the eager masks
for one seed; train/eval switches; ``torch.export`` of the layer, ViT and graph transformer.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from diffusionformer import DiffusionAttention
from diffusionformer.models.gpt import DiffusionGPT, GPTConfig

PERFORMANCE = Path(__file__).resolve().parents[2] / "docs" / "performance.md"

pytestmark = pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")


@pytest.mark.slow
@pytest.mark.parametrize("heads", ["attention:2", "attention:1,heat(t=0.5, steps=2, learnable=True):1"])
def test_bug_compiled_forward_cached_recompiled_at_every_decoding_step(heads):
    """Bug: ``torch.compile(model.forward_cached)`` compiled a new graph at every decoding step, so the recompile
    limit (8) was hit after a few tokens and decoding fell back to eager mode (an error with ``fullgraph=True``).
    The check that every layer cache holds the same number of tokens took ``len(set(lengths))``: hashing a symbolic
    length fixed it to its value, so each cache length became a graph of its own. The lengths are now compared in
    turn: after the prompt and the first steps (static, then dynamic in the cache length) no step compiles."""
    torch._dynamo.reset()  # an empty cache: no earlier test's graphs count against the recompile limit
    torch.manual_seed(0)
    model = DiffusionGPT(GPTConfig(vocab_size=11, block_size=32, n_layer=2, n_head=2, n_embd=16, heads=heads))
    model = model.double().eval()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model.forward_cached, backend=counter)
    want_cache, got_cache = model.new_cache(), model.new_cache()
    with torch.no_grad():
        prompt = torch.randint(0, 11, (2, 4))
        torch.testing.assert_close(compiled(prompt, got_cache), model.forward_cached(prompt, want_cache))
        for step in range(10):
            if step == 3:
                compiled_before = counter.frame_count
            token = torch.randint(0, 11, (2, 1))
            torch.testing.assert_close(compiled(token, got_cache), model.forward_cached(token, want_cache))
    assert counter.frame_count == compiled_before, "later decoding steps compiled new graphs"
    assert [c.length for c in got_cache] == [c.length for c in want_cache] == [14, 14]


def test_bug_docs_said_compiling_warns_about_lru_cache_helpers():
    """Doc bug: performance.md's torch.compile section said that dynamo warns once per call site that it traces the
    engine's ``functools.lru_cache`` helpers, and that the warnings are harmless; since the helpers run unwrapped
    while dynamo traces (``ops.engine._dynamo_traces``) compiling warns nothing (it would be an error under
    ``-W error``). The page now says so; the compile below, a layer with affine, ``K``-step and learned heads (forward
    and backward), pins the behaviour."""
    torch._dynamo.reset()  # a graph compiled before would not be traced again, and warn nothing for that reason
    torch.manual_seed(1)
    layer = DiffusionAttention(16, 4, "attention:1,laplacian:1,heat(t=0.5, steps=3, learnable=True):1,"
                               "ppr(alpha=0.2, steps=2):1", causal=True).double()
    x = torch.randn(2, 5, 16, dtype=torch.float64, requires_grad=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.compile(layer, fullgraph=True, backend="aot_eager")(x).sum().backward()
    assert not [str(w.message) for w in caught if "lru_cache" in str(w.message)]
    text = " ".join(PERFORMANCE.read_text().split())
    assert "Dynamo warns once per call site" not in text
    assert "compiling does not warn" in text


@pytest.mark.slow
def test_bug_blocks_compiled_one_by_one_recompiled_per_layer_with_differential_heads():
    """Bug: compiling each block of a model on its own (``for b in model.blocks: b.compile(...)``, regional
    compilation: the blocks share one code object and graph) compiled one graph per layer with differential attention,
    and a deeper model than dynamo's recompile limit (8) failed with ``fullgraph=True`` (ran its later blocks eagerly
    without it). The ``lambda_init`` schedule ``0.8 - 0.6 exp(-0.3 l)`` read the layer index from the
    :class:`LayerState`, a symbolic int there, through ``math.exp``, which fixed it to its value. While compiling, the
    schedule is now the power ``0.8 - 0.6 (e^{-0.3})^l``, which keeps the depth symbolic: two graphs (depth 0, then
    any depth), as for the other heads; outputs and gradients equal eager mode's."""
    torch._dynamo.reset()
    torch.manual_seed(2)
    model = DiffusionGPT(GPTConfig(vocab_size=11, block_size=8, n_layer=10, n_head=2, n_embd=16,
                                   heads="attention:1,differential:1")).double()
    idx, targets = torch.randint(0, 11, (2, 8)), torch.randint(0, 11, (2, 8))

    def loss_and_grads():
        model.zero_grad(set_to_none=True)
        logits, loss = model(idx, targets)
        loss.backward()
        return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    want, want_grads = loss_and_grads()
    counter = CompileCounterWithBackend("aot_eager")
    for block in model.blocks:
        block.compile(backend=counter, fullgraph=True)
    got, got_grads = loss_and_grads()
    assert counter.frame_count <= 3  # depth 0, then a symbolic depth (and at most one restart of dynamo's analysis)
    torch.testing.assert_close(got, want)
    assert got_grads.keys() == want_grads.keys() and any("lambda_q1" in n for n in got_grads)
    for name, g in want_grads.items():
        torch.testing.assert_close(got_grads[name], g, msg=lambda m: f"gradient of {name}: {m}")
