"""Names that become file names, portability part 2 (edge probes, 44).

A comparison's, task's and setting's names name folders and files (``<out>/<name>/runs/<task>/<setting>/``,
``plots/<task>_curves.png``, ``docs/results/<name>.md`` and ``<name>/``), which must be the same files, and files at
all, on the file systems of macOS and Windows (case-insensitive, normalization-insensitive on macOS). Part 1
(``test_edge_probes_portability_43.py``) covered Windows pids, hard links, a C-locale stdout and spawn workers; the
case and Unicode-normalization collisions of two tasks or two settings of one config were refused already
(``test_edge_probes_config_third.py``).

Bugs found and fixed:

* A Windows device name (``CON``, ``nul.txt``, ``Aux``, ``COM1``, ``LPT¹``) was accepted as a task, setting or
  comparison name: on Windows its folder is the device (a run folder ``runs/con/`` cannot be made; ``docs/nul.md``
  is the null device), and a published ``docs/results/<x>/logs/aux/`` cannot be checked out there.
* A name ending in ``.`` was accepted: Windows drops the dot, so the settings ``heat`` and ``heat.`` were one run
  folder (resuming or overwriting each other), a collision the case check did not see.
* A control character (``\\x01``, ``\\x7f``) other than whitespace passed, which no Windows file name holds.
* A lone surrogate (how Python decodes a command-line byte that is not UTF-8: ``--set name=$'\\xff'``) named a
  folder on Linux, and every run trained before ``results.md``, written as UTF-8, failed.
* On Windows, ``< > " | ? *`` passed the config and failed at the first run's folder, after earlier tasks trained.
* ``publish`` refused a comparison named ``index`` (its page would replace the results index) but took ``Index``:
  on macOS and Windows ``Index.md`` is ``index.md``. A comparison ``Default`` published beside the published
  ``default`` likewise replaced its page and folder there (and the two cannot share a clone of the docs).
* ``run`` (and ``status``, ``summary``, ``publish``, ``gaps``) of a comparison ``Study`` in an ``--out`` holding ``study/``
  went ahead: on macOS and Windows one folder, so each comparison took the other's runs as its own.
* A ``primary`` contrast (or ``--set operators=...``) naming a setting in another Unicode normalization than the
  config (typed on another system) was refused as "unknown operator setting 'café' (did you mean 'café'?)".

Pins: names valid today stay valid (dots inside, ``console.v2``, ``nullspace``, ``com10``, ``a|b`` off Windows); a
comparison's own folder and page are no twins of it (resume and publish again as before).
"""

from __future__ import annotations

import json

import pytest

from diffusionformer.experiments import config as config_module
from diffusionformer.experiments.config import load_experiment_config
from diffusionformer.experiments.results import RunResult, run_dir

INDEX = "# Results\n\n```{toctree}\n:maxdepth: 1\n```\n"


def _config(name="probe", tasks=("a",), operators=("attention", "lap"), primary=()):
    return {"name": name, "seeds": [0],
            "tasks": [{"name": n, "dataset": "digits", "model": "vit-digits", "train": {"max_steps": 4}} for n in tasks],
            "operators": [{"name": o} if i == 0 else {"name": o, "laplacian_heads": 1} for i, o in enumerate(operators)],
            "primary": list(primary)}


def _named(which, name):
    """A config whose ``which`` (experiment, task or setting) is ``name``."""
    if which == "experiment":
        return _config(name=name)
    return _config(tasks=(name,)) if which == "task" else _config(operators=("attention", name))


# ----------------------------------------------------------------------------- names refused by the config
@pytest.mark.parametrize("which", ["experiment", "task", "setting"])
@pytest.mark.parametrize("name", ["CON", "nul", "nul.txt", "Aux", "prn.v2", "COM1", "lpt9", "COM\u00b9", "LPT\u00b3.x"])
def test_bug_windows_device_names_are_refused(which, name):
    """Bug: a Windows device name was accepted as a name: on Windows its folder (or ``docs/<name>.md``) is the
    device, with or without an extension and in any case."""
    with pytest.raises(ValueError, match="Windows device name") as err:
        load_experiment_config(_named(which, name))
    assert repr(name) in str(err.value) and "CON, PRN, AUX, NUL, COM0-COM9, LPT0-LPT9" in str(err.value)


