"""Resume against changed data (61f): a run killed and resumed later, when its data may have changed.

What a run records of its data: ``run_config.json`` names it (dataset, options, data seed, folds), and
``preprocessing.json`` records how its inputs were prepared (the vocabulary ``itos`` of a text task; the pixel scale
and training-split mean/std of an image task). A staged benchmark file is checked against its SHA256 when loaded.

Found and fixed (``test_bug_...``): a resume compared only ``run_config.json`` (the data's names), then rewrote
``preprocessing.json`` with the data's record now: a run resumed on another vocabulary of the same size (a new
Python's ``pydoc_data``) or on a replaced data file with other statistics went on training, its record rewritten as
if the whole run had been made on that data; ``analyze`` measured a finished run on such data likewise. Both now
refuse, naming the entries that changed (``reload._preprocessing_changes``: floats up to float64 rounding).

Not told: a folder of an older version without ``preprocessing.json`` (a corpus changed within its vocabulary and
a user's graph file replaced are since told by the record's fingerprint: test_data_fingerprint_61i.py).
"""

from __future__ import annotations

import json

import pytest
import torch

from diffusionformer.data import register_dataset, unregister_dataset
from diffusionformer.data.images import build_image_data
from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.runner import run_dir, run_experiment
from diffusionformer.testing import interrupt_on_call
from diffusionformer.testing.faults import assert_same_checkpoint_weights
from diffusionformer.train.trainer import Trainer
from experiments_tiny_configs import tiny_text_lm_config


def _quiet(_):
    return None


def _text_cfg():
    return tiny_text_lm_config()


def _killed(cfg, out, method="_update", call=4):
    with pytest.raises(KeyboardInterrupt), interrupt_on_call(Trainer, method, call):
        run_experiment(cfg, out, progress=False, log=_quiet)


def _other_pydoc_text(monkeypatch):
    """The pydoc topics as another Python might ship them: one character of the vocabulary replaced by one that is
    not in it (a vocabulary of the same size, other characters)."""
    import pydoc_data.topics as topics_module

    topics = topics_module.topics
    chars = set("".join(topics.values()))
    new = next(c for c in "\u00e9\u00e8\u00ea\u00eb\u00ff" if c not in chars)
    monkeypatch.setattr(topics_module, "topics", {k: v.replace("~", new) for k, v in topics.items()})
    assert "~" in chars


def test_bug_a_resume_on_another_vocabulary_of_the_same_size_is_refused_naming_it(tmp_path, monkeypatch):
    """Bug: a text run killed and resumed under a Python whose pydoc topics hold another character (vocabulary of the
    same size) went on training with token ids that mean other characters, and its ``preprocessing.json`` was
    rewritten with the new vocabulary, as if the whole run had been made on it. Now the resume is refused, naming the
    vocabulary, and the run's record is left as it was."""
    cfg = _text_cfg()
    _killed(cfg, tmp_path)
    rdir = run_dir(tmp_path / "lm", "t", "attention", 0)
    before = (rdir / "preprocessing.json").read_text()
    _other_pydoc_text(monkeypatch)
    refusal = r"(?s)prepared otherwise.*itos \(id \d+: '~' then .*preprocessing\.json.*--restart"
    with pytest.raises(ValueError, match=refusal):
        run_experiment(cfg, tmp_path, progress=False, log=_quiet)
    assert (rdir / "preprocessing.json").read_text() == before
    assert not (rdir / "summary.json").exists()


@pytest.fixture
def user_images(tmp_path):
    """A user's image dataset (the documented extension point) read from a file of raw pixels."""
    @register_dataset("resume61f-images", kind="image")
    def load(*, seed: int = 0, path: str = "") -> object:
        images, labels = torch.load(path)
        idx = torch.arange(len(labels))
        return build_image_data("resume61f-images", images, labels, (idx[:48], idx[48:64], idx[64:]), num_classes=4,
                                normalize=True, scale=255.0, meta={"source": path})
    yield _pixels(tmp_path / "pixels.pt", 0)
    unregister_dataset("resume61f-images")


def _pixels(path, seed):
    g = torch.Generator().manual_seed(seed)
    torch.save((torch.randint(0, 256, (80, 1, 8, 8), generator=g, dtype=torch.uint8),
                torch.randint(0, 4, (80,), generator=g)), path)
    return path


def _image_cfg(path):
    return load_experiment_config({
        "name": "img", "seeds": [0], "operators": [{"name": "attention"}],
        "tasks": [{"name": "i", "dataset": "resume61f-images", "dataset_options": {"path": str(path)},
                   "model": "vit-digits", "model_overrides": {"dim": 8, "depth": 1, "num_heads": 2, "num_classes": 4},
                   "train": {"max_steps": 6, "batch_size": 8, "lr": 1e-2, "eval_interval": 3,
                             "checkpoint_interval": 2, "log_interval": 2}}]})


