"""Tests that kill mutants which survived a manual mutation audit of the results layer: the
over-fitting tables (``experiments/gaps.py``), the run files read back (``experiments/results.py``)
and the run store's locks (``experiments/store.py``).

Each test's docstring names the mutant it kills (file and the mutation), or starts with "Bug:"
for a defect fixed with it. References are hand-computed values or numpy; run folders, logs and
locks are written by hand, so everything is deterministic, CPU-only and fast (nothing trains).
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
import warnings

import numpy as np
import pytest

from diffusionformer.experiments import gaps
from diffusionformer.experiments import store
from diffusionformer.experiments.config import ExperimentConfig, OperatorSetting, TaskConfig
from diffusionformer.experiments.publish import write_run_log
from diffusionformer.experiments.results import (RunResult, finished_runs, first_reach, read_json_dict, run_dir,
                                                 run_status, select_evaluation)
from diffusionformer.experiments.store import LOCK_NAME, UNREADABLE_GRACE_S, acquire_lock, live_holder, read_lock, release_lock

ME = (os.getpid(), platform.node())


def _eval(step, **metrics):
    return {"split": "eval", "step": step, "metrics": metrics}


def _text_config(seeds, operators=("attention",), tasks=("t",), primary=()):
    return ExperimentConfig("g", [TaskConfig(t, "pydoc-chars", "gpt-char-tiny", metric="val_loss") for t in tasks],
                            [OperatorSetting(o) if i == 0 else OperatorSetting(o, laplacian_heads=1)
                             for i, o in enumerate(operators)], seeds=list(seeds), primary=list(primary))


def _q(fv, ft, bv, bs, bg):
    """One run's :func:`gaps.run_gaps` entry."""
    return {"final_val": fv, "final_train": ft, "final_gap": fv - ft, "best_val": bv, "best_step": float(bs), "best_gap": bg}


# ----------------------------------------------------------------------------- gaps.py: one run
def test_run_gaps_by_hand_from_an_unsorted_log_with_incomplete_and_non_finite_evaluations():
    """Kills gaps._eval_losses: the ``isfinite`` check of the train loss dropped, of the validation loss dropped,
    ``split == "eval"`` dropped (train records counted), ``rows.sort()`` dropped (log order, not step order),
    ``train_loss and val_loss`` -> ``or``; and gaps.run_gaps without its ``None`` for a log with no evaluation."""
    records = [
        _eval(300, train_loss=1.0, val_loss=2.75),
        _eval(100, train_loss=2.0, val_loss=2.5),
        _eval(400, train_loss=math.nan, val_loss=1.0),  # not finite: left out
        _eval(500, train_loss=0.5, val_loss=math.inf),  # not finite: left out
        _eval(450, val_loss=0.1),  # no train loss: left out
        {"split": "train", "step": 600, "loss": 0.1, "metrics": {"train_loss": 0.1, "val_loss": 0.2}},  # not an evaluation
        _eval(200, train_loss=1.5, val_loss=2.25),
    ]
    # by step: (100, 2.0, 2.5), (200, 1.5, 2.25), (300, 1.0, 2.75): final at 300, best val at 200
    assert gaps.run_gaps(records) == {"final_val": 2.75, "final_train": 1.0, "final_gap": 1.75, "best_val": 2.25,
                                      "best_step": 200.0, "best_gap": 0.75}
    assert gaps.run_gaps([{"split": "train", "step": 1, "loss": 1.0}, _eval(2, val_loss=1.0)]) is None
    assert gaps.run_gaps([]) is None