@pytest.mark.parametrize("which", ["experiment", "task", "setting"])
@pytest.mark.parametrize("name", ["console.v2", "nullspace", "com10", "lpt", "aux-loss", "csbm-h0.1", "a.b.c", "CONx"])
def test_pins_names_that_only_look_like_devices_stay_valid(which, name):
    """Pin: only the device name itself (before any ``.``) is reserved; names valid today keep working."""
    cfg = load_experiment_config(_named(which, name))
    assert name in (cfg.name, cfg.tasks[0].name, cfg.operators[1].name)


def test_bug_a_trailing_dot_is_refused_as_windows_drops_it():
    """Bug: the settings ``heat`` and ``heat.`` passed as two (the case check compares them as different), yet
    Windows drops a trailing dot: one run folder, each setting's runs resuming or overwriting the other's."""
    with pytest.raises(ValueError, match=r"must not end in '\.'") as err:
        load_experiment_config(_config(operators=("attention", "heat", "heat.")))
    assert "'heat.'" in str(err.value) and "the folder of 'heat'" in str(err.value)
    for which in ("experiment", "task", "setting"):
        for name in ("x...", "..."):  # "..." is "." (the folder above's own) on Windows
            with pytest.raises(ValueError, match=r"must not end in '\.'"):
                load_experiment_config(_named(which, name))


@pytest.mark.parametrize("char", ["\x01", "\x1b", "\x7f", "\x9b"])
def test_bug_control_characters_are_refused(char):
    """Bug: a control character other than whitespace (already refused) passed as part of a name; no Windows file
    name holds one, and in a table or a terminal it is invisible or an escape sequence."""
    with pytest.raises(ValueError, match="control characters") as err:
        load_experiment_config(_config(tasks=(f"a{char}b",)))
    assert repr(char) in str(err.value)


def test_bug_a_lone_surrogate_is_refused_before_anything_runs(tmp_path):
    """Bug: ``--set name=$'\\xff'`` (Python decodes the byte as the lone surrogate ``'\\udcff'``) was accepted: the
    folder is made on Linux, every run trains, then writing ``results.md`` as UTF-8 fails."""
    from diffusionformer.train.metrics import write_text_atomic

    with pytest.raises(UnicodeEncodeError):  # what happened after the runs: results.md holds the name
        write_text_atomic(tmp_path / "results.md", "# a\udcffb\n")
    for overrides in (["name=a\udcffb"], ["tasks.a.name=a\udcffb"]):
        with pytest.raises(ValueError, match="UTF-8 text") as err:
            load_experiment_config(_config(), overrides)
        assert "lone surrogate" in str(err.value)


def test_bug_windows_only_characters_are_refused_on_windows(monkeypatch):
    """Bug: on Windows a name holding ``< > " | ? *`` passed and failed at its first run folder, after the earlier
    tasks trained. Elsewhere they are kept (results of such names exist; the page escapes them)."""
    for name in ('a<b', 'a>b', 'a"b', 'a|b', 'a?b', 'a*b'):
        load_experiment_config(_config(tasks=(name,)))  # Linux, macOS: as before
    monkeypatch.setattr(config_module, "_on_windows", lambda: True)
    for name in ('a<b', 'a>b', 'a"b', 'a|b', 'a?b', 'a*b'):
        with pytest.raises(ValueError, match="on Windows") as err:
            load_experiment_config(_config(operators=("attention", name)))
        assert repr(name) in str(err.value)
    load_experiment_config(_config(tasks=("a-b.c_d[e](f)",)))


