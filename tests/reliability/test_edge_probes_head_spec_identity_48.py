"""Edge probes of head-spec spellings across run identities, ``summary``'s columns and checkpoints (sitting 48):
one head layout, spelt otherwise ("Attention:2, I-P:2", arguments in another order, ``.5``), is one run."""

from __future__ import annotations

import hashlib
import json

import pytest

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.results import _normalized_identity, run_dir
from experiments_tiny_configs import write_finished_study

CANONICAL = "attention:2,laplacian:2"
#: spellings of CANONICAL's layout (4 heads), and of one learned-heat layout
SPELLINGS = ["Attention:2, Laplacian:2", "attention:2,I-P:2", " attention : 2 ,LAPLACIAN:2", "attention:{half},i-p:{half}"]
HEAT = "attention:2,heat(learnable=True, t=0.5):2"
HEAT_SPELLINGS = ["attention:2,heat(t=0.5,learnable=True):2", "attention:2,Heat( t = .5 , learnable = True ):2",
                  "attention:2,diffusion(learnable=True, t=5e-1):2"]


def _config(heads, *, name="tiny", **train):
    return load_experiment_config({
        "name": name, "seeds": [0],
        "tasks": [{"name": "digits", "dataset": "digits", "model": "vit-digits",
                   "model_overrides": {"dim": 16, "depth": 2, "num_heads": 4},
                   "train": {"max_steps": 2, "batch_size": 16, "lr": 1e-3, "warmup_steps": 0, "eval_interval": 2,
                             "log_interval": 1, "checkpoint_interval": 1, **train}}],
        "operators": [{"name": "s", "heads": heads}]})


@pytest.fixture(scope="module")
def identity():
    """``identity(heads)``: the run identity (``run_config.json``) the runner gives the tiny run of ``heads``."""
    from diffusionformer.experiments.build import build_model, task_data
    from diffusionformer.experiments.config import train_config
    from diffusionformer.experiments.runner import _run_identity

    cache: dict = {}

    def make(heads):
        cfg = _config(heads)
        task, setting = cfg.tasks[0], cfg.operators[0]
        model = build_model(task, setting, task_data(task, 0, None, cache))
        return _run_identity(task, model, train_config(task, 0))
    return make


def _digest(identity):
    # eval_batch_size joined every identity (sitting 57; null where unset): one recorded without it reads as before
    assert identity.get("eval_batch_size", "absent") is None
    identity = {k: v for k, v in identity.items() if k != "eval_batch_size"}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def test_canonically_spelt_identities_keep_their_hash(identity):
    """Pinned before the head specs were read as one spelling: a canonically spelt layout's run identity (what a stored
    ``run_config.json`` holds, and is compared with) is unchanged, so stored runs keep resuming."""
    assert _digest(identity(CANONICAL)) == "a2f41ed743301d61e04264b7ade617cac22188791b792f179465749eed7a8290"
    assert _digest(identity("attention:{half},laplacian:{half}")) == _digest(identity(CANONICAL))
    heat = "attention:2,heat(t=0.5, steps=4, method='taylor', learnable=True):2"  # as heads_spec() writes it
    assert _digest(identity(heat)) == "0086f245064c86585fd9b9fedd20513fb6ff4b5ff21430c988702e411ebeb531"
    assert _digest(identity({"1": "laplacian:4"})) == "d671dceb0dfb1025b1245d9082228081f6d3c5d6d365bfdae09363e5454790ae"
    assert _digest(identity(["attention:4", CANONICAL])) == (
        "276cf7b61472fa4eb6b84f30ed3fbdda0e46f6a4e98bde8e549a35614425c5f8")


def test_the_canonical_form_of_a_head_spec():
    from diffusionformer.models import model_config
    from diffusionformer.models.vit import DiffusionViT
    from diffusionformer.nn.heads import _layout_as_read, _spec_as_read

    for spec in ("attention:6,laplacian:2", "attention:{half},laplacian:{half}", "laplacian", "attention:{H}",
                 "attention:2,heat(t=0.5, steps=4, method='taylor', learnable=True):2",
                 "attention:1,polynomial(steps=3, init='attention', basis='chebyshev'):1,heat(num_heads=1):2"):
        assert _spec_as_read(spec) == spec
    model = DiffusionViT(model_config("vit-digits", dim=16, depth=1, num_heads=4, heads=HEAT_SPELLINGS[1]))
    written = model.blocks[0].attn.heads_spec()  # the library's own spelling is its own
    assert _spec_as_read(written) == written
    assert _spec_as_read("Attention:{half}, I - P:{half}") == "attention:{half},laplacian:{half}"
    assert _spec_as_read('attention:2,polynomial(init="attention", steps=3):2') == (
        "attention:2,polynomial(steps=3, init='attention'):2")
    # not read: left as given, for the config's own checks to report
    for spec in ("attention:2,lapalcian:2", "heat(tt=1):4", "attention:{x}", "attention:2.0", "heat(t=):4", ""):
        assert _spec_as_read(spec) == spec
    per_head = ["Attention", "I-P"]
    assert _spec_as_read(per_head) is per_head and _layout_as_read([None, per_head]) == [None, per_head]
    layout = {"1": "I-P:4"}
    assert _layout_as_read(layout) == {"1": "laplacian:4"} and layout == {"1": "I-P:4"}  # a copy, not changed
    same = ["attention:4", CANONICAL]
    assert _layout_as_read(same) is same


