"""A language-model practitioner's walk (nanoGPT / HF-style decoding) through ``DiffusionGPT``, its KV cache,
its sampling filters, ``from_nanogpt``, the text data and the runner's checks, against independent references:
a plain float64 re-implementation of the causal forward with attention, ``I - P`` and heat heads, token-by-token
decoding against the full forward for every registered operator, a manual sampling loop, brute-force top-k /
top-p masks, the cross-entropy with ignored positions, the parameter count formula and a nanoGPT round trip."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from diffusionformer.models import DiffusionGPT, GPTConfig, top_k_filter, top_p_filter
from diffusionformer.operators import list_operators

_MODELS = str(Path(__file__).resolve().parents[1] / "models")


def _gpt(heads=None, **kw) -> DiffusionGPT:
    cfg = dict(vocab_size=17, block_size=9, n_layer=2, n_head=2, n_embd=16, heads=heads)
    cfg.update(kw)
    return DiffusionGPT(GPTConfig(**cfg))


def _reference_logits(model: DiffusionGPT, idx: torch.Tensor, kinds: list) -> torch.Tensor:
    """nanoGPT's forward written out in float64, each head applying its own matrix of its ``P``."""
    c = model.config
    D, H = c.n_embd, c.n_head
    C = D // H
    T = idx.shape[1]
    x = model.tok_emb.weight[idx] + model.pos_emb.weight[:T]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    eye = torch.eye(T, dtype=torch.float64)
    for b in model.blocks:
        h = F.layer_norm(x, (D,), b.norm1.weight, b.norm1.bias, 1e-5)
        q, k, v = (h @ b.attn.qkv.weight.T + b.attn.qkv.bias).split(D, -1)
        q, k, v = (t.view(*t.shape[:2], H, C).transpose(1, 2) for t in (q, k, v))
        P = torch.softmax((q @ k.transpose(-1, -2) / math.sqrt(C)).masked_fill(~causal, -math.inf), -1)
        heads = []
        for i, kind in enumerate(kinds):
            Ph = P[:, i]
            if kind == "attention":
                M = Ph
            elif kind == "laplacian":
                M = eye - Ph
            elif kind == "heat-exact":  # exp(-t (I - P)), t = 1
                M = torch.matrix_exp(-(eye - Ph))
            else:  # ("heat", K): the Poisson weights e^-t t^k / k! on P^0..P^K, t = 1
                M = math.exp(-1.0) * sum(torch.linalg.matrix_power(Ph, j) / math.factorial(j)
                                         for j in range(kind[1] + 1))
            heads.append(M @ v[:, i])
        o = torch.stack(heads, 1).transpose(1, 2).reshape(x.shape)
        x = x + o @ b.attn.out_proj.weight.T + b.attn.out_proj.bias
        h = F.layer_norm(x, (D,), b.norm2.weight, b.norm2.bias, 1e-5)
        x = x + F.gelu(h @ b.mlp.fc1.weight.T + b.mlp.fc1.bias) @ b.mlp.fc2.weight.T + b.mlp.fc2.bias
    return F.layer_norm(x, (D,), model.norm.weight, model.norm.bias, 1e-5) @ model.tok_emb.weight.T


