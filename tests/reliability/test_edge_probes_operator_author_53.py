"""Edge probes (sitting 53a): a researcher adds her own operators -- a learned Chebyshev filter, a fractional
Laplacian ``(I - P)^s`` by eigendecomposition, a two-hop ``a P P`` head with a learned scalar, a per-head buffer --
and uses them everywhere: layers (dense, sparse, causal), models, KV-cache decoding, the experiment runner, the
analysis. Each result is checked against explicit float64 matrices written here."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from diffusionformer import DiffusionAttention
from diffusionformer.operators import DiffusionOperator, list_operators, register_operator, unregister_operator


class _TwoHop(DiffusionOperator):
    """``a P P v`` through :meth:`apply_matrix` with a learned scalar ``a``: a function of a materialised ``P`` that
    keeps the default ``supports_sparse = True``."""

    name = "probe53-two-hop"
    is_polynomial = False

    def __init__(self, num_heads: int = 1) -> None:
        super().__init__(num_heads)
        self.a = nn.Parameter(torch.tensor(0.7))

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.a.fill_(0.7)

    @property
    def degree(self) -> int:
        return 2

    def coefficients(self) -> torch.Tensor:
        return torch.stack([self.a * 0, self.a * 0, self.a])

    def apply_matrix(self, P: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.a.to(v.dtype) * (P @ (P @ v))


class _BufMix(DiffusionOperator):
    """``(1 - m_g) I + m_g P`` with ``m`` a per-head persistent buffer."""

    name = "probe53-buf-mix"

    def __init__(self, num_heads: int = 1) -> None:
        super().__init__(num_heads)
        self.register_buffer("mix", torch.linspace(0.2, 0.8, num_heads))

    @property
    def degree(self) -> int:
        return 1

    def coefficients(self) -> torch.Tensor:
        return torch.stack([1 - self.mix, self.mix], -1)


@pytest.fixture
def user_operators():
    for cls in (_TwoHop, _BufMix):
        if cls.name not in list_operators():
            register_operator(cls)
    yield
    for cls in (_TwoHop, _BufMix):
        if cls.name in list_operators():
            unregister_operator(cls.name)


GRAPH_TASK = """
name = "probe"
seeds = [0]

[[tasks]]
name = "k"
dataset = "karate"
model = "graph-node-small"
model_overrides = { dim = 8, depth = 1, num_heads = 2, mlp_ratio = 1.0 }
[tasks.train]
max_steps = 1