def test_bug_a_bad_name_stops_run_before_anything_is_written(tmp_path, capsys):
    """Bug: ``run`` with a task named ``con`` started (on Windows: failed at its folder); now the config is refused,
    naming the task, and nothing is written under ``--out``."""
    from diffusionformer.experiments.cli import main

    path = tmp_path / "c.toml"
    path.write_text('name = "probe"\nseeds = [0]\n[[tasks]]\nname = "con"\ndataset = "digits"\nmodel = "vit-digits"\n'
                    '[tasks.train]\nmax_steps = 4\n[[operators]]\nname = "attention"\n', encoding="utf-8")
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out), "--no-progress"]) != 0
    assert "task name must not be a Windows device name" in capsys.readouterr().err and not out.exists()


# ----------------------------------------------------------------------------- names in another normalization
def test_bug_a_primary_contrast_in_another_normalization_names_the_difference():
    """Bug: ``primary = ["cafe\\u0301"]`` against the setting ``"caf\\u00e9"`` (the same text, typed on another
    system) was "unknown operator setting 'café' (did you mean 'café'?)": two names that print alike."""
    with pytest.raises(ValueError, match="another Unicode normalization") as err:
        load_experiment_config(_config(operators=("attention", "caf\u00e9"), primary=["cafe\u0301"]))
    assert "'caf\\xe9' against 'cafe\\u0301'" in str(err.value)
    with pytest.raises(ValueError, match="another Unicode normalization"):
        load_experiment_config(_config(operators=("attention", "caf\u00e9")), ["operators=attention,cafe\u0301"])
    with pytest.raises(ValueError, match=r"unknown operator setting 'lapp' \(did you mean 'lap'\?\)"):
        load_experiment_config(_config(primary=["lapp"]))  # the plain hint as before


# ----------------------------------------------------------------------------- publish
def _published(tmp_path, name, docs=None):
    """Publish a one-run comparison ``name`` into ``docs`` (made with the results index when not given)."""
    from diffusionformer.experiments.publish import publish_experiment

    out = tmp_path / "results"
    src = out / name
    rdir = run_dir(src, "a", "attention", 0)
    rdir.mkdir(parents=True, exist_ok=True)
    record = {"step": 4, "split": "eval", "metrics": {"test_acc": 0.5}}
    (rdir / "metrics.jsonl").write_text(json.dumps(record) + "\n")
    (rdir / "summary.json").write_text(json.dumps({"status": "completed", "eval": record}))
    row = RunResult("a", "attention", 0, "completed", "test_acc", 0.5, {"test_acc": 0.5}, 4, 1.0)
    (src / "results.json").write_text(json.dumps({"runs": [row.__dict__], "summary": []}))
    if docs is None:
        docs = tmp_path / "docs"
        docs.mkdir()
        (docs / "index.md").write_text(INDEX)
    cfg = load_experiment_config(_config(name=name, operators=("attention",)))
    return publish_experiment(cfg, out, docs), docs


@pytest.mark.parametrize("name", ["Index", "INDEX", "iNdEx"])
def test_bug_publish_refuses_index_in_any_case(tmp_path, name):
    """Bug: ``publish`` refused only the exact name ``index``; ``Index`` wrote ``docs/Index.md``, which on macOS and
    Windows is ``docs/index.md``, the hand-written toctree of every results page."""
    with pytest.raises(ValueError, match="would overwrite .*index.md") as err:
        _published(tmp_path, name)
    assert repr(name) in str(err.value)
    docs = tmp_path / "docs"
    assert sorted(p.name for p in docs.iterdir()) == ["index.md"] and (docs / "index.md").read_text() == INDEX


@pytest.mark.parametrize("first, second", [("default", "Default"), ("caf\u00e9", "cafe\u0301"), ("Study", "STUDY")])
def test_bug_publish_refuses_a_name_that_is_a_published_one_on_macos_and_windows(tmp_path, first, second):
    """Bug: publishing ``Default`` beside the published ``default`` (or an NFD name beside its NFC twin) wrote a
    second page and folder, which on macOS and Windows are the first comparison's, replaced without a word."""
    page, docs = _published(tmp_path / "one", first)
    before = page.read_text()
    with pytest.raises(ValueError, match="only in case or in Unicode normalization") as err:
        _published(tmp_path / "two", second, docs)
    assert repr(second) in str(err.value) and f"{str(docs / first)!r}"[:-1] in str(err.value)
    assert page.read_text() == before
    assert sorted(p.name for p in docs.iterdir()) == sorted(["index.md", f"{first}.md", first])
    again, _ = _published(tmp_path / "three", first, docs)  # the same name again: published over itself as before
    assert again == page


