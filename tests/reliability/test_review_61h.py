"""Review 61h of the day's four commits (knn_classify row scaling, top_p copy and decode's float ids, status/run
reading an old folder's ``rope_base`` from its checkpoint, a resume and analyze refusing changed preprocessing).

Found and fixed (``test_bug_...``):

- a resume of a run whose ``preprocessing.json`` is present but unreadable (truncated, not an object) compared
  nothing and rewrote it with the data's record now, without a word: a damaged record hid a vocabulary changed since
  the run started (the run trained on with ids that meant other characters, its record now saying it had not), and
  the damaged record was lost. Now refused, naming the file, which is left as it was (an absent record, a folder of
  an older version, is still written from the data);
- ``TextData.decode`` of a long sequence (a generation) with one id out of range showed the first 20 ids, all valid,
  and not the one refused. It now names that id and its position.
No GPU.
"""

from __future__ import annotations

import pytest

from diffusionformer.data.text import char_text_data
from diffusionformer.experiments.runner import run_dir, run_experiment
from diffusionformer.testing import interrupt_on_call
from diffusionformer.train.trainer import Trainer
from experiments_tiny_configs import tiny_text_lm_config


def _quiet(_):
    return None


def _text_cfg():
    return tiny_text_lm_config()


def _other_pydoc_text(monkeypatch):
    """The pydoc topics with one character of the vocabulary replaced by one not in it (the same size)."""
    import pydoc_data.topics as topics_module

    topics = topics_module.topics
    chars = set("".join(topics.values()))
    new = next(c for c in "\u00e9\u00e8\u00ea\u00eb\u00ff" if c not in chars)
    monkeypatch.setattr(topics_module, "topics", {k: v.replace("~", new) for k, v in topics.items()})


def _killed_text_run(tmp_path):
    cfg = _text_cfg()
    with pytest.raises(KeyboardInterrupt), interrupt_on_call(Trainer, "_update", 4):
        run_experiment(cfg, tmp_path, progress=False, log=_quiet)
    return cfg, run_dir(tmp_path / "lm", "t", "attention", 0)


def test_bug_a_resume_with_a_damaged_preprocessing_record_is_refused_not_rewritten(tmp_path, monkeypatch):
    """Bug: a killed text run whose ``preprocessing.json`` was damaged (truncated) resumed on another vocabulary of
    the same size without a word: the unreadable record was compared with nothing and rewritten with the new
    vocabulary, as if the whole run had been made on it. Now the resume is refused, naming the file, left as it was."""
    cfg, rdir = _killed_text_run(tmp_path)
    record = rdir / "preprocessing.json"
    damaged = record.read_text()[:40]
    record.write_text(damaged)
    _other_pydoc_text(monkeypatch)
    with pytest.raises(ValueError, match=r"(?s)preprocessing\.json is unreadable.*--restart"):
        run_experiment(cfg, tmp_path, progress=False, log=_quiet)
    assert record.read_text() == damaged
    assert not (rdir / "summary.json").exists()


def test_pins_a_resume_without_a_preprocessing_record_writes_it(tmp_path):
    """A folder of an older version (no ``preprocessing.json``) resumes as before and gets the data's record."""
    cfg, rdir = _killed_text_run(tmp_path)
    (rdir / "preprocessing.json").unlink()
    run_experiment(cfg, tmp_path, progress=False, log=_quiet)
    assert (rdir / "summary.json").exists() and (rdir / "preprocessing.json").is_file()


def test_bug_decode_names_the_refused_id_of_a_long_sequence():
    """Bug: decoding a generation of 31 ids whose last is out of range said "got [0, 1, ..., 19]" (its first 20 ids,
    all valid): the id refused was not named. Now it is, with its position; the message stays bounded."""
    data = char_text_data("toy", "abcabcabca")
    ids = [0, 1, 2] * 10 + [500]
    with pytest.raises(ValueError, match=r"decode expects token ids in \[0, 3\), got \[0, 1, 2, .*500 at position 30"):
        data.decode(ids)
    with pytest.raises(ValueError, match=r"101001 ids; 2\.5 at position 1000\) \(float ids: expected integers") as info:
        data.decode([0] * 1000 + [2.5] + [0] * 10**5)
    assert len(str(info.value)) < 300
    with pytest.raises(ValueError, match=r"got \[0, True\]$"):  # short: every id shown, as before
        data.decode([0, True])


def test_decode_says_a_long_sequence_goes_on_past_the_twenty_ids_shown():
    """A refused id among the first 20 of a longer sequence: the message shows 20 ids, then says there are more
    (it read as the whole sequence)."""
    data = char_text_data("toy", "abcabcabca")
    with pytest.raises(ValueError, match=r"\]\.\.\. \(30 ids\)"):
        data.decode([5] + [0] * 29)
