"""Edge-case probes of the results store under kills, second round (``runner``'s restart of a run, ``outputs``).

Probed: ``--restart`` (``resume=False``) killed while it removes a run's old files, then a rerun without it;
a full disk in the middle of the comparison's table write. Not repeated: what ``test_edge_probes_runner*.py``
(kills at every atomic write, three processes on one comparison, stale and junk locks, the manifest merge) and
``test_experiments_store.py`` (lock races, takeovers, other hosts' locks) pin.

Found and fixed (tests named ``test_bug_...``):

* ``runner._train_one``: ``--restart`` removed a run's old files in directory order; a kill after its
  ``run_config.json`` and before its ``summary.json`` left a "completed" run without a definition, and the rerun
  under the changed config (``lr`` 1e-3 then 0.5) read the old run back as its own, silently, and never wrote the
  run's ``run_config.json`` again (``status`` showed it completed, unchanged). The summary is now removed first
  and the definition last.

Seen, not changed: a ``.lock.break`` left by a worker killed in the middle of a stale-lock takeover keeps the run
"held" for ``UNREADABLE_GRACE_S`` (documented; the window is a few system calls); hand-edited ``results.json``
rows whose ``final`` / ``learned`` are not objects are carried over as they are (the tables do not read them).
"""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.runner import run_dir, run_experiment


def _raw(lr=1e-3):
    return {"name": "tiny", "seeds": [0], "tasks": [{
        "name": "digits", "dataset": "digits", "model": "vit-digits",
        "model_overrides": {"dim": 8, "depth": 1, "num_heads": 2},
        "train": {"max_steps": 2, "batch_size": 8, "lr": lr, "warmup_steps": 0, "eval_interval": 2,
                  "log_interval": 1, "checkpoint_interval": 2}}],
        "operators": [{"name": "attention"}]}


class _Killed(BaseException):
    """A kill simulated in-process (no fork): not an Exception, so no handler on the way catches it."""


@pytest.mark.parametrize("killed_after", ["summary.json", "checkpoint.pt", "run_config.json"])
def test_bug_a_restart_killed_while_removing_a_run_never_reads_the_old_run_back(tmp_path, monkeypatch, killed_after):
    """Bug: ``--restart`` with a changed ``lr`` removed the run's files in directory order; killed just after its
    ``run_config.json`` went (its ``summary.json`` still there), the rerun without ``--restart`` returned the old
    ``lr``'s result as the new config's, silently, and left the run without a ``run_config.json`` for good. Here
    the folder lists ``run_config.json`` first, and the kill comes after each file in turn: the rerun either
    refuses the changed definition or trains the run afresh, never reads the old one back."""
    root = tmp_path / "out"
    run_experiment(load_experiment_config(_raw(1e-3)), root, progress=False, log=lambda m: None)
    rdir = run_dir(root / "tiny", "digits", "attention", 0)
    real_iterdir, real_unlink = Path.iterdir, Path.unlink

    def iterdir(self):
        return iter(sorted(real_iterdir(self), key=lambda p: p.name != "run_config.json"))

    def unlink(self, missing_ok=False):
        real_unlink(self, missing_ok=missing_ok)
        if self.parent == rdir and self.name == killed_after:
            raise _Killed

    new = load_experiment_config(_raw(0.5))
    monkeypatch.setattr(Path, "iterdir", iterdir)
    monkeypatch.setattr(Path, "unlink", unlink)
    with pytest.raises(_Killed):
        run_experiment(new, root, progress=False, resume=False, log=lambda m: None)
    monkeypatch.undo()
    assert not (rdir / ".lock").exists()
    try:
        again = run_experiment(new, root, progress=False, log=lambda m: None)
    except ValueError as exc:  # the old definition is still there: refused, and --restart named
        assert "lr" in str(exc) and "--restart" in str(exc)
        assert (rdir / "run_config.json").is_file() and not (rdir / "summary.json").exists()
        return
    assert [r.status for r in again] == ["completed"]
    assert json.loads((rdir / "run_config.json").read_text())["train"]["lr"] == 0.5
    assert json.loads((rdir / "summary.json").read_text())["resumed_from"] is None  # trained from step 0


def test_a_full_disk_in_the_middle_of_the_table_write_keeps_the_old_tables(tmp_path, monkeypatch):
    """A write raising ``OSError(ENOSPC)`` half-way through ``results.md`` (after ``results.json`` was replaced):
    the error reaches the caller, the old ``results.md`` is whole, no temporary is left, and the next
    invocation (disk freed) writes both tables again."""
    import diffusionformer.train.metrics as metrics

    cfg = load_experiment_config(_raw())
    root = tmp_path / "out"
    run_experiment(cfg, root, progress=False, log=lambda m: None)
    out = root / "tiny"
    before = (out / "results.md").read_text()
    (out / "results.md").write_text(before + "\n<!-- marker -->\n")
    real = metrics._atomic_file

    class Full:
        def __init__(self, f):
            self.f = f

        def write(self, text):
            self.f.write(text[: len(text) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")

    import contextlib

    @contextlib.contextmanager
    def atomic(path, newline=None):
        with real(path, newline) as f:
            yield Full(f) if Path(path).name == "results.md" else f

    monkeypatch.setattr(metrics, "_atomic_file", atomic)
    from diffusionformer.experiments.outputs import write_outputs
    from diffusionformer.experiments.results import finished_runs
    with pytest.raises(OSError, match="No space"):
        write_outputs(out, cfg, finished_runs(out, cfg))
    monkeypatch.undo()
    assert (out / "results.md").read_text() == before + "\n<!-- marker -->\n"
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]
    run_experiment(cfg, root, progress=False, log=lambda m: None)
    assert (out / "results.md").read_text() == before
