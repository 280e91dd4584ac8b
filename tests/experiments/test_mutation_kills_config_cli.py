"""Tests written in a mutation-testing audit of the configs, the command line, publishing, the GPU
workers, the mini-batch rules and the comparisons.

Each test kills a mutant of the library code that the rest of the suite let through (the
docstring of each test names it: file, line and the mutation) and checks the code against the
documented contract or a hand-worked value (the strict-config rules of
:mod:`diffusionformer.config`, the exit codes of the command line, what a published page keeps).
One test (its docstring says "defect found in this audit") covers a fix the audit made: a name
filter (``--set tasks=NAME``) on a ``tasks``/``operators`` value that is not a list of tables.
CPU only, deterministic, no network; files only under ``tmp_path``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import pytest

from diffusionformer.config import config_from_dict
from diffusionformer.experiments import load_experiment_config, parse_override
from diffusionformer.experiments.cli import main as cli_main
from diffusionformer.experiments.config import TaskConfig

from tests.experiments.test_experiments_gpu import TINY
from tests.experiments.test_mutation_kills_runner_data import _raw_config


def _raw(**extra):
    """A small valid comparison as a plain dict (what a TOML file parses to): two seeds, two settings."""
    return _raw_config(**{"seeds": [0, 1], "operators": [{"name": "attention"}, {"name": "lap", "laplacian_heads": 1}],
                          **extra})


def _task(**fields):
    raw = _raw()
    raw["tasks"][0].update(fields)
    return raw


@dataclass
class _Typed:
    rate: float = 0.1
    pair: tuple[int, int] = (1, 2)
    weights: dict[str, float] = field(default_factory=dict)


# ---------------------------------------------------------------------------- diffusionformer/config.py
@pytest.mark.parametrize("value", [True, False])
def test_a_bool_is_not_a_float(value):
    """kills: diffusionformer/config.py:93 check_value for ``float`` dropping ``isinstance(value, bool) or`` (TOML ``true``
    read as 1.0)"""
    with pytest.raises(TypeError, match=rf"^_Typed.rate: expected a float, got bool {value}$"):
        config_from_dict(_Typed, {"rate": value})
    assert config_from_dict(_Typed, {"rate": 2}).rate == 2.0 and isinstance(config_from_dict(_Typed, {"rate": 2}).rate, float)


def test_a_fixed_length_tuple_refuses_too_few_items_as_well_as_too_many():
    """kills: diffusionformer/config.py:113 ``len(args) != len(value)`` -> ``len(args) < len(value)`` (a short list is cut
    to a shorter tuple by zip, silently)"""
    with pytest.raises(ValueError, match=r"^_Typed.pair: expected 2 items, got 1$"):
        config_from_dict(_Typed, {"pair": [3]})
    with pytest.raises(ValueError, match=r"^_Typed.pair: expected 2 items, got 3$"):
        config_from_dict(_Typed, {"pair": [3, 4, 5]})
    assert config_from_dict(_Typed, {"pair": [3, 4]}).pair == (3, 4)


def test_the_keys_of_a_typed_table_are_checked():
    """kills: diffusionformer/config.py:131 ``{check_value(k, args[0], ...): ...}`` -> ``{k: ...}`` (a ``dict[str, float]``
    taking an int key)"""
    with pytest.raises(TypeError, match=r"^_Typed.weights key: expected a string, got int 1$"):
        config_from_dict(_Typed, {"weights": {1: 0.5}})
    assert config_from_dict(_Typed, {"weights": {"a": 1}}).weights == {"a": 1.0}


# ---------------------------------------------------------------------------- experiments/config.py
def test_label_smoothing_is_refused_at_one_when_the_config_loads():
    """kills: experiments/config.py:136 ``0.0 <= label_smoothing < 1.0`` -> ``<= 1.0`` (a config with
    label_smoothing = 1 loads and every run of it fails at its start)"""
    with pytest.raises(ValueError, match=r"label_smoothing must be a float in \[0, 1\), got 1.0"):
        load_experiment_config(_task(label_smoothing=1.0))
    assert load_experiment_config(_task(label_smoothing=0.999)).tasks[0].label_smoothing == 0.999


def test_crop_padding_true_is_not_a_padding_of_one():
    """kills: experiments/config.py:131 dropping ``isinstance(pad, bool) or`` (``crop_padding = true``
    read as a padding of 1 pixel)"""
    with pytest.raises(ValueError, match=r"augment.crop_padding must be an int >= 0, got True"):
        load_experiment_config(_task(augment={"crop_padding": True}))
    assert load_experiment_config(_task(augment={"crop_padding": 0})).tasks[0].augment == {"crop_padding": 0}


def test_a_reach_threshold_of_true_is_refused_by_a_directly_built_task():
    """kills: experiments/config.py:144 dropping ``not isinstance(value, bool)`` (``TaskConfig(reach={"val_acc":
    True})`` built in Python, where no type check of config_from_dict runs first, takes the threshold 1.0)"""
    with pytest.raises(ValueError, match="reach must be one evaluation key with a finite threshold"):
        TaskConfig("digits", "digits", "vit-digits", reach={"val_acc": True})
    assert TaskConfig("digits", "digits", "vit-digits", reach={"val_acc": 1}).reach == {"val_acc": 1.0}
    with pytest.raises(TypeError, match="reach"):  # from a file the type check already refuses it
        load_experiment_config(_task(reach={"val_acc": True}))


def test_duplicate_seeds_are_refused():
    """kills: experiments/config.py:281 ``len(set(seeds)) != len(seeds)`` -> ``>`` (seeds = [0, 0] trains
    the same run twice and pairs it with itself)"""
    with pytest.raises(ValueError, match=r"duplicate seeds: \[0, 1, 0\]"):
        load_experiment_config(_raw(seeds=[0, 1, 0]))


def test_cross_validation_seeds_must_cover_every_fold_equally_often():
    """kills: experiments/config.py:286 ``min(counts) != max(counts)`` -> ``min(counts) == 0`` (seeds [0, 1, 2]
    with 2 folds test fold 0 twice and fold 1 once, so the K-fold mean weights the folds unequally)"""
    with pytest.raises(ValueError, match=r"cover every fold equally often.*runs per fold: \[2, 1\]"):
        load_experiment_config(_task(folds=2) | {"seeds": [0, 1, 2]})
    assert load_experiment_config(_task(folds=2) | {"seeds": [0, 1, 2, 3]}).seeds == [0, 1, 2, 3]


def test_an_override_value_may_contain_equals_signs():
    """kills: experiments/config.py:363 ``text.split("=", 1)`` -> ``text.rsplit("=", 1)`` (a head spec with
    operator arguments, ``heads=heat(t=0.5):2``, split at its last ``=``)"""
    assert parse_override("operators.heat.heads=heat(t=0.5):1,attention:1") == (
        ["operators", "heat", "heads"], "heat(t=0.5):1,attention:1")
    cfg = load_experiment_config(_raw(), ["operators.attention.heads=heat(t=0.5, steps=2):1,attention:1"])
    assert cfg.operators[0].heads == "heat(t=0.5, steps=2):1,attention:1"


def test_overrides_leave_the_callers_dict_unchanged():
    """kills: experiments/config.py:380 ``copy.deepcopy(data)`` -> ``dict(data)`` (an override written
    into the caller's nested tables: a second load of the same dict gets the first one's overrides)"""
    raw = _raw()
    before = copy.deepcopy(raw)
    cfg = load_experiment_config(raw, ["tasks.digits.train.max_steps=5", "operators.lap.laplacian_heads=2"])
    assert cfg.tasks[0].train["max_steps"] == 5 and cfg.operators[1].laplacian_heads == 2
    assert raw == before
    assert load_experiment_config(raw).tasks[0].train["max_steps"] == 2


def test_a_filter_naming_an_unknown_task_is_refused_not_narrowed():
    """kills: experiments/config.py:391 dropping ``if missing: raise`` (``tasks=digits,digitz`` silently
    runs digits alone; ``operators=lapp`` leaves no setting)"""
    with pytest.raises(ValueError, match=r"no tasks named \['digitz'\]; available: \['digits'\]"):
        load_experiment_config(_raw(), ["tasks=digits,digitz"])
    with pytest.raises(ValueError, match=r"no operators named \['lapp'\]; available: \['attention', 'lap'\]"):
        load_experiment_config(_raw(), ["operators=attention,lapp"])
    assert [o.name for o in load_experiment_config(_raw(), ["operators=lap"]).operators] == ["lap"]


def test_a_filter_that_makes_a_primary_setting_the_baseline_drops_that_contrast():
    """kills: experiments/config.py:396 ``settings_kept = [...][1:]`` -> ``[...]`` (``operators=lap,lap2``
    makes lap the baseline; a primary contrast naming lap then fails the load: "is the baseline"); lap2 was named
    against the dropped baseline, so it is no primary contrast either (test_edge_probes_config_third)"""
    raw = _raw(primary=["lap", "lap2"])
    raw["operators"].append({"name": "lap2", "laplacian_heads": 2})
    cfg = load_experiment_config(raw, ["operators=lap,lap2"])
    assert [o.name for o in cfg.operators] == ["lap", "lap2"] and cfg.primary == []


def test_a_folder_given_as_the_config_is_a_clear_error_and_exit_2(tmp_path, capsys):
    """kills: experiments/config.py:430 ``p.is_file()`` -> ``p.exists()`` (a folder passed as CONFIG reaches
    read_text: IsADirectoryError, which the command line does not catch: a traceback, not exit 2)"""
    with pytest.raises(FileNotFoundError, match="experiment config .* not found"):
        load_experiment_config(tmp_path)
    assert cli_main(["show", str(tmp_path)]) == 2
    assert "not found" in capsys.readouterr().err


def test_a_seed_beyond_the_folds_tests_on_seed_mod_folds():
    """kills: experiments/config.py:212 ``"fold": self.fold_of(seed)`` -> ``"fold": seed`` (seeds 0..K-1 look
    right; seed K asks the dataset for fold K, which does not exist)"""
    task = TaskConfig("digits", "digits", "vit-digits", folds=3, dataset_options={"val_fraction": 0.2})
    assert [task.dataset_kwargs(s)["fold"] for s in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert task.dataset_kwargs(4) == {"val_fraction": 0.2, "fold": 1, "num_folds": 3}
    assert TaskConfig("digits", "digits", "vit-digits").dataset_kwargs(4) == {}



@pytest.mark.parametrize("section, bad", [("tasks", ["digits"]), ("operators", "attention"), ("operators", [1])])
def test_a_name_filter_on_a_list_that_is_not_of_tables_is_a_named_error(tmp_path, capsys, section, bad):
    """defect found in this audit (experiments/config.py apply_overrides): ``--set tasks=NAME`` on a config whose
    ``tasks`` is not a list of tables (``tasks = ["digits"]``) raised AttributeError ('str' object has no attribute
    'get'), which the command line does not catch: a traceback instead of exit 2 naming the key"""
    raw = _raw(**{section: bad})
    name = "digits" if section == "tasks" else "attention"
    with pytest.raises(ValueError, match=rf"override '{section}={name}': {section} must be a list of tables"):
        load_experiment_config(raw, [f"{section}={name}"])
    with pytest.raises(TypeError, match=rf"config.{section}"):  # without the filter: the validator names it
        load_experiment_config(raw)
    toml = tmp_path / "bad.toml"
    toml.write_text('name = "mk"\ntasks = ["digits"]\n\n[[operators]]\nname = "attention"\n')
    assert cli_main(["show", str(toml), "--set", "tasks=digits"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: override 'tasks=digits': tasks must be a list of tables") and "Traceback" not in err


# ---------------------------------------------------------------------------- experiments/validate.py
def test_a_problem_shared_by_every_seed_is_listed_once(monkeypatch):
    """kills: validate.py:108 ``if msg not in problems: problems.append(msg)`` -> ``problems.append(msg)``
    (the missing-tensorboard problem, found once per seed, listed once per seed)"""
    from diffusionformer.experiments import validate

    raw = _raw(seeds=[0, 1, 2])
    raw["tasks"][0]["train"]["loggers"] = ["jsonl", "tensorboard"]
    monkeypatch.setattr(validate, "_tensorboard_available", lambda: False)
    problems = validate.validate_experiment(load_experiment_config(raw), load_data=False)
    assert len(problems) == 1 and "the tensorboard package is not installed" in problems[0], problems
    with pytest.raises(ValueError, match=r"\(6 runs\) has 1 problem\(s\); nothing was trained"):
        validate.check_experiment(load_experiment_config(raw), load_data=False)


def test_an_unknown_dataset_option_is_a_problem_without_loading_the_data():
    """kills: validate.py:135 ``unknown = [k for k in ... if k not in spec.options]`` -> ``[]`` (a misspelt
    dataset option passes ``show`` and fails every run of the task when its data loads)"""
    from diffusionformer.data import dataset_spec
    from diffusionformer.experiments.validate import validate_experiment

    options = sorted(dataset_spec("digits").options)
    assert "val_fraction" in options
    problems = validate_experiment(load_experiment_config(_task(dataset_options={"val_fractoin": 0.2})), load_data=False)
    assert problems == [f"task 'digits': dataset 'digits' has no option(s) ['val_fractoin'] (did you mean 'val_fraction'?); its options: {options}"]
    assert validate_experiment(load_experiment_config(_task(dataset_options={"val_fraction": 0.2})), load_data=False) == []


# ---------------------------------------------------------------------------- experiments/cli.py
@pytest.fixture
def cli_run(tmp_path, monkeypatch):
    """``run``'s command line with run_experiment swapped for a stub that records its arguments and returns
    ``stub.results``: what the command line decides (device, precision, resume, exit code) runs for real,
    nothing trains. Torch's thread count, which the command line sets, is restored afterwards."""
    import torch

    from diffusionformer.experiments import runner

    class Stub:
        results: list = []
        calls: list = []

        def __call__(self, config, out_root, **kwargs):
            self.calls.append((config, kwargs))
            return list(self.results)

        def toml(self, top="", train=""):
            path = tmp_path / "mk.toml"
            path.write_text(TINY.format(top=top, train=train))  # the GPU tests' comparison: nothing trains here
            return str(path)

    stub = Stub()
    stub.results, stub.calls = [], []
    threads = torch.get_num_threads()
    monkeypatch.setattr(runner, "run_experiment", stub)
    yield stub
    torch.set_num_threads(threads)


