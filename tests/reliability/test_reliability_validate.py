"""``show`` and the start of ``run`` resolve every task x setting x seed and report every problem at once."""

from __future__ import annotations

import pytest
import torch

from diffusionformer.experiments import load_experiment_config, run_experiment
from diffusionformer.experiments.cli import main as cli_main
from diffusionformer.experiments.validate import check_experiment, evaluation_keys, validate_experiment

GOOD = """
name = "tiny"
seeds = [0, 1]

[[tasks]]
name = "digits"
dataset = "digits"
model = "vit-digits"
metric = "test_acc"
select_by = "val_acc"
reach = { val_acc = 0.5 }
model_overrides = { dim = 16, depth = 2, num_heads = 2 }
train = { max_steps = 4, batch_size = 16, eval_interval = 2, log_interval = 2, checkpoint_interval = 2 }

[[tasks]]
name = "text"
dataset = "pydoc-chars"
model = "gpt-char-tiny"
metric = "val_loss"
model_overrides = { n_layer = 1, n_head = 4, n_embd = 16, block_size = 16 }
train = { max_steps = 4, batch_size = 4, eval_interval = 2, log_interval = 2, checkpoint_interval = 2 }

[[operators]]
name = "attention"

[[operators]]
name = "mixed"
heads = "attention:{half},laplacian:{half}"
"""


def _config(tmp_path, text):
    path = tmp_path / "cfg.toml"
    path.write_text(text)
    return path, load_experiment_config(path)


def test_a_good_config_validates_and_show_exits_zero(tmp_path, capsys):
    path, cfg = _config(tmp_path, GOOD)
    assert validate_experiment(cfg) == []
    assert cli_main(["show", str(path)]) == 0
    assert "2 tasks x 2 operator settings x 2 seeds = 8 runs" in capsys.readouterr().out


BAD = (GOOD.replace('metric = "test_acc"', 'metric = "test_ac"')  # misspelled metric
       .replace('dataset = "pydoc-chars"', 'dataset = "digit"')  # unknown dataset of the second task
       + '\n[[operators]]\nname = "wrong"\nheads = "attention:3,laplacian:3"\n')  # 6 heads for 2- and 4-head models


def test_every_problem_is_listed_at_once(tmp_path):
    _, cfg = _config(tmp_path, BAD)
    problems = validate_experiment(cfg)
    text = "\n".join(problems)
    assert "task 'digits': metric 'test_ac' is not an evaluation key" in text and "did you mean 'test_acc'" in text
    assert "task 'text': unknown dataset 'digit' (did you mean 'digits'?)" in text
    # the third setting's heads fit neither model (the second task's is resolved from its preset's sizes)
    assert "task 'digits' / setting 'wrong': head specification 'attention:3,laplacian:3' assigns 6 heads" in text
    assert "task 'text' / setting 'wrong': head specification 'attention:3,laplacian:3' assigns 6 heads" in text
    assert len(problems) == 4, problems
    with pytest.raises(ValueError, match=r"(?s)config 'tiny' \(12 runs\) has 4 problem\(s\); nothing was trained:.*test_ac.*digit.*wrong"):
        check_experiment(cfg)


def test_show_exits_nonzero_naming_all_problems(tmp_path, capsys):
    path, _ = _config(tmp_path, BAD)
    assert cli_main(["show", str(path)]) == 2
    err = capsys.readouterr().err
    assert "4 problem(s)" in err and "did you mean 'test_acc'" in err and "did you mean 'digits'" in err


def test_run_trains_nothing_when_one_run_would_fail(tmp_path):
    _, cfg = _config(tmp_path, GOOD.replace('metric = "val_loss"', 'metric = "val_los"'))  # only the second task is bad
    with pytest.raises(ValueError, match=r"task 'text': metric 'val_los' .*did you mean 'val_loss'"):
        run_experiment(cfg, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()  # no manifest, no run folder: nothing was trained


def test_a_heads_string_that_fits_only_the_first_task_is_caught_before_training(tmp_path):
    text = GOOD.replace('heads = "attention:{half},laplacian:{half}"', 'heads = "attention:1,laplacian:1"')
    _, cfg = _config(tmp_path, text)  # fits the 2-head ViT, not the 4-head GPT
    with pytest.raises(ValueError, match=r"task 'text' / setting 'mixed': .*4"):
        run_experiment(cfg, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_operator_arguments_and_reach_and_select_keys_are_checked(tmp_path):
    text = (GOOD.replace('reach = { val_acc = 0.5 }', 'reach = { val_accuracy = 0.5 }')
            .replace('select_by = "val_acc"', 'select_by = "val_loss"')
            .replace('heads = "attention:{half},laplacian:{half}"', 'heads = "attention:{half},heat(t=50, steps=4):{half}"'))
    _, cfg = _config(tmp_path, text)
    text = "\n".join(validate_experiment(cfg))
    assert "reach 'val_accuracy' is not an evaluation key" in text
    assert "select_by 'val_loss' is not an evaluation key" in text  # a classification task has loss, not val_loss
    assert "setting 'mixed': heat(t=50, steps=4): truncation error" in text


def test_missing_data_is_a_problem_for_run_but_not_for_show(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("DIFFUSIONFORMER_DATA", raising=False)
    text = GOOD.replace('dataset = "digits"', 'dataset = "mnist"').replace('model = "vit-digits"', 'model = "vit-mnist"')
    path, cfg = _config(tmp_path, text)
    assert any("mnist" in p and "data root" in p for p in validate_experiment(cfg))
    assert validate_experiment(cfg, missing_data_ok=True) == []
    assert cli_main(["show", str(path)]) == 0


@pytest.mark.parametrize("dataset,options,model", [
    ("digits", {}, "vit-digits"),
    ("mnist1d", {"num_samples": 200}, "vit-mnist1d"),
    ("assoc-recall", {"num_examples": 60, "num_pairs": 2, "vocab_size": 16}, "gpt-recall"),
    ("pydoc-chars", {}, "gpt-char-tiny"),
    ("csbm", {"num_nodes": 60}, "graph-node-small"),
    ("digits", {}, "dino-digits"),
])
def test_evaluation_keys_are_what_the_task_adapters_report(dataset, options, model):
    """The table in validate.py against the adapters themselves (one evaluation of an untrained model)."""
    from diffusionformer.data import dataset_spec, load_dataset
    from diffusionformer.experiments.tasks import build_task, model_overrides_for_data
    from diffusionformer.models import create_model, get_preset

    data = load_dataset(dataset, **options)
    overrides = model_overrides_for_data(data, get_preset(model).config_cls)
    small = {"dim": 16, "depth": 1} if "vit" in model or "dino" in model or "graph" in model else {"n_layer": 1, "n_embd": 16}
    torch.manual_seed(0)
    net = create_model(model, **overrides, **small)
    adapter = build_task(data, net, eval_batch_size=32)
    if hasattr(adapter, "eval_batches"):
        adapter.eval_batches = 1
    keys = set(adapter.evaluate(net.eval(), 1))
    assert keys == set(evaluation_keys(dataset_spec(dataset).kind, model))
