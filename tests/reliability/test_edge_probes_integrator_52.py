"""Edge probes (sitting 52j): our layers and models inside someone else's training stack.

The persona runs :class:`~diffusionformer.nn.DiffusionAttention`, :class:`~diffusionformer.models.DiffusionGPT`,
:class:`~diffusionformer.models.DiffusionViT` and :class:`~diffusionformer.models.DiffusionGraphTransformer` in
plain PyTorch loops (as Lightning or accelerate would run them), never through our trainer or runner. Each check
compares with an independent reference: the same computation without the feature, or torch's own module where
the math coincides (:class:`torch.nn.MultiheadAttention` for all-attention heads).
"""

from __future__ import annotations

import copy
import io
import pickle
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from diffusionformer.models import (
    DiffusionGPT,
    DiffusionGraphTransformer,
    DiffusionViT,
    GPTConfig,
    GraphTransformerConfig,
    ViTConfig,
)
from diffusionformer.nn import Block, DiffusionAttention, LayerState

SPECS = ["attention:4", "attention:2,laplacian:2", "heat(t=0.5, learnable=True):2,attention:2", "differential:4",
         "heat-exact(learnable=True):2,attention:2", "polynomial(steps=2):4"]


def _gpt(**kw) -> DiffusionGPT:
    return DiffusionGPT(GPTConfig(**{**dict(vocab_size=50, block_size=16, n_layer=2, n_head=4, n_embd=32), **kw}))


def _perturb(m: nn.Module) -> None:
    """Move every parameter off its initial value (a 'trained' model: learned operator parameters included)."""
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))


def _ids(seed: int = 0, shape: tuple[int, int] = (4, 12)) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 50, shape, generator=g), torch.randint(0, 50, shape, generator=g)


# ---------------------------------------------------------------------------------------------------- bugs
def _gpt_loss_checkpointed(m: DiffusionGPT, idx: torch.Tensor, tgt: torch.Tensor, blocks: tuple[int, ...],
                           reentrant: bool) -> torch.Tensor:
    """A user's own loop over ``m.blocks`` (as DiffusionGPT.forward), with ``checkpoint`` around some blocks."""
    x = m._embed(idx)
    state = LayerState()
    for i, block in enumerate(m.blocks):
        if i in blocks:
            x = checkpoint(lambda x, b=block: b(x, state=state), x, use_reentrant=reentrant)
        else:
            x = block(x, state=state)
    return F.cross_entropy(m.lm_head(m.norm(x)).flatten(0, 1), tgt.flatten())


@pytest.mark.parametrize("heads", ["neutreno:4", {0: "attention:4", 1: "value-residual:4", 2: "value-residual:4"}])
def test_reentrant_checkpoint_of_the_first_block_alone_refuses_to_lose_the_first_values_gradient(heads):
    """Bug: reentrant checkpointing (``use_reentrant=True``) of the first block alone, the later blocks reading its
    values (NeuTRENO's ``v0``, ResFormer's ``V_1``) outside the checkpoint, gave silently wrong gradients: the
    checkpoint ran the first block without autograd, so the values ``LayerState`` kept had no graph, the later
    layers read them with autograd on, and the gradient through them never reached the first block, the embeddings
    or the positional table (the existing guard raised only when the *reading* layer was checkpointed). Now the
    reading layer raises a RuntimeError naming use_reentrant=False before any gradient is formed; non-reentrant
    checkpointing (the reference: gradients equal to no checkpointing) is unchanged."""
    torch.manual_seed(0)
    m = _gpt(n_layer=3, heads=heads)
    idx, tgt = _ids()
    ref = torch.autograd.grad(_gpt_loss_checkpointed(m, idx, tgt, (), False), list(m.parameters()))
    got = torch.autograd.grad(_gpt_loss_checkpointed(m, idx, tgt, (0,), False), list(m.parameters()))
    for (name, _), a, b in zip(m.named_parameters(), ref, got):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-4, msg=name)
    m.zero_grad(set_to_none=True)
    with pytest.raises(RuntimeError, match="use_reentrant=False"):
        _gpt_loss_checkpointed(m, idx, tgt, (0,), True).backward()