def test_run_precision_overrides_the_tasks_own_amp(cli_run, tmp_path):
    """kills: cli.py:185 ``task.train = {**task.train, "amp": amp}`` -> ``{"amp": amp, **task.train}`` (the
    documented ``run --precision`` overrides the config's precision and every task's train.amp)"""
    toml = cli_run.toml(train='amp = "bf16"')
    assert cli_main(["run", toml, "--out", str(tmp_path / "r"), "--precision", "fp32", "--no-progress"]) == 0
    (config, _), = cli_run.calls
    assert config.tasks[0].train["amp"] == "off"


def test_run_device_flag_wins_over_the_configs_device(cli_run, tmp_path):
    """kills: cli.py:179 ``args.device if args.device is not None else config.device`` -> the config's device
    first (``--device cpu`` ignored for a config that says cuda)"""
    toml = cli_run.toml(top='device = "cuda"')
    assert cli_main(["run", toml, "--out", str(tmp_path / "r"), "--device", "cpu", "--no-progress"]) == 0
    (_, kwargs), = cli_run.calls
    assert kwargs["device"] == "cpu"


def test_run_restart_asks_for_no_resume(cli_run, tmp_path):
    """kills: cli.py:196 ``resume=not args.restart`` -> ``resume=True`` (``--restart`` would resume the old runs)"""
    toml = cli_run.toml()
    assert cli_main(["run", toml, "--out", str(tmp_path / "r"), "--no-progress"]) == 0
    assert cli_main(["run", toml, "--out", str(tmp_path / "r"), "--restart", "--no-progress"]) == 0
    assert [kwargs["resume"] for _, kwargs in cli_run.calls] == [True, False]


