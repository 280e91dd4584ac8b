"""Mutation audit (task 51p) of the run locks' machine id and foreign-lock notes (``experiments.store``), the skip
message (``runner``), ``status`` (``results``, ``tables``, ``cli``), analyze's and run's closing lines, publish's
"run ... first" hint, and the max_steps / laplacian_heads messages: pins that kill the mutants the earlier tests let
live, and one bug (the skip message spelt the other host's name with a capital)."""
from __future__ import annotations

import json
import os
import platform
import shlex
import time
from pathlib import Path

import pytest

from diffusionformer.experiments import load_experiment_config, store
from diffusionformer.experiments.results import run_dir, run_status
from diffusionformer.experiments.runner import run_experiment
from diffusionformer.experiments.tables import format_status

DEFAULT_TOML = Path(__file__).resolve().parents[2] / "experiments" / "configs" / "default.toml"
_OTHER = "0123456789abcdef0123456789abcdef"


def _cfg(name="m51", max_steps=2):
    return load_experiment_config({
        "name": name, "seeds": [0],
        "tasks": [{"name": "digits", "dataset": "digits", "model": "vit-digits",
                   "model_overrides": {"dim": 8, "depth": 1, "num_heads": 2},
                   "train": {"max_steps": max_steps, "batch_size": 8, "warmup_steps": 0, "eval_interval": max_steps}}],
        "operators": [{"name": "attention"}]})


def _machine_id_from(monkeypatch, files):
    """``store._machine_id`` uncached, reading ``files`` (``{path: bytes or None}``, None: no such file)."""
    real_open = open

    def fake_open(path, *args, **kwargs):
        if files.get(path) is None:
            raise FileNotFoundError(path)
        return real_open(files[path], *args, **kwargs)

    monkeypatch.setattr(store, "open", fake_open, raising=False)
    return store._machine_id.__wrapped__()


def test_machine_id_reads_etc_then_dbus_stripped(tmp_path, monkeypatch):
    """Pin: ``_machine_id`` is ``/etc/machine-id`` stripped of its newline, else (missing, empty, not ASCII)
    ``/var/lib/dbus/machine-id``, else None; and it is cached (``status`` asks for every run)."""
    def f(name, data):
        p = tmp_path / name
        p.write_bytes(data)
        return str(p)

    etc, dbus = "/etc/machine-id", "/var/lib/dbus/machine-id"
    a, b = f("a", b"aaaa\n"), f("b", b"bbbb\n")
    assert _machine_id_from(monkeypatch, {etc: a, dbus: b}) == "aaaa"
    assert _machine_id_from(monkeypatch, {etc: None, dbus: b}) == "bbbb"
    assert _machine_id_from(monkeypatch, {etc: f("e", b"\n"), dbus: b}) == "bbbb"
    assert _machine_id_from(monkeypatch, {etc: f("u", b"\xff\xfe"), dbus: b}) == "bbbb"
    assert _machine_id_from(monkeypatch, {etc: None, dbus: None}) is None
    assert hasattr(store._machine_id, "cache_info")


def test_a_non_string_machine_field_is_no_machine_id():
    """Pin: ``_parse`` keeps a string ``machine`` and reads any other (a number, null) as none, so such a lock is
    judged by its host name and pid, not as another machine's."""
    base = {"pid": 7, "host": "h"}
    assert store._parse(json.dumps({**base, "machine": "abc"}).encode())[3] == "abc"
    assert store._parse(json.dumps({**base, "machine": 123}).encode())[3] is None
    assert store._parse(json.dumps({**base, "machine": None}).encode())[3] is None


def test_a_lock_written_without_a_machine_id_has_no_machine_key(tmp_path, monkeypatch):
    """Pin: where this machine has no id the lock leaves ``machine`` out (not ``null``), as the module says."""
    monkeypatch.setattr(store, "_machine_id", lambda: None)
    assert store.acquire_lock(tmp_path) is None
    assert "machine" not in json.loads((tmp_path / ".lock").read_text())
    store.release_lock(tmp_path)


