"""The prose claims of ``docs/design.md`` and ``docs/tutorials/*.rst`` about behaviour, held against the code.

Each test names the page and the claim it pins: defaults, what a function or command does, what a run writes
and where, what is refused and with what error, what resumes, which package imports which, registry names.
The snippets of the tutorials run in ``test_docs_snippets_run.py``; these are the sentences around them.

Found and fixed (tests named ``test_bug_...``):

- ``experiments.minibatch``/``experiments.config``: a ``[tasks.minibatch]`` or ``[tasks.ssl]`` table with two
  problems raised ``TypeError: ConfigErrors.__init__() missing 1 required positional argument: 'where'`` (the
  tables re-raised ``type(exc)(message)``, which a ``ConfigErrors`` cannot be built from) instead of listing them.
- ``train.config``: the ``[tasks.train]`` table (``TrainConfig.from_dict`` and ``TrainConfig``) raised its first
  problem alone (an unknown key hid every other key's, a mistyped value every later field's), where the pages
  promise every unknown key, mistyped value and out-of-range field of the file in one ``ConfigErrors``.
"""

from __future__ import annotations

import ast
import functools
import json
import struct
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import diffusionformer
from diffusionformer import DiffusionAttention
from diffusionformer.config import ConfigErrors
from diffusionformer.experiments import load_experiment_config, propagation_hops, validate_experiment
from diffusionformer.experiments.cli import main
from diffusionformer.experiments.config import parse_override
from diffusionformer.experiments.runner import run_experiment
from diffusionformer.experiments.threads import plan_threads
from diffusionformer.functional import choose_dense_backend, diffuse, diffuse_sparse
from diffusionformer.models import create_model
from diffusionformer.operators import DiffusionOperator, build_operator, register_operator, unregister_operator
from diffusionformer.train import TrainConfig, Trainer, read_metrics

PKG = Path(diffusionformer.__file__).resolve().parent


def _experiment(task=None, operators=None, **top):
    task = {"name": "d", "dataset": "digits", "model": "vit-digits", **(task or {})}
    return {"name": "t", "seeds": [0], "tasks": [task], "operators": operators or [{"name": "attention"}], **top}


# --- bugs ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("table, model, problems", [
    ("minibatch", "graph-node-small", {"batch_size": "x", "eval": "ful"}),
    ("ssl", "dino-digits", {"knn_k": "x", "blur_prob": "y"}),
])
def test_bug_two_problems_of_a_minibatch_or_ssl_table_are_listed(table, model, problems):
    """Bug: a minibatch or ssl table with two problems raised a TypeError from ConfigErrors' constructor (the table
    re-raised ``type(exc)(text)``) instead of the ConfigErrors listing both, each naming the task."""
    task = {"dataset": "csbm" if table == "minibatch" else "digits", "model": model, table: problems}
    with pytest.raises(ConfigErrors) as info:
        load_experiment_config(_experiment(task))
    assert len(info.value.problems) == 2
    assert all(p.startswith("task 'd'") for p in info.value.problems)
    assert all(key in str(info.value) for key in problems)


def test_bug_the_train_table_lists_every_problem():
    """Bug: TrainConfig.from_dict stopped at the first unknown key and TrainConfig at the first bad field, so a
    ``[tasks.train]`` table with several typos was reported one problem per attempt (experiments.rst: "every unknown
    key, mistyped value and out-of-range field of the file is listed in one error")."""
    train = {"max_step": 3, "bach_size": 4, "lr": "fast", "warmup_steps": -1}
    with pytest.raises(ConfigErrors) as info:
        TrainConfig.from_dict(train)
    text = str(info.value)
    assert len(info.value.problems) == 4
    assert "'max_step' (did you mean 'max_steps'?)" in text and "'bach_size'" in text
    assert "TrainConfig.lr: expected float, got str" in text
    assert "TrainConfig.warmup_steps: expected an int >= 0" in text
    with pytest.raises(ConfigErrors) as info:  # the constructor too, cross-field checks included
        TrainConfig(batch_size="x", min_lr=1.0, lr=0.5)
    assert [p.split(":")[0] for p in info.value.problems] == ["TrainConfig.batch_size", "TrainConfig.min_lr"]
    with pytest.raises(ConfigErrors) as info:  # and through the experiment config, naming the task
        load_experiment_config(_experiment({"train": train}))
    assert len(info.value.problems) == 4 and all(p.startswith("task 'd' train: ") for p in info.value.problems)
    with pytest.raises(ValueError, match=r"^task 'd' train: TrainConfig.max_steps: expected an int >= 1, got 0$"):
        load_experiment_config(_experiment({"train": {"max_steps": 0}}))  # one problem: its own error, as before


# --- design.md: operators, back-ends, graphs ---------------------------------------------------------------


def test_design_capability_flags_and_their_defaults():
    """design.md: is_polynomial and supports_sparse default to True, the four context flags to False; a context flag
    on an operator that still claims is_polynomial is refused (by the layer, at construction)."""
    names = ("is_polynomial", "supports_sparse", "needs_second_map", "needs_layer_state", "reprojects_each_step",
             "needs_uniform_map")
    flags = {f: getattr(DiffusionOperator, f) for f in names}
    assert flags == {"is_polynomial": True, "supports_sparse": True, "needs_second_map": False,
                     "needs_layer_state": False, "reprojects_each_step": False, "needs_uniform_map": False}

    class TwoMaps(DiffusionOperator):
        name = "probe-two-maps"
        needs_second_map = True
        degree = 1

        def coefficients(self):
            return torch.tensor([0.0, 1.0])

    with pytest.raises(ValueError, match="declares needs_second_map but is_polynomial=True"):
        DiffusionAttention(8, 2, heads=[TwoMaps(1), build_operator("attention")])