def test_a_missing_config_file_is_exit_2_with_its_name(tmp_path, capsys):
    """kills: cli.py:209 dropping ``FileNotFoundError`` from the caught errors (a mistyped config path: a
    traceback instead of ``error: ...`` and exit 2)"""
    missing = tmp_path / "nope.toml"
    for command in (["show", str(missing)], ["run", str(missing), "--no-progress"], ["status", str(missing)]):
        assert cli_main(command) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: experiment config") and "nope.toml" in err and "Traceback" not in err


def test_summary_passes_selected_through(cli_run, monkeypatch, capsys):
    """kills: cli.py:129 ``selected=args.selected`` -> ``selected=False`` (``summary --selected`` printing the
    final-metric table)"""
    from diffusionformer.experiments import publish

    seen = []
    monkeypatch.setattr(publish, "summary_table", lambda configs, out, *, selected: seen.append(selected) or "t\n")
    toml = cli_run.toml()
    assert cli_main(["summary", toml]) == 0 and cli_main(["summary", toml, "--selected"]) == 0
    assert seen == [False, True]


# ---------------------------------------------------------------------------- experiments/publish.py
def _finished_comparison(tmp_path, seeds=(0, 1, 2)):
    """A finished comparison on disk (``results.json`` only: no training) and a docs folder with an index."""
    import json

    from diffusionformer.experiments.results import RunResult

    cfg = load_experiment_config(_raw(seeds=list(seeds)))
    src = tmp_path / "results" / "mk"
    src.mkdir(parents=True)
    value = {("attention", s): 0.50 + 0.01 * s for s in seeds} | {("lap", s): 0.52 + 0.01 * s + 0.002 * s * s for s in seeds}
    rows = [RunResult("digits", op, s, "completed", "test_acc", v, {"test_acc": v}, elapsed=60.0)
            for (op, s), v in value.items()]
    (src / "results.json").write_text(json.dumps({"runs": [r.__dict__ for r in rows], "summary": []}))
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Results\n\n```{toctree}\n:maxdepth: 1\n\nother\n```\n")
    return cfg, tmp_path / "results", docs