def test_gap_rows_reads_finished_runs_only_and_prefers_the_run_folder_to_the_published_log(write_run, tmp_path):
    """Kills gaps._run_records reading an unfinished run (``'"completed"' in summary`` dropped) and preferring
    the published log to the run folder; and gaps.gap_rows keeping runs whose log has no train/val evaluation
    (``g is not None`` -> ``records is not None``: a ``None`` entry)."""
    config = _text_config(range(5))
    out = tmp_path / "g"
    write_run(out, "t", "attention", 0, [_eval(10, train_loss=1.0, val_loss=1.5)])
    trainer_failure = {"error": "non-finite loss", "bad_step": 10, "eval": {"val_loss": 1.2}}  # what Trainer writes
    write_run(out, "t", "attention", 1, [_eval(10, train_loss=1.0, val_loss=1.2)], status="non_finite", **trainer_failure)
    write_run(out, "t", "attention", 2, [{"split": "train", "step": 10, "loss": 1.0}, _eval(10, val_acc=0.5)])
    write_run(out, "t", "attention", 3, [_eval(10, train_loss=1.0, val_loss=1.25)])
    write_run_log([_eval(10, train_loss=9.0, val_loss=9.5)], out / "logs" / "t" / "attention" / "seed3.json")
    write_run_log([_eval(10, train_loss=0.5, val_loss=0.75)], out / "logs" / "t" / "attention" / "seed4.json")
    rows = gaps.gap_rows(config, tmp_path)["t"]["attention"]
    assert sorted(rows) == [0, 3, 4]
    assert (rows[0]["final_val"], rows[0]["final_gap"]) == (1.5, 0.5)
    assert (rows[3]["final_val"], rows[3]["final_gap"]) == (1.25, 0.25)  # the run folder, not the published copy
    assert (rows[4]["final_val"], rows[4]["final_gap"]) == (0.75, 0.25)  # no run folder: the published log


def test_bug_an_unreadable_summary_counts_as_an_unfinished_run_in_the_gap_tables(write_run, tmp_path, capsys):
    """Bug: gaps._run_records tested ``'"completed"' in summary.read_text()``: a ``summary.json`` that is not
    UTF-8 (junk left by a crash or another tool) raised a bare UnicodeDecodeError from gap_rows, and
    ``python -m diffusionformer.experiments.gaps`` failed with "error: 'utf-8' codec can't decode ..." naming
    no file. Now it is an unfinished run, as everywhere else in the results layer (results.read_json_dict)."""
    config = _text_config([0, 1])
    out = tmp_path / "g"
    write_run(out, "t", "attention", 0, [_eval(10, train_loss=1.0, val_loss=1.5)])
    rdir = write_run(out, "t", "attention", 1, [_eval(10, train_loss=1.0, val_loss=1.2)])
    (rdir / "summary.json").write_bytes(b'\xff\xfe{"status": "completed"')
    assert sorted(gaps.gap_rows(config, tmp_path)["t"]["attention"]) == [0]
    assert gaps.gap_curves(config, tmp_path)["t"]["attention"]["n"] == 1


def test_gap_curves_count_only_the_runs_with_train_and_val_evaluations(write_run, tmp_path):
    """Kills gaps.gap_curves keeping a finished run with no train/val evaluation (``losses[0]`` check dropped)."""
    config = _text_config([0, 1, 2])
    out = tmp_path / "g"
    write_run(out, "t", "attention", 0, [_eval(10, train_loss=1.0, val_loss=1.5), _eval(20, train_loss=0.5, val_loss=1.25)])
    write_run(out, "t", "attention", 1, [_eval(10, train_loss=2.0, val_loss=2.5), _eval(20, train_loss=1.5, val_loss=2.25)])
    write_run(out, "t", "attention", 2, [{"split": "train", "step": 10, "loss": 1.0}])
    entry = gaps.gap_curves(config, tmp_path)["t"]["attention"]
    assert entry["n"] == 2
    x, m, sd = entry["gap"]
    assert list(x) == [10, 20]
    np.testing.assert_allclose(m, [0.5, 0.75], rtol=1e-12)  # gaps (0.5, 0.5) at 10 and (0.75, 0.75) at 20
    np.testing.assert_allclose(sd, [0.0, 0.0], atol=1e-12)


# ----------------------------------------------------------------------------- gaps.py: tables
def _ref_ms(values, digits=4):
    """mean ± sample std, by numpy (``n/a`` std for one value)."""
    sd = f"{np.std(values, ddof=1):.{digits}f}" if len(values) > 1 else "n/a"
    return f"{np.mean(values):.{digits}f} ± {sd}"


def _ref_delta(row, base, key):
    """Mean paired difference and paired t over the shared seeds, by hand ("" without a shared seed)."""
    seeds = sorted(set(row) & set(base))
    if not seeds:
        return ""
    d = np.array([row[s][key] - base[s][key] for s in seeds])
    text = f"{d.mean():+.4f}"
    if len(d) > 1 and np.std(d, ddof=1) > 1e-12:
        text += f" (t {d.mean() / (np.std(d, ddof=1) / math.sqrt(len(d))):+.1f}, {len(d) - 1} df)"
    return text