def test_design_static_coefficients_are_a_cache_rebuilt_by_casts_and_assign_loads():
    """design.md: the static coefficient tensor is in no state dict and is rebuilt by casts, to_empty and
    load_state_dict(assign=True) of a model built on the meta device."""
    op = build_operator("laplacian")
    assert op.state_dict() == {} and op.double().coefficients().dtype == torch.float64
    with torch.device("meta"):
        layer = DiffusionAttention(16, 2, heads="attention:1,laplacian:1")
    layer.load_state_dict(DiffusionAttention(16, 2, heads="attention:1,laplacian:1").double().state_dict(), assign=True)
    c = layer.operators[1].coefficients()
    assert (c.device.type, c.dtype, c.tolist()) == ("cpu", torch.float64, [1.0, -1.0])
    with torch.device("meta"):
        layer = DiffusionAttention(16, 2, heads="laplacian:2")
    assert layer.to_empty(device="cpu").operators[0].coefficients().tolist() == [1.0, -1.0]


def test_design_exact_ppr_refuses_dropout_at_alpha_or_above():
    """design.md: the exact PPR needs dropout p < alpha; the layer asks at construction."""
    DiffusionAttention(8, 2, heads="ppr-exact(alpha=0.1):2", dropout=0.05)
    for p in (0.1, 0.2):
        with pytest.raises(ValueError, match="dropout < alpha"):
            DiffusionAttention(8, 2, heads="ppr-exact(alpha=0.1):2", dropout=p)


@pytest.mark.parametrize("n, k, causal, expected", [
    (128, 2, False, "matrix"), (129, 2, False, "sdpa"), (256, 3, False, "matrix"), (257, 3, False, "sdpa"),
    (384, 4, False, "matrix"), (512, 8, False, "matrix"), (513, 8, False, "sdpa"), (64, 2, True, "matrix"),
    (65, 2, True, "sdpa"), (128, 3, True, "matrix"), (256, 4, True, "matrix"), (384, 8, True, "matrix"),
    (385, 8, True, "sdpa"),
])
def test_design_auto_rule_crossovers(n, k, causal, expected):
    """design.md: materialise P up to N = 128 (K = 2), 256 (3), 384 (4), 512 (K >= 8); causal 64, 128, 256, 384."""
    assert choose_dense_backend(n, n, k, is_causal=causal) == expected


def test_design_auto_never_picks_triton_yet():
    from diffusionformer.ops.dense import TRITON_IN_AUTO

    assert TRITON_IN_AUTO is False


@pytest.mark.parametrize("backend", ["sdpa", "matrix", "auto", "csr", "native"])
def test_design_a_query_with_no_admissible_key_outputs_c0_v(backend):
    """design.md: a fully masked row gets a zero row of P on every back-end, so it outputs c_0 v and never NaN."""
    torch.manual_seed(0)
    coeffs = [[0.5, 1.0], [0.25, -0.5, 0.125]]
    degrees = [1, 2]
    c = torch.tensor([[0.5, 1.0, 0.0], [0.25, -0.5, 0.125]], dtype=torch.float64)
    if backend in ("csr", "native"):
        x = torch.randn(4, 2, 3, dtype=torch.float64)
        ei = torch.tensor([[0, 1, 3, 0], [1, 0, 0, 3]])  # node 2 receives no edge
        out = diffuse_sparse(x, x, x, ei, c, backend=backend, degrees=degrees)
        row, v = out[2], x[2]
    else:
        q, k, v = torch.randn(3, 1, 2, 4, 3, dtype=torch.float64)
        mask = torch.ones(4, 4, dtype=torch.bool)
        mask[2] = False
        out = diffuse(q, k, v, c, attn_mask=mask, backend=backend, degrees=degrees)
        row, v = out[0, :, 2], v[0, :, 2]
    assert torch.isfinite(out).all()
    torch.testing.assert_close(row, torch.tensor([r[0] for r in coeffs], dtype=torch.float64)[:, None] * v)


def test_design_a_bare_edge_index_is_an_unchecked_graph_and_graphs_convert_both_ways():
    from diffusionformer import graph as G

    g = DiffusionAttention(8, 2).graph_from_arguments(torch.randn(3, 8), edge_index=torch.tensor([[0, 1], [1, 0]]))
    assert g.checked is False
    builders = ("complete", "causal", "sliding_window", "grid", "knn", "from_pyg", "from_networkx")
    assert all(hasattr(G, n) for n in builders)
    sparse = G.causal(5).to_sparse()
    assert sparse.edge_index.shape[1] == 15 and sparse.to_dense().is_dense


@pytest.mark.parametrize("make", [
    lambda q: diffuse(q.to("meta"), q, q, [0.0, 1.0]),
    lambda q: diffuse(q, q, q.to("meta"), [0.0, 1.0]),
    lambda q: diffuse(q, q, q, [0.0, 1.0], attn_mask=torch.ones(3, 3, dtype=torch.bool, device="meta")),
    lambda q: diffuse_sparse(q[0].transpose(0, 1), q[0].transpose(0, 1), q[0].transpose(0, 1),
                             torch.tensor([[0], [1]], device="meta"), [0.0, 1.0]),
])
def test_design_functional_entry_points_refuse_other_devices(make):
    with pytest.raises(ValueError, match="device"):
        make(torch.randn(1, 2, 3, 4))


# --- design.md: arguments checked where they enter; registry -------------------------------------------------


@pytest.mark.parametrize("spec, kwargs, error, match", [
    ("heat", {"steps": 10**12}, ValueError, "exceeds the maximum"),
    ("heat", {"learnable": "no"}, TypeError, r"learnable must be a bool, got str \('no'\)"),
    ("heat", {"learnable": np.bool_(True)}, TypeError, "got numpy.bool"),
    ("heat", {"tt": 1.0}, TypeError, r"unknown argument 'tt' \(did you mean 't'\?\)"),
    ("heat(t=1, t=2)", {}, ValueError, "argument 't' is given twice"),
])
def test_design_operator_arguments_are_checked_where_they_enter(spec, kwargs, error, match):
    with pytest.raises(error, match=match):
        build_operator(spec, **kwargs)


@pytest.mark.parametrize("spelling, cls", [("I - P", "LaplacianOperator"), ("heat_exact", "ExactHeatOperator"),
                                           ("LAPLACIAN", "LaplacianOperator"), ("Heat-Exact", "ExactHeatOperator")])
def test_design_names_match_ignoring_case_spaces_and_underscores(spelling, cls):
    assert type(build_operator(spelling)).__name__ == cls


