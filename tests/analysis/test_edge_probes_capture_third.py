"""Edge probes of capture_dataset (third pass): torch.compile wrappers, per-token outputs, float64 hand references."""

from __future__ import annotations

import copy
import math
import warnings

import torch

from diffusionformer.analysis import capture_dataset
from diffusionformer.models import DiffusionGPT, GPTConfig


def _gpt(**kw):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    return DiffusionGPT(GPTConfig(vocab_size=13, block_size=8, n_layer=2, n_head=2, n_embd=16, **kw))


def _no_hooks(model: torch.nn.Module) -> bool:
    return all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_bug_a_compiled_model_that_already_ran_is_captured():
    """Bug: a torch.compile'd model that had run once skipped the capture hooks: "layers [0, 1, 2] were not recorded"."""
    gpt = _gpt()
    ids = torch.randint(0, 13, (5, 8), generator=torch.Generator().manual_seed(1))
    ref = capture_dataset(gpt, [ids], attentions=True, keep_outputs=True)
    compiled = torch.compile(gpt, backend="eager")
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        compiled.eval()
        compiled(ids)  # warm: dynamo does not guard on hooks registered later
        got = capture_dataset(compiled, [ids], attentions=True, keep_outputs=True)
    assert got.layers == ref.layers
    for layer in ref.layers:
        torch.testing.assert_close(got.states[layer], ref.states[layer])
    for i in ref.attentions:
        torch.testing.assert_close(got.attentions[i], ref.attentions[i])
    torch.testing.assert_close(got.outputs, ref.outputs)
    assert got.extra["model"] == "DiffusionGPT"  # the model class, not the wrapper's "OptimizedModule"
    assert _no_hooks(gpt)


def test_bug_per_token_outputs_of_batches_of_different_lengths_are_padded():
    """Bug: keep_outputs with GPT batches of lengths 8 and 5 crashed in torch.cat ("Sizes of tensors must match")."""
    gpt = _gpt().eval()
    g = torch.Generator().manual_seed(2)
    a, b = torch.randint(0, 13, (2, 8), generator=g), torch.randint(0, 13, (3, 5), generator=g)
    cap = capture_dataset(gpt, [a, b], max_examples=4, keep_outputs=True)
    with torch.no_grad():
        want_a, want_b = gpt(a)[0], gpt(b[:2])[0]  # (logits, loss)
    assert cap.outputs.shape == (4, 8, 13)
    torch.testing.assert_close(cap.outputs[:2], want_a)
    torch.testing.assert_close(cap.outputs[2:, :5], want_b)
    assert cap.outputs[2:, 5:].abs().max() == 0
    assert cap.mask is not None and cap.mask.sum(1).tolist() == [8, 8, 5, 5]


def test_pins_gpt_states_and_causal_attention_equal_a_float64_hand_run():
    """States = the blocks run by hand in float64 on the embeddings; P = causal softmax(q k^T / sqrt(C)) from qkv."""
    gpt = _gpt(heads="attention:2")
    ids = torch.randint(0, 13, (5, 8), generator=torch.Generator().manual_seed(3))
    gpt.train()
    grads = [p.requires_grad for p in gpt.parameters()]
    cap = capture_dataset(gpt, [ids[:3], ids[3:]], attentions=True, max_examples=4, max_attention_examples=3)
    assert gpt.training and grads == [p.requires_grad for p in gpt.parameters()] and _no_hooks(gpt)
    m = copy.deepcopy(gpt).double().eval()
    x, B, T, H, C = ids[:4], 4, 8, 2, 8
    with torch.no_grad():
        h = m.tok_emb(x) + m.pos_emb(torch.arange(T))
        want, Ps = [h], []
        for blk in m.blocks:
            q, k, _ = blk.attn.qkv(blk.norm1(h)).split(H * C, -1)
            q, k = q.view(B, T, H, C).transpose(1, 2), k.view(B, T, H, C).transpose(1, 2)
            s = (q @ k.transpose(-1, -2) / math.sqrt(C)).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1),
                                                                    -math.inf)
            Ps.append(s.softmax(-1))
            h = blk(h)
            want.append(h)
    assert all(cap.states[layer].dtype == torch.float32 and not cap.states[layer].requires_grad for layer in range(3))
    for layer in range(3):
        torch.testing.assert_close(cap.states[layer].double(), want[layer], atol=1e-5, rtol=1e-5)
    for i in range(2):
        assert cap.attentions[i].shape == (3, H, T, T) and cap.attentions[i].triu(1).abs().max() == 0
        torch.testing.assert_close(cap.attentions[i].double(), Ps[i][:3], atol=1e-6, rtol=1e-5)


def test_pins_bf16_autocast_capture_is_float32_and_repeatable():
    """Under bf16 autocast the stored states, maps and outputs are float32, causal maps stay zero above the diagonal,
    and a second capture is bit-identical."""
    gpt = _gpt()
    ids = torch.randint(0, 13, (3, 8), generator=torch.Generator().manual_seed(4))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        caps = [capture_dataset(gpt, [ids], attentions=True, keep_outputs=True) for _ in range(2)]
    for cap in caps:
        assert {x.dtype for x in cap.states.values()} == {torch.float32}
        assert cap.outputs.dtype == torch.float32 and not cap.outputs.requires_grad
        assert all(P.dtype == torch.float32 and P.triu(1).abs().max() == 0 for P in cap.attentions.values())
    for layer in caps[0].layers:
        assert torch.equal(caps[0].states[layer], caps[1].states[layer])
    for i in caps[0].attentions:
        assert torch.equal(caps[0].attentions[i], caps[1].attentions[i])