def test_first_values_recorded_without_autograd_pass_when_nothing_needs_their_gradient():
    """The guard above is no false alarm: a frozen stem run under ``torch.no_grad`` (its output has no gradient),
    inference under ``no_grad``, a hand-built state and reentrant checkpointing of a part whose layers read
    nothing run as before."""
    torch.manual_seed(0)
    m = _gpt(n_layer=3, heads="neutreno:4")
    idx, tgt = _ids()
    x = m._embed(idx)
    state = LayerState()
    with torch.no_grad():
        h = m.blocks[0](x, state=state)  # a frozen stem
    for block in m.blocks[1:]:
        h = block(h, state=state)
    F.cross_entropy(m.lm_head(m.norm(h)).flatten(0, 1), tgt.flatten()).backward()
    assert m.blocks[2].attn.qkv.weight.grad is not None and m.blocks[0].attn.qkv.weight.grad is None
    with torch.no_grad():
        assert torch.isfinite(m(idx, tgt)[1])
    plain = _gpt(n_layer=3, heads={0: "attention:4", 1: "attention:4", 2: "differential:4"})
    _gpt_loss_checkpointed(plain, idx, tgt, (0,), True).backward()  # differential reads the depth only


# ---------------------------------------------------------------------------------------------------- save / copy
@pytest.mark.parametrize("spec", SPECS)
def test_whole_layer_save_load_deepcopy_pickle_keep_outputs(spec):
    torch.manual_seed(0)
    a = DiffusionAttention(32, 4, spec)
    _perturb(a)
    a.eval()
    x = torch.randn(2, 7, 32)
    ref = a(x)
    buf = io.BytesIO()
    torch.save(a, buf)
    buf.seek(0)
    for b in (torch.load(buf, weights_only=False), copy.deepcopy(a), pickle.loads(pickle.dumps(a))):
        assert torch.equal(b(x), ref)
        assert [n for n, _ in b.named_parameters()] == [n for n, _ in a.named_parameters()]
    b = copy.deepcopy(a)
    with torch.no_grad():
        for p in b.parameters():
            p.zero_()
    assert torch.equal(a(x), ref)  # the copy shares nothing


def _model_cases():
    gx = torch.randn(10, 16)
    ei = torch.randint(0, 10, (2, 30), generator=torch.Generator().manual_seed(0))
    ei = ei[:, (ei[0] < 5) == (ei[1] < 5)]
    batch = torch.tensor([0] * 5 + [1] * 5)
    idx, _ = _ids(shape=(2, 12))
    img = torch.randn(2, 1, 28, 28)
    return [
        (lambda: _gpt(heads="heat(t=0.5, learnable=True):2,attention:2", rope=True, n_kv_head=2), lambda m: m(idx)[0]),
        (lambda: _gpt(heads="differential:4", tie_weights=False, mlp="swiglu"), lambda m: m(idx)[0]),
        (lambda: DiffusionViT(ViTConfig(dim=32, depth=2, num_heads=4, heads="attention:2,laplacian:2", rope=True,
                                        layer_scale=0.1)), lambda m: m(img)),
        (lambda: DiffusionGraphTransformer(GraphTransformerConfig(
            dim=32, depth=2, num_heads=4, task="graph", global_attention=True, heads="heat(learnable=True):4")),
         lambda m: m(gx, ei, batch)),
    ]


@pytest.mark.parametrize("case", range(4))
def test_models_round_trip_through_torch_save_deepcopy_pickle_state_dict_and_meta(case):
    make, run = _model_cases()[case]
    torch.manual_seed(0)
    m = make()
    _perturb(m)
    m.eval()
    ref = run(m)
    buf = io.BytesIO()
    torch.save(m, buf)
    buf.seek(0)
    copies = [torch.load(buf, weights_only=False), copy.deepcopy(m), pickle.loads(pickle.dumps(m))]
    assert pickle.loads(pickle.dumps(m.config)) == m.config  # configs travel to spawned workers
    fresh = make().eval()
    fresh.load_state_dict(m.state_dict(), strict=True)  # trained -> fresh
    copies.append(fresh)
    with torch.device("meta"):
        meta = make()
    meta.load_state_dict(m.state_dict(), strict=True, assign=True)
    copies.append(meta.eval())
    n = sum(1 for _ in m.parameters())
    for c in copies:
        assert torch.equal(run(c), ref)
        assert sum(1 for _ in c.parameters()) == n  # ties kept
        assert not any(t.is_meta for t in (*c.parameters(), *c.buffers()))
    back = copy.deepcopy(m)
    back.load_state_dict(make().state_dict(), strict=True)  # fresh -> trained
    assert not torch.equal(run(back), ref)