def _probe_op(name, aliases=()):
    return type("ProbeOp", (DiffusionOperator,), {"name": name, "aliases": aliases, "degree": 1,
                                                  "coefficients": lambda self: torch.tensor([0.0, 1.0])})


@pytest.mark.parametrize("name, aliases, match", [
    ("laplacian", (), "already registered"), ("probe-fresh", ("lap",), "'lap' is already registered"),
    ("probe(x", (), r"characters \['\('\]"), ("probe:x", (), r"characters \[':'\]"),
    ("probe-fresh", ("a,b",), r"characters \[','\]"), ("true", (), "boolean literal"),
])
def test_custom_operator_registry_refusals(name, aliases, match):
    """custom_operator.rst: the registry refuses a taken name or alias and one specs cannot read back."""
    with pytest.raises(ValueError, match=match):
        register_operator(_probe_op(name, aliases))


def test_custom_operator_a_class_registered_twice_is_refused_and_subclasses_do_not_inherit_aliases():
    base = _probe_op("probe-base", ("probe-b",))
    register_operator(base)
    try:
        with pytest.raises(ValueError, match="already registered as 'probe-base'"):
            register_operator(base)
        sub = type("ProbeSub", (base,), {"name": "probe-sub"})
        register_operator(sub)  # its inherited alias 'probe-b' is not claimed again
        try:
            assert type(build_operator("probe-b")) is base and type(build_operator("probe-sub")) is sub
        finally:
            unregister_operator("probe-sub")
    finally:
        unregister_operator("probe-base")


def test_custom_operator_defaults_named_on_the_page():
    from diffusionformer.operators import ExactHeatOperator, HeatOperator

    assert HeatOperator.example_kwargs == {"t": 0.7, "steps": 4, "learnable": True}
    assert DiffusionOperator.example_kwargs == {} and ExactHeatOperator.supports_sparse is False
    assert build_operator("heat", learnable=True).static_coefficients() is None


# --- design.md: numbers, flags, configs ----------------------------------------------------------------------


def test_design_numbers_flags_and_config_errors():
    cfg = TrainConfig(max_steps=np.int64(5), lr=np.float32(0.5))
    assert (type(cfg.max_steps), type(cfg.lr), cfg.lr) == (int, float, 0.5)
    assert issubclass(ConfigErrors, ValueError) and issubclass(ConfigErrors, TypeError)
    with pytest.raises(TypeError, match="expected int, got bool"):
        TrainConfig(max_steps=True)
    with pytest.raises(TypeError, match=r"expected bool, got numpy.bool"):
        TrainConfig(progress=np.bool_(True))
    with pytest.raises(TypeError, match=r"expected bool, got str \('no'\)"):
        TrainConfig(progress="no")


# --- design.md: layering -------------------------------------------------------------------------------------


def _imports(path: Path) -> set[str]:
    """Every ``diffusionformer`` module or name a file imports, top level or in a function (not TYPE_CHECKING)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for stmt in node.body for n in ast.walk(stmt)}
    here = ".".join(path.relative_to(PKG.parent).with_suffix("").parts)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = package
                for _ in range(node.level - 1):
                    pkg = pkg.rpartition(".")[0]
                base = f"{pkg}.{base}" if base else pkg
            found |= {f"{base}.{a.name}" for a in node.names} | {base}
    return {f for f in found if f.startswith("diffusionformer.")}


@functools.lru_cache(maxsize=1)
def _package_edges() -> dict[str, set[str]]:
    """``{module path under the package: its imports}`` for every module."""
    return {str(p.relative_to(PKG)): _imports(p) for p in sorted(PKG.rglob("*.py"))}


def test_design_layering_as_the_page_states_it():
    """design.md: dependencies point downwards (graph, ops -> operators -> nn -> models -> train -> experiments),
    the one upward import being ops/reference_rivals.py; analysis is read by experiments and models/vit.py only;
    nn never imports a back-end class, ops.csr or ops.triton."""
    order = {"graph": 0, "ops": 0, "operators": 1, "nn": 2, "models": 3, "train": 4, "experiments": 5}
    upward, analysis_readers, nn_kernels = set(), set(), set()
    for path, targets in _package_edges().items():
        src = path.split("/")[0]
        for t in targets:
            dst = t.split(".")[1]
            if src in order and dst in order and order[dst] > order[src]:
                upward.add((path, dst))
            if dst == "analysis" and src != "analysis":
                analysis_readers.add(path)
            if src == "nn" and (t.endswith("Backend") or t.startswith(("diffusionformer.ops.csr",
                                                                        "diffusionformer.ops.triton"))):
                nn_kernels.add((path, t))
    assert upward == {("ops/reference_rivals.py", "operators")}
    assert {p for p in analysis_readers if not p.startswith("experiments/")} == {"models/vit.py"}
    assert nn_kernels == set()


@pytest.mark.parametrize("src, dst", [
    ("cli", "runner"), ("runner", "store"), ("runner", "build"), ("build", "tasks"), ("runner", "outputs"),
    ("outputs", "tables"), ("tables", "compare"), ("compare", "stats"), ("outputs", "plots"), ("plots", "results"),
    ("runner", "results"), ("validate", "build"), ("publish", "tables"), ("publish", "results"),
    ("config", "minibatch"), ("validate", "minibatch"), ("tasks", "minibatch"), ("analyze", "build"),
    ("analyze", "results"), ("analyze", "tasks"), ("analyze", "reload"), ("analyze", "stats"),
])
def test_design_experiments_package_arrows(src, dst):
    """design.md: the arrows of the experiments package's import picture exist, and none points back."""
    edges = _package_edges()
    mod = "diffusionformer.experiments."
    assert any(t == mod + dst or t.startswith(mod + dst + ".") for t in edges[f"experiments/{src}.py"])
    assert not any(t == mod + src or t.startswith(mod + src + ".") for t in edges[f"experiments/{dst}.py"])


# --- design.md / experiments.rst: the experiment config --------------------------------------------------------


