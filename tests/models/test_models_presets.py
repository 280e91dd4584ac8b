"""Model families: shapes for every preset, causality, equivariance, round trips, bad configs."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Batch, Data

from diffusionformer import list_operators
from diffusionformer.models import (
    DINO,
    DiffusionGPT,
    DiffusionViT,
    GPTConfig,
    GraphTransformerConfig,
    ViTConfig,
    create_model,
    learned_operator_parameters,
    list_models,
    model_config,
)

SMALL = {"gpt": dict(n_layer=2, n_embd=32), "vit": dict(depth=2, dim=32), "graph": dict(depth=2, dim=32), "gcn": dict(hidden=8), "gin": dict(hidden=8, num_layers=3), "dino": dict(depth=2, dim=32)}


def _inputs(model, B=2):
    g = torch.Generator().manual_seed(0)
    if isinstance(model, DiffusionGPT):
        c = model.config
        return (torch.randint(0, c.vocab_size, (B, min(c.block_size, 16)), generator=g),)
    if isinstance(model, (DiffusionViT, DINO)):
        c = model.config
        shape = (B, c.in_channels, *c.input_size) if len(c.input_size) == 2 else (B, c.input_size[0], c.in_channels)
        return (torch.randn(*shape, generator=g),)
    c = model.config
    x = torch.randn(9, c.in_channels, generator=g)
    # two graphs (nodes 0-4 and 5-8), with edges inside each: a batch is block-diagonal
    edges = torch.cat([torch.randint(0, 5, (2, 12), generator=g), torch.randint(5, 9, (2, 8), generator=g)], dim=1)
    batch = torch.tensor([0] * 5 + [1] * 4)
    return (x, edges, batch)


def _small(name):
    kind = name.split("-")[0]
    return create_model(name, **SMALL[kind])


@pytest.mark.parametrize("name", list_models())
def test_every_preset_builds_and_runs(name):
    model = _small(name).eval()
    out = model(*_inputs(model))
    if isinstance(model, DiffusionGPT):
        logits, loss = out
        assert logits.shape[-1] == model.config.vocab_size and loss is None and logits.dtype == torch.float32
    elif isinstance(model, DiffusionViT):
        assert out.shape == (2, model.config.num_classes)
    elif isinstance(model, DINO):  # frozen features of the teacher backbone
        assert out.shape == (2, model.config.dim)
    else:
        rows = 2 if model.config.task == "graph" else 9
        assert out.shape == (rows, model.config.num_classes)
    assert torch.isfinite(out[0] if isinstance(out, tuple) else out).all()


@pytest.mark.parametrize("name", list_models())
def test_no_weight_decay_names_are_parameters(name):
    model = _small(name)
    names = {n for n, _ in model.named_parameters()}
    exclude = model.no_weight_decay() if hasattr(model, "no_weight_decay") else set()
    assert set(exclude) <= names


@pytest.mark.parametrize("name", list_models())
def test_float64_and_state_dict_round_trip(name, tmp_path):
    model = _small(name).double().eval()
    inputs = tuple(t.double() if t.is_floating_point() else t for t in _inputs(model))
    out = model(*inputs)
    path = tmp_path / "m.pt"
    torch.save(model.state_dict(), path)
    clone = _small(name).double().eval()
    clone.load_state_dict(torch.load(path, weights_only=True))
    out2 = clone(*inputs)
    a, b = (out[0], out2[0]) if isinstance(out, tuple) else (out, out2)
    assert a.dtype == torch.float64 and torch.equal(a, b)


@pytest.mark.parametrize("name", list_models())
def test_numpy_numbers_from_a_sweep_build_the_same_model(name):
    """Bug: ``create_model("gpt-shakespeare", n_layer=np.int64(2))`` (a sweep grid's numbers) was
    refused ("n_layer must be a positive int, got int64"). Every config now reads numpy numbers,
    alone or in a list/tuple, as the Python numbers they equal: the config compares and serialises
    equal and the model has the same weights for the same seed."""
    import dataclasses
    import json

    import numpy as np

    def numpy_of(value):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return value
        return np.int64(value) if isinstance(value, int) else np.float32(value)

    kind = name.split("-")[0]
    plain_config = model_config(name, **SMALL[kind])
    grid = {}
    for f in dataclasses.fields(plain_config):
        value = getattr(plain_config, f.name)
        if isinstance(value, float) and float(np.float32(value)) != value:
            grid[f.name] = np.float64(value)  # float32 cannot hold it exactly (the comparisons are exact)
            continue
        grid[f.name] = type(value)(numpy_of(v) for v in value) if isinstance(value, (list, tuple)) else numpy_of(value)
    assert any(isinstance(v, np.int64) for v in grid.values())
    torch.manual_seed(0)
    plain = create_model(name, **SMALL[kind])
    torch.manual_seed(0)
    model = create_model(name, **grid)
    assert model.config == plain.config
    assert type(plain_config)(**grid) == plain_config  # built directly, not through create_model
    assert json.dumps(dataclasses.asdict(model.config)) == json.dumps(dataclasses.asdict(plain.config))
    for f in dataclasses.fields(model.config):
        value = getattr(model.config, f.name)
        assert all(not isinstance(v, np.generic) for v in (value if isinstance(value, (list, tuple)) else [value]))
    got, want = model.state_dict(), plain.state_dict()
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


@pytest.mark.parametrize("name", [n for n in list_operators()])
def test_gpt_is_causal_for_every_operator(name):
    torch.manual_seed(0)
    heads = f"{name}:1,attention:1"
    model = DiffusionGPT(GPTConfig(vocab_size=13, block_size=12, n_layer=2, n_head=2, n_embd=16, heads=heads)).double().eval()
    idx = torch.randint(0, 13, (3, 12))
    logits = model(idx)[0]
    for cut in (3, 7, 11):
        idx2 = idx.clone()
        idx2[:, cut:] = (idx2[:, cut:] + 5) % 13
        logits2 = model(idx2)[0]
        assert torch.allclose(logits[:, :cut], logits2[:, :cut], atol=1e-12), (name, cut)
        assert not torch.allclose(logits[:, cut:], logits2[:, cut:])


def test_gpt_generate_and_sampling_controls():
    torch.manual_seed(1)
    model = create_model("gpt-char-tiny", n_layer=1, block_size=8)
    prompt = torch.zeros(2, 3, dtype=torch.long)
    out = model.generate(prompt, 12, temperature=0.8, top_k=5, generator=torch.Generator().manual_seed(0))
    assert out.shape == (2, 15) and torch.equal(out[:, :3], prompt)
    again = model.generate(prompt, 12, temperature=0.8, top_k=5, generator=torch.Generator().manual_seed(0))
    assert torch.equal(out, again)
    greedy = model.generate(prompt, 4, temperature=0)
    logits = model(prompt)[0][:, -1]
    assert torch.equal(greedy[:, 3], logits.argmax(-1))
    top1 = model.generate(prompt, 4, top_k=1, generator=torch.Generator().manual_seed(3))
    assert torch.equal(top1, greedy)
    with pytest.raises(ValueError, match="temperature"):
        model.generate(prompt, 2, temperature=-1.0)
    with pytest.raises(ValueError, match="top_k"):
        model.generate(prompt, 2, top_k=0)


def test_gpt_generate_reads_numpy_numbers_as_python_numbers():
    """Bug: ``generate(prompt, np.int64(4), top_k=np.int64(5))`` (a sweep grid's numbers) was refused
    ("max_new_tokens must be a non-negative int, got np.int64(4)"), as were numpy ``temperature``,
    ``top_p`` and the filters' ``k``/``p``; they now give the tokens Python numbers give."""
    import numpy as np

    from diffusionformer.models.sampling import top_k_filter, top_p_filter

    torch.manual_seed(1)
    model = create_model("gpt-char-tiny", n_layer=1, block_size=8)
    prompt = torch.zeros(2, 3, dtype=torch.long)
    want = model.generate(prompt, 6, temperature=0.5, top_k=5, top_p=0.75,
                          generator=torch.Generator().manual_seed(0))
    got = model.generate(prompt, np.int64(6), temperature=np.float32(0.5), top_k=np.int32(5),
                         top_p=np.float64(0.75), generator=torch.Generator().manual_seed(0))
    assert got.shape == (2, 9) and torch.equal(got, want)
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.5]])
    assert torch.equal(top_k_filter(logits, np.int64(2)), torch.tensor([[-float("inf"), 3.0, 2.0, -float("inf")]]))
    assert torch.equal(top_p_filter(logits, np.float32(0.5)), top_p_filter(logits, 0.5))
    with pytest.raises(ValueError, match="max_new_tokens must be a non-negative int, got np.True_"):
        model.generate(prompt, np.bool_(True))


