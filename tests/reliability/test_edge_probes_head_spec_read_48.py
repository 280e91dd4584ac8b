"""Edge probes of the head-spec canonical form (sitting 48, ``_spec_as_read``/``_layout_as_read``, adfe8a1): as read,
a spec builds exactly the model its spelling builds, reads as itself, keeps refusals refusals and different layouts
different, and a config of a hostile spec is neither crashed nor slowed down by it."""

from __future__ import annotations

import time

import pytest
import torch

from diffusionformer.models import GPTConfig, ViTConfig
from diffusionformer.nn import DiffusionAttention
from diffusionformer.nn import heads as heads_module
from diffusionformer.nn.heads import _layout_as_read, _spec_as_read, parse_heads
from diffusionformer.operators import list_operators
from diffusionformer.operators.registry import parse_operator_spec

#: spellings with arguments of every registered operator that takes arguments (4 heads)
SPELT = {
    "attnscale": "attnscale(learnable=False, omega=.3):4",
    "differential": "Differential( lambda_init=.5, depth=2 ):4",
    "grand-nl": "grand(steps=2, t=.5, method='rk4'):2, Attention:2",
    "heat": "attention:2,Heat(learnable=True, t=5e-1, steps=4):2",
    "heat-exact": "expm(learnable=True, t=.2):4",
    "neutreno": "neu_treno(lam=.5):4",
    "polynomial": "poly(basis=\"chebyshev\", init='laplacian', steps=2):2,attention:02",
    "ppr": "APPNP(steps=4, learnable=True, alpha=.2):3,I-P:1",
    "ppr-exact": "pagerank_exact(alpha=.3):4",
    "value-residual": "resformer(lam=.5):4",
    "attention": "Softmax:{half},attn:{half}",
    "laplacian": " I - P : 4 ",
}


def _built(spec, num_heads=4):
    """``spec``'s layer under one seed: its heads_spec(), its parameters and its output on one input."""
    torch.manual_seed(0)
    layer = DiffusionAttention(16, num_heads, spec)
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1))
    return layer.heads_spec(), [p.detach().clone() for p in layer.parameters()], layer(x).detach()


def test_the_registry_is_covered():
    assert sorted(SPELT) == list_operators()


@pytest.mark.parametrize("name", sorted(SPELT))
def test_the_read_spec_builds_the_same_model(name):
    spelt = SPELT[name]
    read = _spec_as_read(spelt)
    assert read != spelt and _spec_as_read(read) == read  # read, and read as itself
    a, b = _built(spelt), _built(read)
    assert a[0] == b[0] and len(a[1]) == len(b[1])
    assert all(torch.equal(p, q) for p, q in zip(a[1], b[1])) and torch.equal(a[2], b[2])
    assert GPTConfig(n_head=4, n_embd=16, heads=spelt).heads == read


@pytest.mark.parametrize("spec", [
    "attention:2,heat(t=1e400):2", "heat(t=nan):4", "heat(t=-nan):4", "heat(t=0x10):4", "heat(t=1_000):4",
    "polynomial(init='a,b)c:d', steps=2):2,attention:2", "polynomial(init='a\\'b\"c'):4",
    "heat(method='taylor' 'x'):4", "attention:2,,laplacian:2,", "attention , laplacian , heat , ppr", "heat():4",
    "attention:{half},laplacian:{H}", "heat(ｔ=0.5):4", "attention:2,heat(t=-0.0):2"])
def test_read_as_itself_and_refused_or_built_alike(spec):
    read = _spec_as_read(spec)
    assert _spec_as_read(read) == read
    for num_heads in (2, 4):
        try:
            want = [(type(g.operator), g.start, g.count, g.operator.spec()) for g in parse_heads(spec, num_heads)]
        except (ValueError, TypeError) as err:
            with pytest.raises(type(err)):
                parse_heads(read, num_heads)
        else:
            assert [(type(g.operator), g.start, g.count, g.operator.spec()) for g in parse_heads(read, num_heads)] == want