@pytest.mark.parametrize("change, match", [
    ({"tasks": [{"name": "cora", "dataset": "digits", "model": "vit-digits"},
                {"name": "Cora", "dataset": "digits", "model": "vit-digits"}]}, "differ only in case"),
    ({"operators": [{"name": "attention"}, {"name": "Attention"}]}, "differ only in case"),
    ({"operators": [{"name": "attention"}, {"name": "a b"}]}, "without whitespace"),
    ({"operators": [{"name": "attention"}, {"name": "a$b"}]}, r"'\$'"),
    ({"operators": [{"name": "attention"}, {"name": "a:b"}]}, "':'"),
    ({"primary": ["lapl"], "operators": [{"name": "attention"}, {"name": "lap", "laplacian_heads": 1}]},
     r"did you mean 'lap'\?"),
    ({"primary_quantities": ["finall"]}, r"did you mean 'final'\?"),
    ({"seeds": [0, 1], "tasks": [{"name": "d", "dataset": "digits", "model": "vit-digits", "folds": 3}]},
     "seeds must cover every fold equally often"),
])
def test_experiments_config_refusals(change, match):
    with pytest.raises(ValueError, match=match):
        load_experiment_config({**_experiment(), **change})


def test_experiments_config_defaults_and_overrides():
    """experiments.rst: data_seed defaults to 0, primary_quantities to all three, a setting with no key is attention
    only, names ending in loss are minimised; --set values are TOML (bare words strings), names may hold dots."""
    cfg = load_experiment_config(_experiment())
    assert cfg.tasks[0].data_seed == 0 and cfg.primary_quantities == ["final", "selected", "reach"]
    assert (cfg.operators[0].heads, cfg.operators[0].laplacian_heads) == (None, None)
    assert load_experiment_config(_experiment({"metric": "val_loss"})).tasks[0].minimize
    assert parse_override("tasks.digits.train.max_steps=100") == (["tasks", "digits", "train", "max_steps"], 100)
    assert parse_override('tasks."csbm-h0.1".train.lr=0.01') == (["tasks", "csbm-h0.1", "train", "lr"], 0.01)
    assert parse_override("name=foo") == (["name"], "foo")
    two = _experiment({"name": "csbm-h0.1"}, [{"name": "attention"}, {"name": "lap", "laplacian_heads": 1}])
    cfg = load_experiment_config(two, ["tasks.csbm-h0.1.train.lr=0.01", "operators=lap"])
    assert cfg.tasks[0].train == {"lr": 0.01} and [o.name for o in cfg.operators] == ["lap"]


@pytest.mark.parametrize("num_neighbors, problem, warns", [
    ([5, 5, 5], "samples 3 hops but the model propagates R = 2", False),
    ([5], None, True), ([5, 5], None, False), (3, None, False),
])
def test_experiments_minibatch_hops_against_propagation(num_neighbors, problem, warns):
    """experiments.rst: the validator refuses more hops than a setting's R and warns for fewer."""
    task = {"name": "c", "dataset": "csbm", "dataset_options": {"num_nodes": 40}, "model": "graph-node-small",
            "model_overrides": {"dim": 8, "num_heads": 2}, "train": {"max_steps": 2},
            "minibatch": {"batch_size": 8, "num_neighbors": num_neighbors}}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        problems = validate_experiment(load_experiment_config(_experiment(task)))
    assert (problem in problems[0]) if problem else problems == []
    assert any("approximations" in str(w.message) for w in caught) == warns


def test_experiments_grad_accum_refused_where_micro_batches_do_not_add_up():
    """design.md: a full-batch node task (with a minibatch table: refused) and DINO refuse grad_accum_steps."""
    with pytest.raises(ValueError, match="grad_accum_steps cannot split"):
        load_experiment_config(_experiment({"dataset": "csbm", "model": "graph-node-small",
                                            "train": {"grad_accum_steps": 2},
                                            "minibatch": {"batch_size": 8, "num_neighbors": [5, 5]}}))
    dino = {"model": "dino-digits", "metric": "knn_test_acc", "train": {"max_steps": 4, "grad_accum_steps": 2,
            "batch_size": 8}, "model_overrides": {"dim": 16, "depth": 1, "num_heads": 2, "schedule_steps": 4}}
    problems = validate_experiment(load_experiment_config(_experiment(dino)), load_data=False)
    assert len(problems) == 1 and "DINO updates its teacher and centre at every loss call" in problems[0]


def test_experiments_propagation_hops():
    """experiments.rst: two layers of heat(steps=2) give R = 4; a GCN needs num_layers + 1."""
    heat = create_model("graph-node-small", in_channels=4, num_classes=2, heads="heat(steps=2):4")
    assert propagation_hops(heat) == 4
    assert propagation_hops(create_model("gcn-2layer", in_channels=4, num_classes=2)) == 3


@pytest.mark.parametrize("kwargs, environ, threads, source", [
    ({"threads": 3, "cores": 2}, {"OMP_NUM_THREADS": "1"}, 3, "--threads"),
    ({"cores": 8}, {"OMP_NUM_THREADS": "2"}, 2, "OMP_NUM_THREADS"),
    ({"cores": 8, "workers": 3}, {}, 2, "cores // workers"),
    ({"cores": 2, "workers": 4}, {}, 1, "cores // workers"),
    ({"cores": 16}, {"LOCAL_WORLD_SIZE": "4"}, 4, "cores // workers"),
])
def test_experiments_threads_rule(kwargs, environ, threads, source):
    plan = plan_threads(environ=environ, **kwargs)
    assert (plan.threads, plan.source) == (threads, source)


# --- experiments.rst: the command line, what a comparison writes, resuming ------------------------------------


TINY = '''name = "tiny"
seeds = [0]
[[tasks]]
name = "nodes"
dataset = "csbm"
dataset_options = {num_nodes = 60}
model = "graph-node-small"
model_overrides = {dim = 8, depth = 1, num_heads = 2}
[tasks.train]
max_steps = 2
batch_size = 8
eval_interval = 2
log_interval = 1
checkpoint_interval = 2
[[operators]]
name = "attention"
[[operators]]
name = "heat"
heads = "heat(t=1.0, learnable=True, steps=2):1,attention:1"
'''


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    (root / "tiny.toml").write_text(TINY, encoding="utf-8")
    config = load_experiment_config(str(root / "tiny.toml"))
    results = run_experiment(config, root / "out", progress=False, log=lambda m: None, device="cpu")
    return root, config, results


