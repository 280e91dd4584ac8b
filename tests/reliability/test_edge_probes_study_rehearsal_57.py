"""Found rehearsing the issue-16 GPU study flow on the CPU (``gpu_study.sh stage``/``run`` with ``ALLOW_CPU=1`` and
tiny ``--set`` overrides, then ``analyze``, ``publish`` and ``gaps`` here): what the tables and notes say of the runs."""

from __future__ import annotations

import json

from experiments_tiny_configs import TINY_GAPS_TOML, write_gap_run

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.analyze import _markdown
from diffusionformer.experiments.config import train_config
from diffusionformer.experiments.gaps import main as gaps_main
from diffusionformer.experiments.results import _task_identity, _train_identity, run_dir


def _geometry(tasks: dict) -> dict:
    """analyze's result (metrics.json) of ``tasks`` ({name: the split its held-out examples came from}), no runs."""
    return {"experiment": "s", "split": "test", "max_examples": 128, "skipped_tasks": {},
            "tasks": {name: {"dataset": "d", "model": "m", "kind": "text", "split": split, "operators": {}}
                      for name, split in tasks.items()}}


def test_bug_token_geometry_names_the_split_each_task_measured():
    """Bug: the token-geometry page of gpu_text.toml said "Held-out split `test`" (analyze's --split default), but a
    text corpus has no test split: its held-out windows are val's, as the task's record in metrics.json says. The
    header now names the split the tasks measured (each task's where they differ), in examples, not "sequences"."""
    text = _markdown(_geometry({"shakespeare-char": "val"}))
    assert "Held-out split `val`, up to 128 examples per run." in text
    assert "`test`" not in text
    assert "Held-out split `test`, up to 128 examples per run." in _markdown(_geometry({"cifar10": "test"}))
    mixed = _markdown(_geometry({"cifar10": "test", "chars": "val"}))
    assert "Held-out split `test` (cifar10), `val` (chars), up to 128 examples per run." in mixed


def _finished_gap_runs(root, made_with):
    """The two-seed gap study of TINY_GAPS_TOML finished under ``root/g`` by runs made with the config
    ``made_with`` (their run_config.json, as the runner writes its train and task entries), without training."""
    for task in made_with.tasks:
        for setting in made_with.operators:
            for seed in made_with.seeds:
                rdir = run_dir(root / "g", task.name, setting.name, seed)
                write_gap_run(rdir, [(s, 2.0 - s / 10 - seed / 100, 2.5 - s / 20 + seed / 100) for s in (1, 2)], step=2)
                identity = {**_task_identity(task, seed), "model_config": {},
                            "train": json.loads(json.dumps(_train_identity(train_config(task, seed)), default=str))}
                (rdir / "run_config.json").write_text(json.dumps(identity))


def test_bug_gaps_warns_of_runs_made_with_another_train_config(tmp_path, capsys):
    """Bug: ``gaps`` read without the ``--set`` overrides the runs were made with (the rehearsal's tiny
    ``max_steps = 20`` runs against gpu_text.toml's 5000) tabulated them under the config's names, onto its page, without
    a word, where ``publish`` refuses such runs and ``summary`` and ``analyze`` warn. It now warns too, naming the
    change and the remedy; read with the overrides, nothing is said."""
    cfg = tmp_path / "g.toml"
    cfg.write_text(TINY_GAPS_TOML + "[tasks.train]\nmax_steps = 4\n")
    _finished_gap_runs(tmp_path, load_experiment_config(str(cfg), ["tasks.t.train.max_steps=2"]))
    assert gaps_main([str(cfg), "--out", str(tmp_path), "--set", "tasks.t.train.max_steps=2"]) == 0
    out = capsys.readouterr()
    assert "| lap |" in out.out and out.err == ""
    assert gaps_main([str(cfg), "--out", str(tmp_path)]) == 0  # warned, not refused: the tables are still printed
    out = capsys.readouterr()
    assert "| lap |" in out.out
    assert out.err.startswith("warning: gaps: 4 finished run(s) of 'g' were made with another train or model config")
    assert "max_steps: 2 then 4" in out.err and "run `gaps` with the --set overrides they were run with" in out.err