def test_republishing_keeps_the_gap_tables_and_the_reading_that_follow_the_tables(tmp_path):
    """kills: publish.py:54 ``text[min(at):]`` -> ``text[max(at):]`` (a page with gap tables followed by a
    hand-written reading loses its gap tables at the next publish)"""
    from diffusionformer.experiments.publish import GAP_MARKER, READING_MARKER, publish_experiment

    cfg, out, docs = _finished_comparison(tmp_path)
    page = publish_experiment(cfg, out, docs, config_path="mk.toml")
    first = page.read_text()
    tail = f"{GAP_MARKER}\n\n| gap table |\n\n{READING_MARKER}\n\nOur reading, written by hand.\n"
    page.write_text(first + "\n" + tail)
    assert publish_experiment(cfg, out, docs, config_path="mk.toml") == page
    assert page.read_text() == first + "\n" + tail


def test_republishing_removes_files_of_the_earlier_publish(tmp_path):
    """kills: publish.py:115 dropping ``shutil.rmtree(dst)`` (files published earlier, e.g. the log of a run
    since deleted, stay in the docs beside the new results)"""
    from diffusionformer.experiments.publish import publish_experiment

    cfg, out, docs = _finished_comparison(tmp_path)
    stale = docs / "mk" / "logs" / "digits" / "lap" / "seed9.json"
    stale.parent.mkdir(parents=True)
    stale.write_text("{}")
    publish_experiment(cfg, out, docs)
    assert not stale.exists() and (docs / "mk" / "results.json").is_file()
    assert sorted(p.name for p in (docs / "mk").iterdir()) == ["results.json"]