def test_experiments_what_a_comparison_writes(tiny_run):
    """experiments.rst: the files of <out>/<name>/, learned_operators.json for learned heads, and a second run
    that trains nothing and reads the same results back."""
    root, config, results = tiny_run
    out = root / "out" / "tiny"
    for name in ("manifest.json", "results.json", "results.md", "plots/nodes_curves.png", "plots/nodes_final.png"):
        assert (out / name).is_file(), name
    for setting in ("attention", "heat"):
        files = {p.name for p in (out / "runs" / "nodes" / setting / "seed0").iterdir()}
        assert {"metrics.jsonl", "summary.json", "checkpoint.pt", "run_config.json"} <= files
        assert ("learned_operators.json" in files) == (setting == "heat")
    manifest = json.loads((out / "manifest.json").read_text())
    assert {"config", "command", "git_commits", "cpu_kernels", "cpu_kernel_sets"} <= set(manifest)
    summary = json.loads((out / "runs/nodes/heat/seed0/summary.json").read_text())
    assert summary["status"] == "completed" and {"eval", "num_parameters", "config"} <= set(summary)
    again = run_experiment(config, root / "out", progress=False, log=lambda m: None, device="cpu")
    assert [r.value for r in again] == [r.value for r in results]
    assert summary == json.loads((out / "runs/nodes/heat/seed0/summary.json").read_text())


@pytest.mark.parametrize("override, change", [
    ("tasks.nodes.train.lr=0.5", "train (lr: 0.0003 then 0.5)"),
    ("tasks.nodes.train.eval_interval=1", "train (eval_interval: 2 then 1)"),
    ("tasks.nodes.train.max_steps=4", "train (max_steps: 2 then 4)"),
])
def test_experiments_run_refuses_a_changed_train_table(tiny_run, capsys, override, change):
    """experiments.rst (Resuming): every train setting but the device is a run's identity; run refuses a change,
    naming it, and writes nothing; status names it too."""
    root = tiny_run[0]
    argv = [str(root / "tiny.toml"), "--out", str(root / "out"), "--set", override]
    before = (root / "out/tiny/runs/nodes/attention/seed0/run_config.json").read_text()
    assert main(["run", *argv, "--no-progress", "--device", "cpu"]) == 2
    assert f"made with a different {change}" in capsys.readouterr().err
    assert (root / "out/tiny/runs/nodes/attention/seed0/run_config.json").read_text() == before
    assert main(["status", *argv]) == 0
    assert f"made with another {change}" in capsys.readouterr().out


def test_experiments_show_lists_every_problem_and_run_writes_nothing(tmp_path, capsys):
    bad = TINY.replace('model = "graph-node-small"', 'model = "graph-node-small"\nmetric = "test_ac"')
    (tmp_path / "bad.toml").write_text(bad, encoding="utf-8")
    assert main(["show", str(tmp_path / "bad.toml")]) == 2
    assert "metric 'test_ac' is not an evaluation key" in capsys.readouterr().err
    assert main(["run", str(tmp_path / "bad.toml"), "--out", str(tmp_path / "out"), "--device", "cpu"]) == 2
    assert "nothing was trained" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_experiments_show_needs_no_data_root(tmp_path, capsys, monkeypatch):
    """experiments.rst: a missing data root is not a problem for show, while run reports it (before writing)."""
    monkeypatch.delenv("DIFFUSIONFORMER_DATA", raising=False)
    (tmp_path / "c.toml").write_text('name = "c"\nseeds = [0]\n[[tasks]]\nname = "cora"\ndataset = "cora"\n'
                                     'model = "graph-node-small"\n[[operators]]\nname = "attention"\n',
                                     encoding="utf-8")
    assert main(["show", str(tmp_path / "c.toml")]) == 0
    assert main(["run", str(tmp_path / "c.toml"), "--out", str(tmp_path / "out"), "--device", "cpu"]) == 2
    assert "reads files from a data root, and none is set" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def _exit_code(argv):
    """The exit status of ``python -m diffusionformer.experiments ARGV``: main's return value, or argparse's exit."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


@pytest.mark.parametrize("argv, env, match", [
    (["--device", "CUDA:1"], {}, "did you mean 'cuda:1'?"),
    (["--work", "2"], {}, "unrecognized arguments: --work 2 (did you mean '--workers'?)"),
    (["--workers", "2"], {"DIFFUSIONFORMER_WORKER": "1"}, "a worker does not start workers of its own"),
])
def test_experiments_run_options_are_checked_first(tmp_path, capsys, monkeypatch, argv, env, match):
    """experiments.rst / design.md: a misspelt device, an abbreviated --workers and workers of a worker are refused
    before anything is written."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    (tmp_path / "tiny.toml").write_text(TINY, encoding="utf-8")
    assert _exit_code(["run", str(tmp_path / "tiny.toml"), "--out", str(tmp_path / "out"), *argv]) == 2
    assert match in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# --- experiments.rst / modern_parts.rst: the trainer -------------------------------------------------------------


class _Regression:
    def train_batch(self, step, generator, batch_size):
        x = torch.randn(batch_size, 3, generator=generator)
        return {"x": x, "y": x.sum(-1, keepdim=True)}

    def loss(self, model, batch):
        return F.mse_loss(model(batch["x"]), batch["y"]), {"acc": 1.0}

    def evaluate(self, model, max_batches):
        return {"loss": 0.0, "accuracy": 0.5}


def _fit(out, model=None, task=None, **kw):
    cfg = TrainConfig(**{"max_steps": 2, "batch_size": 4, "device": "cpu", "progress": False, **kw})
    torch.manual_seed(0)
    return Trainer(model or nn.Linear(3, 1), task or _Regression(), cfg, out, resume=True).fit()


