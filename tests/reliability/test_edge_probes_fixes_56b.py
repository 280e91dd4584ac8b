"""Edge-case probes of the experiments command line's texts (sitting 56): help, warnings, estimates and refusals
that said something untrue or left out the remedy.

Found and fixed (tests named ``test_bug_...``):

- ``--workers``' help said "every command: size each process's torch threads", but only ``run`` and ``analyze``
  take ``--workers``; and ``analyze``'s help began with "run: start N worker processes". Each command's help now says
  what the option does there.
- ``summary``'s warning about runs made with another config named no remedy (a comment said "summary takes no
  --set", but it does): it now ends with the advice ``publish``'s refusal gives (the ``--set`` overrides the runs
  were made with, or ``run --restart``).
- ``status`` during the first run of a task said "about 0 min of training left" although the running run's log
  gives its pace: a task with no finished run is now estimated at the pace its running runs logged.
- A results page with no finished run said its logs were "not published for this study (it was published before
  `publish` copied them ...)": it now says there is no finished run's log to publish.
- (Rows of another metric than the task's naming the ``--set`` that reads them: test_edge_probes_review_56c.py.)
"""

from __future__ import annotations

import json

import pytest

from diffusionformer.experiments import load_experiment_config, publish_experiment, summary_table
from diffusionformer.experiments.config import train_config
from diffusionformer.experiments.cli import _parser
from diffusionformer.experiments.results import RunResult, _train_identity, run_dir, run_status
from diffusionformer.experiments.tables import format_status
from experiments_tiny_configs import write_finished_study

OPS = [{"name": "attention"}, {"name": "lap", "laplacian_heads": 1}]
VALUES = {"attention": {0: 0.5, 1: 0.6, 2: 0.7}, "lap": {0: 0.55, 1: 0.65, 2: 0.8}}
INDEX = "# Results\n\n```{toctree}\n:maxdepth: 1\n\n```\n"


def _workers_help(command: str) -> str | None:
    parser = _parser().commands[command]
    action = next((a for a in parser._actions if "--workers" in a.option_strings), None)
    return None if action is None else " ".join(action.help.split())


def test_bug_workers_help_is_true_of_each_command_that_takes_it():
    takes = {name for name in _parser().commands if _workers_help(name) is not None}
    assert takes == {"run", "analyze"}
    for name in takes:
        assert "every command" not in _workers_help(name)
    assert _workers_help("run").startswith("start N worker processes that share the runs")
    analyze = _workers_help("analyze")
    assert "start N worker" not in analyze and "run:" not in analyze
    assert "size this process's torch threads to cores // N" in analyze


def _raw(metric="test_acc"):
    """The config ``write_finished_study`` returns, as the dict it is read from (``metric`` its task's)."""
    return {"name": "h", "seeds": [0, 1, 2], "operators": OPS,
            "tasks": [{"name": "t", "dataset": "digits", "model": "vit-digits", "metric": metric,
                       "model_overrides": {}, "train": {"max_steps": 4}}]}


def _made_with(out, override):
    """Records in every run folder of the study ``h`` under ``out`` the ``run_config.json`` (its train) of a run made
    with the ``--set`` ``override``."""
    made = load_experiment_config(_raw(), [override])
    task = made.tasks[0]
    for o in made.operators:
        for seed in made.seeds:
            identity = json.loads(json.dumps({"train": _train_identity(train_config(task, seed))}, default=str))
            (run_dir(out / "h", task.name, o.name, seed) / "run_config.json").write_text(json.dumps(identity))


def test_bug_summary_warning_of_runs_of_another_train_says_how_to_read_them(tmp_path):
    out = tmp_path / "results"
    config = write_finished_study(out, "h", OPS, VALUES)  # max_steps 4
    _made_with(out, "tasks.t.train.max_steps=2")  # the runs were made with `run --set tasks.t.train.max_steps=2`
    with pytest.warns(UserWarning) as caught:
        summary_table([config], out)
    text = " ".join(str(w.message) for w in caught if "summary:" in str(w.message))
    assert "6 finished run(s) of 'h' were made with another train or model config" in text
    assert "run `summary` with the --set overrides they were run with, or redo them with `run --restart`" in text
    # publish's refusal gives the same advice with its own verb
    with pytest.raises(ValueError, match="publish with the --set overrides they were run with, or redo them"):
        publish_experiment(config, out, tmp_path / "docs")