def test_an_entry_listed_with_its_md_suffix_is_not_added_again(tmp_path):
    """kills: publish.py:247 dropping ``.removesuffix(".md")`` (an index listing ``mk.md`` gets a second
    entry ``mk``: sphinx warns of a duplicate and ``-W`` fails)"""
    from diffusionformer.experiments.publish import add_to_toctree

    index = tmp_path / "index.md"
    text = "# Results\n\n```{toctree}\n:maxdepth: 1\n\nmk.md\n```\n"
    index.write_text(text)
    assert add_to_toctree(index, "mk") is False and index.read_text() == text
    assert add_to_toctree(index, "mk2") is True and index.read_text().count("\nmk2\n```") == 1


def test_an_unclosed_toctree_is_a_named_error_and_the_index_is_unchanged(tmp_path):
    """kills: publish.py:245 ``if end is None: raise ValueError(...)`` -> the entry appended at the end of the
    file (inside a fence that never closes: the page renders as a code block)"""
    from diffusionformer.experiments.publish import add_to_toctree

    index = tmp_path / "index.md"
    text = "# Results\n\n```{toctree}\n:maxdepth: 1\n\nother\n"
    index.write_text(text)
    with pytest.raises(ValueError, match=r"index.md: expected a closing ``` for the toctree opened on line 3"):
        add_to_toctree(index, "mk")
    assert index.read_text() == text


def _results_on_disk(tmp_path, raw, values, final=None):
    """``<tmp>/results/<name>/results.json`` holding one completed run per ``(operator, seed): value``."""
    import json

    from diffusionformer.experiments.results import RunResult

    src = tmp_path / "results" / raw["name"]
    src.mkdir(parents=True)
    rows = [RunResult("digits", op, s, "completed", "test_acc", v, {"test_acc": v, **(final or {})})
            for (op, s), v in values.items()]
    (src / "results.json").write_text(json.dumps({"runs": [r.__dict__ for r in rows], "summary": []}))
    return tmp_path / "results"