def test_release_leaves_a_lock_of_another_machine_with_our_pid_and_start(tmp_path, monkeypatch):
    """Pin: ``release_lock`` leaves a lock of another machine of this host's name even when its pid and start time
    are this process's (that machine's process had the same ones)."""
    monkeypatch.setattr(store, "_machine_id", lambda: "f" * 32)
    record = {"pid": os.getpid(), "host": platform.node(), "machine": _OTHER}
    start = store._start_time(os.getpid())
    if start is not None:
        record["start"] = start
    (tmp_path / ".lock").write_text(json.dumps(record))
    store.release_lock(tmp_path)
    assert json.loads((tmp_path / ".lock").read_text()) == record


def test_a_claim_left_by_another_machine_of_this_hosts_name_is_swept_as_another_hosts(tmp_path, monkeypatch):
    """Pin: a claim temporary of another machine of this host's name is another host's: kept while younger than
    ``_CLAIM_LEFTOVER_S`` (its pid is not ours to check), removed once older."""
    monkeypatch.setattr(store, "_machine_id", lambda: "f" * 32)
    old = tmp_path / ".lock.4194311.0123456789ab.tmp"
    young = tmp_path / ".lock.4194312.0123456789ab.tmp"
    for p, age in ((old, store._CLAIM_LEFTOVER_S + 60), (young, store.UNREADABLE_GRACE_S + 60)):
        p.write_text(json.dumps({"pid": int(p.name.split(".")[2]), "host": platform.node(), "machine": _OTHER}))
        os.utime(p, (time.time() - age, time.time() - age))
    assert store.acquire_lock(tmp_path) is None
    store.release_lock(tmp_path)
    assert not old.exists() and young.exists()


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0 s"), (42, "42 s"), (59.9, "59 s"), (60, "1 min"), (61, "1 min 1 s"), (3600, "1 h"), (3660, "1 h 1 min"),
    (3 * 3600 + 300, "3 h 5 min"), (86400, "1 d"), (2 * 86400 + 3 * 3600 + 59, "2 d 3 h")])
def test_ago(seconds, text):
    """Pin: ``_ago``'s units, its floor of a fraction, its zero remainders left out."""
    assert store._ago(seconds) == text


def _foreign(rdir, age, host="nodeA"):
    rdir.mkdir(parents=True, exist_ok=True)
    (rdir / ".lock").write_text(json.dumps({"pid": 4242, "host": host}))
    os.utime(rdir / ".lock", (time.time() - age, time.time() - age))


@pytest.mark.parametrize("name", ["metrics.jsonl", "metrics.csv", "checkpoint.pt", "summary.json"])
def test_each_sign_of_life_counts_and_the_newest_wins(tmp_path, name):
    """Pin: the log (either format), the checkpoint and the summary are signs of life besides the lock: the newest
    change of any of them is the run's last; an older one does not hide it."""
    _foreign(tmp_path, 5 * 3600)
    for other in ("metrics.jsonl", "checkpoint.pt"):
        if other != name:
            (tmp_path / other).write_text("x")
            os.utime(tmp_path / other, (time.time() - 7 * 3600, time.time() - 7 * 3600))
    (tmp_path / name).write_text("x")
    os.utime(tmp_path / name, (time.time() - 3600 - 30, time.time() - 3600 - 30))
    assert store._foreign_lock_note(tmp_path) == "nodeA is another host; the run last showed a sign of life 1 h ago"


def test_the_lock_is_a_sign_of_life_and_a_note_needs_none(tmp_path, monkeypatch):
    """Pin: the lock's own change counts (a claim just made); with no sign of life at all the note still says the
    holder is another host; an age of exactly 0 s is "0 s ago", not ahead of the clock."""
    _foreign(tmp_path, 120)
    (tmp_path / "metrics.jsonl").write_text("x")
    os.utime(tmp_path / "metrics.jsonl", (time.time() - 7200, time.time() - 7200))
    assert store._foreign_lock_note(tmp_path).endswith("sign of life 2 min ago")
    monkeypatch.setattr(store, "_SIGNS_OF_LIFE", ("nothing-here",))
    assert store._foreign_lock_note(tmp_path) == "nodeA is another host"
    monkeypatch.setattr(store, "_SIGNS_OF_LIFE", (".lock",))
    os.utime(tmp_path / ".lock", (1_700_000_000, 1_700_000_000))
    monkeypatch.setattr(store.time, "time", lambda: 1_700_000_000.0)
    assert store._foreign_lock_note(tmp_path).endswith("sign of life 0 s ago")