def test_the_forward_equals_a_float64_reimplementation_with_mixed_heads():
    torch.manual_seed(0)
    model = DiffusionGPT(GPTConfig(vocab_size=19, block_size=12, n_layer=2, n_head=4, n_embd=32,
                                   heads="attention:1,laplacian:1,heat(steps=3):1,heat-exact:1")).double().eval()
    idx = torch.randint(0, 19, (2, 12))
    ref = _reference_logits(model, idx, ["attention", "laplacian", ("heat", 3), "heat-exact"])
    targets = torch.randint(0, 19, (2, 12))
    targets[0, :5] = -100  # ignored positions
    logits, loss = model(idx, targets)
    torch.testing.assert_close(logits, ref, rtol=0, atol=1e-12)
    keep = targets.flatten() != -100
    torch.testing.assert_close(loss, F.cross_entropy(ref.flatten(0, 1)[keep], targets.flatten()[keep]),
                               rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", list_operators())
def test_token_by_token_decoding_equals_the_full_forward_for_every_operator(name):
    torch.manual_seed(0)
    model = _gpt(f"attention:1,{name}:1", rope=True, n_kv_head=1).double().eval()
    idx = torch.randint(0, 17, (3, 9))
    cache = model.new_cache()
    rows = [model.forward_cached(idx[:, :3], cache)]
    rows += [model.forward_cached(idx[:, t : t + 1], cache) for t in range(3, 9)]
    torch.testing.assert_close(torch.cat(rows, 1), model(idx)[0], rtol=0, atol=1e-10)
    # past block_size the window slides and the cache is rebuilt: the tokens stay those of the uncached loop
    prompt = idx[:, :4]
    greedy = model.generate(prompt, 12, temperature=0)
    assert torch.equal(greedy, model.generate(prompt, 12, temperature=0, use_cache=True))
    kw = dict(temperature=0.9, top_k=5, top_p=0.8)
    assert torch.equal(model.generate(prompt, 12, generator=torch.Generator().manual_seed(3), **kw),
                       model.generate(prompt, 12, generator=torch.Generator().manual_seed(3), use_cache=True, **kw))


def test_seeded_generate_equals_a_manual_nanogpt_sampling_loop():
    torch.manual_seed(0)
    model = _gpt("attention:1,heat(steps=2):1").eval()
    prompt = torch.tensor([[1, 2], [3, 4]])
    out = model.generate(prompt, 12, temperature=0.7, top_k=4, generator=torch.Generator().manual_seed(5))
    g, idx = torch.Generator().manual_seed(5), prompt
    with torch.no_grad():
        for _ in range(12):
            logits = model(idx[:, -9:])[0][:, -1, :]
            probs = torch.softmax(top_k_filter(logits, 4) / 0.7, -1)
            idx = torch.cat([idx, torch.multinomial(probs, 1, generator=g)], 1)
    assert torch.equal(out, idx)


def test_top_k_and_top_p_masks_equal_a_brute_force():
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        V = int(torch.randint(1, 8, (), generator=g))
        logits = torch.randn(1, V, generator=g) * 2
        p = float(torch.rand((), generator=g))
        probs = torch.softmax(logits.double(), -1)[0].tolist()
        keep, mass = set(), 0.0
        for i in sorted(range(V), key=lambda i: -probs[i]):
            if mass < p:
                keep.add(i)
                mass += probs[i]
        assert set(top_p_filter(logits, p)[0].isfinite().nonzero().flatten().tolist()) == keep
        k = int(torch.randint(1, V + 1, (), generator=g))
        kth = sorted(logits[0].tolist(), reverse=True)[k - 1]
        want = {i for i in range(V) if logits[0, i] >= kth}
        assert set(top_k_filter(logits, k)[0].isfinite().nonzero().flatten().tolist()) == want


@pytest.mark.parametrize("kw", [dict(), dict(tie_weights=False, bias=False), dict(rope=True, n_kv_head=1, mlp="swiglu"),
                                dict(qk_norm=True, n_kv_head=2)])
def test_the_parameter_count_equals_the_formula(kw):
    V, Tb, L, D, H = 19, 12, 3, 32, 4
    model = DiffusionGPT(GPTConfig(vocab_size=V, block_size=Tb, n_layer=L, n_head=H, n_embd=D, **kw))
    c = model.config
    bias, C, G = c.bias, D // H, c.n_kv_head or H
    qkv = D * (D + 2 * G * C) + (D + 2 * G * C) * bias
    norm = D + D * bias
    hidden = 4 * D if c.mlp == "gelu" else int(4 * D * 2 / 3)
    up = hidden if c.mlp == "gelu" else 2 * hidden
    mlp = D * up + up * bias + hidden * D + D * bias
    qk_norm = 2 * (C + C * bias) if c.qk_norm else 0
    per_layer = qkv + D * D + D * bias + 2 * norm + mlp + qk_norm
    formula = V * D + (0 if c.rope else Tb * D) + L * per_layer + norm + (0 if c.tie_weights else V * D)
    assert model.num_parameters() == formula
    assert model.num_parameters(exclude_embeddings=True) == formula - (0 if c.rope else Tb * D)


def test_from_nanogpt_round_trips_through_nanogpt_names():
    sys.path.insert(0, _MODELS)
    try:
        import nanogpt_reference as ng
    finally:
        sys.path.remove(_MODELS)
    from diffusionformer.models.gpt import _nanogpt_names

    torch.manual_seed(0)
    args = dict(n_layer=2, n_head=2, n_embd=16, block_size=8, bias=False, vocab_size=23, dropout=0.0)
    ref = ng.GPT(ng.GPTConfig(**args)).double().eval()
    model = DiffusionGPT.from_nanogpt({"model": ref.state_dict(), "model_args": args}).eval()
    idx = torch.randint(0, 23, (2, 8))
    torch.testing.assert_close(model(idx, idx)[0], ref(idx, idx)[0], rtol=0, atol=1e-12)
    back_names = {ours: theirs for theirs, ours in _nanogpt_names(2).items()}
    again = ng.GPT(ng.GPTConfig(**args)).double().eval()
    again.load_state_dict({back_names[k]: v for k, v in model.state_dict().items()})
    torch.testing.assert_close(again(idx, idx)[1], model(idx, idx)[1], rtol=0, atol=1e-12)


def test_generate_edge_cases_of_a_practitioner():
    model = _gpt("attention:1,heat(steps=2):1", dropout=0.1).train()
    one = torch.tensor([[3]])
    assert model.generate(one, 5).shape == (1, 6)
    out = model.generate(one, 0)
    assert torch.equal(out, one) and out is not one
    long = torch.randint(0, 17, (2, 20))  # longer than block_size: cropped
    assert torch.equal(model.generate(long, 3, temperature=0), model.generate(long, 3, temperature=0, use_cache=True))
    assert model.training and all(m.training for m in model.modules())  # modes restored
    assert torch.is_grad_enabled()
    assert model.generate(one.int(), 3, use_cache=True).dtype == torch.int32
    with pytest.raises(ValueError, match="at least one token"):
        model.generate(torch.zeros(1, 0, dtype=torch.long), 2)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # bf16 decoding: the cache gives the uncached tokens
        p = torch.randint(0, 17, (2, 3))
        assert torch.equal(model.generate(p, 8, temperature=0), model.generate(p, 8, temperature=0, use_cache=True))


def test_bug_token_ids_of_another_integer_dtype_are_told_what_to_do():
    """Bug: a uint16 / int16 prompt (nanoGPT's ``train.bin`` holds uint16 ids) was refused with "idx must be an
    integer tensor ... with dtype torch.uint16", an integer tensor told it was none; and one prompt without its batch
    dimension (``TextData.encode`` returns one) got no hint. The messages now name int64 / int32 and the fix."""
    model = _gpt()
    ids = torch.zeros(2, 3, dtype=torch.uint16)
    with pytest.raises(ValueError,
                       match=r"idx must be an integer tensor \(int64 or int32\).*torch.uint16 .*idx\.long\(\)"):
        model(ids)
    with pytest.raises(ValueError, match=r"add the batch dimension, idx\[None\]"):
        model.generate(torch.zeros(3, dtype=torch.long), 2)
    with pytest.raises(ValueError, match=r"got dtype torch.int16; expected int64 or int32 .*targets\.long\(\)"):
        model(ids.long(), ids.to(torch.int16))


def _experiment(task: dict) -> dict:
    return {"name": "lm-user-52", "seeds": [0], "operators": [{"name": "attn"}],
            "tasks": [{"metric": "val_loss", "train": {"max_steps": 2, "batch_size": 8}, **task}]}


def test_bug_validate_experiment_catches_a_context_shorter_than_the_data():
    """Bug: a GPT whose ``block_size`` is shorter than a sequence task's rows (assoc-recall, T = 17) or no shorter
    than a text split passed ``validate_experiment`` and then failed at its first training step ("sequence length
    T=17 exceeds block_size=8", or ``get_batch``'s "block_size must be in [1, 45]"), after the tasks before it had
    trained. ``build_model`` now refuses it, so the validator lists it before anything trains."""
    from diffusionformer.experiments import load_experiment_config, validate_experiment

    recall = load_experiment_config(_experiment({
        "name": "recall", "dataset": "assoc-recall", "model": "gpt-recall", "metric": "test_acc",
        "dataset_options": {"num_examples": 100}, "model_overrides": {"n_layer": 1, "n_head": 2, "n_embd": 16,
                                                                       "block_size": 8}}))
    problems = validate_experiment(recall, load_data=True)
    assert len(problems) == 1 and "block_size = 8" in problems[0] and "sequences of 17 tokens" in problems[0]
    text = load_experiment_config(_experiment({
        "name": "text", "dataset": "pydoc-chars", "model": "gpt-char-tiny", "dataset_options": {"train_fraction": 1e-4},
        "model_overrides": {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 64}}))
    problems = validate_experiment(text, load_data=True)
    assert len(problems) == 1 and "the 'train' split" in problems[0] and "block_size = 64" in problems[0]
    fits = load_experiment_config(_experiment({
        "name": "recall", "dataset": "assoc-recall", "model": "gpt-recall", "metric": "test_acc",
        "dataset_options": {"num_examples": 100}, "model_overrides": {"n_layer": 1, "n_head": 2, "n_embd": 16,
                                                                       "block_size": 17}}))
    assert validate_experiment(fits, load_data=True) == []


def test_bug_a_cache_filled_under_autocast_names_autocast():
    """Bug: a KV cache filled inside ``torch.autocast(bfloat16)`` and continued outside it was refused as "the layer
    ... was converted or moved during decoding; ... convert the layer back", a conversion that never happened; the
    message now names autocast too."""
    model = _gpt().eval()
    cache = model.new_cache()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model.forward_cached(torch.tensor([[1, 2]]), cache)
    with pytest.raises(ValueError, match=r"torch\.bfloat16 keys .* torch\.float32 .*torch\.autocast entered or left"):
        model.forward_cached(torch.tensor([[3]]), cache)