def test_summary_table_marks_a_cell_whose_baseline_lacks_seeds(tmp_path):
    """kills: publish.py:421 dropping ``or len(base_row[...]) < len(config.seeds)`` (a baseline with a seed
    missing: the cell compares fewer pairs than the config asks for and does not say so)"""
    from diffusionformer.experiments.publish import summary_table

    raw = _raw(seeds=[0, 1, 2])
    values = {("attention", 0): 0.50, ("attention", 1): 0.52}
    values |= {("lap", s): 0.53 + 0.01 * s * s for s in range(3)}
    text = summary_table([load_experiment_config(raw)], _results_on_disk(tmp_path, raw, values))
    assert "[3 vs 2 seeds]" in text
    full = _raw(name="mk2", seeds=[0, 1, 2])
    values[("attention", 2)] = 0.49
    assert "seeds]" not in summary_table([load_experiment_config(full)], _results_on_disk(tmp_path, full, values))


def test_published_results_json_is_strict_json_with_null_for_nan(tmp_path):
    """kills: publish.py:121 ``write_json_atomic(dst / "results.json", ...)`` -> a plain ``json.dumps`` write
    (a run's nan metric published as the bare token NaN, which is not JSON: browsers and strict parsers
    refuse the whole file)"""
    import json

    from diffusionformer.experiments.publish import publish_experiment

    raw = _raw(seeds=[0, 1])
    values = {(op, s): 0.5 + 0.01 * s + 0.03 * (op == "lap") for op in ("attention", "lap") for s in (0, 1, 2)}
    out = _results_on_disk(tmp_path, raw, values, final={"val_loss": float("nan")})  # seed 2: outside the config
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Results\n\n```{toctree}\n\nother\n```\n")
    publish_experiment(load_experiment_config(raw), out, docs)

    def refuse(token):
        raise ValueError(f"not JSON: {token}")

    runs = json.loads((docs / "mk" / "results.json").read_text(), parse_constant=refuse)["runs"]
    assert sorted((r["operator"], r["seed"]) for r in runs) == [("attention", 0), ("attention", 1), ("lap", 0), ("lap", 1)]
    assert all(r["final"]["val_loss"] is None and r["final"]["test_acc"] == r["value"] for r in runs)


# ---------------------------------------------------------------------------- experiments/gpu.py
@pytest.mark.parametrize("spec", ["mps", "meta", "xpu", "mps:0"])
def test_devices_other_than_cpu_and_cuda_are_refused_even_by_spelling(spec):
    """kills: gpu.py:42 ``_DEVICE_TYPES = ("cpu", "cuda")`` widened (a device torch can name but the runner
    does not support, e.g. ``meta``, accepted in a config and failing every run)"""
    from diffusionformer.experiments.gpu import check_device

    for available in (True, False):
        with pytest.raises(ValueError, match=rf"expected 'auto', 'cpu', 'cuda' or 'cuda:N', got '{spec}'"):
            check_device(spec, available=available)


@pytest.mark.parametrize("workers", [0, -1, True, 2.0])
def test_run_workers_refuses_a_count_below_one_and_starts_nothing(tmp_path, procs, workers):
    """kills: gpu.py:150 ``workers < 1`` -> ``workers < 0`` (``run_workers(argv, 0, ...)`` returns no exit codes,
    which ``any(codes)`` reads as every worker succeeding)"""
    from diffusionformer.experiments.gpu import run_workers

    with pytest.raises(ValueError, match=r"workers: expected an int >= 1"):
        run_workers(["run", "c.toml"], workers, tmp_path / "w", stagger=0, log=lambda _: None)
    assert procs.started == [] and not (tmp_path / "w").exists()


def test_each_worker_is_told_the_worker_count_and_its_own_rank(tmp_path, procs):
    """kills: gpu.py:160 dropping ``WORKERS_ENV: str(workers)`` (every worker sizes its torch threads to all the
    cores: N workers oversubscribe the machine N times) and gpu.py:161 dropping ``WORKER_ENV: f"{k}/{workers}"``
    (a worker could start workers of its own)"""
    import sys

    from diffusionformer.experiments.gpu import WORKER_ENV, run_workers
    from diffusionformer.experiments.threads import WORKERS_ENV

    codes = run_workers(["run", "c.toml", "--no-progress"], 3, tmp_path / "w", stagger=0, log=lambda _: None)
    assert codes == [0, 0, 0]
    assert [p.cmd for p in procs.started] == [[sys.executable, "-m", "diffusionformer.experiments", "run", "c.toml",
                                                    "--no-progress"]] * 3
    assert [p.env[WORKERS_ENV] for p in procs.started] == ["3", "3", "3"]
    assert [p.env[WORKER_ENV] for p in procs.started] == ["0/3", "1/3", "2/3"]
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == ["worker0.log", "worker1.log", "worker2.log"]