def test_state_dict_loads_under_weights_only():
    m = _gpt(heads="heat(t=0.5, learnable=True):2,differential:2")
    buf = io.BytesIO()
    torch.save(m.state_dict(), buf)
    buf.seek(0)
    _gpt(heads="heat(t=0.5, learnable=True):2,differential:2").load_state_dict(torch.load(buf, weights_only=True))


# ---------------------------------------------------------------------------------------------------- autograd
@pytest.mark.parametrize("spec", ["attention:2,laplacian:2", "heat(t=0.5, learnable=True):2,attention:2",
                                  "differential:4", "heat-exact(learnable=True):2,attention:2"])
def test_checkpoint_around_a_layer_gives_the_gradients_of_no_checkpointing(spec):
    torch.manual_seed(0)
    a = DiffusionAttention(32, 4, spec)
    x0 = torch.randn(2, 6, 32)

    def grads(reentrant):
        a.zero_grad(set_to_none=True)
        x = x0.clone().requires_grad_()
        y = a(x) if reentrant is None else checkpoint(a, x, use_reentrant=reentrant)
        y.square().sum().backward()
        return [x.grad, *(p.grad for p in a.parameters())]

    ref = grads(None)
    for reentrant in (False, True):
        for g, r in zip(grads(reentrant), ref):
            torch.testing.assert_close(g, r, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("heads", [None, "heat(t=0.5, learnable=True):2,attention:2", "neutreno:4"])
def test_non_reentrant_checkpoint_of_every_gpt_block_with_dropout_matches(heads):
    torch.manual_seed(0)
    m = _gpt(n_layer=3, heads=heads, dropout=0.1).train()
    idx, tgt = _ids()
    torch.manual_seed(1)
    ref = torch.autograd.grad(_gpt_loss_checkpointed(m, idx, tgt, (), False), list(m.parameters()))
    torch.manual_seed(1)
    got = torch.autograd.grad(_gpt_loss_checkpointed(m, idx, tgt, (0, 1, 2), False), list(m.parameters()))
    for a, b in zip(ref, got):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-4)


def test_deterministic_algorithms_and_anomaly_mode_run_and_repeat_bitwise():
    idx, tgt = _ids()
    gx = torch.randn(10, 16)
    ei = torch.randint(0, 10, (2, 30), generator=torch.Generator().manual_seed(0))

    def train(make, loss):
        torch.manual_seed(0)
        m = make()
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        for _ in range(2):
            opt.zero_grad()
            loss(m).backward()
            opt.step()
        return torch.cat([p.detach().flatten() for p in m.parameters()])

    cases = [(lambda: _gpt(heads="heat(t=0.5, learnable=True):2,differential:2", dropout=0.1),
              lambda m: m(idx, tgt)[1]),
             (lambda: DiffusionGraphTransformer(GraphTransformerConfig(dim=32, depth=2, num_heads=4, attn_dropout=0.1,
                                                                       global_attention=True)),
              lambda m: m(gx, ei).square().mean())]
    torch.use_deterministic_algorithms(True)
    try:
        for make, loss in cases:
            assert torch.equal(train(make, loss), train(make, loss))
            with warnings.catch_warnings(), torch.autograd.set_detect_anomaly(True):
                warnings.simplefilter("ignore")
                train(make, loss)
    finally:
        torch.use_deterministic_algorithms(False)


# ---------------------------------------------------------------------------------------------------- precision
def test_autocast_bf16_gradscaler_fp16_and_half_models_on_cpu():
    torch.manual_seed(0)
    idx, tgt = _ids()
    m = _gpt(heads="heat(t=0.5, learnable=True):2,attention:2")
    with torch.no_grad():
        ref = m(idx, tgt)[1]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert abs(m(idx, tgt)[1].item() - ref.item()) < 2e-2
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    for _ in range(2):
        with torch.autocast("cpu", dtype=torch.float16):
            loss = m(idx, tgt)[1]
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in m.parameters())
    for dtype in (torch.float16, torch.bfloat16):
        h = copy.deepcopy(m).to(dtype)
        with torch.no_grad():
            assert abs(h(idx, tgt)[1].item() - m(idx, tgt)[1].item()) < 3e-2
        h(idx, tgt)[1].backward()


