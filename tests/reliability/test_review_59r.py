"""Review 59r of df2b097 and 3803da0, as a reviewer who assumes each has a bug.

- df2b097: ``_format_p``'s fallback for a p that 17 decimals round onto a bound is ``repr(p)``; a numpy float64 (a
  ``float`` subclass, what scipy returns) has the repr ``np.float64(0.049999999999999996)`` under numpy 2, which
  ``format_p`` put in the table.
- 3803da0: the refusal of a subclass that inherits its registered parent's name fired for any class without a name of
  its own whose inherited name was taken, also where the holder is no parent of it: a notebook cell defining a class
  that inherits its name from an unregistered base, run twice, was told to give the class another name, not (the
  class being defined again) to unregister the earlier one first.
- df2b097: a run's claim is one step under ``runner._TRAINING_HERE_LOCK``, but ``resume=False``'s check of held runs
  read ``_TRAINING_HERE`` without it: a claim in flight was "taken back", then refused once runs were discarded.
"""

from __future__ import annotations

import math

import pytest
import torch


# ---------------------------------------------------------------------------- df2b097: repr fallback of _format_p
def test_bug_a_numpy_p_just_below_alpha_printed_as_its_numpy_repr():
    """Bug: ``format_p(np.float64(p))`` for the double just below 0.05 returned "np.float64(0.049999999999999996)"
    (numpy 2's repr of its scalar) in a table cell; it reads "0.049999999999999996" as for a float."""
    np = pytest.importorskip("numpy")
    from diffusionformer.experiments.compare import _format_p, format_p

    below = math.nextafter(0.05, 0.0)
    assert format_p(np.float64(below)) == format_p(below) == "0.049999999999999996"
    p = math.nextafter(0.01, 0.0)
    text = _format_p(np.float64(p), 0.01)
    assert float(text) == p and text == repr(p)


# ---------------------------------------------------------------------------- 3803da0: a name inherited, not a parent's
def test_bug_a_class_defined_again_inheriting_its_name_from_an_unregistered_base_told_to_rename_it():
    """Bug: a notebook cell registering ``Mine(Base)``, where the unregistered ``Base`` declares ``name``, run a second
    time was refused as "Mine has no registry name of its own: it inherits 'review59r-mine' from Base, which Mine
    holds; give it one": the holder is the earlier ``Mine``, no parent of the new one, and unregistering it (the advice
    for a class defined again) is what replaces it. The inherited-name refusal stays for a holder the class derives
    from."""
    from diffusionformer.operators import DiffusionOperator, register_operator, unregister_operator

    class Base(DiffusionOperator):
        name = "review59r-mine"
        degree = 1

        def coefficients(self):
            return torch.tensor([0.5, 0.5])

    def cell():
        @register_operator
        class Mine(Base):
            pass

        return Mine

    first = cell()
    try:
        with pytest.raises(ValueError, match=r"already registered by Mine; to replace it \(a class defined again\), "
                                             r"call unregister_operator\('review59r-mine'\) first"):
            cell()

        class Child(first):  # the holder is its parent: still told to give it a name of its own
            pass

        with pytest.raises(ValueError, match=r"^Child has no registry name of its own: it inherits 'review59r-mine' "
                                             r"from Mine, which Mine holds"):
            register_operator(Child)
    finally:
        unregister_operator("review59r-mine")


# ---------------------------------------------------------------------------- df2b097: the restart's check of claims
def test_bug_a_restart_beside_a_claim_in_flight_took_the_claimed_lock_back(tmp_path, monkeypatch):
    """Bug: df2b097 makes a run's claim (its lock file, then ``_TRAINING_HERE``) one step under
    ``runner._TRAINING_HERE_LOCK``, but ``resume=False``'s check of held runs read ``_TRAINING_HERE`` without it: a
    call (a thread) claiming a run between the two steps left the run's lock this process's own and the run in no
    call's training, so the restart logged "... taken back, the run is restarted", went on (discarding the runs before
    it), and was refused at that run's claim. The check waits for the claim: the restart is refused before anything
    is discarded, and takes nothing back."""
    import threading

    from diffusionformer.experiments import runner
    from experiments_tiny_configs import tiny_digits_config  # tests/experiments, on the path (conftest.py)

    config = tiny_digits_config(1)
    claimed, go, done = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, object] = {}
    acquire = runner._acquire_lock

    class Stop(Exception):
        pass

    def first_call() -> None:
        try:
            runner.run_experiment(config, tmp_path, progress=False, log=lambda m: None)
        except Stop:
            pass
        except BaseException as exc:  # pragma: no cover - reported by the assertion below
            seen["error"] = exc

    first = threading.Thread(target=first_call)

    def claiming(rdir):
        holder = acquire(rdir)
        if threading.current_thread() is first:  # its lock file linked, the run not yet in _TRAINING_HERE
            claimed.set()
            go.wait(10)
        return holder

    def train(*args, **kwargs):
        done.wait(30)
        raise Stop

    monkeypatch.setattr(runner, "_acquire_lock", claiming)
    monkeypatch.setattr(runner, "_train_one", train)
    first.start()
    try:
        assert claimed.wait(60)
        threading.Timer(1.0, go.set).start()
        said: list[str] = []
        with pytest.raises(ValueError, match=r"another call of run_experiment trains it.*nothing was discarded"):
            runner.run_experiment(config, tmp_path, resume=False, progress=False, log=said.append)
        assert not [m for m in said if "taken back" in m], said
    finally:
        go.set()
        done.set()
        first.join(60)
    assert "error" not in seen, seen
    assert not runner._TRAINING_HERE