def test_an_interrupted_run_workers_stops_every_live_worker(tmp_path, procs, monkeypatch):
    """kills: gpu.py:170 dropping ``p.terminate()`` (Ctrl-C in the parent leaves the workers training on,
    holding their run locks and the GPU)"""
    from diffusionformer.experiments.gpu import run_workers

    def interrupted_wait(self, timeout=None):
        if timeout is None:
            raise KeyboardInterrupt
        return -15 if self.terminated else None

    monkeypatch.setattr(procs, "wait", interrupted_wait)
    with pytest.raises(KeyboardInterrupt):
        run_workers(["run", "c.toml"], 2, tmp_path / "w", stagger=0, log=lambda _: None)
    assert len(procs.started) == 2 and all(p.terminated for p in procs.started)


# ---------------------------------------------------------------------------- experiments/minibatch.py
def _ring_nodes(N=40, F=3, C=2):
    """A ring graph with Planetoid-style masks (10 train, 10 val, 20 test nodes)."""
    import torch
    from torch_geometric.data import Data

    from diffusionformer.data.base import NodeData

    g = torch.Generator().manual_seed(0)
    i = torch.arange(N)
    edge_index = torch.stack([torch.cat([i, (i + 1) % N]), torch.cat([(i + 1) % N, i])])
    masks = [torch.zeros(N, dtype=torch.bool) for _ in range(3)]
    for m, idx in zip(masks, (i[:10], i[10:20], i[20:])):
        m[idx] = True
    data = Data(x=torch.randn(N, F, generator=g), edge_index=edge_index, y=torch.randint(0, C, (N,), generator=g),
                train_mask=masks[0], val_mask=masks[1], test_mask=masks[2])
    return NodeData("ring", data, num_classes=C, num_features=F)


@pytest.mark.parametrize("eval_batch_size", [0, -3, True, 2.5])
def test_minibatch_task_refuses_a_bad_eval_batch_size(eval_batch_size):
    """kills: minibatch.py:226 dropping the ``eval_batch_size`` check of NodeMiniBatchTask (0 makes the
    sampled evaluation's ``range(0, n, 0)`` raise mid-run; a negative size evaluates no node and reports nan)"""
    from diffusionformer.experiments.minibatch import NodeMiniBatchTask

    with pytest.raises(ValueError, match=rf"eval_batch_size must be a positive int, got {eval_batch_size!r}"):
        NodeMiniBatchTask(_ring_nodes(), [2], 4, eval="sampled", eval_batch_size=eval_batch_size)
    assert NodeMiniBatchTask(_ring_nodes(), [2], 4, eval="sampled", eval_batch_size=1).eval_batch_size == 1


# ---------------------------------------------------------------------------- experiments/compare.py
def test_format_p_gives_four_decimals_from_0_0495_on():
    """kills: compare.py:116 ``0.0495 <= p`` -> ``0.0495 < p`` (p = 0.0495 printed with three decimals, the
    binary value 0.04949... as 0.049: the documented four decimals start at 0.0495). Since ``_format_p`` keeps a p
    on its side of 0.05, this alpha-0.05 case prints "0.0495" under the mutant too: the mutant is killed at alpha
    0.01 by tests/reliability/test_mutation_kills_sitting48_stats.py; these rows pin the band's edges at 0.05."""
    from diffusionformer.experiments.compare import format_p

    assert format_p(0.0495) == "0.0495"
    assert format_p(0.0505) == "0.051" and format_p(0.04949) == "0.049"