def test_gpt_loss_matches_cross_entropy_and_ignores_minus_100():
    model = create_model("gpt-char-tiny", n_layer=1)
    idx = torch.randint(0, 65, (2, 10))
    targets = torch.randint(0, 65, (2, 10))
    targets[:, :5] = -100
    logits, loss = model(idx, targets)
    ref = torch.nn.functional.cross_entropy(logits[:, 5:].reshape(-1, 65), targets[:, 5:].reshape(-1))
    assert torch.allclose(loss, ref)


def test_laplacian_heads_keep_parameter_count_learned_ops_add_few():
    base = create_model("gpt-char-small").num_parameters()
    assert create_model("gpt-char-small", laplacian_heads=[0, 2, 2, 0]).num_parameters() == base
    assert create_model("gpt-char-small", heads="attention:2,laplacian:2").num_parameters() == base
    heat = create_model("gpt-char-small", heads="attention:2,heat(t=0.5, learnable=True, steps=4):2")
    assert heat.num_parameters() == base + 4 * 2
    assert len(learned_operator_parameters(heat)) == 4


def test_vit_layer_three_with_learned_heat_heads_trains():
    torch.manual_seed(2)
    model = create_model("vit-digits", depth=4, dim=32, heads={3: "attention:2,heat(t=1.0, learnable=True, steps=4):2"})
    assert model.blocks[3].attn.heads_spec() == "attention:2,heat(t=1.0, steps=4, method='taylor', learnable=True):2"
    assert model.blocks[0].attn.heads_spec() == "attention:4"
    t = model.blocks[3].attn.operators[1].t
    x, y = torch.randn(16, 1, 8, 8), torch.randint(0, 10, (16,))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    before = t.detach().clone()
    losses = []
    for _ in range(15):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] and not torch.equal(t.detach(), before)