def _row(state, step, elapsed, holder=None, seed=0, max_steps=100):
    return dict(task="t", operator="att", seed=seed, state=state, step=step, max_steps=max_steps, elapsed=elapsed,
                holder=holder)


def test_bug_status_times_the_first_run_by_its_own_pace():
    # the first run: 50 of 100 steps in 60 s; the second is missing: 50 + 100 steps left at 1.2 s a step = 3 min
    rows = [_row("running", 50, 60.0, holder="pid 9 on h"), _row("missing", 0, None, seed=1)]
    head = format_status(rows).split("\n")[0]
    assert head == ("0 of 2 runs completed; about 3 min of training left on one worker (tasks with no finished run: "
                    "at the pace their running runs logged so far).")


def test_status_with_a_finished_run_or_nothing_timed_keeps_its_estimate():
    # a finished run times the task (10 steps in 600 s: 60 s a step), not the running run's pace (1.2 s a step)
    rows = [_row("completed", 10, 600.0, max_steps=10), _row("running", 5, 6.0, seed=1, max_steps=10)]
    assert format_status(rows).startswith("1 of 2 runs completed; about 5 min of training left on one worker.\n")
    # a running run that has logged no step (or no time) yet: nothing known, the wording as before
    for step, elapsed in ((0, None), (3, None), (0, 4.0)):
        rows = [_row("running", step, elapsed), _row("missing", 0, None, seed=1)]
        assert format_status(rows).startswith("0 of 2 runs completed; about 0 min of training left on one worker "
                                              "(plus 2 run(s) of tasks with no finished run to time).\n")


def test_status_of_a_running_run_on_disk_uses_its_logged_pace(tmp_path):
    out = tmp_path / "results"
    config = write_finished_study(out, "h", OPS, {"attention": {0: 0.5}, "lap": {}})
    rdir = run_dir(out / "h", "t", "attention", 0)
    (rdir / "summary.json").unlink()  # seed 0 of attention is under way: 2 of 4 steps in 30 s
    (rdir / "metrics.jsonl").write_text(json.dumps({"step": 2, "split": "train", "loss": 1.0, "elapsed": 30.0}) + "\n")
    rows = run_status(config, out)
    rows[0].update(state="running", holder="pid 1 on h")  # as a live lock makes it (no process is started here)
    # 2 steps left of the running run and 4 of each of the 5 others, at 15 s a step: 22 steps, 5.5 min
    assert format_status(rows).startswith("0 of 6 runs completed; about 6 min of training left on one worker (tasks")


def test_bug_a_page_with_no_finished_run_does_not_say_it_was_published_before_logs(tmp_path):
    out = tmp_path / "results"
    config = write_finished_study(out, "h", OPS, VALUES)
    rows = [RunResult("t", o["name"], s, "failed", "test_acc", None) for o in OPS for s in (0, 1, 2)]
    (out / "h" / "results.json").write_text(json.dumps({"runs": [r.__dict__ for r in rows], "summary": []}))
    for o in OPS:  # failed before their first log line
        for s in (0, 1, 2):
            rdir = run_dir(out / "h", "t", o["name"], s)
            (rdir / "metrics.jsonl").unlink()
            (rdir / "summary.json").write_text(json.dumps({"status": "failed", "error": "boom"}))
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text(INDEX)
    with pytest.warns(RuntimeWarning, match="not finished"):
        page = publish_experiment(config, out, docs).read_text()
    assert "**Runs:** 0 of 6 finished" in page
    assert "- **Per-run metric logs:** none yet (no run of this study has finished)\n" in page
    assert "published before" not in page


def test_a_page_of_finished_runs_without_their_logs_keeps_its_reason(tmp_path):
    out = tmp_path / "results"
    config = write_finished_study(out, "h", OPS, VALUES)
    for o in OPS:
        for s in (0, 1, 2):
            (run_dir(out / "h", "t", o["name"], s) / "metrics.jsonl").unlink()
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text(INDEX)
    page = publish_experiment(config, out, docs).read_text()
    assert "- **Per-run metric logs:** not published for this study (it was published before `publish`" in page
