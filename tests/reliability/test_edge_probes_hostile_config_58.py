"""Hostile experiment configs (round 58): values far out of range that the config validated and then either hung
the validation or failed only once a run had started, naming no key.

* ``folds = 2**62`` hung ``show`` and ``run`` for ever, ``folds = 10**7`` took seconds and its error printed the
  runs of each of the ten million folds: the check counted the seeds of every fold, one fold at a time.
* ``seeds = [-1]`` or ``[2**32]`` loaded, and ``check_experiment`` then listed one problem per task and bad seed,
  each naming ``train.seed`` (a key the user is told not to set) rather than ``seeds``.
* ``train.batch_size = 2**63`` passed every check, then the first training step failed with torch's "Overflow when
  unpacking long long" and its C++ backtrace, naming no key.
* ``augment.crop_padding`` had no upper bound: 2**63 failed the same way at the first step; a padding of a whole
  image side trained on crops that may hold padding alone.
"""

from __future__ import annotations

import pytest

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.cli import main
from diffusionformer.train import TrainConfig
from experiments_tiny_configs import TINY_DIGITS_USER_TOML as _BASE  # tests/experiments, on the path (conftest.py)


def _refused_by_show(tmp_path, capsys, text: str) -> str:
    """``show`` of the config ``text``: refused with status 2; its output."""
    path = tmp_path / "c.toml"
    path.write_text(text, encoding="utf-8")
    rc = main(["show", str(path)])
    captured = capsys.readouterr()
    assert rc == 2, captured
    return captured.out + captured.err


def test_folds_beyond_the_seeds_refused_at_once_with_a_short_message(tmp_path, capsys):
    """Bug: the fold check counted the seeds of each fold in turn, ``folds`` passes over the seeds: ``folds = 2**62``
    never ended, ``folds = 10**6`` printed a list of a million counts. Fewer seeds than folds leave a fold without a
    run: refused in time independent of ``folds``, the message as short as the config's seeds."""
    text = _BASE.replace('metric = "test_acc"', 'metric = "test_acc"\nfolds = 1000000', 1).replace(
        "seeds = [0]", "seeds = [0, 1]", 1)
    out = _refused_by_show(tmp_path, capsys, text)
    assert "cover every fold equally often" in out and "2 seeds for 1000000 folds" in out, out
    assert len(out) < 1000, out[:300]


def test_seeds_out_of_range_refused_when_loading_naming_seeds(tmp_path):
    """Bug: seeds outside a run's seed range [0, 2**32 - 1] loaded, and validation reported each one once per task
    as ``train.seed``, the key the config refuses; now the load refuses them, naming each as ``seeds[i]``."""
    text = _BASE.replace("seeds = [0]", "seeds = [0, -1, 4294967296]", 1)
    text = text.replace('[[operators]]', '[[tasks]]\nname = "digits2"\ndataset = "digits"\nmodel = "vit-digits"\n\n'
                        '[[operators]]', 1)
    path = tmp_path / "c.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError) as info:
        load_experiment_config(path)
    message = str(info.value)
    assert "seeds[1]: TrainConfig.seed: expected an int >= 0, got -1" in message, message
    assert "seeds[2]: TrainConfig.seed: expected an int <= 4294967295, got 4294967296" in message, message
    assert "digits" not in message, message  # one problem per seed, not one per task and seed


@pytest.mark.parametrize("size", [2**63, 10**30])
def test_batch_size_past_an_index_refused_naming_it(size):
    """Bug: ``batch_size = 2**63`` passed the config and failed at the first step in torch ("Overflow when unpacking
    long long", a C++ backtrace, no key named); a batch size is a tensor size, at most ``sys.maxsize``."""
    with pytest.raises(ValueError, match=rf"TrainConfig.batch_size: expected an int <= 9223372036854775807, got {size}"):
        TrainConfig(batch_size=size)


def test_batch_size_past_an_index_refused_by_show(tmp_path, capsys):
    """The same through the command line: ``show`` refuses it, naming the task and the key."""
    out = _refused_by_show(tmp_path, capsys, _BASE.replace("batch_size = 16", "batch_size = 9223372036854775808", 1))
    assert "task 'digits' train: TrainConfig.batch_size: expected an int <= 9223372036854775807" in out, out


@pytest.mark.parametrize("pad", [16, 9223372036854775808])
def test_crop_padding_of_a_whole_image_side_refused_before_training(tmp_path, capsys, pad):
    """Bug: ``augment.crop_padding`` had no upper bound: 2**63 passed ``run``'s checks and its first step failed with
    torch's "Overflow when unpacking long long" (no key named), 10**5 with an allocation error; a padding of a whole
    side (the digits are 8x8) trained on crops that may hold padding alone, blank images under a label."""
    text = _BASE.replace('metric = "test_acc"', f'metric = "test_acc"\naugment = {{ crop_padding = {pad} }}', 1)
    path = tmp_path / "c.toml"
    path.write_text(text, encoding="utf-8")
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out), "--no-progress"]) == 2
    captured = capsys.readouterr()
    assert not out.exists(), sorted(out.rglob("*"))
    assert (f"task 'digits': augment.crop_padding = {pad} is not smaller than the images (8x8)"
            in captured.out + captured.err), captured


def test_crop_padding_smaller_than_the_images_accepted(tmp_path, capsys):
    """The bound is the image side: a padding of 7 on 8x8 digits is a valid (if heavy) augmentation."""
    path = tmp_path / "c.toml"
    path.write_text(_BASE.replace('metric = "test_acc"', 'metric = "test_acc"\naugment = { crop_padding = 7 }', 1),
                    encoding="utf-8")
    assert main(["show", str(path)]) == 0, capsys.readouterr()
