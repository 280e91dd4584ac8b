"""Task 61a: ``status`` and ``run`` read a run folder written before 41b9968 (its ``run_config.json`` left
``rope_base`` out at 100.0 or 10000.0 for every model) at the base its checkpoint's model record holds, as
``load_run`` does since ea944aa: a GPT run at base 100 is the run of a config at 100, not of one at GPT's own 10000
(it was: ``status`` completed, ``run`` skipped it and the tables filed it under the default base, while the config
at 100 was told of a change and refused). No GPU."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.results import run_dir, run_status
from diffusionformer.experiments.runner import run_experiment
from experiments_tiny_configs import TINY_ROPE_TASKS as TASKS, TINY_TRAIN as TRAIN


OWN = {"vit": 100.0, "gpt": 10000.0}
OTHER = {"vit": 10000.0, "gpt": 100.0}  # the base the runner left out before 41b9968 though not the model's own


def _config(model: str, rope_base: float | None, seeds=(0,), rope: bool = True):
    """The comparison of one setting ``rope`` of ``TASKS[model]`` at ``rope_base`` (``None``: the model's default)."""
    task = {**TASKS[model], "train": TRAIN}
    task["model_overrides"] = {**task["model_overrides"], "rope": rope}
    setting = {"name": "rope"} if rope_base is None else {"name": "rope", "model_overrides": {"rope_base": rope_base}}
    return load_experiment_config({"name": "tiny", "seeds": list(seeds), "tasks": [task], "operators": [setting]})


@pytest.fixture(scope="module")
def old_runs(tmp_path_factory):
    """``old_runs(model, rope_base)``: a results root holding a finished 2-step seed-0 run of ``TASKS[model]`` at
    ``rope_base`` whose ``run_config.json`` is as the runner wrote it before 41b9968 (``rope_base`` left out); a
    fresh copy each call (made once)."""
    made = {}

    def make(model: str, rope_base: float, rope: bool = True):
        key = model, rope_base, rope
        if key not in made:
            root = tmp_path_factory.mktemp(f"{model}_{int(rope_base)}_{rope}")
            run_experiment(_config(model, rope_base, rope=rope), root, progress=False, log=lambda s: None)
            path = run_dir(root / "tiny", "t", "rope", 0) / "run_config.json"
            identity = json.loads(path.read_text(encoding="utf-8"))
            assert identity["model_config"].pop("rope_base", OWN[model]) == rope_base  # kept since 41b9968
            path.write_text(json.dumps(identity), encoding="utf-8")
            made[key] = root
        copy = tmp_path_factory.mktemp("copy")
        shutil.copytree(made[key], copy / "out")
        return copy / "out"
    return make


@pytest.mark.parametrize("model", ["gpt", "vit"])
def test_bug_status_reads_an_old_run_at_its_checkpoints_rope_base(old_runs, model):
    """Bug: a GPT run at 100 (a ViT at 10000) from before 41b9968 was ``status``'s completed run of the config at the
    model's own base and a changed run ("rope_base: 'unset' then 100.0") of the config it was made with."""
    root = old_runs(model, OTHER[model])
    made_with = run_status(_config(model, OTHER[model]), root)
    assert [(r["state"], r["changed"]) for r in made_with] == [("completed", None)]
    for base in (None, OWN[model]):  # the model's default, unset or named
        (row,) = run_status(_config(model, base), root)
        assert row["state"] == "completed"
        assert row["changed"] == f"model_config (rope_base: {OTHER[model]!r} then 'unset')"


def test_bug_run_skips_an_old_run_only_under_its_own_rope_base(old_runs):
    """Bug: ``run`` of the config at GPT's default 10000 skipped an old GPT run at 100 and reported it as its own,
    while the config at 100 refused it as made with another ``rope_base``."""
    root = old_runs("gpt", 100.0)
    rdir = run_dir(root / "tiny", "t", "rope", 0)
    before = {p.name: p.read_bytes() for p in rdir.iterdir() if p.is_file()}
    logs: list[str] = []
    (result,) = run_experiment(_config("gpt", 100.0), root, progress=False, log=logs.append)
    assert result.status == "completed" and result.value == json.loads(before["summary.json"])["eval"]["metrics"][
        "val_loss"]
    assert all((rdir / name).read_bytes() == data for name, data in before.items()
               if name in ("checkpoint.pt", "summary.json", "metrics.jsonl", "run_config.json"))  # not trained again
    with pytest.raises(ValueError, match=r"different model_config \(rope_base: 100\.0 then 'unset'\).*--restart"):
        run_experiment(_config("gpt", None), root, progress=False, log=logs.append)
    assert (rdir / "summary.json").read_bytes() == before["summary.json"]


def test_bug_an_old_interrupted_run_resumes_under_its_rope_base(old_runs):
    """Bug: an old GPT run at 100 killed after its checkpoint was refused by the config at 100 ("made with a
    different model_config"); it resumes from its checkpoint and its ``run_config.json`` then records the base."""
    root = old_runs("gpt", 100.0)
    rdir = run_dir(root / "tiny", "t", "rope", 0)
    (rdir / "summary.json").unlink()
    (row,) = run_status(_config("gpt", 100.0), root)
    assert (row["state"], row["resumes_from"], row["changed"]) == ("interrupted", 2, None)
    (row,) = run_status(_config("gpt", None), root)
    assert row["changed"] == "model_config (rope_base: 100.0 then 'unset')"
    (result,) = run_experiment(_config("gpt", 100.0), root, progress=False, log=lambda s: None)
    assert result.status == "completed"
    assert json.loads((rdir / "run_config.json").read_text(encoding="utf-8"))["model_config"]["rope_base"] == 100.0


def test_bug_a_new_seed_beside_an_old_seed_of_the_same_rope_base_trains(old_runs):
    """Bug: seed 1 of the config at 100, beside the old finished seed 0 at 100, was refused as a sibling "made with a
    different model_config (rope_base: 'unset' then 100.0)" whose rows the table would average with its own."""
    root = old_runs("gpt", 100.0)
    results = run_experiment(_config("gpt", 100.0, seeds=(0, 1)), root, progress=False, log=lambda s: None)
    assert [(r.seed, r.status) for r in results] == [(0, "completed"), (1, "completed")]
    assert [r["changed"] for r in run_status(_config("gpt", 100.0, seeds=(0, 1)), root)] == [None, None]


def test_an_old_run_at_the_models_own_base_or_without_rope_reads_as_before(old_runs):
    """A run at the model's own base (``run_config.json`` leaves it out now too) is the default config's; a run with
    RoPE off is not read for its base (its checkpoint is not opened: the base changes nothing it computes)."""
    root = old_runs("gpt", 10000.0)
    assert [r["changed"] for r in run_status(_config("gpt", None), root)] == [None]
    assert run_status(_config("gpt", 100.0), root)[0]["changed"] == "model_config (rope_base: 'unset' then 100.0)"
    root = old_runs("gpt", 100.0, rope=False)  # its checkpoint's record holds 100.0
    assert [r["changed"] for r in run_status(_config("gpt", None, rope=False), root)] == [None]


def test_bug_finished_runs_keep_an_old_seed_beside_new_ones_of_its_rope_base(old_runs):
    """Bug: the tables of the config at 100 (``finished_runs``, under ``run``'s outputs and ``publish``) left the old
    seed 0 out beside a new seed 1, warning it was "made with a different model_config (rope_base: 'unset' then
    100.0)", and a run of seed 1 alone dropped seed 0's row from ``results.json`` (``outputs``)."""
    import warnings

    from diffusionformer.experiments.results import finished_runs

    root = old_runs("gpt", 100.0)
    new = run_experiment(_config("gpt", 100.0, seeds=(1,)), root, progress=False, log=lambda s: None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        merged = finished_runs(root / "tiny", _config("gpt", 100.0, seeds=(0, 1)), new)
    assert [(r.seed, r.status) for r in merged] == [(0, "completed"), (1, "completed")]
    runs = json.loads((root / "tiny" / "results.json").read_text(encoding="utf-8"))["runs"]
    assert sorted(r["seed"] for r in runs) == [0, 1]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_status_does_not_read_a_fifo_in_place_of_an_old_runs_checkpoint(old_runs):
    """The checkpoint is read for its base only where it is a file: a FIFO in its place (torch.load waits for a
    writer for ever) leaves the run read as ``run_config.json`` has it, as ``status`` reads such a folder's step."""
    import threading

    root = old_runs("gpt", 100.0)
    ckpt = run_dir(root / "tiny", "t", "rope", 0) / "checkpoint.pt"
    ckpt.unlink()
    os.mkfifo(ckpt)
    rows = []
    reader = threading.Thread(target=lambda: rows.extend(run_status(_config("gpt", None), root)), daemon=True)
    reader.start()
    reader.join(30)
    assert not reader.is_alive(), "run_status waits on the FIFO"
    assert [(r["state"], r["changed"]) for r in rows] == [("completed", None)]


_GPT_TOML = """name = "tiny"
seeds = [0]
[[tasks]]
name = "t"
dataset = "pydoc-chars"
model = "gpt-char-tiny"
metric = "val_loss"
model_overrides = {{n_embd = 8, n_layer = 1, n_head = 2, block_size = 16, rope = true}}
[tasks.train]
max_steps = 2
batch_size = 8
warmup_steps = 0
eval_interval = 2
log_interval = 1
checkpoint_interval = 2
[[operators]]
name = "rope"
{overrides}
"""


@pytest.mark.parametrize("overrides, done", [("model_overrides = {rope_base = 100.0}", True), ("", False)])
def test_bug_the_status_command_counts_an_old_run_done_only_at_its_rope_base(old_runs, tmp_path, capsys, overrides,
                                                                             done):
    """``python -m diffusionformer.experiments status`` counts the old GPT run at 100 as done for the config at 100
    (it said 0 of 1, the run made with another config) and not for the config at GPT's default (it said 1 of 1)."""
    from diffusionformer.experiments.cli import main

    root = old_runs("gpt", 100.0)
    toml = tmp_path / "tiny.toml"
    toml.write_text(_GPT_TOML.format(overrides=overrides), encoding="utf-8")
    assert main(["status", str(toml), "--out", str(root)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("1 of 1 runs completed" if done else "0 of 1 runs completed"), out
    assert ("made with another model_config (rope_base: 100.0 then 'unset')" in out) is not done, out