[[operators]]
name = "two-hop"
heads = "attention:1,probe53-two-hop:1"
"""


@pytest.mark.parametrize("load_data", [True, False])
def test_bug_graph_task_refuses_a_matrix_operator_that_keeps_supports_sparse(tmp_path, user_operators, load_data):
    """Bug: the runner's check of a graph transformer's operators (experiments/build.py ``_check_graph_model``) read
    ``supports_sparse`` alone, while the layer also refuses on edges every function of a materialised ``P`` that is
    neither a polynomial nor a context operator (a user's ``apply_matrix`` operator that keeps the default
    ``supports_sparse = True``). Such a setting passed validation, and its run failed at the first training step
    ("does not support the sparse back-end"); ``heat-exact`` in the same place was refused up front."""
    from diffusionformer.experiments import load_experiment_config
    from diffusionformer.experiments.validate import validate_experiment
    from diffusionformer.models import DiffusionGraphTransformer, GraphTransformerConfig

    # the layer itself refuses it on edges (what the run met at its first step)
    model = DiffusionGraphTransformer(GraphTransformerConfig(in_channels=3, dim=8, depth=1, num_heads=2,
                                                             heads="attention:1,probe53-two-hop:1"))
    with pytest.raises(ValueError, match="does not support the sparse back-end"):
        model(torch.randn(4, 3), torch.tensor([[0, 1, 2], [1, 2, 3]]))
    path = tmp_path / "probe.toml"
    path.write_text(GRAPH_TASK, encoding="utf-8")
    problems = validate_experiment(load_experiment_config(path), load_data=load_data)
    assert len(problems) == 1, problems
    assert problems[0].startswith("task 'k' / setting 'two-hop': model 'graph-node-small' layer 0 has operator "
                                  "'probe53-two-hop', which needs a dense P"), problems[0]
    # a polynomial user operator is a sparse one: accepted
    path.write_text(GRAPH_TASK.replace("probe53-two-hop:1", "probe53-buf-mix:1"), encoding="utf-8")
    assert validate_experiment(load_experiment_config(path), load_data=load_data) == []


def test_bug_frequency_response_labels_heads_by_their_index(tmp_path, monkeypatch):
    """Bug: ``analyze``'s frequency-response figure dropped the NaN rows of the heads that are no polynomial in ``P``
    (``heat-exact``, a user's ``apply_matrix`` operator) and then labelled the rows kept ``name[0]``, ``name[1]``...
    counted anew: with heads ``[chebyshev, fractional, two-hop, mix]`` the mix head (head 3) was drawn as
    ``mine[1]``, the label of the fractional head, whose line is not drawn."""
    import diffusionformer.analysis as analysis
    from diffusionformer.experiments import analyze as A

    drawn = {}
    real = analysis.plot_frequency_response

    def spy(named_coeffs, ax=None, **kwargs):
        ax = real(named_coeffs, ax=ax, **kwargs)
        drawn.update({line.get_label(): line.get_ydata() for line in ax.get_lines() if line.get_label()[:1] != "_"})
        return ax

    monkeypatch.setattr(analysis, "plot_frequency_response", spy)
    nan = math.nan
    last_block = [[0.0, 1.0, 0.0], [nan, nan, nan], [nan, nan, nan], [0.8, 0.2, 0.0]]
    layers = [{"layer": 0, "within_variance": 1.0}, {"layer": 1, "within_variance": 0.5}]
    op = {"seeds": {"0": {"layers": layers, "coefficients": [last_block], "learned_operators": {}}},
          "summary": A._summary([layers])}
    whole = {"seeds": {"0": {"layers": layers, "coefficients": [[[0.0, 1.0], [1.0, -1.0]]], "learned_operators": {}}},
             "summary": A._summary([layers])}
    result = {"tasks": {"d": {"operators": {"mine": op, "base": whole}}}}
    spectra = {"d": {"mine": [[[2.0, 1.0], [2.0, 0.5]]], "base": [[[2.0, 1.0], [2.0, 0.5]]]}}
    A._write_plots(tmp_path / "plots", result, spectra, {}, {})
    assert sorted(drawn) == ["base[0]", "base[1]", "mine[0]", "mine[3]"], sorted(drawn)
    lam = torch.linspace(-1.0, 1.0, len(drawn["mine[3]"]), dtype=torch.float64)
    torch.testing.assert_close(torch.as_tensor(drawn["mine[3]"]), 0.8 + 0.2 * lam)  # f(lambda) of head 3
    torch.testing.assert_close(torch.as_tensor(drawn["mine[0]"]), lam)
    torch.testing.assert_close(torch.as_tensor(drawn["base[1]"]), 1.0 - lam)


def _explicit_mix_output(layer: DiffusionAttention, x: torch.Tensor, causal: bool) -> torch.Tensor:
    """The layer's output for ``(1 - m) I + m P`` heads, from explicit float64 matrices."""
    x = x.double()
    D, H = layer.dim, layer.num_heads
    C = D // H
    qkv = x @ layer.qkv.weight.double().T + layer.qkv.bias.double()
    q, k, v = (t.reshape(*x.shape[:-1], H, C).transpose(-2, -3) for t in qkv.split(D, -1))
    S = q @ k.transpose(-1, -2) / math.sqrt(C)
    N = x.shape[-2]
    if causal:
        S = S.masked_fill(torch.ones(N, N, dtype=torch.bool).triu(1), -math.inf)
    P = S.softmax(-1)
    m = layer.operators[0].mix.double()[:, None, None]
    out = (1 - m) * v + m * (P @ v)
    o = out.transpose(-2, -3).reshape(*x.shape[:-1], D)
    return o @ layer.out_proj.weight.double().T + layer.out_proj.bias.double()


def test_bug_kv_cache_refuses_non_finite_user_coefficients_as_the_forward_does(user_operators):
    """Bug: cached decoding (``attend_cached``, so ``forward_cached`` and ``generate(use_cache=True)``) used the
    layer's coefficients unchecked, so a user operator whose coefficients became non-finite (an ``inf`` in a
    per-head buffer, a NaN parameter) decoded NaN outputs without a word, while the layer's forward refuses them
    ("coeffs must be finite"). The built-in learned operators refuse in their own ``coefficients()``; a user's
    operator has no such check."""
    from diffusionformer.nn.kv_cache import LayerKVCache, attend_cached

    torch.manual_seed(0)
    layer = DiffusionAttention(8, 2, heads="probe53-buf-mix:2", causal=True).eval()
    x = torch.randn(1, 5, 8)
    # finite: the cache equals the forward and the explicit float64 reference
    cache = LayerKVCache()
    steps = torch.cat([attend_cached(layer, x[:, :2], cache), attend_cached(layer, x[:, 2:], cache)], 1)
    torch.testing.assert_close(steps.double(), _explicit_mix_output(layer, x, causal=True), atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        layer.operators[0].mix[1] = math.inf
    with pytest.raises(ValueError, match="coeffs must be finite"):
        layer(x)
    with pytest.raises(ValueError, match="coeffs must be finite"):
        attend_cached(layer, x, LayerKVCache())


def test_bug_edge_feature_attention_refuses_non_finite_user_coefficients(user_operators):
    """Bug: ``edge_feature_attention`` used the layer's coefficients unchecked: a user operator with a NaN in its
    per-head buffer gave NaN node features, while the layer's own sparse call refuses them ("coeffs must be
    finite")."""
    from diffusionformer.nn.edge_features import edge_feature_attention

    torch.manual_seed(0)
    layer = DiffusionAttention(8, 2, heads="probe53-buf-mix:2")
    x, edge_index = torch.randn(4, 8), torch.tensor([[0, 1, 2, 3, 0], [1, 2, 3, 0, 0]])
    zero_keys = torch.zeros(edge_index.shape[1], 8)
    torch.testing.assert_close(edge_feature_attention(layer, x, edge_index, zero_keys), layer(x, edge_index=edge_index))
    with torch.no_grad():
        layer.operators[0].mix[0] = math.nan
    with pytest.raises(ValueError, match="coeffs must be finite"):
        layer(x, edge_index=edge_index)
    with pytest.raises(ValueError, match="coeffs must be finite"):
        edge_feature_attention(layer, x, edge_index, zero_keys)


class _Cheb(DiffusionOperator):
    """A learned Chebyshev filter ``sum_k theta_gk T_k(P)`` whose degree is its attribute ``steps``."""

    def __init__(self, steps: int = 2, num_heads: int = 1) -> None:
        super().__init__(num_heads)
        self.steps = steps
        self.theta = nn.Parameter(torch.randn(num_heads, steps + 1))

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.theta.normal_()

    @property
    def degree(self) -> int:
        return self.steps

    def coefficients(self) -> torch.Tensor:
        from diffusionformer.operators.polynomial import chebyshev_matrix

        return self.theta @ chebyshev_matrix(self.steps, self.theta.dtype)


@pytest.mark.parametrize("other_steps", [2, 4])  # the layer's degree K equal to, or above, the new degree
def test_bug_an_operator_whose_degree_grew_in_place_is_refused_not_truncated(other_steps):
    """Bug: the layer plans its heads' degrees once (and again when ``operators`` is given a new operator); an
    operator whose degree grew in place (``op.steps = 3`` and a longer ``theta``) passed the layer's check, which
    compared its coefficients with the operator's present degree, and the layer then dropped the powers past the
    planned degree (``F.pad`` by a negative width, or the engine's per-head degrees), a silently wrong output (off by
    ~1 here against the float64 reference of ``sum_k theta_k T_k(P)``). Now a clear error; a new operator put in
    is planned for."""
    from diffusionformer.operators.polynomial import chebyshev_matrix

    torch.manual_seed(0)
    layer = DiffusionAttention(8, 2, heads=[_Cheb(2), _Cheb(other_steps)])
    x = torch.randn(1, 5, 8)
    layer(x)
    op = layer.operators[0]
    op.steps = 3
    op.theta = nn.Parameter(torch.randn(1, 4))
    with pytest.raises(ValueError, match=r"has degree 3, but the layer planned its heads \[0\] for degree 2"):
        layer(x)
    with pytest.raises(ValueError, match="has degree 3"):
        layer(x[0], edge_index=torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]]))
    layer.operators[0] = _Cheb(3)  # a new operator: the layer plans for degree 3
    with torch.no_grad():
        layer.operators[0].theta.copy_(op.theta)
    # explicit float64 reference: per head P (softmax of the scores) and sum_k c_k P^k v
    xd = x.double()[0]
    q, k, v = (t.reshape(5, 2, 4).transpose(0, 1) for t in
               (xd @ layer.qkv.weight.double().T + layer.qkv.bias.double()).split(8, -1))
    P = (q @ k.transpose(-1, -2) / 2.0).softmax(-1)
    heads = []
    for h, theta in enumerate((op.theta, layer.operators[1].theta)):
        c = (theta.double() @ chebyshev_matrix(theta.shape[1] - 1, torch.float64))[0]
        heads.append(sum(c[j] * torch.linalg.matrix_power(P[h], j) for j in range(len(c))) @ v[h])
    ref = torch.cat(heads, -1) @ layer.out_proj.weight.double().T + layer.out_proj.bias.double()
    torch.testing.assert_close(layer(x)[0].double(), ref, atol=1e-5, rtol=1e-5)