def test_vit_patch_tokens_and_mean_pool():
    model = create_model("vit-mnist1d", depth=1, dim=32).eval()
    x = torch.randn(3, 40, 1)
    assert model.forward_patch_tokens(x).shape == (3, 10, 32)
    assert torch.allclose(model.forward_features(x), model.forward_patch_tokens(x).mean(1), atol=1e-6)
    vit = create_model("vit-mnist", depth=1, dim=32, num_classes=0).eval()
    assert vit(torch.randn(2, 1, 28, 28)).shape == (2, 32)
    tokens, inter = vit.forward_tokens(torch.randn(2, 1, 28, 28), return_intermediates=True)
    assert tokens.shape == (2, 50, 32) and len(inter.hidden_states) == 1


def test_graph_model_permutation_equivariance_and_invariance():
    torch.manual_seed(3)
    x = torch.randn(10, 16, dtype=torch.float64)
    edges = torch.randint(0, 10, (2, 30))
    perm = torch.randperm(10)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(10)
    for global_attention in (False, True):
        node = create_model("graph-node-small", in_channels=16, num_classes=3, global_attention=global_attention,
                            laplacian_heads=[1, 2]).double().eval()
        out = node(x, edges)
        out_p = node(x[perm], inv[edges])
        assert torch.allclose(out_p, out[perm], atol=1e-10)
    graph = create_model("graph-graph-small", in_channels=16, num_classes=2, heads="heat(t=0.5, steps=3):2,attention:2").double().eval()
    g1 = Data(x=x[:6], edge_index=torch.tensor([[0, 1, 2, 3, 4], [1, 2, 3, 4, 5]]))
    g2 = Data(x=x[6:], edge_index=torch.tensor([[0, 1, 2], [1, 2, 3]]))
    batch = Batch.from_data_list([g1, g2])
    out = graph(batch.x, batch.edge_index, batch.batch)
    p = torch.randperm(6)
    ip = torch.empty_like(p)
    ip[p] = torch.arange(6)
    g1p = Data(x=g1.x[p], edge_index=ip[g1.edge_index])
    out_p = graph(*(lambda b: (b.x, b.edge_index, b.batch))(Batch.from_data_list([g1p, g2])))
    assert torch.allclose(out, out_p, atol=1e-10)
    # graphs in one batch never influence each other
    alone = graph(g2.x, g2.edge_index, torch.zeros(4, dtype=torch.long))
    assert torch.allclose(out[1], alone[0], atol=1e-10)


BAD = [
    (ValueError, "must divide", lambda: create_model("gpt-char-small", n_head=3)),
    (ValueError, "per-layer heads list must have 4 entries", lambda: create_model("gpt-char-small", heads=[None, None])),
    (ValueError, "laplacian_heads lists 2 layers, the model has 4", lambda: create_model("gpt-char-small", laplacian_heads=[1, 1])),
    (ValueError, r"unknown model 'gpt-char-smal' \(did you mean 'gpt-char-small'\?\)", lambda: create_model("gpt-char-smal")),
    (ValueError, "unknown key 'n_layers'", lambda: create_model("gpt-char-small", n_layers=3)),
    (TypeError, "expected an int", lambda: create_model("vit-mnist", depth="4")),
    (ValueError, "patch_size=5 must divide", lambda: create_model("vit-mnist", patch_size=5)),
    (ValueError, "dropout must lie in", lambda: create_model("vit-mnist", dropout=1.2)),
    (ValueError, "give either heads= or laplacian_heads=", lambda: create_model("vit-mnist", heads="attention", laplacian_heads=1)),
    (ValueError, "unknown operator", lambda: create_model("vit-mnist", heads="diffusion-wave:4")),
    (ValueError, r"task: expected one of \[.node., .graph.\]", lambda: create_model("graph-node-small", task="edge")),
    (ValueError, "laplacian_heads\\[0\\] must be an int in \\[0, 4\\]", lambda: create_model("gpt-char-small", laplacian_heads=[5, 0, 0, 0])),
]