@pytest.mark.parametrize("change, refused", [
    ({"eval_interval": 1}, None), ({"checkpoint_interval": 1}, None), ({"lr": 0.5}, "lr: checkpoint 0.0003, now 0.5"),
    ({"batch_size": 8}, "batch_size: checkpoint 4, now 8"), ({"max_steps": 4}, "lr_decay_steps"),
])
def test_experiments_the_trainer_resumes_only_what_continues_the_updates(tmp_path, change, refused):
    """experiments.rst (Resuming): the Trainer lets intervals change, refuses what changes the updates, naming it."""
    _fit(tmp_path)
    if refused is None:
        assert _fit(tmp_path, **change)["status"] == "completed"
    else:
        with pytest.raises(ValueError, match=refused):
            _fit(tmp_path, **change)


def test_experiments_max_steps_grows_with_an_explicit_lr_decay_steps(tmp_path):
    _fit(tmp_path, lr_decay_steps=8)
    assert _fit(tmp_path, lr_decay_steps=8, max_steps=4)["step"] == 4


def test_design_a_flipped_byte_of_tensor_data_is_a_damaged_checkpoint(tmp_path):
    """design.md: every checkpoint entry is checked against its zip CRC-32 before torch.load."""
    from diffusionformer.train.checkpoint import CheckpointError

    _fit(tmp_path, lr_decay_steps=8)
    path = tmp_path / "checkpoint.pt"
    raw = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as z:
        entry = next(i for i in z.infolist() if "/data/" in i.filename)
    name_len, extra_len = struct.unpack("<HH", raw[entry.header_offset + 26: entry.header_offset + 30])
    raw[entry.header_offset + 30 + name_len + extra_len] ^= 1  # the first byte of a tensor's data
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="fails its CRC-32 check"):
        _fit(tmp_path, lr_decay_steps=8, max_steps=4)


def test_modern_parts_opt_in_defaults_csv_columns_and_accumulation(tmp_path):
    """modern_parts.rst: every part is opt-in; the csv logger's columns; a batch not divisible by A is an error."""
    from diffusionformer.models import GPTConfig, GraphTransformerConfig, ViTConfig

    cfg, gpt = TrainConfig(), GPTConfig()
    assert (cfg.grad_accum_steps, cfg.amp, cfg.loggers) == (1, "auto", ("jsonl",))
    assert (gpt.rope, gpt.n_kv_head, gpt.zero_init_proj, ViTConfig().rope) == (False, None, False, False)
    graph = GraphTransformerConfig(in_channels=3, num_classes=2)
    assert (graph.pe, graph.edge_dim, graph.pe_sign_flip, graph.self_loops, graph.pool) == (
        None, None, True, True, "mean")
    _fit(tmp_path / "csv", loggers=["jsonl", "csv"], log_interval=1, eval_interval=1)
    header = (tmp_path / "csv" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert header[:6] == ["step", "split", "loss", "lr", "elapsed", "time"]
    assert all(c.startswith("metrics.") for c in header[6:]) and "metrics.accuracy" in header

    class Odd(_Regression):
        def train_batch(self, step, generator, batch_size):
            return super().train_batch(step, generator, batch_size - 1)

    with pytest.raises(ValueError, match="grad_accum_steps=2: expected the batch .* divisible by 2"):
        _fit(tmp_path / "odd", task=Odd(), grad_accum_steps=2)


def test_modern_parts_a_missing_tensorboard_is_said_before_training(tmp_path):
    import importlib.util

    if importlib.util.find_spec("tensorboard") is not None:
        pytest.skip("tensorboard is installed")
    steps = []

    class Counted(_Regression):
        def train_batch(self, step, generator, batch_size):
            steps.append(step)
            return super().train_batch(step, generator, batch_size)

    with pytest.raises(ImportError, match="pip install tensorboard"):
        _fit(tmp_path, task=Counted(), loggers=["jsonl", "tensorboard"])
    assert steps == []


def test_modern_parts_zero_init_proj_starts_every_residual_branch_at_zero():
    from diffusionformer.models import DiffusionGPT, GPTConfig

    model = DiffusionGPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16, zero_init_proj=True))
    y = torch.randn(2, 8, 16)
    assert all(torch.equal(block(y), y) for block in model.blocks)


