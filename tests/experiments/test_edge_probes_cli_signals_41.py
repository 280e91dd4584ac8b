"""Edge-case probes of the experiments command line: signals to ``python -m diffusionformer.experiments run``.

Probed (a fresh interpreter per signalled run; tiny digits config, one run of 40 steps): SIGTERM (``kill``, a batch
scheduler's stop, ``run --workers``'s own stop of its workers) after the first checkpoint. SIGINT is pinned in
``test_edge_probes_cli_third.py``; usage errors, ``--help`` and pipes in the other ``test_edge_probes_cli*`` files.

Found and fixed (tests named ``test_bug_...``):

- ``cli.main``: SIGTERM killed ``run`` at once by Python's default action: no message, exit -15, the run's
  ``.lock`` left behind (stale, read as such later), none of the ``except``/``finally`` clean-ups that Ctrl-C runs
  (temporaries of an atomic write half done, a metrics line half appended, ``run --workers``'s workers left
  running as orphans when the parent was the one terminated). SIGTERM now stops the command as Ctrl-C does: one
  ``terminated:`` line, the clean-ups, exit 143 (128 + SIGTERM).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import diffusionformer
from experiments_tiny_configs import TINY_DIGITS_TOML
from diffusionformer.experiments.cli import main
from diffusionformer.experiments.results import run_dir

#: one run (attention, seed 0) of 40 steps, a checkpoint every 5
_ONE_RUN = (TINY_DIGITS_TOML.split('[[operators]]\nname = "lap"')[0]
            .replace("max_steps = 2", "max_steps = 40").replace("eval_interval = 2", "eval_interval = 40")
            .replace("checkpoint_interval = 2", "checkpoint_interval = 5"))

_SLOW_CHILD = """
import sys, time
from diffusionformer.train.trainer import Trainer
update = Trainer._update
def slow(self, step, *args, **kwargs):  # 0.2 s a step after the first checkpoint: the signal comes mid-run
    time.sleep(0.02 if step < 5 else 0.2)
    return update(self, step, *args, **kwargs)