def test_vit_channels_last_gives_the_contiguous_output():
    torch.manual_seed(0)
    m = DiffusionViT(ViTConfig(input_size=(16, 16), in_channels=3, dim=32, depth=2, num_heads=4,
                               heads="heat(t=0.5, learnable=True):2,laplacian:2")).eval()
    img = torch.randn(2, 3, 16, 16)
    ref = m(img)
    cl = copy.deepcopy(m).to(memory_format=torch.channels_last)
    torch.testing.assert_close(cl(img.to(memory_format=torch.channels_last)), ref, atol=1e-5, rtol=1e-5)


def test_compile_dynamic_over_sequence_lengths_one_graph_equal_to_eager():
    torch._dynamo.reset()
    from torch._dynamo.utils import counters

    counters.clear()
    torch.manual_seed(0)
    m = _gpt(block_size=32, n_layer=1, heads="heat(t=0.5, learnable=True):2,laplacian:2")
    c = copy.deepcopy(m)
    cm = torch.compile(c, dynamic=True, backend="aot_eager")
    for n in (5, 9, 17):
        idx, tgt = _ids(n, (2, n))
        m.zero_grad()
        c.zero_grad()
        ref = m(idx, tgt)[1]
        ref.backward()
        got = cm(idx, tgt)[1]
        got.backward()
        torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-6)
        for a, b in zip(m.parameters(), c.parameters()):
            torch.testing.assert_close(b.grad, a.grad, atol=1e-5, rtol=1e-5)
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    torch._dynamo.reset()


# ---------------------------------------------------------------------------------------------------- training loop
def test_frozen_backbone_fine_tuning_touches_only_the_trainable_parameters():
    torch.manual_seed(0)
    m = _gpt(heads="heat(t=0.5, learnable=True):2,differential:2", tie_weights=False)
    m.requires_grad_(False)
    m.lm_head.requires_grad_(True)
    m.blocks[1].attn.operators.requires_grad_(True)
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.1)
    idx, tgt = _ids()
    m(idx, tgt)[1].backward()
    opt.step()
    assert all(p.grad is None for p in m.parameters() if not p.requires_grad)
    changed = {n for n, p in m.named_parameters() if not torch.equal(p, before[n])}
    assert changed == {n for n, p in m.named_parameters() if p.requires_grad}


def test_shared_layers_and_projections_count_once_and_survive_save():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 32)
    b = DiffusionAttention(32, 4, "attention:2,laplacian:2")
    c = DiffusionAttention(32, 4, "heat(learnable=True):4")
    c.qkv, c.out_proj = b.qkv, b.out_proj
    pair = nn.ModuleList([b, c])
    assert len(list(pair.parameters())) == 5  # qkv, out_proj (weight, bias) once, and heat's t
    y = c(b(x))
    y.sum().backward()
    buf = io.BytesIO()
    torch.save(pair, buf)
    buf.seek(0)
    back = torch.load(buf, weights_only=False)
    assert back[0].qkv is back[1].qkv
    assert torch.equal(back[1](back[0](x)), y)


def test_forward_hooks_see_the_documented_outputs_and_match_multihead_attention():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(32, 4, batch_first=True)
    a = DiffusionAttention.from_multihead_attention(mha)
    x = torch.randn(2, 6, 32)
    kpm = torch.zeros(2, 6, dtype=torch.bool)
    kpm[0, 4:] = True
    seen = []
    a.register_forward_hook(lambda mod, inp, out: seen.append(out))
    torch.testing.assert_close(a(x, key_padding_mask=kpm), mha(x, x, x, key_padding_mask=kpm, need_weights=False)[0],
                               atol=1e-6, rtol=1e-6)
    a(x, return_intermediates=True)
    assert isinstance(seen[0], torch.Tensor) and isinstance(seen[1], tuple) and seen[1][0].shape == x.shape
    h = a.register_forward_hook(lambda mod, inp, out: out * 2)
    doubled = a(x)
    h.remove()
    torch.testing.assert_close(doubled, 2 * a(x))