def test_bug_model_configs_record_the_head_spec_as_read():
    """Bug: the model configs recorded ``heads`` as spelt, so ``"Attention:2, I-P:2"`` and
    ``"attention:2,laplacian:2"`` (one model) gave two configs, two run identities and two checkpoint records."""
    from diffusionformer.models import GPTConfig, GraphTransformerConfig, ViTConfig
    from diffusionformer.models.dino import DINOConfig

    assert GPTConfig(n_head=4, n_embd=16, heads="Attention:2, I-P:2").heads == CANONICAL
    assert ViTConfig(num_heads=4, dim=16, heads={"1": "I-P:4"}).heads == {"1": "laplacian:4"}
    assert GraphTransformerConfig(num_heads=4, dim=16, heads=[None, "Heat( t=.5 ):4"]).heads == [None, "heat(t=0.5):4"]
    dino = DINOConfig(input_size=(8, 8), patch_size=2, dim=16, depth=2, num_heads=4, heads="Attention:2,I-P:2")
    assert dino.heads == CANONICAL and dino.vit_config().heads == CANONICAL


@pytest.mark.parametrize("spelt", SPELLINGS)
def test_bug_run_identity_of_a_head_spec_spelt_otherwise(identity, spelt):
    """Bug: the run identity held the head spec as spelt, so a stored run of ``"attention:2,laplacian:2"`` read with
    ``"Attention:2, Laplacian:2"`` or ``"attention:2,I-P:2"`` (the same model) was refused by ``run`` as made with
    a different model_config."""
    assert identity(spelt) == identity(CANONICAL)


def test_bug_run_identity_of_operator_arguments_spelt_otherwise(identity):
    """Bug: ``heat(learnable=True, t=0.5)`` and ``heat(t=0.5,learnable=True)`` (one operator) were two identities."""
    for spelt in HEAT_SPELLINGS:
        assert identity(spelt) == identity(HEAT)


def test_another_layout_is_another_identity(identity):
    base = identity(CANONICAL)
    for other in ("laplacian:3,attention:1", "laplacian:2,attention:2", "attention:2,heat:2",
                  "attention:2,heat(t=1.0):2", "attention:2,heat(t=0.5):2"):
        assert identity(other) != base, other
    assert identity("attention:2,heat(t=0.5):2") != identity("attention:2,heat(t=0.25):2")


def test_bug_stored_identities_with_old_spellings_resume():
    """Bug: a ``run_config.json`` written while ``heads`` was recorded as spelt (``experiments/configs``' own
    ``heat(t=0.5, learnable=True, steps=4)``, ``Attention:2, I-P:2``) no longer equalled the identity of the same
    model now; stored identities are read as the configs record heads."""
    def stored(heads):
        return {"model": "vit-digits", "model_config": {"dim": 16, "heads": heads, "norm": "layernorm"}}

    old = stored("attention:2,heat(t=0.5, learnable=True, steps=4):2")
    assert _normalized_identity(old) == _normalized_identity(stored("attention:2,heat(t=0.5, steps=4, learnable=True):2"))
    assert _normalized_identity(stored("Attention:2, I-P:2")) == _normalized_identity(stored(CANONICAL))
    assert _normalized_identity(stored({"1": "Laplacian:4"})) == _normalized_identity(stored({"1": "laplacian:4"}))
    assert _normalized_identity(stored("laplacian:3,attention:1")) != _normalized_identity(stored(CANONICAL))