def test_no_note_for_an_unreadable_lock_and_advice_without_a_holder(tmp_path):
    """Pin: an unreadable lock (a writer still writing it) gets no foreign-lock note; the advice for a lock that is
    gone (or unreadable) says "that host"."""
    (tmp_path / ".lock").write_text("{not json")
    assert store._foreign_lock_note(tmp_path) is None
    assert store._foreign_lock_advice(tmp_path).startswith("if that host no longer trains it")
    (tmp_path / ".lock").unlink()
    assert store._foreign_lock_note(tmp_path) is None
    assert store._foreign_lock_advice(tmp_path).startswith("if that host no longer trains it")


def test_bug_the_skip_message_keeps_the_other_hosts_name_as_it_is(tmp_path):
    """Bug: the skip message of a run held by another host capitalised the note it appends, and with it the host
    name it starts with: a lock of ``cn001`` was said to be "Cn001 is another host", a host name the cluster does not
    have (next to "process 4242 on cn001" in the same line). The name is now given as the lock records it."""
    cfg = _cfg()
    rdir = run_dir(tmp_path / cfg.name, "digits", "attention", 0)
    _foreign(rdir, 600, host="cn001")
    logs = []
    assert run_experiment(cfg, tmp_path, progress=False, log=logs.append) == []
    skip = next(m for m in logs if "skipped" in m)
    assert "process 4242 on cn001 is training it" in skip and "cn001 is another host; the run last showed" in skip
    assert "Cn001" not in skip, skip
    assert skip.endswith("never while cn001 may still train it (the run would be "
                         "trained twice)."), skip
    assert "; if cn001 no longer trains it (a failed node" in skip, skip


def _row(i, holder="pid 4242 on nodeA; nodeA is another host; the run last showed a sign of life 1 h ago"):
    return {"task": "digits", "operator": "attention", "seed": i, "state": "running", "step": 1, "max_steps": 4,
            "holder": holder, "other_host": "another host" in holder, "elapsed": None, "changed": None,
            "resumes_from": None}


def test_the_foreign_lock_line_counts_names_five_locks_and_stands_apart():
    """Pin: the foreign-lock line counts the runs held by other hosts (not every run), names the first five locks
    and "..." past five, after a blank line."""
    rows = [_row(i) for i in range(5)] + [_row(9, holder="pid 1 on here")]
    lines = format_status(rows).splitlines()
    i = next(k for k, line in enumerate(lines) if "held by locks of other hosts" in line)
    assert lines[i - 1] == "" and lines[i].startswith("5 run(s) are held by locks of other hosts")
    assert "seed4/.lock)" in lines[i] and "seed9" not in lines[i] and " ..." not in lines[i]
    text = format_status([_row(i) for i in range(6)])
    assert "runs/digits/attention/seed4/.lock ...)" in text and "seed5/.lock" not in text


def test_status_notes_a_missing_comparison_folder_under_an_existing_out(tmp_path, capsys):
    """Pin: the note is about ``<out>/<name>``: an --out folder holding other comparisons but not this one gets it."""
    from diffusionformer.experiments.cli import main

    (tmp_path / "other").mkdir()
    assert main(["status", str(DEFAULT_TOML), "--out", str(tmp_path)]) == 0
    assert f"note: {tmp_path / 'default'} does not exist" in capsys.readouterr().err


def test_analyze_with_no_plot_drawn_says_so(tmp_path, monkeypatch, capsys):
    """Pin: analyze's closing line names the plots only when some were drawn: an empty plots folder (matplotlib
    missing) gives "no plots (see above)"."""
    import diffusionformer.experiments.analyze as analyze
    from diffusionformer.experiments.cli import main

    def fake(config, out_root, **kwargs):
        adir = Path(out_root) / config.name / "analysis"
        (adir / "plots").mkdir(parents=True)
        return {}

    monkeypatch.setattr(analyze, "analyze_experiment", fake)
    assert main(["analyze", str(DEFAULT_TOML), "--out", str(tmp_path), "--no-progress", "--threads", "1"]) == 0
    adir = tmp_path / "default" / "analysis"
    assert f"analysis: {adir}/README.md, {adir}/metrics.json, no plots (see above)" in capsys.readouterr().out