def _ref_line(label, row, base):
    cells = [label, str(len(row))]
    vals = lambda k: [row[s][k] for s in sorted(row)]  # noqa: E731
    cells += [_ref_ms(vals("final_val")), _ref_ms(vals("final_train")), _ref_ms(vals("final_gap"))]
    cells += ["", ""] if base is None else [_ref_delta(row, base, "final_val"), _ref_delta(row, base, "final_gap")]
    cells += [_ref_ms(vals("best_val")), _ref_ms(vals("best_step"), 0), _ref_ms(vals("best_gap"))]
    cells += [""] if base is None else [_ref_delta(row, base, "best_val")]
    return "| " + " | ".join(cells) + " |"


def test_gap_table_rows_equal_a_hand_computed_table():
    """Kills gaps._ms ``len(values) > 1`` -> ``>= 1`` (one seed), the ``n/a`` of no value dropped, the best step
    printed with 4 decimals; gaps._diff pairing over the union of seeds, its ``""`` without a shared seed dropped,
    a ``t`` printed when it is None, the median instead of the mean; gaps.gap_table with a header for a task
    without runs, a row for a setting with none (``if not row`` -> ``if row is None``), the baseline's Δ best val
    filled in, the Δ final val and Δ final gap columns swapped, final val and final train swapped, the seed count
    of the config instead of the finished seeds, "(primary)" given by setting name over every task, and a
    separator row one column short."""
    config = _text_config([0, 1, 2, 3], operators=("attention", "lap", "one", "late", "mid"), tasks=("t1", "t2", "t3"),
                          primary=["t1:lap"])
    att = {0: _q(3.0, 1.0, 2.5, 200, 0.5), 1: _q(3.2, 1.1, 2.4, 300, 0.6), 2: _q(2.9, 1.3, 2.6, 200, 0.4)}
    lap = {1: _q(2.9, 1.2, 2.3, 300, 0.3), 2: _q(2.5, 1.4, 2.2, 100, 0.2)}  # seeds 0 and 3 did not finish
    one = {0: _q(3.1, 1.0, 2.45, 100, 0.25)}
    late = {3: _q(2.0, 1.0, 1.9, 400, 0.1)}  # shares no seed with the baseline
    att2 = {s: _q(1.0, 0.5, 0.9, 100, 0.1) for s in range(3)}
    lap2 = {0: _q(1.1, 0.5, 0.8, 100, 0.1), 1: _q(1.2, 0.5, 0.85, 100, 0.1), 2: _q(1.6, 0.5, 0.7, 200, 0.1)}  # Δ 0.1 0.2 0.6
    rows = {"t1": {"attention": att, "lap": lap, "one": one, "late": late, "mid": {}},
            "t2": {"attention": att2, "lap": lap2}}
    text = gaps.gap_table(config, "unused", rows)
    lines = text.splitlines()
    assert "### t1: train/validation gap" in lines and "### t2: train/validation gap" in lines
    assert not any(line.startswith("### t3") for line in lines) and not any(line.startswith("| mid") for line in lines)
    t1 = lines[lines.index("### t1: train/validation gap"):lines.index("### t2: train/validation gap")]
    t2 = lines[lines.index("### t2: train/validation gap"):]
    table1 = [line for line in t1 if line.startswith("| ") and not line.startswith("| operator")]
    assert table1 == [_ref_line("attention", att, None), _ref_line("lap (primary)", lap, att),
                      _ref_line("one", one, att), _ref_line("late", late, att)]
    # spot checks of the reference itself, by hand
    assert table1[1].split(" | ")[1:3] == ["2", "2.7000 ± 0.2828"]
    assert table1[1].split(" | ")[5:7] == ["-0.3500 (t -7.0, 1 df)", "-0.4500 (t -9.0, 1 df)"]
    assert table1[0].split(" | ")[8] == "233 ± 58" and table1[2].split(" | ")[2] == "3.1000 ± n/a"
    assert table1[2].split(" | ")[5] == "+0.1000" and table1[3].split(" | ")[5:7] == ["", ""]
    table2 = [line for line in t2 if line.startswith("| ") and not line.startswith("| operator")]
    assert table2 == [_ref_line("attention", att2, None), _ref_line("lap", lap2, att2)]
    assert table2[1].split(" | ")[5].startswith("+0.3000 (t ")  # the mean of 0.1, 0.2, 0.6 (median 0.2)
    for line in lines:  # header, separator and rows: 11 columns each
        if line.startswith("|"):
            assert line.count("|") == 12, line
    assert gaps._ms([]) == "n/a"


