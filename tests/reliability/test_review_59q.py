"""Review 59q of f29589f, 2e2e12e, 5bccfb8 and d7b81d7, as a reviewer who assumes each has a bug.

- d7b81d7: ``_format_p`` adds digits until the printed p keeps its side of every bound, but stops at 17 decimals,
  which do not tell the double just below 0.05 from 0.05: it printed "0.05000000000000000" in bold (a p that
  reads as the level itself marked significant, what ``format_p`` promises never to print).
- 2e2e12e: a call ending a run took it out of ``runner._TRAINING_HERE`` before it removed its lock file, outside the
  new ``threading.Lock``: a call (a thread) claiming the run between the two trained it, and the lock it trained under
  was then removed; a ``resume=False`` refused for another call of this process advised to "stop that process" (the
  caller's own); the one-process environment's refusal (``dist_env``) came after the log said that a lock this
  process left in place was taken back.
"""

from __future__ import annotations

import math

import pytest


# ---------------------------------------------------------------------------- d7b81d7: p on its side of the bounds
def test_bug_a_p_just_below_alpha_printed_as_alpha_itself():
    """Bug: p = the double just below 0.05 (below it: bold) printed with 17 decimals, the cap, which round it to 0.05:
    "0.05000000000000000" in bold. It is printed as ``repr(p)``, which reads back as p; every p next to an alpha keeps
    its side."""
    from diffusionformer.experiments.compare import _format_p, format_p

    below = math.nextafter(0.05, 0.0)
    assert format_p(below) == repr(below) == "0.049999999999999996"
    for alpha in (0.05, 0.0497, 0.0506, 0.01, 0.0001):
        for p in (math.nextafter(alpha, 0.0), alpha, math.nextafter(alpha, 1.0)):
            text = _format_p(p, alpha)
            assert (float(text) < alpha) == (p < alpha) and (float(text) < 0.05) == (p < 0.05), (p, alpha, text)
    assert format_p(0.0498) == "0.0498" and _format_p(0.0499, 0.1) == "0.0499"  # the short forms kept


# ---------------------------------------------------------------------------- 2e2e12e: a run's claim and release
def _tiny_config():
    from experiments_tiny_configs import tiny_digits_config  # tests/experiments, on the path (conftest.py)

    return tiny_digits_config(1)


def test_bug_a_call_claiming_a_run_while_another_call_released_it_trained_without_a_lock(tmp_path, monkeypatch):
    """Bug: a call of ``run_experiment`` ending a run (here: its training failed) took the run out of
    ``runner._TRAINING_HERE`` and then removed its lock file; another call (a thread) claiming the run between the
    two found the lock file this process's own and the run in no call's training: it trained it, and the first call
    then removed the lock it trained under (another process could take the run too). The end of a run and a claim
    of it are now one after the other, never interleaved."""
    import threading

    from diffusionformer.experiments import runner
    from diffusionformer.experiments.results import run_dir
    from diffusionformer.experiments.store import LOCK_NAME

    config = _tiny_config()
    lock = run_dir(tmp_path / "tiny", "digits", "attention", 0) / LOCK_NAME
    at_run, decided, released = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, object] = {}
    one_run, release = runner._one_run, runner._release_lock

    class Stop(Exception):
        pass

    def second_call() -> None:
        try:
            runner.run_experiment(config, tmp_path, progress=False, log=lambda m: None)
        except Stop:
            pass
        except BaseException as exc:  # pragma: no cover - reported by the assertion below
            seen["error"] = exc

    second = threading.Thread(target=second_call)

    def entered(*args, **kwargs):
        if threading.current_thread() is second:
            at_run.set()
        return one_run(*args, **kwargs)

    def train(*args, **kwargs):
        if threading.current_thread() is not second:
            raise RuntimeError("the first call's training failed")
        decided.set()
        released.wait(10)
        seen["locked"] = lock.exists()  # the second call trains the run: under its lock
        raise Stop

    def releasing(rdir):
        if threading.current_thread() is not second and not second.is_alive():  # the first call's release
            second.start()
            assert at_run.wait(60)
            decided.wait(1)  # the second call claims the run now, or waits for the release
            release(rdir)
            released.set()
            return
        release(rdir)

    monkeypatch.setattr(runner, "_one_run", entered)
    monkeypatch.setattr(runner, "_train_one", train)
    monkeypatch.setattr(runner, "_release_lock", releasing)
    with pytest.raises(RuntimeError, match="the first call's training failed"):
        runner.run_experiment(config, tmp_path, progress=False, log=lambda m: None)
    second.join(60)
    assert "error" not in seen, seen
    assert seen["locked"] is True
    assert not lock.exists() and not runner._TRAINING_HERE


def test_bug_a_restart_refused_for_another_call_of_this_process_said_to_stop_this_process(tmp_path, monkeypatch):
    """Bug: ``resume=False`` claiming a run another call of this process (a thread, once past the call's own check of
    held runs) trains was refused with "another call of run_experiment in this process (process N) is training it
    ...; stop that process and run again": the process named is the caller's own, which would stop both calls. It
    says to let that call end."""
    from diffusionformer.experiments import runner

    config, train_one = _tiny_config(), runner._train_one
    seen: dict[str, str] = {}

    def nested(*args, **kwargs):
        monkeypatch.setattr(runner, "_train_one", train_one)  # once
        with monkeypatch.context() as patch:  # as a thread past the check: its refusal is the claim's
            patch.setattr(runner, "_refuse_restart_of_held_runs", lambda *a: None)
            with pytest.raises(ValueError, match="resume=False") as refusal:
                runner.run_experiment(config, tmp_path, resume=False, progress=False, log=lambda m: None)
        seen["refusal"] = str(refusal.value)
        return train_one(*args, **kwargs)

    monkeypatch.setattr(runner, "_train_one", nested)
    runner.run_experiment(config, tmp_path, progress=False, log=lambda m: None)
    assert "another call of run_experiment in this process" in seen["refusal"], seen
    assert "let that call end and run again" in seen["refusal"] and "stop that process" not in seen["refusal"]


def test_bug_a_restart_refused_by_its_environment_said_it_took_this_process_lock_back(tmp_path, monkeypatch):
    """Bug: ``resume=False`` beside a lock this process left in place (its release failed) logged "... this process's
    own lock ...: taken back, the run is restarted", then ``WORLD_SIZE=1`` with a stray ``RANK=1`` (2e2e12e's
    ``dist_env`` of the one-process path) refused the call: the log said what the call did not do (the refusal 2e2e12e
    kept from saying it for held runs). The environment is read first."""
    from diffusionformer.experiments import runner
    from diffusionformer.experiments.results import run_dir
    from diffusionformer.experiments.store import LOCK_NAME

    from experiments_tiny_configs import leave_own_lock_in_place  # tests/experiments, on the path (conftest.py)

    config = _tiny_config()
    lock = leave_own_lock_in_place(monkeypatch, config, tmp_path)
    assert lock == run_dir(tmp_path / "tiny", "digits", "attention", 0) / LOCK_NAME and lock.exists()
    said: list[str] = []
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    with pytest.raises(ValueError, match=r"distributed environment: .*RANK=1"):
        runner.run_experiment(config, tmp_path, resume=False, progress=False, log=said.append)
    assert not [m for m in said if "taken back" in m], said
    monkeypatch.delenv("RANK")
    runner.run_experiment(config, tmp_path, resume=False, progress=False, log=said.append)
    assert [m for m in said if "taken back" in m]  # a one-process environment: taken back, as 2e2e12e says
