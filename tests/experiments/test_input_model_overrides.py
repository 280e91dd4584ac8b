"""``model_overrides`` may not change a size the model takes from the data.

``num_classes = 3`` on digits used to pass ``show`` and the pre-run check, then die with an
IndexError at the first step; ``num_classes = 30`` silently trained a different model. Both
are now one ``ValueError`` naming the field, the data's value and the task, raised by
:func:`build_model`, which the pre-run check (:func:`validate_experiment`) calls with the data.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from diffusionformer.data.base import TextData
from diffusionformer.data.images import build_image_data
from diffusionformer.experiments import load_experiment_config, run_experiment
from diffusionformer.experiments.build import build_model
from diffusionformer.experiments.validate import validate_experiment

CONFIG = """
name = "overrides"
seeds = [0]

[[tasks]]
name = "digits"
dataset = "digits"
model = "vit-digits"
model_overrides = {{ dim = 16, depth = 1, num_heads = 2, mlp_ratio = 1.0{extra} }}
train = {{ max_steps = 2, batch_size = 8, eval_interval = 1, log_interval = 1, checkpoint_interval = 1 }}

[[operators]]
name = "attention"
{setting}
"""


def _config(tmp_path, extra: str = "", setting: str = ""):
    path = tmp_path / "cfg.toml"
    path.write_text(CONFIG.format(extra=extra, setting=setting))
    return load_experiment_config(path)


def _images(num_classes: int = 10):
    """A tiny digits look-alike: 30 grey 8x8 images."""
    g = torch.Generator().manual_seed(0)
    images = torch.rand(30, 1, 8, 8, generator=g)
    labels = torch.arange(30) % num_classes
    idx = torch.arange(30)
    return build_image_data("digits", images, labels, (idx[:20], idx[20:25], idx[25:]), num_classes=num_classes,
                            normalize=False, scale=1.0, meta={})


@pytest.mark.parametrize("extra, field, value, data_value", [
    (", num_classes = 3", "num_classes", "3", "10"),
    (", num_classes = 30", "num_classes", "30", "10"),
    (", in_channels = 3", "in_channels", "3", "1"),
    (", input_size = [16, 16]", "input_size", r"\[16, 16\]", r"\(8, 8\)"),
])
def test_an_override_that_disagrees_with_the_data_is_refused(tmp_path, extra, field, value, data_value):
    cfg = _config(tmp_path, extra)
    task, setting = cfg.tasks[0], cfg.operators[0]
    message = (rf"task 'digits': model_overrides sets {field} = {value}, but dataset 'digits' gives "
               rf"{field} = {data_value}; the model takes {field} from the data")
    with pytest.raises(ValueError, match=message):
        build_model(task, setting, _images())
    # the pre-run check reaches it: it builds every run's model from the loaded data
    problems = validate_experiment(cfg, loaded={"digits": _images()})
    assert len(problems) == 1 and f"sets {field} = " in problems[0] and "'attention'" in problems[0], problems


def test_an_override_equal_to_the_data_is_allowed(tmp_path):
    cfg = _config(tmp_path, ", num_classes = 10, in_channels = 1, input_size = [8, 8]")
    model = build_model(cfg.tasks[0], cfg.operators[0], _images())
    assert model.config.num_classes == 10 and tuple(model.config.input_size) == (8, 8)
    assert validate_experiment(cfg, loaded={"digits": _images()}) == []


def test_an_operator_settings_override_of_a_data_size_is_refused(tmp_path):
    cfg = _config(tmp_path, setting="model_overrides = { num_classes = 3 }")
    with pytest.raises(ValueError, match=r"task 'digits': operator setting 'attention' sets num_classes = 3, "
                                         r"but dataset 'digits' gives num_classes = 10"):
        build_model(cfg.tasks[0], cfg.operators[0], _images())


def test_a_gpt_vocabulary_override_is_refused_before_training(tmp_path):
    path = tmp_path / "gpt.toml"
    path.write_text(CONFIG.format(extra="", setting="").replace('dataset = "digits"', 'dataset = "pydoc-chars"')
                    .replace('model = "vit-digits"', 'model = "gpt-char-tiny"').replace(
                        "{ dim = 16, depth = 1, num_heads = 2, mlp_ratio = 1.0 }",
                        "{ n_layer = 1, n_head = 2, n_embd = 16, block_size = 8, vocab_size = 10 }"))
    cfg = load_experiment_config(path)
    text: Any = TextData.__new__(TextData)  # only its vocabulary size reaches the model
    text.__dict__.update(name="pydoc-chars", kind="text", vocab_size=65)
    with pytest.raises(ValueError, match=r"model_overrides sets vocab_size = 10, but dataset 'pydoc-chars' gives "
                                         r"vocab_size = 65"):
        build_model(cfg.tasks[0], cfg.operators[0], text)
    padded = load_experiment_config(path, ["tasks.digits.model_overrides.vocab_size=72"])
    assert build_model(padded.tasks[0], padded.operators[0], text).config.vocab_size == 72  # nanoGPT-style padding


def test_run_trains_nothing_with_a_wrong_num_classes(tmp_path):
    pytest.importorskip("sklearn", reason="the digits dataset comes with scikit-learn")
    cfg = _config(tmp_path, ", num_classes = 3")
    with pytest.raises(ValueError, match=r"(?s)nothing was trained.*sets num_classes = 3, but dataset 'digits' "
                                         r"gives num_classes = 10"):
        run_experiment(cfg, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_an_override_of_a_size_the_data_does_not_give_reaches_the_model_config_check(tmp_path):
    pytest.importorskip("sklearn", reason="the digits dataset comes with scikit-learn")
    cfg = _config(tmp_path, ", vocab_size = 100")  # a ViT has no vocabulary: was a bare KeyError('vocab_size')
    problems = validate_experiment(cfg)
    assert any("unknown key 'vocab_size'" in p for p in problems), problems