def test_design_a_damaged_metrics_line_loses_that_line(tmp_path):
    lines = [json.dumps({"step": 1, "split": "train", "metrics": {}}).encode(), b"not json", b"\xff\xfe",
             b'{"step": "1", "split": "train", "metrics": {}}',
             json.dumps({"step": 2, "split": "eval", "metrics": {}}).encode()]
    (tmp_path / "metrics.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    with pytest.warns(UserWarning) as caught:
        records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [1, 2]
    assert [str(w.message).split(": ")[0].rsplit(":", 1)[1] for w in caught] == ["2", "3", "4"]


# --- quickstart.rst, graph_transformer.rst, head_mix.rst --------------------------------------------------------


def _sdpa_reference(layer, x, **kw):
    B, N, D = x.shape
    q, k, v = layer.qkv(x).view(B, N, 3, layer.num_heads, D // layer.num_heads).permute(2, 0, 3, 1, 4)
    return layer.out_proj(F.scaled_dot_product_attention(q, k, v, **kw).transpose(1, 2).reshape(B, N, D))


def test_quickstart_masks_work_as_in_sdpa_and_edges_point_source_to_target():
    torch.manual_seed(0)
    layer = DiffusionAttention(8, 2).double().eval()
    x = torch.randn(1, 5, 8, dtype=torch.float64)
    allowed = torch.rand(5, 5) > 0.4
    allowed.fill_diagonal_(True)
    bias = torch.randn(5, 5, dtype=torch.float64)
    pad = torch.tensor([[False, False, False, True, True]])
    torch.testing.assert_close(layer(x, attn_mask=allowed), _sdpa_reference(layer, x, attn_mask=allowed))
    torch.testing.assert_close(layer(x, attn_mask=bias), _sdpa_reference(layer, x, attn_mask=bias))
    torch.testing.assert_close(layer(x, key_padding_mask=pad), _sdpa_reference(layer, x, attn_mask=~pad[:, None, None]))
    causal = DiffusionAttention(8, 2, causal=True).double().eval()
    causal.load_state_dict(layer.state_dict())
    torch.testing.assert_close(causal(x), _sdpa_reference(layer, x, is_causal=True))
    nodes, edge = torch.randn(2, 8, dtype=torch.float64), torch.tensor([[0], [1]])  # 0 -> 1: node 1 attends to 0
    moved = nodes.clone()
    moved[0] += 1.0
    y, y_moved = layer(nodes, edge_index=edge), layer(moved, edge_index=edge)
    assert not torch.allclose(y[1], y_moved[1])
    moved = nodes.clone()
    moved[1] += 1.0
    torch.testing.assert_close(layer(moved, edge_index=edge)[0], y[0])


def test_graph_transformer_attention_never_crosses_graphs():
    torch.manual_seed(0)
    model = create_model("graph-graph-small", in_channels=3, num_classes=2).eval()
    x, batch = torch.randn(6, 3), torch.tensor([0, 0, 0, 1, 1, 1])
    ring = torch.tensor([[0, 1, 2, 3, 4, 5], [1, 2, 0, 4, 5, 3]])
    moved = x.clone()
    moved[0] += 5.0
    y, y_moved = model(x, ring, batch), model(moved, ring, batch)
    torch.testing.assert_close(y[1], y_moved[1])
    assert not torch.allclose(y[0], y_moved[0])
    with pytest.raises(ValueError, match="connects nodes of different graphs"):
        model(x, torch.tensor([[0], [4]]), batch)


def test_graph_transformer_to_networkx_edge_j_to_i_carries_p_ij():
    from diffusionformer.graph import to_networkx

    torch.manual_seed(0)
    ei = torch.tensor([[0, 1, 2, 0, 2, 1], [1, 1, 1, 2, 2, 0]])
    _, inter = DiffusionAttention(8, 2)(torch.randn(3, 8), edge_index=ei, return_intermediates=True)
    g = to_networkx(inter, head=0)
    assert all(g[j][i]["weight"] == pytest.approx(inter.attn_weights[e, 0].item())
               for e, (j, i) in enumerate(ei.T.tolist()))
    mean = inter.attn_weights.mean(1)
    top = to_networkx(inter, head="mean", top_k=1)
    heaviest = {i: max((e for e in range(6) if ei[1, e] == i), key=lambda e: mean[e]) for i in range(3)}
    assert sorted(top.edges()) == sorted((ei[0, e].item(), i) for i, e in heaviest.items())


def test_head_mix_generate_crops_the_context_and_temperature_zero_is_greedy():
    torch.manual_seed(0)
    model = create_model("gpt-char-tiny", vocab_size=11).eval()
    T = model.config.block_size
    seq = torch.randint(0, 11, (1, T + 5))
    out = model.generate(seq, 3, temperature=0)
    for _ in range(3):
        logits = model(seq[:, -T:])[0]  # (logits, loss=None)
        seq = torch.cat([seq, logits[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, seq)


# --- ssl.rst, token_geometry.rst ----------------------------------------------------------------------------------


def test_ssl_defaults_buffers_and_the_python_ssl_argument():
    """ssl.rst: k = 20 and temperature 0.07; dino-digits blurs with [0.1, 0.6], dino-mnist with SSLConfig's
    [0.1, 1.0]; the teacher is buffers; old model overrides warn; an ssl given in Python replaces the model's."""
    from diffusionformer.data import load_dataset
    from diffusionformer.data.ssl import SSLConfig
    from diffusionformer.experiments.tasks import build_task

    tiny = {"dim": 16, "depth": 1, "num_heads": 2}
    dino = create_model("dino-digits", schedule_steps=5, **tiny)
    cfg = dino.task_config
    assert (cfg.knn_k, cfg.knn_temperature, cfg.blur_sigma) == (20, 0.07, (0.1, 0.6))
    assert create_model("dino-mnist", **tiny).task_config.blur_sigma == SSLConfig().blur_sigma == (0.1, 1.0)
    teacher = [n for n, _ in dino.named_buffers() if "teacher" in n]
    assert teacher and not any("teacher" in n for n, _ in dino.named_parameters())
    with pytest.warns(DeprecationWarning, match="settings of the task"):
        assert create_model("dino-digits", knn_k=7, **tiny).task_config.knn_k == 7
    data = load_dataset("digits")
    assert build_task(data, dino).ssl is dino.task_config
    # blur_sigma (0.1, 1.0), not the preset's (0.1, 0.6)
    assert build_task(data, dino, ssl={"knn_k": 10}).ssl == SSLConfig(knn_k=10)


def test_ssl_validate_warns_when_schedule_steps_is_not_max_steps():
    task = {"model": "dino-digits", "metric": "knn_test_acc", "train": {"max_steps": 10},
            "model_overrides": {"dim": 16, "depth": 1, "num_heads": 2, "schedule_steps": 20}}
    with pytest.warns(UserWarning, match="schedule_steps = 20"):
        assert validate_experiment(load_experiment_config(_experiment(task)), load_data=False) == []


def test_token_geometry_capture_stops_early_restores_the_model_and_groups_need_labels():
    from diffusionformer.analysis import (capture_dataset, layer_reports, register_metric, unregister_metric,
                                          variance_ratio)

    torch.manual_seed(0)
    vit = create_model("vit-digits", dim=16, depth=2, num_heads=2).train()
    pulled = []

    def batches():
        for i in range(10):
            pulled.append(i)
            yield torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))

    cap = capture_dataset(vit, batches(), max_examples=16)
    hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in vit.modules())
    assert (pulled, vit.training, hooks, cap.states[0].requires_grad) == ([0, 1], True, 0, False)
    register_metric("probe_seq", group="sequence_label")(lambda view: 0.0)
    try:
        unlabelled = capture_dataset(vit, [torch.randn(4, 1, 8, 8)], max_examples=4).drop_prefix(1)
        assert "probe_seq" not in layer_reports(unlabelled)[0].metrics
        assert "probe_seq" in layer_reports(cap.drop_prefix(1))[0].metrics
    finally:
        unregister_metric("probe_seq")
    with pytest.raises(ValueError, match=r"did you mean 'smoothing'\?"):
        register_metric("probe_bad", group="smoothin")
    assert variance_ratio(torch.ones(2, 5, 3)).tolist() == [0.0, 0.0]  # no variation: 0, not NaN
    with pytest.raises(ValueError, match="NaN"):
        variance_ratio(torch.full((1, 3, 2), float("nan")))


# --- own_model_data.rst: a user's dataset, preset and model family ------------------------------------------------


@pytest.fixture
def own_family():
    """own_model_data.rst's registrations, small: a synthetic image loader that records the seeds it is called with,
    a one-layer pixel-token model family with its adapter, and a model family without a head count; removed after."""
    from dataclasses import dataclass

    from diffusionformer.data import ClassificationData, register_dataset, unregister_dataset
    from diffusionformer.experiments.tasks import task_adapter, unregister_task_adapter
    from diffusionformer.models import register_model, unregister_model

    seeds = []

    @register_dataset("probe-own-blobs", kind="image")
    def _load(*, seed, num_train=16):
        seeds.append(seed)
        g = torch.Generator().manual_seed(seed)
        x = [torch.randn(n, 1, 2, 2, generator=g, dtype=torch.float32) for n in (num_train, 8, 8)]
        y = [torch.randint(0, 2, (n,), generator=g) for n in (num_train, 8, 8)]
        return ClassificationData("probe-own-blobs", "image", x[0], y[0], x[1], y[1], x[2], y[2], num_classes=2,
                                  input_shape=(1, 2, 2))

    @dataclass
    class OwnConfig:
        num_pixels: int = 4
        num_classes: int = 2
        dim: int = 4
        num_heads: int = 2
        heads: str | None = None

    class OwnNet(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.config = config
            self.embed = nn.Linear(1, config.dim)
            self.attn = DiffusionAttention(config.dim, config.num_heads, heads=config.heads)
            self.head = nn.Linear(config.dim, config.num_classes)

        def forward(self, x):
            return self.head(self.attn(self.embed(x.flatten(1)[..., None])).mean(1))

    @dataclass
    class HeadlessConfig:
        num_pixels: int = 4
        num_classes: int = 2

    class Headless(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.config = config
            self.lin = nn.Linear(config.num_pixels, config.num_classes)

        def forward(self, x):
            return self.lin(x.flatten(1))

    sizes = lambda data: {"num_pixels": 4, "num_classes": data.num_classes}  # noqa: E731
    task_adapter(OwnConfig, ClassificationData)(sizes)
    task_adapter(HeadlessConfig, ClassificationData)(sizes)
    register_model("probe-own-net", OwnNet, OwnConfig)
    register_model("probe-headless", Headless, HeadlessConfig)
    try:
        yield {"seeds": seeds, "config": OwnConfig, "sizes": sizes, "data_cls": ClassificationData}
    finally:
        unregister_dataset("probe-own-blobs")
        unregister_model("probe-own-net")
        unregister_model("probe-headless")
        unregister_task_adapter((OwnConfig, HeadlessConfig), ClassificationData)


def _own(model="probe-own-net", operators=None, **task):
    return load_experiment_config(_experiment(
        {"dataset": "probe-own-blobs", "model": model, "metric": "test_acc", **task,
         "train": {"max_steps": 1, "batch_size": 4, "warmup_steps": 0, "eval_interval": 1, "log_interval": 1,
                   "checkpoint_interval": 1}},
        operators or [{"name": "attention"}, {"name": "lap", "heads": "attention:{half},laplacian:{half}"}],
        seeds=[0, 1]))


def test_own_model_data_loader_gets_the_data_seed_and_the_settings_write_heads(own_family, tmp_path):
    """own_model_data.rst: the runner calls the loader with the task's data_seed, not the run's seed; a setting's
    ``{half}`` layout is written into the family's ``heads`` field; the user's class is recorded in the identity."""
    results = run_experiment(_own(data_seed=3), tmp_path, progress=False, log=lambda s: None)
    assert [r.status for r in results] == ["completed"] * 4
    assert set(own_family["seeds"]) == {3}
    identity = json.loads((tmp_path / "t" / "runs" / "d" / "lap" / "seed1" / "run_config.json").read_text())
    assert identity["model_config"]["heads"] == "attention:1,laplacian:1"
    assert identity["model_class"].endswith("OwnNet")


def test_own_model_data_refusals_before_training(own_family):
    """own_model_data.rst: a metric the task does not evaluate is refused for a user's family as for the library's; a
    config without a head count refuses a setting with a head layout and takes a setting's model_overrides alone;
    adapters are keyed by the exact config class (a subclass needs its own); a cell that defines the config class
    again registers its adapter without a refusal, while the same class twice is refused naming the way back."""
    from dataclasses import dataclass

    from diffusionformer.data import load_dataset
    from diffusionformer.experiments.tasks import model_overrides_for_data, task_adapter, unregister_task_adapter

    problems = validate_experiment(_own(metric="test_ac"), load_data=False)
    assert any("'test_ac' is not an evaluation key" in p for p in problems), problems
    problems = validate_experiment(_own("probe-headless"), load_data=False)
    assert any("sets heads but model 'probe-headless' has no attention heads" in p for p in problems), problems
    assert validate_experiment(_own("probe-headless", [{"name": "a"}, {"name": "b", "model_overrides": {
        "num_classes": 2}}]), load_data=False) == []
    own_cls, data_cls = own_family["config"], own_family["data_cls"]
    data = load_dataset("probe-own-blobs")
    sub = dataclass(type("SubConfig", (own_cls,), {}))
    with pytest.raises(ValueError, match="no task adapter is registered for model config class .*SubConfig"):
        model_overrides_for_data(data, sub)
    with pytest.raises(ValueError, match=r"call unregister_task_adapter\(OwnConfig, ClassificationData\) first"):
        task_adapter(own_cls, data_cls)(own_family["sizes"])
    again = dataclass(type("OwnConfig", (), {"__annotations__": {"num_pixels": int}, "num_pixels": 4}))
    task_adapter(again, data_cls)(own_family["sizes"])  # a new class: another key, not refused
    try:
        assert model_overrides_for_data(data, again) == {"num_pixels": 4, "num_classes": 2}
    finally:
        unregister_task_adapter(again, data_cls)