def test_primary_quantities_must_be_distinct_known_and_not_empty():
    """Kills gaps._check_quantities accepting a repeated quantity (the distinct check dropped) and an empty tuple
    (``not quantities`` dropped)."""
    config = _text_config([0, 1], operators=("attention", "lap"), primary=["lap"])
    for bad in [("final_val", "final_val"), (), ("final_val", "nope")]:
        with pytest.raises(ValueError, match="primary quantities must be distinct names"):
            gaps.primary_table(config, "unused", bad, rows={})


def test_primary_table_on_best_val_has_no_exploratory_copy_and_needs_the_baseline():
    """Kills gaps.primary_table adding the exploratory best-val row when best_val is itself primary, and testing
    a primary setting whose task has no finished baseline run (``not base`` dropped: a crash)."""
    config = _text_config([0, 1, 2], operators=("attention", "lap"), primary=["lap"])
    base = {0: _q(2.0, 1.0, 1.8, 100, 0.1), 1: _q(2.3, 1.0, 2.1, 100, 0.1), 2: _q(2.1, 1.0, 1.9, 100, 0.1)}
    lap = {0: _q(1.9, 1.0, 1.7, 100, 0.1), 1: _q(2.2, 1.0, 1.75, 100, 0.1), 2: _q(2.05, 1.0, 1.85, 100, 0.1)}
    text = gaps.primary_table(config, "unused", ("best_val",), rows={"t": {"attention": base, "lap": lap}})
    body = [line for line in text.splitlines() if line.startswith("| t, lap") or line.startswith("| *exploratory")]
    assert len(body) == 1 and body[0].startswith("| t, lap, best val loss | ")
    d = [lap[s]["best_val"] - base[s]["best_val"] for s in range(3)]  # -0.1, -0.35, -0.05
    assert body[0].split(" | ")[1] == f"{np.mean(d):+.4f}" == "-0.1667"
    assert "adjusted over the 1 primary cells" in text
    assert gaps.primary_table(config, "unused", ("final_val",), rows={"t": {"lap": lap}}) == ""


def _toml(tmp_path):
    cfg = tmp_path / "g.toml"
    cfg.write_text('name = "g"\nseeds = [0, 1]\nprimary = ["lap"]\n[[tasks]]\nname = "t"\ndataset = "pydoc-chars"\n'
                   'model = "gpt-char-tiny"\nmetric = "val_loss"\n[[operators]]\nname = "attention"\n'
                   '[[operators]]\nname = "lap"\nlaplacian_heads = 1\n')
    return cfg