def test_run_with_matplotlib_points_at_its_plots(tmp_path, capsys):
    """Pin: with the plots drawn, run's closing line says where they are."""
    pytest.importorskip("matplotlib")
    from diffusionformer.experiments.cli import main

    from experiments_tiny_configs import TINY_DIGITS_TOML

    toml = tmp_path / "tiny.toml"
    toml.write_text(TINY_DIGITS_TOML)
    out = tmp_path / "res"
    assert main(["run", str(toml), "--out", str(out), "--no-progress", "--threads", "1"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    folder = out / "tiny"
    assert last.startswith(f"results: {folder}/results.md, {folder}/results.json, plots in {folder}/plots/ "), last


@pytest.mark.parametrize("command", ["status", "publish", "analyze"])
def test_every_option_with_a_default_names_it(command):
    """Pin: every option of status, publish and analyze has a help text, and each one with a default value (a
    folder, a count) names it."""
    from diffusionformer.experiments.cli import _parser

    sub = _parser()._subparsers._group_actions[0].choices[command]
    for a in sub._actions:
        if not a.option_strings or a.option_strings[0] == "-h":
            continue
        assert a.help, f"{command} {a.option_strings[0]}"
        if isinstance(a.default, (str, int)) and not isinstance(a.default, bool):
            assert f"(default: {a.default})" in a.help, f"{command} {a.option_strings[0]}: {a.help}"


def test_publish_hint_quotes_the_config_path_and_says_config_without_one(tmp_path):
    """Pin: the "run ... first" hint quotes a config path with a space, and says CONFIG when none was given."""
    from diffusionformer.experiments.publish import publish_experiment

    cfg = _cfg()
    with pytest.raises(FileNotFoundError) as info:
        publish_experiment(cfg, "results", tmp_path / "docs", config_path="my config.toml")
    assert f"run {shlex.quote('my config.toml')}` first" in str(info.value), str(info.value)
    with pytest.raises(FileNotFoundError) as info:
        publish_experiment(cfg, "results", tmp_path / "docs")
    assert "experiments run CONFIG` first" in str(info.value), str(info.value)


def test_a_laplacian_heads_half_with_spaces_gets_the_hint():
    """Pin: the "did you mean 'half'?" hint also covers stray spaces around it."""
    raw = {"name": "lh", "seeds": [0], "tasks": [{"name": "digits", "dataset": "digits", "model": "vit-digits"}],
           "operators": [{"name": "lap", "laplacian_heads": " half "}]}
    with pytest.raises(ValueError, match=r"got ' half ' \(did you mean 'half'\?\)"):
        load_experiment_config(raw)


def test_status_holder_of_another_host_and_the_skip_advice(tmp_path):
    """Pin: status's holder cell of another host's lock is the pid and host, then "; " and the note."""
    cfg = _cfg()
    rdir = run_dir(tmp_path / cfg.name, "digits", "attention", 0)
    _foreign(rdir, 600)
    row, = run_status(cfg, tmp_path)
    assert row["holder"] == "pid 4242 on nodeA; nodeA is another host; the run last showed a sign of life 10 min ago"


def test_max_steps_below_the_warmup_gives_the_count_as_read():
    """Pin: the max_steps message gives the count as read (a numpy int from a sweep grid is "20", not its repr)."""
    import numpy as np

    from diffusionformer.train import TrainConfig

    with pytest.raises(ValueError, match=r"TrainConfig\.max_steps: .*, got 20; lower warmup_steps"):
        TrainConfig.from_dict({"max_steps": np.int64(20), "warmup_steps": 40})


def test_the_skip_message_of_a_lock_of_this_host_has_no_note(tmp_path):
    """Pin: a run held by a live process of this host is skipped with the plain message: no note, no advice."""
    cfg = _cfg()
    rdir = run_dir(tmp_path / cfg.name, "digits", "attention", 0)
    rdir.mkdir(parents=True)
    (rdir / ".lock").write_text(json.dumps({"pid": 1, "host": platform.node()}))  # init: alive, and not us
    logs = []
    assert run_experiment(cfg, tmp_path, progress=False, log=logs.append) == []
    skip = next(m for m in logs if "skipped" in m)
    assert skip.endswith(f"skipped: process 1 on {platform.node()} is training it ({rdir / '.lock'})."), skip