class _Gated(DiffusionOperator):
    """``(1 - g) I + g P``, ``g = sigmoid(gate(1))`` per head, its gate an ``nn.Linear`` it initialises itself
    (zero weight, bias 2)."""

    degree = 1

    def __init__(self, num_heads: int = 1) -> None:
        super().__init__(num_heads)
        self.gate = nn.Linear(1, num_heads)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        self.gate.weight.zero_()
        self.gate.bias.fill_(2.0)

    def coefficients(self) -> torch.Tensor:
        g = torch.sigmoid(self.gate(self.gate.weight.new_ones(1, 1)))[0]
        return torch.stack([1 - g, g], -1)


@pytest.mark.parametrize("model", ["gpt", "vit", "graph"])
def test_bug_model_initialisation_keeps_a_user_operators_own_linear(model):
    """Bug: the models' GPT-2 initialisation (``init_transformer_weights``) drew every ``nn.Linear`` of the model
    N(0, 0.02) with a zero bias, those inside a head operator too, although its docstring says operator parameters
    keep the values their constructors chose: a user's operator with a gate ``nn.Linear`` that starts at
    ``g = sigmoid(2)`` started at ``g = 0.5`` in every model (and again after ``model.reset_parameters()``)."""
    from diffusionformer.models import (DiffusionGPT, DiffusionGraphTransformer, DiffusionViT, GPTConfig,
                                        GraphTransformerConfig, ViTConfig)

    torch.manual_seed(0)
    gated = _Gated(2)
    heads = [gated, gated]
    if model == "gpt":
        net = DiffusionGPT(GPTConfig(vocab_size=7, block_size=8, n_layer=1, n_head=2, n_embd=8, heads=[heads]))
    elif model == "vit":
        net = DiffusionViT(ViTConfig(input_size=(8, 8), patch_size=4, in_channels=1, dim=8, depth=1, num_heads=2,
                                     heads=[heads]))
    else:
        net = DiffusionGraphTransformer(GraphTransformerConfig(in_channels=3, dim=8, depth=1, num_heads=2,
                                                               heads=[heads]))
    for _ in range(2):  # as built, and after a reset
        op = net.blocks[0].attn.operators[0]
        assert op.gate.weight.abs().max().item() == 0.0 and op.gate.bias.tolist() == [2.0, 2.0]
        g = 1 / (1 + math.exp(-2.0))
        torch.testing.assert_close(net.blocks[0].attn.coefficients()[0], torch.tensor([1 - g, g]))
        # the rest of the model keeps GPT-2's initialisation: the attention projections N(0, 0.02), zero biases
        qkv = net.blocks[0].attn.qkv
        assert qkv.bias.abs().max().item() == 0.0 and 0.005 < qkv.weight.std().item() < 0.05
        net.reset_parameters()