@pytest.mark.parametrize("a,b", [
    ("heat(t=0.5):4", "heat(t=0.50000001):4"), ("heat(t=-0.0):4", "heat(t=0.0):4"),
    ("heat(learnable=True):4", "heat(learnable=1):4"), ("heat(t=nan):4", "heat(t=inf):4"),
    ("heat(t=1e400):4", "heat(t=1e308):4"), (f"heat(steps={10**30}):4", f"heat(steps={10**30 + 1}):4"),
    ("polynomial(init='a,b'):4", "polynomial(init='a', b=1):4"), ("polynomial(init='x(y)'):4", "polynomial(init='x'):4"),
    ("polynomial(init='\"'):4", "polynomial(init=\"'\"):4"), ("attention:{H}", "attention:{h}"),
    ("attention:{half},laplacian:{half}", "laplacian:{half},attention:{half}"), ("heat:4", "heаt:4"),  # Cyrillic а
    ("attention:02,laplacian:2", "attention:20,laplacian:2")])
def test_different_layouts_stay_different(a, b):
    assert _spec_as_read(a) != _spec_as_read(b)


def test_refused_specs_stay_refused():
    for spec in ("attention:2,lapalcian:2", "heat(tt=1):4", "attention:{x}", "attention:2.0", "attention:-1,heat:5",
                 "attention:{h}", "attention:4,heat(bogus=1):0", "attention:2:2", "аttention:4",
                 "attention:２,laplacian:2", "attention:1_0", "heat(t=1, t=2):4", "heat(**{}):4"):
        assert _spec_as_read(spec) == spec
        with pytest.raises((ValueError, TypeError)):
            DiffusionAttention(16, 4, spec)
    # a template among the arguments is filled as any other (t=4): kept as given, which builds what it did
    assert _spec_as_read("heat(t={H}):4") == "heat(t={H}):4" and _built("heat(t={H}):4")[0] == _built("heat(t=4):4")[0]


def test_a_layout_mixing_spec_strings_and_per_head_lists():
    per_head = ["Attention", "I-P", "heat(t=.5)", "laplacian"]
    layout = [per_head, "Attention:2, I-P:2", None]
    read = _layout_as_read(layout)
    assert read == [per_head, "attention:2,laplacian:2", None] and read[0] is per_head
    config = ViTConfig(num_heads=4, dim=16, depth=3, heads={"0": per_head, "-1": "Heat( t=.5 ):4"})
    assert config.heads == {"0": per_head, "-1": "heat(t=0.5):4"}
    assert _layout_as_read(("I-P:4", "laplacian:4")) == ("laplacian:4", "laplacian:4")


def test_bug_a_deeply_nested_argument_crashed_config_construction():
    """Bug: a head spec whose argument is a literal nested a few hundred levels deep (``t=------...1``,
    ``1+1+...+1j``) raised RecursionError or MemoryError out of ``GPTConfig(...)`` (which now reads the spec), and
    out of the model build and ``parse_operator_spec``: not the ValueError naming the spec that any other unreadable
    argument gets."""
    for value in ("-" * 600 + "1", "-" * 20000 + "1", "1+" * 600 + "1j", "not " * 600 + "1"):
        spec = f"attention:2,heat(t={value}):2"
        config = GPTConfig(n_head=4, n_embd=16, heads=spec)
        assert config.heads == spec  # kept as given, for the model build to refuse
        with pytest.raises(ValueError, match="nested too deeply") as err:
            DiffusionAttention(16, 4, spec)
        assert len(str(err.value)) < 400  # a 20,000-character spec is not written out whole
        with pytest.raises(ValueError, match="nested too deeply"):
            parse_operator_spec(f"heat(t={value})")