def test_bug_run_resumes_a_run_stored_under_another_spelling(tmp_path):
    """Bug: ``run`` refused a finished run of ``heads = "attention:2,laplacian:2"`` when the config spelt it
    ``"Attention:2, Laplacian:2"`` ("made with a different model_config"), and ``status`` marked it changed; and a run
    whose ``run_config.json`` and checkpoint were written with the layout as spelt (a library of yesterday) was
    refused on resume from its checkpoint."""
    import torch

    from diffusionformer.experiments.reload import load_run
    from diffusionformer.experiments.results import run_status
    from diffusionformer.experiments.runner import run_experiment

    run_experiment(_config(CANONICAL), tmp_path, progress=False)
    for spelt in (SPELLINGS[0], SPELLINGS[1]):
        (result,) = run_experiment(_config(spelt), tmp_path, progress=False)
        assert result.status == "completed"
        assert [row["changed"] for row in run_status(_config(spelt), tmp_path)] == [None]
    rdir = run_dir(tmp_path / "tiny", "digits", "s", 0)
    # as spelt, as a library of yesterday wrote it: the checkpoint's model record and the run's identity
    ident = json.loads((rdir / "run_config.json").read_text())
    ident["model_config"]["heads"] = "Attention:2, I-P:2"
    (rdir / "run_config.json").write_text(json.dumps(ident))
    payload = torch.load(rdir / "checkpoint.pt", weights_only=True)
    payload["model_record"]["config"]["heads"] = "Attention:2, I-P:2"
    torch.save(payload, rdir / "checkpoint.pt")
    assert load_run(rdir).config.heads == CANONICAL
    (rdir / "summary.json").unlink()  # interrupted: the trainer resumes from the checkpoint and checks its record
    (result,) = run_experiment(_config("attention:2,laplacian:2"), tmp_path, progress=False)
    assert result.status == "completed"


def test_bug_checkpoint_record_of_a_head_spec_spelt_otherwise():
    """Bug: the trainer's resume check compared the checkpoint's model record with the model's field by field, so a
    checkpoint written while ``heads`` was kept as spelt was "written by a different model"."""
    from diffusionformer.models import model_config
    from diffusionformer.models.vit import DiffusionViT
    from diffusionformer.train.checkpoint import model_record, model_record_differences

    read = "attention:2,heat(t=0.5, learnable=True):2"  # HEAT as read
    now = model_record(DiffusionViT(model_config("vit-digits", dim=16, depth=1, num_heads=4, heads=read)))
    assert now["config"]["heads"] == read
    saved = json.loads(json.dumps(now))
    for spelt in [HEAT, *HEAT_SPELLINGS]:
        saved["config"]["heads"] = spelt
        assert model_record_differences(saved, now) == []
    saved["config"]["heads"] = "attention:2,heat(t=0.25, learnable=True):2"  # another model all the same
    assert model_record_differences(saved, now) == [
        "config heads: checkpoint 'attention:2,heat(t=0.25, learnable=True):2', "
        "now 'attention:2,heat(t=0.5, learnable=True):2'"]


def _study(out, name, heads, values):
    return write_finished_study(out, name, [{"name": "attention"}, {"name": "x", "heads": heads}], values)


def _header(tmp_path, a_heads, b_heads):
    from diffusionformer.experiments.publish import summary_table

    base = {0: 0.5, 1: 0.6, 2: 0.7}
    a = _study(tmp_path, "A", a_heads, {"attention": base, "x": {0: 0.6, 1: 0.7, 2: 0.8}})
    b = _study(tmp_path, "B", b_heads, {"attention": base, "x": {0: 0.3, 1: 0.4, 2: 0.5}})
    lines = summary_table([a, b], tmp_path).splitlines()
    return [c.strip() for c in lines[0].strip("|").split("|")]


@pytest.mark.parametrize("a_heads,b_heads", [
    ("attention:{half},laplacian:{half}", "Attention:{half}, I-P:{half}"),
    ("attention:{half},heat(learnable=True, t=0.5):{half}", "attention:{half},heat(t=.5,learnable=True):{half}"),
    ({"1": "laplacian:{H}"}, {"1": "Laplacian : {H}"})])
def test_bug_summary_one_column_for_two_spellings_of_one_head_layout(tmp_path, a_heads, b_heads):
    """Bug: ``summary`` keyed a setting's column by its heads as written, so one layout spelt two ways in two
    comparisons got a column each, headed as if the comparisons defined the setting differently."""
    assert _header(tmp_path, a_heads, b_heads) == ["task", "metric (baseline mean)", "x"]


def test_summary_keeps_two_columns_for_two_head_layouts(tmp_path):
    assert _header(tmp_path, "attention:{half},laplacian:{half}", "laplacian:{half},attention:{half}") == [
        "task", "metric (baseline mean)", "x (A)", "x (B)"]