def test_apply_reinit_clip_grad_norm_zero_grad_and_accumulation():
    torch.manual_seed(0)
    idx, tgt = _ids()
    m = _gpt(heads="heat(t=0.5, learnable=True):2,differential:2")

    def init(mod):
        if isinstance(mod, (nn.Linear, nn.Embedding)):
            nn.init.normal_(mod.weight, 0.0, 0.02)

    m.apply(init)
    assert m.lm_head.weight is m.tok_emb.weight
    m(idx, tgt)[1].backward()
    assert all(p.grad is not None and not p.grad.is_sparse for p in m.parameters())
    full = {n: p.grad.clone() for n, p in m.named_parameters()}  # the big batch's gradient
    total = torch.nn.utils.clip_grad_norm_(m.parameters(), 0.1, error_if_nonfinite=True)
    torch.testing.assert_close(total, torch.linalg.vector_norm(torch.cat([g.flatten() for g in full.values()])))
    m.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in m.parameters())
    m(idx, tgt)[1].backward()
    m.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for p in m.parameters())
    for i in range(2):  # two micro-batches of half the batch, each loss halved: the big batch's mean gradient
        (m(idx[2 * i : 2 * i + 2], tgt[2 * i : 2 * i + 2])[1] / 2).backward()
    for n, p in m.named_parameters():
        torch.testing.assert_close(p.grad, full[n], atol=1e-6, rtol=1e-4, msg=n)


def test_parameter_names_do_not_depend_on_calls_or_construction():
    for make in (lambda: _gpt(heads="differential:2,heat(learnable=True):2"),
                 lambda: DiffusionViT(ViTConfig(dim=32, depth=2, num_heads=4, heads="differential:4"))):
        names = [n for n, _ in make().named_parameters()]
        m = make()
        m(_ids()[0]) if isinstance(m, DiffusionGPT) else m(torch.randn(1, 1, 28, 28))
        assert [n for n, _ in m.named_parameters()] == names
        with torch.device("meta"):
            assert [n for n, _ in make().named_parameters()] == names
    assert "attn.operators.0.lambda_q1" in dict(Block(32, 4, "differential:4").named_parameters())


def test_state_dict_names_are_pinned():
    """The names a user's checkpoint holds (Lightning, accelerate): fixed strings, the same in every release."""
    gpt = _gpt(n_layer=1, heads="heat(learnable=True):2,differential:2")
    assert list(gpt.state_dict()) == [
        "tok_emb.weight", "pos_emb.weight", "blocks.0.norm1.weight", "blocks.0.norm1.bias", "blocks.0.attn.qkv.weight",
        "blocks.0.attn.qkv.bias", "blocks.0.attn.out_proj.weight", "blocks.0.attn.out_proj.bias",
        "blocks.0.attn.operators.0.t", "blocks.0.attn.operators.1.lambda_q1", "blocks.0.attn.operators.1.lambda_k1",
        "blocks.0.attn.operators.1.lambda_q2", "blocks.0.attn.operators.1.lambda_k2",
        "blocks.0.attn.operators.1.subln.weight", "blocks.0.norm2.weight", "blocks.0.norm2.bias",
        "blocks.0.mlp.fc1.weight", "blocks.0.mlp.fc1.bias", "blocks.0.mlp.fc2.weight", "blocks.0.mlp.fc2.bias",
        "norm.weight", "norm.bias", "lm_head.weight"]
    vit = DiffusionViT(ViTConfig(dim=32, depth=1, num_heads=4))
    assert list(vit.state_dict())[:4] == ["cls_token", "pos_embed", "patch_embed.weight", "patch_embed.bias"]
    assert list(vit.state_dict())[-2:] == ["head.weight", "head.bias"]
    gt = DiffusionGraphTransformer(GraphTransformerConfig(dim=32, depth=1, num_heads=4, global_attention=True))
    assert {"embed.weight", "blocks.0.attn.qkv.weight", "blocks.0.global_attn.out_proj.bias", "head.bias"} <= set(
        gt.state_dict())


def test_kv_cache_survives_deepcopy_pickle_and_torch_save():
    """Beam search copies a cache per beam: every copy continues the decoding as the full forward pass."""
    torch.manual_seed(0)
    m = _gpt(heads="heat(t=0.5, learnable=True):2,neutreno:2", rope=True).eval()
    idx, _ = _ids(shape=(2, 8))
    with torch.no_grad():
        full = m(idx)[0][:, 5:]
        cache = m.new_cache()
        m.forward_cached(idx[:, :5], cache)
        buf = io.BytesIO()
        torch.save(cache, buf)
        buf.seek(0)
        copies = [copy.deepcopy(cache), pickle.loads(pickle.dumps(cache)), torch.load(buf, weights_only=False), cache]
        for c in copies:
            torch.testing.assert_close(m.forward_cached(idx[:, 5:], c), full, atol=1e-5, rtol=1e-5)