def test_bug_a_long_spec_read_every_item_anew(monkeypatch):
    """Bug: a config of a 10,000-item head spec read (parsed, looked up and introspected) every item anew: 1.5 s
    per config construction, and again in each run identity and checkpoint comparison; each distinct item is read
    once now."""
    calls = []
    item_as_read = heads_module._item_as_read
    monkeypatch.setattr(heads_module, "_item_as_read", lambda item: calls.append(item) or item_as_read(item))
    spec = ",".join(["Attention:1", "Heat(t=.5, learnable=True):1"] * 5000)
    start = time.perf_counter()
    config = GPTConfig(n_head=10000, n_embd=10000, heads=spec)
    elapsed = time.perf_counter() - start
    assert config.heads == ",".join(["attention:1", "heat(t=0.5, learnable=True):1"] * 5000)
    assert sorted(calls) == ["Attention:1", "Heat(t=.5, learnable=True):1"]
    assert elapsed < 1.0
    calls.clear()  # an unreadable last item: kept as given, read once
    bad = ",".join(["attention:1"] * 9999 + ["heat(tt=1):1"])
    assert _spec_as_read(bad) is bad and calls == ["attention:1", "heat(tt=1):1"]


def test_bug_an_unhashable_set_literal_was_a_bare_type_error():
    """Bug: an operator argument written as a set of lists (``heat(t={[1]})``) raised Python's bare
    ``TypeError: unhashable type: 'list'``, naming neither the spec nor the argument."""
    from diffusionformer.operators import build_operator

    for spec in ("heat(t={[1]})", "heat(t={(1, [2])})", "heat(t={[]: 1})"):
        with pytest.raises(ValueError, match=r"the value of 't' must be a Python literal"):
            build_operator(spec)
    assert _spec_as_read("Heat(t={[1]}):4") == "Heat(t={[1]}):4"


def test_a_hostile_layout_survives_the_checkpoint_and_load_run(tmp_path):
    """A layout mixing a per-head list, a learned heat spelt otherwise and a polynomial whose string argument holds
    ``,():`` is trained, checkpointed, reloaded by ``load_run`` as read, and resumed under a third spelling."""
    import json

    from diffusionformer.experiments import load_experiment_config
    from diffusionformer.experiments.reload import load_run
    from diffusionformer.experiments.results import run_dir
    from diffusionformer.experiments.runner import run_experiment

    def config(heads):
        return load_experiment_config({
            "name": "tiny", "seeds": [0],
            "tasks": [{"name": "digits", "dataset": "digits", "model": "vit-digits",
                       "model_overrides": {"dim": 16, "depth": 2, "num_heads": 4},
                       "train": {"max_steps": 2, "batch_size": 16, "lr": 1e-3, "warmup_steps": 0,
                                 "eval_interval": 2, "log_interval": 1, "checkpoint_interval": 1}}],
            "operators": [{"name": "s", "heads": heads}]})

    per_head = ["Attention", "I-P", "heat(t=0.5)", "laplacian"]
    spelt = {"0": per_head, "1": "Heat(learnable=True, t=.5):1, Poly(init = \"laplacian\", steps=2):1,Attention:{half}"}
    read = {"0": per_head, "1": "heat(t=0.5, learnable=True):1,polynomial(steps=2, init='laplacian'):1,attention:2"}
    (result,) = run_experiment(config(spelt), tmp_path, progress=False)
    assert result.status == "completed"
    rdir = run_dir(tmp_path / "tiny", "digits", "s", 0)
    assert json.loads((rdir / "run_config.json").read_text())["model_config"]["heads"] == read
    loaded = load_run(rdir)
    assert loaded.config.heads == read
    assert loaded.model.blocks[1].attn.heads_spec() == (
        "heat(t=0.5, steps=6, method='taylor', learnable=True):1,polynomial(steps=2, init='laplacian'):1,attention:2")
    respelt = dict(read, **{"1": "diffusion(t=5e-1,learnable=True):1,polynomial(steps=2,init='laplacian'):1,softmax:2"})
    (result,) = run_experiment(config(respelt), tmp_path, progress=False)
    assert result.status == "completed"