# ----------------------------------------------------------------------------- results folders of the --out root
@pytest.mark.parametrize("command", ["run", "status"])
def test_bug_run_refuses_a_comparison_whose_folder_is_another_comparisons_on_macos(tmp_path, capsys, command):
    """Bug: ``run`` of a comparison ``Study`` in an ``--out`` holding ``study/`` (or an NFD twin of an NFC name) went
    ahead: on macOS and Windows the two are one folder, so ``Study`` resumed, rewrote and reported ``study``'s runs
    as its own (``status``, ``summary`` and ``publish`` read them too). Now refused, naming both, before writing."""
    from diffusionformer.experiments.cli import main

    out = tmp_path / "out"
    for existing, name in (("study", "Study"), ("caf\u00e9", "cafe\u0301")):
        (out / existing / "runs").mkdir(parents=True)
        path = tmp_path / "c.toml"
        path.write_text(f'name = "{name}"\nseeds = [0]\n[[tasks]]\nname = "a"\ndataset = "digits"\n'
                        'model = "vit-digits"\n[tasks.train]\nmax_steps = 4\n[[operators]]\nname = "attention"\n',
                        encoding="utf-8")
        argv = [command, str(path), "--out", str(out)] + (["--no-progress"] if command == "run" else [])
        assert main(argv) != 0
        err = capsys.readouterr().err
        assert "differs from" in err and repr(existing) in err and repr(name) in err
        assert sorted(p.name for p in out.iterdir()) == sorted({"study", existing})  # nothing written
        assert [p.name for p in (out / existing).iterdir()] == ["runs"]
    assert main(["status", str(path), "--out", str(tmp_path / "other")]) == 0  # no twin: as before


def test_pins_the_same_comparison_again_is_no_twin_of_itself(tmp_path):
    """Pin: a comparison's own folder (and page) is not a twin: resuming and publishing again work as before; a
    hidden folder (``.study.publishing``) and an absent folder are no twins either."""
    from diffusionformer.experiments.config import _folder_twin

    (tmp_path / "study").mkdir()
    (tmp_path / ".Study.publishing").mkdir()
    (tmp_path / "study.md").write_text("")
    assert _folder_twin(tmp_path, "study") is None and _folder_twin(tmp_path, "study", ".md") is None
    assert _folder_twin(tmp_path, "Study") == "study" and _folder_twin(tmp_path, "STUDY", ".md") == "study"
    assert _folder_twin(tmp_path / "absent", "x") is None and _folder_twin(tmp_path, "studies") is None


def test_bug_gaps_refuses_a_comparison_whose_folder_is_another_comparisons_on_macos(tmp_path, capsys):
    """Bug: ``gaps`` of ``Study`` with ``--out`` holding ``study/`` printed (or wrote into the page) the tables of
    ``study``'s runs on macOS and Windows, where the two are one folder; now refused like ``run``."""
    from diffusionformer.experiments.gaps import main as gaps_main

    out = tmp_path / "out"
    (out / "study" / "runs").mkdir(parents=True)
    path = tmp_path / "c.toml"
    path.write_text('name = "Study"\nseeds = [0]\n[[tasks]]\nname = "a"\ndataset = "digits"\nmodel = "vit-digits"\n'
                    '[[operators]]\nname = "attention"\n', encoding="utf-8")
    assert gaps_main([str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "'study'" in err and "'Study'" in err and "differs from" in err
    assert gaps_main([str(path), "--out", str(tmp_path / "other")]) == 1  # no twin: "no finished runs" as before