def test_gaps_cli_strips_the_primary_list_and_names_a_missing_config(write_run, tmp_path, capsys):
    """Kills gaps.main splitting ``--primary`` without stripping the names (``"final_val, final_gap"`` refused)
    and without catching FileNotFoundError (a missing config a traceback instead of exit code 2)."""
    out = tmp_path / "g"
    for op, vals in (("attention", (2.0, 2.3)), ("lap", (1.9, 2.25))):
        for seed, v in enumerate(vals):
            write_run(out, "t", op, seed, [_eval(10, train_loss=1.0, val_loss=v)])
    assert gaps.main([str(_toml(tmp_path)), "--out", str(tmp_path), "--primary", "final_val, final_gap,"]) == 0
    assert "### Primary contrasts: final val loss, final gap" in capsys.readouterr().out
    assert gaps.main([str(tmp_path / "missing.toml"), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "missing.toml" in err


def test_gaps_cli_page_figure_is_reduced_to_a_palette(write_run, tmp_path):
    """Kills gaps.main skipping ``_copy_png`` on the figures it links from the page (a full RGBA PNG in the
    docs, not the 256-colour palette publish writes)."""
    pytest.importorskip("matplotlib")
    image = pytest.importorskip("PIL.Image")
    out = tmp_path / "g"
    for op, vals in (("attention", (2.0, 2.3)), ("lap", (1.9, 2.25))):
        for seed, v in enumerate(vals):
            write_run(out, "t", op, seed, [_eval(10, train_loss=1.5, val_loss=v + 0.5), _eval(20, train_loss=1.0, val_loss=v)])
    page = tmp_path / "docs" / "g.md"
    assert gaps.main([str(_toml(tmp_path)), "--out", str(tmp_path), "--page", str(page)]) == 0
    png = tmp_path / "docs" / "g" / "plots" / "t_gap.png"
    assert "](g/plots/t_gap.png)" in page.read_text()
    with image.open(png) as im:
        assert im.mode == "P"


# ----------------------------------------------------------------------------- store.py
def _lock(rdir, pid, host=None):
    rdir.mkdir(parents=True, exist_ok=True)
    (rdir / LOCK_NAME).write_text(json.dumps({"pid": pid, "host": platform.node() if host is None else host}))


def test_a_process_of_another_user_counts_as_alive(tmp_path, monkeypatch):
    """Kills store._pid_alive returning False on PermissionError (a process of another user is alive: its
    lock must be held, never taken over)."""
    def kill(pid, sig):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(store.os, "kill", kill)
    assert store._pid_alive(4242)
    _lock(tmp_path, 4242)
    assert live_holder(tmp_path) == (4242, platform.node())
    assert acquire_lock(tmp_path) == f"process 4242 on {platform.node()}"
    assert read_lock(tmp_path) == (4242, platform.node())


@pytest.mark.parametrize("pid", [0, -7])
def test_a_lock_of_pid_zero_or_negative_is_stale(tmp_path, pid):
    """Kills store._is_stale without ``pid <= 0`` (and with ``pid < 0``): ``os.kill(0 or -n, 0)`` signals a process
    group and succeeds, so such a lock would count as held for ever."""
    _lock(tmp_path, pid)
    assert live_holder(tmp_path) is None
    assert acquire_lock(tmp_path) is None and read_lock(tmp_path) == ME


@pytest.mark.parametrize("content", ['{"pid": null, "host": "h"}', "[1, 2]", '{"pid": [1], "host": "h"}'])
def test_a_lock_of_the_wrong_json_types_is_unreadable_not_a_crash(tmp_path, content):
    """Kills store._parse without TypeError among the errors it catches (``int(None)``, ``[1, 2]["pid"]``)."""
    (tmp_path / LOCK_NAME).write_text(content)
    assert read_lock(tmp_path) is None
    assert live_holder(tmp_path) == (-1, "")
    assert acquire_lock(tmp_path) == f"a process that is still writing {tmp_path / LOCK_NAME}"


def test_a_lock_that_cannot_be_opened_counts_as_unreadable(tmp_path, monkeypatch):
    """Kills store._state returning ``(None, None)`` (no lock) for a lock that exists but cannot be opened
    (here: opening it is refused): it must count as held while young, as an unparsable lock. (A folder in
    its place is refused by name: tests/reliability/test_edge_probes_leftovers_third.py.)"""
    (tmp_path / LOCK_NAME).write_text('{"pid": 1, "host": "h"}')

    def refuse(path, *args, **kwargs):
        if os.fspath(path) == os.fspath(tmp_path / LOCK_NAME):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return open(path, *args, **kwargs)

    monkeypatch.setattr(store, "open", refuse, raising=False)  # the module's name shadows the builtin
    assert live_holder(tmp_path) == (-1, "")
    assert acquire_lock(tmp_path) == f"a process that is still writing {tmp_path / LOCK_NAME}"


def test_bug_a_lock_that_is_not_utf8_is_unreadable_not_a_crash(tmp_path):
    """Bug: store._state and store.read_lock decoded the lock as UTF-8 text, and a lock holding other bytes
    (junk left by a crash or another tool) raised a bare UnicodeDecodeError from read_lock, live_holder,
    acquire_lock and release_lock, so ``run`` and ``status`` crashed on it. Now it is an unreadable lock: held
    while younger than UNREADABLE_GRACE_S, taken over after."""
    lock = tmp_path / LOCK_NAME
    lock.write_bytes(b"\xff\xfe\x80\x81 not a lock")
    assert read_lock(tmp_path) is None
    assert live_holder(tmp_path) == (-1, "")
    assert acquire_lock(tmp_path) == f"a process that is still writing {lock}"
    release_lock(tmp_path)  # not ours: left alone
    assert lock.read_bytes() == b"\xff\xfe\x80\x81 not a lock"
    old = time.time() - UNREADABLE_GRACE_S - 5
    os.utime(lock, (old, old))
    assert live_holder(tmp_path) is None
    assert acquire_lock(tmp_path) is None and read_lock(tmp_path) == ME


def _claim(tmp_path):
    claim = tmp_path / "claim.tmp"
    claim.write_text(json.dumps({"pid": ME[0], "host": ME[1]}))
    return claim


def _dead_pid():
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_takeover_leaves_a_stale_lock_alone_when_it_was_replaced_meanwhile(tmp_path):
    """Kills store._take_over without the inode check: the stale lock it saw was replaced by another file
    (another worker's takeover) before it got ``.lock.break``; that file is not the one it judged stale."""
    dead = _dead_pid()
    _lock(tmp_path, dead)
    seen = (tmp_path / LOCK_NAME).stat()
    os.link(tmp_path / LOCK_NAME, tmp_path / "keep")  # keeps the old inode in use: the new lock gets another
    (tmp_path / LOCK_NAME).unlink()
    _lock(tmp_path, dead, host=platform.node())
    assert (tmp_path / LOCK_NAME).stat().st_ino != seen.st_ino
    assert store._take_over(tmp_path, _claim(tmp_path), seen) is False
    assert read_lock(tmp_path) == (dead, platform.node()) and not (tmp_path / (LOCK_NAME + ".break")).exists()


def test_a_takeover_leaves_an_unreadable_lock_alone_once_it_is_being_written_again(tmp_path):
    """Kills store._take_over without the second staleness check: the same (unreadable) lock file was written
    to after it was judged stale, so it is young again and held."""
    lock = tmp_path / LOCK_NAME
    lock.write_text("")
    old = time.time() - UNREADABLE_GRACE_S - 5
    os.utime(lock, (old, old))
    seen = lock.stat()
    os.utime(lock, None)  # touched now: someone is filling it
    assert store._take_over(tmp_path, _claim(tmp_path), seen) is False
    assert lock.read_text() == "" and not (tmp_path / (LOCK_NAME + ".break")).exists()


def test_a_takeover_of_a_lock_that_went_away_asks_the_caller_to_try_again(tmp_path):
    """Kills store._take_over returning False (someone else holds it) instead of None (try again) when the
    stale lock is gone by the time it holds ``.lock.break``."""
    claim = _claim(tmp_path)
    assert store._take_over(tmp_path, claim, claim.stat()) is None
    assert not (tmp_path / LOCK_NAME).exists() and not (tmp_path / (LOCK_NAME + ".break")).exists()


def test_a_lock_released_between_a_failed_link_and_the_read_is_claimed_on_the_next_try(tmp_path, monkeypatch):
    """Kills store.acquire_lock returning None ("claimed") without holding the lock when the holder released it
    between the failed ``os.link`` and the read of its record (``continue`` -> ``return None``)."""
    real, failed = store._link_exclusive, []

    def link(src, dst):
        if dst.name == LOCK_NAME and not failed:  # as if a lock was there, released right after
            failed.append(dst)
            return False
        return real(src, dst)

    monkeypatch.setattr(store, "_link_exclusive", link)
    assert acquire_lock(tmp_path) is None
    assert failed and read_lock(tmp_path) == ME


# ----------------------------------------------------------------------------- results.py
def _digits_config(seeds=(0, 1), operators=("attention",), **task):
    task.setdefault("train", {"max_steps": 7})
    return ExperimentConfig("r", [TaskConfig("d", "digits", "vit-digits", **task)],
                            [OperatorSetting(o) if i == 0 else OperatorSetting(o, laplacian_heads=1)
                             for i, o in enumerate(operators)], seeds=list(seeds))


def test_finished_runs_prefer_memory_keep_config_order_and_skip_unfinished_runs(write_run, tmp_path):
    """Kills results.finished_runs ignoring the runs in memory, reading a run whose summary is not
    ``completed``, and ordering by seed before setting."""
    config = _digits_config(seeds=(0, 1, 2), operators=("attention", "lap"))
    out = tmp_path / "r"
    for op in ("attention", "lap"):
        write_run(out, "d", op, 0, [], eval=_eval(7, test_acc=0.5))
    write_run(out, "d", "attention", 1, [], status="non_finite", eval=_eval(7, test_acc=0.1))
    write_run(out, "d", "attention", 2, [], eval=_eval(7, test_acc=0.6))
    write_run(out, "d", "lap", 2, [], eval=_eval(7, test_acc=0.75))
    memory = [RunResult("d", "lap", 1, "completed", "test_acc", 0.8), RunResult("d", "attention", 0, "completed", "test_acc", 0.9)]
    got = finished_runs(out, config, memory)
    assert [(r.operator, r.seed, r.value) for r in got] == [("attention", 0, 0.9), ("attention", 2, 0.6), ("lap", 0, 0.5),
                                                            ("lap", 1, 0.8), ("lap", 2, 0.75)]
    assert got[0] is memory[1] and got[3] is memory[0]


@pytest.mark.parametrize("raw", [b"[1, 2]", b'"completed"', b"\xff\xfe{}", b'{"status": "comp'])
def test_a_summary_that_is_not_a_json_object_is_no_summary(write_run, tmp_path, raw):
    """Kills results.read_json_dict returning any JSON value (a list, a string) and catching only JSONDecodeError
    (a file that is not UTF-8 raised UnicodeDecodeError)."""
    config = _digits_config(seeds=(0,))
    rdir = write_run(tmp_path / "r", "d", "attention", 0, [{"split": "train", "step": 2, "loss": 1.0}])
    (rdir / "summary.json").write_bytes(raw)
    assert read_json_dict(rdir / "summary.json") is None
    assert finished_runs(tmp_path / "r", config) == []
    (row,) = run_status(config, tmp_path)
    assert (row["state"], row["step"]) == ("interrupted", 2)


def test_run_status_states_by_hand(write_run, tmp_path):
    """Kills results.run_status: the step of a completed summary without ``step`` defaulting to 0 instead of the
    budget, the running check after the failed one, ``startswith("failed")`` -> ``== "failed"``, a folder with only
    a checkpoint reported missing, and the holder left out."""
    config = _digits_config(seeds=(0, 1, 2, 3, 4))
    out = tmp_path / "r"
    write_run(out, "d", "attention", 0, [], elapsed=3.5)  # completed, no step recorded
    failed = write_run(out, "d", "attention", 1, [{"split": "train", "step": 4, "loss": 1.0, "elapsed": 2.0}],
                        status="failed: out of memory")
    write_run(out, "d", "attention", 2, [{"split": "train", "step": 2, "loss": 1.0}], status="failed: boom")
    _lock(run_dir(out, "d", "attention", 2), ME[0])  # retrained now by this (live) process
    ckpt = run_dir(out, "d", "attention", 3)
    ckpt.mkdir(parents=True)
    (ckpt / "checkpoint.pt").write_bytes(b"x")
    run_dir(out, "d", "attention", 4).mkdir(parents=True)  # an empty folder: nothing started
    rows = run_status(config, tmp_path)
    assert [(r["state"], r["step"], r["elapsed"], r["holder"]) for r in rows] == [
        ("completed", 7, 3.5, None), ("failed", 4, 2.0, None), ("running", 2, None, f"pid {ME[0]} on {ME[1]}"),
        ("interrupted", 0, None, None), ("missing", 0, None, None)]
    assert all(r["max_steps"] == 7 for r in rows) and failed.is_dir()


def test_bug_a_run_stopped_by_a_non_finite_loss_is_reported_failed(write_run, tmp_path):
    """Bug: results.run_status reported ``failed`` only for a summary status starting with "failed", which no
    code writes to ``summary.json``; the Trainer writes ``"non_finite"`` when a loss stops the run, so such a run
    showed as ``interrupted`` ("started, not finished, nobody training it"). Now it is ``failed``."""
    config = _digits_config(seeds=(0,))
    write_run(tmp_path / "r", "d", "attention", 0, [{"split": "train", "step": 4, "loss": 1.0}], status="non_finite",
               error="loss is nan at step 5; training stopped", bad_step=5)
    (row,) = run_status(config, tmp_path)
    assert (row["state"], row["step"]) == ("failed", 4)


def test_a_completed_run_without_an_evaluation_has_no_value_and_no_error(write_run, tmp_path):
    """Kills results._result_from_files raising "metric not among the evaluation keys" for a summary with no
    evaluation at all (``and summary.get("eval")`` dropped); the named error stays for an evaluation without it."""
    config = _digits_config(seeds=(0, 1))
    out = tmp_path / "r"
    write_run(out, "d", "attention", 0, [], eval=None)
    (r,) = finished_runs(out, _digits_config(seeds=(0,)))
    assert (r.value, r.final) == (None, {})
    write_run(out, "d", "attention", 1, [], eval=_eval(7, val_acc=0.5))
    with pytest.raises(ValueError, match="metric 'test_acc' is not among the evaluation keys \\['val_acc'\\]"):
        finished_runs(out, config)


def test_learned_operators_missing_is_silent_and_unreadable_warns(write_run, tmp_path):
    """Kills results._result_from_files reading a missing learned_operators.json as unreadable (a warning for
    every run without learned operators), and dropping the warning for an unreadable one."""
    config = _digits_config(seeds=(0, 1))
    out = tmp_path / "r"
    write_run(out, "d", "attention", 0, [], eval=_eval(7, test_acc=0.5))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (r,) = finished_runs(out, _digits_config(seeds=(0,)))
    assert r.learned == {}
    rdir = write_run(out, "d", "attention", 1, [], eval=_eval(7, test_acc=0.5))
    (rdir / "learned_operators.json").write_text('{"layer0": [0.5')
    with pytest.warns(UserWarning, match="learned_operators.json is unreadable"):
        runs = finished_runs(out, config)
    assert [r.learned for r in runs] == [{}, {}]


def test_reach_is_read_from_the_log_without_a_select_by_key(write_run, tmp_path):
    """Kills results._result_from_files reading the log only for ``select_by`` (``or task.reach`` dropped: the
    reach step of runs read back from disk is always None)."""
    config = _digits_config(seeds=(0,), reach={"val_acc": 0.9})
    write_run(tmp_path / "r", "d", "attention", 0, [_eval(5, val_acc=0.5), _eval(10, val_acc=0.95)],
               eval=_eval(7, test_acc=0.9))
    (r,) = finished_runs(tmp_path / "r", config)
    assert (r.reach_step, r.selected_value, r.selected_step) == (10, None, None)


def test_select_evaluation_skips_non_finite_and_incomplete_evaluations_and_train_records():
    """Kills results.select_evaluation without the ``isfinite`` check (a NaN first evaluation is never beaten),
    without ``task.metric in m`` (a KeyError), and counting train records."""
    task = TaskConfig("t", "digits", "vit-digits", select_by="val_acc")
    records = [_eval(10, val_acc=math.nan, test_acc=0.1), _eval(20, val_acc=0.9),  # no test_acc
               {"split": "train", "step": 25, "metrics": {"val_acc": 0.99, "test_acc": 0.2}},
               _eval(30, val_acc=0.5, test_acc=0.6), _eval(40, val_acc=0.7, test_acc=0.65), _eval(50, val_acc=0.6, test_acc=0.7)]
    assert select_evaluation(records, task) == (0.65, 40)
    assert select_evaluation(records[:3], task) == (None, None)


def test_first_reach_skips_infinite_values_and_train_records():
    """Kills results.first_reach without the ``isfinite`` check (an infinite accuracy or a loss of -inf meets any
    threshold) and counting train records (a training loss is not the evaluation's)."""
    acc = TaskConfig("t", "digits", "vit-digits", reach={"val_acc": 0.9})
    assert first_reach([_eval(10, val_acc=math.inf), _eval(20, val_acc=0.5), _eval(30, val_acc=0.95)], acc) == 30
    loss = TaskConfig("t", "digits", "vit-digits", reach={"loss": 1.0})
    records = [{"split": "train", "step": 5, "loss": 0.5}, {"split": "eval", "step": 10, "loss": -math.inf},
               {"split": "eval", "step": 20, "loss": 1.5}, {"split": "eval", "step": 30, "loss": 0.8}]
    assert first_reach(records, loss) == 30


def test_select_evaluation_and_first_reach_need_their_keys():
    """Kills results.select_evaluation without its named ValueError for a task with no ``select_by`` (an
    AttributeError on None) and results.first_reach without its named ValueError for a task with no ``reach``
    (an unpacking error naming nothing)."""
    task = TaskConfig("t", "digits", "vit-digits")
    with pytest.raises(ValueError, match="task 't' has no select_by key"):
        select_evaluation([_eval(1, test_acc=0.5)], task)
    with pytest.raises(ValueError, match="task 't' has no reach threshold"):
        first_reach([_eval(1, test_acc=0.5)], task)