@pytest.mark.parametrize("err,match,call", BAD, ids=[m for _, m, _ in BAD])
def test_bad_configurations(err, match, call):
    with pytest.raises(err, match=match):
        call()


def test_bad_inputs():
    gpt = create_model("gpt-char-tiny", n_layer=1)
    with pytest.raises(ValueError, match="exceeds block_size"):
        gpt(torch.zeros(1, 65, dtype=torch.long))
    with pytest.raises(ValueError, match="integer tensor"):
        gpt(torch.zeros(1, 4))
    vit = create_model("vit-digits", depth=1)
    with pytest.raises(ValueError, match=r"expected images of shape \(B, 1, 8, 8\)"):
        vit(torch.zeros(2, 3, 8, 8))
    graph = create_model("graph-node-small", in_channels=4, num_classes=2)
    with pytest.raises(ValueError, match="in_channels=4"):
        graph(torch.zeros(5, 3), torch.zeros(2, 0, dtype=torch.long))


def test_model_config_is_validated_and_typed():
    cfg = model_config("gpt-char-small", laplacian_heads=2)
    assert isinstance(cfg, GPTConfig) and cfg.n_layer == 4 and cfg.laplacian_heads == 2
    assert isinstance(model_config("vit-cifar"), ViTConfig)
    assert isinstance(model_config("graph-node-small"), GraphTransformerConfig)
    assert model_config("vit-mnist", input_size=[28, 28]).input_size == (28, 28)


@pytest.mark.slow
def test_torch_compile_tiny_gpt():
    torch.manual_seed(4)
    model = DiffusionGPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16, laplacian_heads=1))
    compiled = torch.compile(model)
    idx = torch.randint(0, 11, (2, 8))
    eager_logits, eager_loss = model(idx, idx)
    logits, loss = compiled(idx, idx)
    assert torch.allclose(logits, eager_logits, atol=1e-5)
    loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_graph_models_read_numpy_sizes_as_python_ints(tiny_graph_transformer):
    """Bug: ``model(x, edge_index, batch, num_graphs=np.int64(4))`` (a count summed with numpy) and the graph
    transformer's ``max_num_nodes=np.int32(3)`` were refused ("num_graphs: expected None or a positive int, got
    np.int64(4)") although every config count takes numpy ints. They now give what Python ints give: four rows,
    the two trailing empty graphs pooled to zero (their scores the heads' biases, for GCN and GIN); bools and
    floats stay refused."""
    import numpy as np

    from diffusionformer.models import GCN, GIN, GCNConfig, GINConfig

    x = torch.randn(5, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    ei = torch.tensor([[0, 1, 2, 3], [1, 0, 3, 4]])
    batch = torch.tensor([0, 0, 1, 1, 1])
    torch.manual_seed(0)
    gcn = GCN(GCNConfig(in_channels=3, num_classes=2, hidden=4, task="graph", dropout=0.0)).double().eval()
    gin = GIN(GINConfig(in_channels=3, num_classes=2, hidden=4, num_layers=2)).double().eval()
    for model, bias in ((gcn, gcn.head.bias), (gin, gin.heads[0].bias + gin.heads[1].bias)):
        got = model(x, ei, batch, num_graphs=np.int64(4))
        assert got.shape == (4, 2)
        torch.testing.assert_close(got, model(x, ei, batch, num_graphs=4), rtol=0, atol=0)
        torch.testing.assert_close(got[2:], bias.expand(2, 2), rtol=0, atol=0)
    gt = tiny_graph_transformer(task="graph", global_attention=True).eval()
    want = gt(x, ei, batch, max_num_nodes=3, num_graphs=4)
    got = gt(x, ei, batch, max_num_nodes=np.int32(3), num_graphs=np.int64(4))
    assert got.shape == (4, 2)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    for model in (gcn, gin, gt):
        for bad in (np.bool_(True), np.float64(4.0), np.int64(0)):
            with pytest.raises(ValueError, match=r"num_graphs: expected None or a positive int"):
                model(x, ei, batch, num_graphs=bad)
    with pytest.raises(ValueError, match=r"max_num_nodes: expected None or a positive int"):
        gt(x, ei, batch, max_num_nodes=np.float32(3.0))