Trainer._update = slow
from diffusionformer.experiments.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _signalled_run(tmp_path: Path, sig: int) -> tuple[subprocess.Popen, str, str, str, Path]:
    """Start ``run`` of :data:`_ONE_RUN` in a fresh interpreter, send ``sig`` once its first checkpoint is written;
    ``(child, stdout, stderr, config path, results root)``."""
    toml = tmp_path / "tiny.toml"
    toml.write_text(_ONE_RUN, encoding="utf-8")
    out = tmp_path / "res"
    rdir = run_dir(out / "tiny", "digits", "attention", 0)
    package = Path(diffusionformer.__file__).parents[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(package), *sys.path])}
    child = subprocess.Popen([sys.executable, "-c", _SLOW_CHILD, "run", str(toml), "--out", str(out), "--no-progress"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 120  # imports and the data load may be slow on a loaded machine
        while time.monotonic() < deadline and child.poll() is None and not (rdir / "checkpoint.pt").is_file():
            time.sleep(0.01)
        child.send_signal(sig)
        stdout, stderr = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    return child, stdout, stderr, str(toml), out


def _log(root: Path) -> list[tuple]:
    path = run_dir(root / "tiny", "digits", "attention", 0) / "metrics.jsonl"
    return [(r["step"], r["split"], r["loss"]) for r in map(json.loads, path.open())]


def test_bug_sigterm_stops_run_as_ctrl_c_does_and_the_run_resumes(tmp_path, capsys):
    """Bug: SIGTERM to ``run`` (``kill PID``, a scheduler's stop) killed the process by Python's default action:
    exit -15 with no message, the run's ``.lock`` left in its folder and none of the clean-ups of an interrupt run.
    Now: exit 143, nothing on stdout, one ``terminated:`` line last on stderr and no traceback, the lock released,
    no temporary left, and the next ``run`` finishes the run with the log of a run never interrupted."""
    child, stdout, stderr, toml, out = _signalled_run(tmp_path, signal.SIGTERM)
    assert child.returncode == 128 + signal.SIGTERM, (child.returncode, stderr[-2000:])
    assert stdout == "" and "Traceback" not in stderr
    assert stderr.rstrip().splitlines()[-1].startswith("terminated: `run` stopped; run the same command again")
    rdir = run_dir(out / "tiny", "digits", "attention", 0)
    assert not (rdir / ".lock").exists() and not (rdir / "summary.json").exists()
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp") or p.name.startswith(".lock")]
    assert main(["status", toml, "--out", str(out)]) == 0
    assert "| attention | 0 | interrupted |" in capsys.readouterr().out
    assert main(["run", toml, "--out", str(out), "--no-progress", "--threads", "1"]) == 0
    once = tmp_path / "once"
    assert main(["run", toml, "--out", str(once), "--no-progress", "--threads", "1"]) == 0
    assert _log(out) == _log(once) and _log(out)[-1][0] == 40

    def finals(root):  # the results rows less their wall time
        return [{k: v for k, v in row.items() if k != "elapsed"}
                for row in json.loads((root / "tiny" / "results.json").read_text())["runs"]]

    assert finals(out) == finals(once)


def test_pins_main_leaves_the_callers_sigterm_handler_as_it_was(capsys):
    """Pins (of the fix above): ``main()`` called in process (a test, a notebook) gives back the default SIGTERM
    action it found, and keeps a handler the caller installed (it replaces only the default action)."""
    before = signal.getsignal(signal.SIGTERM)
    if before == signal.SIG_DFL:
        assert main(["list"]) == 0
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL

    def mine(signum, frame):  # pragma: no cover - never delivered
        pass

    signal.signal(signal.SIGTERM, mine)
    try:
        seen = []
        import diffusionformer.experiments.cli as cli

        real = cli._main

        def spy(argv):
            seen.append(signal.getsignal(signal.SIGTERM))
            return real(argv)

        cli._main = spy
        try:
            assert main(["list"]) == 0
        finally:
            cli._main = real
        assert seen == [mine] and signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, before)
    capsys.readouterr()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:  # a zombie (exited, not yet reaped by its parent) runs no more
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_bug_sigterm_to_run_with_workers_stops_its_workers(tmp_path):
    """Bug: SIGTERM to ``run --workers 2`` ended the parent at once (exit -15), and its two workers went on training
    as orphans, holding their runs' locks, after the command had returned to the shell. Now the parent stops its
    workers (which stop as on Ctrl-C: locks released) and exits 143."""
    if not Path("/proc/self/stat").exists():
        pytest.skip("reads the workers' states from /proc")
    toml = tmp_path / "tiny.toml"  # two runs of many steps: each worker trains one when the signal comes
    toml.write_text(_ONE_RUN.replace("seeds = [0]", "seeds = [0, 1]").replace("max_steps = 40", "max_steps = 20000")
                    .replace("eval_interval = 40", "eval_interval = 20000"), encoding="utf-8")
    out = tmp_path / "res"
    runs = [run_dir(out / "tiny", "digits", "attention", s) for s in (0, 1)]
    package = Path(diffusionformer.__file__).parents[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(package), *sys.path])}
    env.pop("DIFFUSIONFORMER_WORKER", None)
    child = subprocess.Popen([sys.executable, "-m", "diffusionformer.experiments", "run", str(toml), "--out", str(out),
                              "--workers", "2", "--no-progress"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and child.poll() is None and not all((r / "checkpoint.pt").is_file()
                                                                               for r in runs):
            time.sleep(0.05)
        pids = [json.loads((r / ".lock").read_text())["pid"] for r in runs if (r / ".lock").is_file()]
        assert len(pids) == 2 and child.poll() is None, child.poll()
        child.send_signal(signal.SIGTERM)
        _, stderr = child.communicate(timeout=90)
        assert child.returncode == 128 + signal.SIGTERM, (child.returncode, stderr[-2000:])
        assert stderr.rstrip().splitlines()[-1].startswith("terminated: `run` stopped")
        assert not [p for p in pids if _alive(p)]
        assert not [r for r in runs if (r / ".lock").exists()]
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
        for pid in pids:  # never leave a worker training
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
