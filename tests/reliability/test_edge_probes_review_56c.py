"""Review of the experiments command line and result readers of sitting 56 (``run --precision``'s status command,
publish's readers of ``results.json``):

- ``publish``, ``summary``: rows of another metric than the task's were refused as "changed since the runs; `run`
  the comparison again", also where the runs were made with a ``--set tasks.T.metric=...`` not given to the reader
  (a ``run --set`` published without it); the message now names that ``--set``, which reads them.
- ``experiments/scripts/gpu_study.sh``: a ``--precision`` given to ``run`` was not given to the ``status`` and
  ``analyze`` it runs after it (as ``run``'s own status command gives it: the ``--set`` of every task's ``amp``).
- ``publish``'s warning of finished runs the analysis did not measure said "`analyze` the comparison again" also
  for runs that ``analyze`` cannot measure where they are (no checkpoint, no analysis cache: a results archive);
  and an entry of another type in the analysis's ``metrics.json`` stopped it with an ``AttributeError``.
- ``--set operators={name = "x", ...}`` (one inline table, not in a list) was still read as misspelt names.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.cli import main
from diffusionformer.experiments.publish import publish_experiment, summary_table
from diffusionformer.train.checkpoint import CHECKPOINT_NAME
from experiments_tiny_configs import (FINISHED_OPS, FINISHED_VALUES, TINY_DIGITS_TOML, run_gpu_study_stand_in,
                                     write_finished_study)

OPS, VALUES = FINISHED_OPS, FINISHED_VALUES


def _raw(name, metric):
    return {"name": name, "seeds": [0, 1, 2], "operators": OPS,
            "tasks": [{"name": "t", "dataset": "digits", "model": "vit-digits", "metric": metric,
                       "train": {"max_steps": 4}}]}


@pytest.mark.parametrize("reader", ["publish", "summary"])
def test_bug_rows_of_a_metric_set_by_run_name_the_set_that_reads_them(tmp_path, reader):
    """Bug: ``run c.toml --set tasks.t.metric=...`` then ``publish``/``summary`` without that ``--set``: "changed since
    the runs; `run` the comparison again", which rewrites ``results.json`` with the config's metric, where giving the
    same ``--set`` was the remedy. The message names it, and with it the rows are read."""
    out = tmp_path / "results"
    write_finished_study(out, "h", OPS, VALUES)  # rows of test_acc: as `run --set tasks.t.metric="test_acc"` wrote
    config = load_experiment_config(_raw("h", "test_loss"))  # the config file's metric
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Results\n\n```{toctree}\n:maxdepth: 1\n\n```\n")

    def read(cfg):
        return publish_experiment(cfg, out, docs) if reader == "publish" else summary_table([cfg], out)

    with pytest.raises(ValueError, match=r"'test_acc'.*'test_loss'") as caught:
        read(config)
    assert "`--set 'tasks.t.metric=\"test_acc\"'`" in str(caught.value)
    assert "give it here too" in str(caught.value)
    read(load_experiment_config(_raw("h", "test_loss"), ['tasks.t.metric="test_acc"']))  # the --set named: read


# ---------------------------------------------------------------------------- experiments/scripts/gpu_study.sh


@pytest.mark.slow  # the script reads the config in two fresh pythons
@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("flag", [["--precision", "fp32"], ["--precision=bf16"]])
def test_bug_gpu_study_reads_the_runs_of_run_precision_with_their_amp(tmp_path, flag):
    """Bug: ``gpu_study.sh run CONFIG N --precision fp32`` gave ``--precision`` to ``run`` only: the ``status`` of
    status.md and the ``analyze`` after it read every run the call trained as "made with another train (amp: 'off'
    then 'bf16')" (``run --restart`` redoes it), where ``run``'s own status command gives every task's
    ``train.amp`` as a ``--set``; they now get those ``--set`` too."""
    config = tmp_path / "c.toml"  # the top-level precision (gpu_text.toml's) fills the train.amp of a task
    config.write_text('name = "p"\nseeds = [0]\nprecision = "bf16"\n[[tasks]]\nname = "t.1"\ndataset = "digits"\n'
                      'model = "vit-digits"\n[[operators]]\nname = "a"\nheads = "attention:4"\n')
    done, out = run_gpu_study_stand_in(tmp_path, config, "--set", "seeds=[0]", *flag)
    assert done.returncode == 0, done.stderr
    amp = '"off"' if flag == ["--precision", "fp32"] else '"bf16"'
    for name, command in [("status.md", "status"), ("analyze.log", "analyze")]:
        argv = (out / name).read_text().splitlines()
        assert argv[:3] == ["-m", "diffusionformer.experiments", command]
        assert f'tasks."t.1".train.amp={amp}' in argv
        assert argv[argv.index(f'tasks."t.1".train.amp={amp}') - 1] == "--set"
    assert "seeds=[0]" in (out / "status.md").read_text().splitlines()


# ---------------------------------------------------------------------------- publish: the analysis's runs
@pytest.fixture
def tiny(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.toml").write_text(TINY_DIGITS_TOML)
    return "tiny.toml"


def _unanalysed(caught) -> str:
    return " ".join(str(w.message) for w in caught if "token-geometry" in str(w.message))


def test_bug_publish_names_the_runs_analyze_cannot_measure_where_they_are(tiny):
    """Bug: a run finished after a GPU call's analysis was cut at its budget comes back in the results archive
    without its checkpoint and without an analysis cache; ``analyze --partial`` here skips it ("its checkpoint is
    missing"), and publish said "`analyze` the comparison again first", which skips it again. Publish now says which
    runs cannot be measured where they are (and the advice stays for the others)."""
    run = ["run", tiny, "--no-progress", "--out", "res", "--threads", "1"]
    assert main(run) == 0
    (Path("res/tiny/runs/digits/lap/seed0") / CHECKPOINT_NAME).unlink()  # as gpu_study.sh packs it
    with pytest.warns(RuntimeWarning, match="checkpoint"):
        assert main(["analyze", tiny, "--out", "res", "--partial", "--no-progress", "--threads", "1"]) == 0
    with pytest.warns(RuntimeWarning, match="token-geometry analysis") as caught:
        assert main(["publish", tiny, "--out", "res", "--to", "docs"]) == 0
    text = _unanalysed(caught)
    assert "measured 1 of the 2 finished runs" in text and "`analyze` the comparison again first" in text
    assert "; 'digits' / 'lap' seed 0 cannot be measured here: neither their checkpoint nor an analysis cache" in text


@pytest.mark.parametrize("entry", [{"operators": ["attention", "lap"]}, {"operators": "attention"},
                                   {"operators": {"attention": {"seeds": 0}}}])
def test_bug_a_hand_edited_analysis_does_not_stop_publish(tiny, capsys, entry):
    """Bug: publish reads the analysis's ``metrics.json`` for the runs it measured; an entry of another type there (a
    list of settings, a seed count) stopped it with a traceback of ``AttributeError: 'list' object has no attribute
    'items'`` (or ``'int' object is not iterable``). Such an entry measured nothing: publish warns, and writes."""
    assert main(["run", tiny, "--no-progress", "--out", "res", "--threads", "1"]) == 0
    capsys.readouterr()
    (Path("res/tiny/analysis")).mkdir()
    Path("res/tiny/analysis/metrics.json").write_text(json.dumps({"tasks": {"digits": entry}, "skipped_tasks": []}))
    with pytest.warns(RuntimeWarning, match="token-geometry analysis") as caught:
        assert main(["publish", tiny, "--out", "res", "--to", "docs"]) == 0
    assert "measured 0 of the 2 finished runs" in _unanalysed(caught)


# ---------------------------------------------------------------------------- config: --set tasks= / operators=
@pytest.mark.parametrize("key", ["operators", "tasks"])
def test_bug_set_of_one_inline_table_for_operators_says_it_keeps_names(tiny, capsys, key):
    """Bug: ``--set 'operators=[{name = "x"}]'`` says that names are expected (sitting 56), but one inline table
    without the list, ``--set 'operators={name = "x", laplacian_heads = 1}'``, still said "no operators named
    ['{name = \\"x\\"', 'laplacian_heads = 1}']", its TOML text cut at the comma and read as two misspelt names."""
    assert main(["show", tiny, "--set", f'{key}={{name = "x", laplacian_heads = 1}}']) == 2
    err = capsys.readouterr().err
    assert f"{key}=NAME,... keeps only the {key} named, expected names (strings), got dict" in err
    assert f"no {key} named" not in err and f"[[{key}]]" in err