class _DenseOnly(DiffusionOperator):
    """``P v`` through :meth:`apply_matrix`, a class never registered (its ``name`` is ``''``)."""

    is_polynomial = False
    supports_kv_cache = False
    degree = 0

    def coefficients(self) -> torch.Tensor:
        return torch.tensor([0.0])

    def apply_matrix(self, P: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return P @ v


def test_bug_refusals_name_an_unregistered_operator_by_its_class():
    """Bug: the layer's refusals named an operator by its registry ``name``, which a class never registered does not
    have: a user's operator on edges read "operator '' does not support the sparse back-end", and so did cached
    decoding ("operator '' does not support a KV cache"), edge features and a per-head list of the wrong width
    ("operator instance ''"). They now name its class (a registered operator is still named by its name; an
    unregistered subclass by the name it inherits, as tests/models/test_edge_probes_kv_rivals.py pins)."""
    from diffusionformer.nn.edge_features import edge_feature_attention
    from diffusionformer.nn.kv_cache import LayerKVCache, attend_cached

    label = _DenseOnly.__qualname__
    layer = DiffusionAttention(8, 2, heads=[_DenseOnly(), "attention"], causal=True)
    x, edges = torch.randn(4, 8), torch.tensor([[0, 1], [1, 2]])
    with pytest.raises(ValueError, match=f"^operator {label} does not support the sparse back-end"):
        layer(x, edge_index=edges)
    with pytest.raises(ValueError, match=f"^attend_cached: operator {label} does not support a KV cache"):
        attend_cached(layer, x[None], LayerKVCache())
    with pytest.raises(ValueError, match=f"^edge_feature_attention: operator {label} is not a polynomial"):
        edge_feature_attention(DiffusionAttention(8, 2, heads=[_DenseOnly(), "attention"]), x, edges,
                               torch.zeros(2, 8))
    with pytest.raises(ValueError, match=f"^operator instance {label} has num_heads=3 but covers 2"):
        DiffusionAttention(8, 4, heads=[_DenseOnly(num_heads=3)] * 2 + ["attention"] * 2)
    # a registered operator keeps its name
    with pytest.raises(ValueError, match="^operator 'ppr-exact' does not support the sparse back-end"):
        DiffusionAttention(8, 2, heads="ppr-exact:1,attention:1")(x, edge_index=edges)


def test_bug_propagation_hops_do_not_trust_a_name_an_overriding_subclass_inherits():
    """Bug: ``operator_hops`` counted the context operators that read their map once (``attnscale``,
    ``differential``, ...) by their ``name``, which a subclass inherits: a user's subclass of ``attnscale`` that
    propagates its output once more (two hops) read as one, so ``propagation_hops`` under-counted the model's
    neighbourhood and ``NodeMiniBatchTask.for_model`` sampled subgraphs that left out nodes its outputs depend on,
    without the warning it gives for too few hops. Such a subclass is now of unknown hops (``None``), as any
    operator the library does not know; a subclass that adds no behaviour keeps its parent's count."""
    from diffusionformer.experiments.minibatch import operator_hops, propagation_hops
    from diffusionformer.models import DiffusionGraphTransformer, GraphTransformerConfig
    from diffusionformer.operators import AttnScaleOperator

    class TwiceAttnScale(AttnScaleOperator):
        def apply_context(self, ctx):
            return ctx.propagate(super().apply_context(ctx))

    class Documented(AttnScaleOperator):
        """AttnScale with a docstring of its own: the same operator."""

    assert operator_hops(AttnScaleOperator()) == 1 and operator_hops(Documented()) == 1
    assert operator_hops(TwiceAttnScale()) is None
    # the second hop is real: node 0's output depends on node 2 through 2 -> 1 -> 0
    torch.manual_seed(0)
    model = DiffusionGraphTransformer(GraphTransformerConfig(in_channels=3, dim=8, depth=1, num_heads=2,
                                                             heads=[[TwiceAttnScale(), "attention"]])).eval()
    assert propagation_hops(model) is None
    edges = torch.tensor([[1, 2, 0, 1, 2], [0, 1, 0, 1, 2]])
    x = torch.randn(3, 3)
    x2 = x.clone()
    x2[2] += 1.0
    with torch.no_grad():
        assert (model(x, edges)[0] - model(x2, edges)[0]).abs().max() > 1e-6