def test_a_reach_contrast_with_a_run_that_never_reached_is_censored_not_a_crash():
    """kills: compare.py:48 ``if not by_seed or any(v is None ...)`` -> ``if not by_seed`` (a run that never
    met the threshold has reach_step None: ``float(None)`` stops the whole page's tables with a TypeError)"""
    from diffusionformer.experiments.compare import contrasts
    from diffusionformer.experiments.config import ExperimentConfig, OperatorSetting
    from diffusionformer.experiments.results import RunResult
    from diffusionformer.experiments.tables import aggregate

    task = TaskConfig("digits", "digits", "vit-digits", reach={"val_acc": 0.9})
    cfg = ExperimentConfig("mk", [task], [OperatorSetting("attention"), OperatorSetting("lap", laplacian_heads=1)],
                           seeds=[0, 1, 2])
    steps = {("attention", 0): 40, ("attention", 1): 60, ("attention", 2): 50, ("lap", 0): 30, ("lap", 1): None,
             ("lap", 2): 35}
    runs = [RunResult("digits", op, s, "completed", "test_acc", 0.9 + 0.01 * s + 0.001 * (op == "lap") * s * s,
                      reach_step=step) for (op, s), step in steps.items()]
    reach = [c for c in contrasts(aggregate(runs), cfg) if c.kind == "reach"]
    assert len(reach) == 1 and reach[0].diff.p is None and "censored" in reach[0].diff.note
    assert reach[0].diff.mean is None and reach[0].minimize
    steps[("lap", 1)] = 45  # every run reached: differences -10, -15, -15
    runs = [RunResult("digits", op, s, "completed", "test_acc", 0.9, reach_step=step) for (op, s), step in steps.items()]
    reach = [c for c in contrasts(aggregate(runs), cfg) if c.kind == "reach"]
    assert reach[0].diff.mean == pytest.approx(-40 / 3, rel=1e-12) and reach[0].diff.p is not None


# ---------------------------------------------------------------------------- page writes and config encoding
def test_a_failed_page_write_keeps_the_hand_written_reading_and_leaves_no_temporary(tmp_path, monkeypatch):
    """publish rewrites the results page, and write_gap_section the gap section, around a reading
    written by hand that cannot be regenerated: a write that fails half-way (full disk, interrupt)
    must leave the previous page whole (was: ``page.write_text``, which truncates first)."""
    import os

    from diffusionformer.experiments.gaps import write_gap_section
    from diffusionformer.experiments.publish import READING_MARKER, publish_experiment

    cfg, out, docs = _finished_comparison(tmp_path)
    page = publish_experiment(cfg, out, docs, config_path="mk.toml")
    page.write_text(page.read_text() + f"\n{READING_MARKER}\n\nOur reading, written by hand: é ü.\n", encoding="utf-8")
    before = page.read_bytes()

    real_fsync = os.fsync

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space left"):
        publish_experiment(cfg, out, docs, config_path="mk.toml")
    assert page.read_bytes() == before
    with pytest.raises(OSError, match="No space left"):
        write_gap_section(page, "| gap |\n")
    assert page.read_bytes() == before
    assert sorted(p.name for p in page.parent.iterdir() if p.name.startswith(".")) == []  # no temporary left
    monkeypatch.setattr(os, "fsync", real_fsync)
    write_gap_section(page, "| gap |\n")
    text = page.read_text(encoding="utf-8")
    assert "| gap |" in text and text.endswith("Our reading, written by hand: é ü.\n")


def test_a_config_that_is_not_utf8_is_a_named_error_and_exit_2(tmp_path, capsys):
    """TOML is UTF-8 whatever the locale: a Latin-1 config is a ValueError naming the file, and
    ``run`` exits 2 with it (was: a bare UnicodeDecodeError naming no file, or, under a
    non-UTF-8 locale, a silently misread name)."""
    good = tmp_path / "good.toml"
    good.write_text('name = "caf\u00e9"\n', encoding="utf-8")
    with pytest.raises(ValueError, match="missing required key 'tasks'") as info:  # decoded, then checked
        load_experiment_config(good)
    assert "missing required key 'operators'" in str(info.value) and "UTF-8" not in str(info.value)
    bad = tmp_path / "latin1.toml"
    bad.write_bytes('name = "caf\u00e9"\n'.encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1\.toml: not UTF-8 text"):
        load_experiment_config(bad)
    assert cli_main(["run", str(bad), "--out", str(tmp_path / "r"), "--no-progress"]) == 2
    assert "latin1.toml: not UTF-8 text" in capsys.readouterr().err


def test_missing_required_keys_are_named_and_gathered_with_the_other_problems():
    """A config without a required key names it, beside its other problems (was: the dataclass's
    ``TypeError: __init__() missing 2 required positional arguments``, raised only after every
    other problem was fixed)."""
    from diffusionformer.config import ConfigErrors

    with pytest.raises(ConfigErrors) as info:
        load_experiment_config({"name": "x", "seeds": [0], "taks": []})
    text = str(info.value)
    assert "unknown key 'taks'" in text and "did you mean 'tasks'" in text
    assert "missing required key 'tasks'" in text and "missing required key 'operators'" in text
    assert "missing required key 'seeds'" not in text and "missing required key 'name'" not in text