def test_bug_a_resume_on_a_replaced_data_file_with_other_statistics_is_refused_naming_them(tmp_path, user_images):
    """Bug: an image run killed, its data file replaced by another (same name, same options, so the same
    ``run_config.json``), resumed: it went on standardising with the new training split's mean/std and rewrote
    ``preprocessing.json`` with them. Now refused, naming ``mean`` and ``std`` with both values."""
    cfg = _image_cfg(user_images)
    _killed(cfg, tmp_path)
    rdir = run_dir(tmp_path / "img", "i", "attention", 0)
    before = json.loads((rdir / "preprocessing.json").read_text())
    _pixels(user_images, 1)  # another file in its place
    with pytest.raises(ValueError, match=rf"(?s)prepared otherwise.*mean \(\[{before['mean'][0]!r}\] then .*std"):
        run_experiment(cfg, tmp_path, progress=False, log=_quiet)
    assert json.loads((rdir / "preprocessing.json").read_text()) == before


@pytest.mark.parametrize("kind", ["text", "image"])
def test_pins_a_resume_on_unchanged_data_is_bitwise_the_uninterrupted_run(tmp_path, user_images, kind):
    """The check lets a resume of the same data through: killed in update 4 (checkpoint at 2), resumed, the weights,
    optimiser and generators equal the uninterrupted run's, and ``preprocessing.json`` is the one it started with."""
    cfg, name, task = (_text_cfg(), "lm", "t") if kind == "text" else (_image_cfg(user_images), "img", "i")
    run_experiment(cfg, tmp_path / "clean", progress=False, log=_quiet)
    _killed(cfg, tmp_path / "killed")
    clean, killed = (run_dir(tmp_path / o / name, task, "attention", 0) for o in ("clean", "killed"))
    before = (killed / "preprocessing.json").read_text()
    run_experiment(cfg, tmp_path / "killed", progress=False, log=_quiet)
    assert json.loads((killed / "summary.json").read_text())["resumed_from"] == 2
    for key in ("model", "optimizer", "rng"):
        assert_same_checkpoint_weights(clean / "checkpoint.pt", killed / "checkpoint.pt", key)
    assert (killed / "preprocessing.json").read_text() == before == (clean / "preprocessing.json").read_text()


def test_pins_a_run_with_nothing_to_continue_starts_again_on_the_new_data(tmp_path, monkeypatch):
    """Killed in its first update (no checkpoint): nothing of it is continued, so the new vocabulary is no refusal;
    the run starts again and records it. A finished run is read back, not trained, and keeps its record."""
    cfg = _text_cfg()
    _killed(cfg, tmp_path, call=1)
    rdir = run_dir(tmp_path / "lm", "t", "attention", 0)
    assert not (rdir / "checkpoint.pt").exists()
    old = json.loads((rdir / "preprocessing.json").read_text())["itos"]
    _other_pydoc_text(monkeypatch)
    run_experiment(cfg, tmp_path, progress=False, log=_quiet)
    new = json.loads((rdir / "preprocessing.json").read_text())["itos"]
    assert new != old and len(new) == len(old)
    monkeypatch.undo()
    run_experiment(cfg, tmp_path, progress=False, log=_quiet)  # finished: read back, its record kept
    assert json.loads((rdir / "preprocessing.json").read_text())["itos"] == new


def test_bug_analyze_refuses_a_run_whose_vocabulary_changed_since_it_was_trained(tmp_path, monkeypatch):
    """Bug: ``analyze`` loads a finished run's data again from its config: under a Python whose pydoc topics hold
    another character it measured the model on token ids that meant other characters in training, without a word
    (its check of the data compared only ``run_config.json``'s names). Now refused, naming the vocabulary."""
    from diffusionformer.experiments import analyze_experiment

    cfg = _text_cfg()
    run_experiment(cfg, tmp_path, progress=False, log=_quiet)
    kwargs = dict(max_examples=4, max_attention_examples=2, progress=False, plots=False)
    analyze_experiment(cfg, tmp_path, **kwargs)  # the same data: measured
    _other_pydoc_text(monkeypatch)
    with pytest.raises(ValueError, match=r"(?s)run .*seed0.*prepared otherwise.*itos \(id \d+: '~' then "):
        analyze_experiment(cfg, tmp_path, **kwargs)


def test_pins_statistics_equal_up_to_float64_rounding_resume(tmp_path, user_images):
    """Training statistics are float64 sums (their order, and last bit, may change with the torch thread count): a
    record one ulp off the data's resumes; only the refusal of real changes is wanted."""
    import math

    cfg = _image_cfg(user_images)
    _killed(cfg, tmp_path)
    rdir = run_dir(tmp_path / "img", "i", "attention", 0)
    record = json.loads((rdir / "preprocessing.json").read_text())
    record["mean"] = [math.nextafter(m, math.inf) for m in record["mean"]]
    (rdir / "preprocessing.json").write_text(json.dumps(record))
    run_experiment(cfg, tmp_path, progress=False, log=_quiet)
    assert json.loads((rdir / "summary.json").read_text())["status"] == "completed"
