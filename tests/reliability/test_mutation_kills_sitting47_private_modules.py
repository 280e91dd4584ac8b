"""Mutation audit (sitting 47) of the private helper modules and two small public ones (_files.py, _imports.py,
_modes.py, _warnings.py, data/_unpickle.py, data/paths.py, testing/memory.py, experiments/plots.py): tests that kill
mutants the earlier tests left alive (each docstring names the mutant). No GPU is used.

48 mutants (_files.py 7, _imports.py 6, _modes.py 5, _warnings.py 4, data/_unpickle.py 7, data/paths.py 7,
testing/memory.py 5, experiments/plots.py 7): 34 killed by earlier tests (one of them, ``_plain`` walking a shared
list once per path, by a test that then never ends; one, no check for a running profiler, by a segmentation fault),
14 survivors killed here, 0 equivalent. No bug found: the restricted unpickler's safety mutants (object dtypes,
width-0 strings, ``_reconstruct`` shapes, BUILD on the shared globals, shared-list walks) were all killed before;
the code-point check's boundary (U+110000) was not pinned and is here.
"""

from __future__ import annotations

import json
import os
import stat
import struct
import warnings
from pathlib import Path

import numpy as np
import pytest
from torch import nn

from diffusionformer import _files, _imports
from diffusionformer._modes import _evaluating
from diffusionformer.data import CorruptDataError
from diffusionformer.data.cifar10 import _unpickle as cifar_unpickle
from diffusionformer.testing import cpu_allocations


# ---- _files.py ---------------------------------------------------------------------------------------------------


def test_kills_file_kind_names_block_devices_as_devices():
    """kills: _files.py ``file_kind`` ``stat.S_ISCHR(mode) or stat.S_ISBLK(mode)`` -> ``stat.S_ISCHR(mode)`` (a
    block device, ``/dev/sda`` given as a run file, was "not a regular file" rather than "a device")."""
    assert _file_kinds() == {stat.S_IFDIR: "a folder", stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a device",
                            stat.S_IFBLK: "a device", stat.S_IFSOCK: "a socket", stat.S_IFLNK: "not a regular file"}


def _file_kinds() -> dict[int, str]:
    return {mode: _files.file_kind(mode | 0o644) for mode in
            (stat.S_IFDIR, stat.S_IFIFO, stat.S_IFCHR, stat.S_IFBLK, stat.S_IFSOCK, stat.S_IFLNK)}


@pytest.mark.skipif(not hasattr(os, "fchmod"), reason="no flock/fchmod here")
def test_kills_leftover_temps_are_exactly_the_files_own(tmp_path):
    """kills: _files.py ``leftover_temps`` ``{'[a-z0-9_]' * 8}`` -> ``*`` (the temporaries of ``NAME.best`` beside
    ``NAME``, and in-flight ones with other names, were taken for ``NAME``'s leftovers and removed). The reference:
    the names ``tempfile.mkstemp(prefix=".NAME.", suffix=".tmp")`` makes."""
    import tempfile

    target = tmp_path / "ckpt[1].pt"
    own = [Path(tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=tmp_path)[1]) for _ in range(3)]
    other = Path(tempfile.mkstemp(prefix=f".{target.name}.best.", suffix=".tmp", dir=tmp_path)[1])
    (tmp_path / f".{target.name}.x.tmp").write_text("")  # not 8 random characters
    assert sorted(_files.leftover_temps(target)) == sorted(own)
    assert list(_files.leftover_temps(tmp_path / f"{target.name}.best")) == [other]


# ---- _imports.py -------------------------------------------------------------------------------------------------


def test_kills_lazy_export_is_kept_in_the_modules_globals():
    """kills: _imports.py ``_lazy_exports`` ``setattr(sys.modules[module], name, value)`` dropped (each access of a
    lazy name went through the hook and ``import_module`` again; the docstring promises it is kept in the module's
    globals)."""
    import diffusionformer

    value = diffusionformer.load_run
    from diffusionformer.experiments.reload import load_run

    assert value is load_run and vars(diffusionformer)["load_run"] is load_run


def test_kills_lazy_exports_are_listed_by_dir_before_first_access():
    """kills: _imports.py ``_lazy_exports`` ``__dir__`` ``| set(names)`` dropped (``dir()`` and tab completion did
    not list a lazy name until it had been accessed). Checked on a fresh module of the hook's own making."""
    import sys
    import types

    mod = types.ModuleType("_sitting47_lazy")
    sys.modules[mod.__name__] = mod
    try:
        mod.__getattr__, mod.__dir__ = _imports._lazy_exports(mod.__name__, {"dumps": "json"})
        assert "dumps" in dir(mod) and "dumps" not in vars(mod)
        assert mod.dumps is json.dumps and vars(mod)["dumps"] is json.dumps
        with pytest.raises(AttributeError, match="has no attribute 'loads'"):
            mod.loads  # noqa: B018
    finally:
        del sys.modules[mod.__name__]


# ---- _modes.py ---------------------------------------------------------------------------------------------------


def _model() -> nn.Module:
    model = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5), nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.1)))
    model.train()
    model[2].eval()  # a frozen submodule of a training model
    return model


def _modes(model: nn.Module) -> list[bool]:
    return [m.training for m in model.modules()]


def test_kills_evaluating_overlapping_calls_restore_when_the_last_ends():
    """kills: _modes.py ``_evaluating`` ``if hold[0] == 0:`` -> ``if hold[0] < 2:`` (the first of two overlapping
    calls to end put training mode back while the other was still decoding), and ``del _EVAL_HOLDS[model]``
    dropped (a later call found the finished hold and neither saved the modes nor switched to eval); and
    ``model.eval()`` dropped (the block ran in training mode: dropout on in ``generate``)."""
    model = _model()
    before = _modes(model)
    outer = _evaluating(model)
    outer.__enter__()
    with _evaluating(model):
        assert not any(_modes(model))
    assert not any(_modes(model))  # the outer call is still running
    outer.__exit__(None, None, None)
    assert _modes(model) == before
    with _evaluating(model):  # a later call evaluates again
        assert not any(_modes(model))
    assert _modes(model) == before


# ---- _warnings.py -----------------------------------------------------------------------------------------------


def test_kills_user_stacklevel_is_two_when_every_frame_is_the_packages():
    """kills: _warnings.py ``user_stacklevel`` ``return 2 if frame is None`` -> ``return 1`` (with no frame outside
    the package, a warning named the line of ``warnings.warn`` itself, not its caller's caller as documented).
    Every frame is the package's in a thread started by ``_thread.start_new_thread`` (no ``threading`` frame
    below) on a function whose module is the package's: made here by ``exec`` in such globals."""
    import _thread
    import threading

    from diffusionformer._warnings import user_stacklevel

    done, got = threading.Event(), []
    scope = {"__name__": "diffusionformer._sitting47_probe", "user_stacklevel": user_stacklevel, "got": got,
             "done": done}
    exec("def inner():\n    return user_stacklevel()\n"
         "def outer():\n    try:\n        got.append(inner())\n    finally:\n        done.set()\n", scope)
    _thread.start_new_thread(scope["outer"], ())
    assert done.wait(30)
    assert got == [2]


# ---- data/_unpickle.py -------------------------------------------------------------------------------------------


def _unicode_batch(tmp_path: Path, code_point: int) -> Path:
    """A CIFAR-style batch pickle (protocol 4: raw bytes) whose ``label_names`` is a ``<U1``
    array holding ``code_point`` (written as "a", then the four bytes replaced in the pickle)."""
    import pickle

    raw = pickle.dumps({b"label_names": np.array(["a"], dtype="<U1")}, protocol=4)
    assert raw.count(b"a\x00\x00\x00") == 1
    path = tmp_path / f"batch_{code_point:x}"
    path.write_bytes(raw.replace(b"a\x00\x00\x00", struct.pack("<I", code_point)))
    return path


def test_kills_unicode_code_points_are_checked_at_the_boundary(tmp_path):
    """kills: data/_unpickle.py ``_check_code_points`` ``> 0x10FFFF`` -> ``> 0x110000`` (the first code point past
    Unicode's last, U+110000, passed: NumPy made a ``str`` Python cannot handle). The reference: ``chr`` accepts
    0x10FFFF and refuses 0x110000."""
    chr(0x10FFFF)
    with pytest.raises(ValueError):
        chr(0x110000)
    assert cifar_unpickle(_unicode_batch(tmp_path, 0x10FFFF))["label_names"].tolist() == [chr(0x10FFFF)]
    with pytest.raises(CorruptDataError, match=r"code point 0x110000, beyond U\+10FFFF"):
        cifar_unpickle(_unicode_batch(tmp_path, 0x110000))


class _ArrayWithListData:
    """Pickled as NumPy pickles an array (``_reconstruct(ndarray, (0,), b"b")``, then its state), with a list of ints
    where the state's raw bytes go."""

    def __reduce__(self):
        from numpy.core.multiarray import _reconstruct

        return _reconstruct, (np.ndarray, (0,), b"b"), (1, (3,), np.dtype("u1"), False, [1, 2, 3])


def test_kills_array_data_that_is_not_bytes_is_named(tmp_path):
    """kills: data/_unpickle.py ``_CheckedArray.__setstate__`` ``if not isinstance(data, bytes): raise`` dropped
    (NumPy then refused the list itself, but as "pickle not returning string", naming neither the array data nor
    what it was: the error says what the file holds)."""
    import pickle

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # numpy.core is numpy._core's alias on NumPy 2
        raw = pickle.dumps({b"data": _ArrayWithListData()}, protocol=4)
    path = tmp_path / "batch"
    path.write_bytes(raw)
    with pytest.raises(CorruptDataError, match="array data must be raw bytes, got list"):
        cifar_unpickle(path)


# ---- testing/memory.py -------------------------------------------------------------------------------------------


def test_kills_cpu_allocations_counts_cpu_events_only(monkeypatch):
    """kills: testing/memory.py ``cpu_allocations`` ``"Device Type" ... == 0`` -> ``in (0, 1)`` (a CUDA allocation
    in the call, device type 1 in the trace, was counted as CPU memory). No GPU here: the profiler is replaced by
    one whose trace holds a CPU event, a CUDA event and a CPU event, as a run on a GPU machine writes them."""
    import torch.profiler

    events = [{"name": "[memory]", "args": {"Device Type": 0, "Bytes": 100, "Total Allocated": 100}},
              {"name": "[memory]", "args": {"Device Type": 1, "Bytes": 4096, "Total Allocated": 4096}},
              {"name": "[memory]", "args": {"Device Type": 0, "Bytes": -40, "Total Allocated": 60}},
              {"name": "aten::empty", "args": {}}]

    class FakeProfile:
        def __init__(self, **kwargs):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def export_chrome_trace(self, path):
            with open(path, "w") as f:
                json.dump({"traceEvents": events}, f)

    monkeypatch.setattr(torch.profiler, "profile", FakeProfile)
    assert cpu_allocations(lambda: 7) == (7, [100, -40], [100, 60])


# ---- experiments/plots.py ----------------------------------------------------------------------------------------


def test_kills_final_plot_point_is_the_finite_mean_with_sample_std(tmp_path, monkeypatch):
    """kills: experiments/plots.py the final plot's ``math.isfinite(r.value)`` dropped (one NaN seed made the
    setting's point and error bar NaN: not drawn, where the tables' mean leaves the NaN out); the sample std
    (``ddof=1``) is pinned too. Reference: ``statistics.mean``/``statistics.stdev``
    of the finite values, read back from the real matplotlib error bar."""
    pytest.importorskip("matplotlib")
    import statistics

    from diffusionformer.experiments import load_experiment_config, plots
    from diffusionformer.experiments.results import RunResult

    figs = []
    real = plots._figure
    monkeypatch.setattr(plots, "_figure", lambda *a, **k: figs.append(real(*a, **k)) or figs[-1])
    cfg = load_experiment_config({
        "name": "mk", "seeds": [0, 1, 2],
        "tasks": [{"name": "digits", "dataset": "digits", "model": "vit-digits",
                   "model_overrides": {"dim": 8, "depth": 1, "num_heads": 2},
                   "train": {"max_steps": 2, "batch_size": 8, "warmup_steps": 0}}],
        "operators": [{"name": "attention"}]})
    values = [0.5, 0.8, float("nan")]
    results = [RunResult("digits", "attention", s, "completed", "test_acc", v) for s, v in enumerate(values)]
    out = tmp_path / "mk"
    out.mkdir()
    plots.plot_experiment(out, cfg, results)
    ax = figs[1].axes[0]
    data_line, _, (bars,) = ax.containers[0].lines
    (lo, hi), = [(seg[0][1], seg[1][1]) for seg in bars.get_segments()]
    mean, sd = statistics.mean(values[:2]), statistics.stdev(values[:2])
    assert float(data_line.get_ydata()[0]) == pytest.approx(mean)
    assert (lo, hi) == pytest.approx((mean - sd, mean + sd))


def test_kills_series_steps_in_order_whatever_the_log_order():
    """kills: experiments/plots.py ``_series`` ``for step in sorted(last)`` -> ``for step in last`` (a log whose
    first record of a step came after a later step's, e.g. a resume from an earlier checkpoint, drew its curve
    back and forth in log order)."""
    from diffusionformer.experiments import plots

    records = [{"step": 3, "split": "train", "loss": 0.3}, {"step": 1, "split": "train", "loss": 1.0},
               {"step": 2, "split": "train", "loss": 0.5}, {"step": 2, "split": "eval", "loss": 9.0}]
    assert plots._series(records, "train", "loss") == ([1, 2, 3], [1.0, 0.5, 0.3])


def test_kills_mean_band_leaves_out_runs_without_a_curve():
    """kills: experiments/plots.py ``_mean_band`` ``curves = [c for c in curves if c[0]]`` dropped (a completed run
    whose log holds no record of the split made the steps all runs share empty: no band for its setting at all,
    though the label counts only the runs with a curve). Reference: numpy mean and population std of the others."""
    from diffusionformer.experiments import plots

    x, mean, sd = plots._mean_band([([1, 2, 3], [1.0, 2.0, 4.0]), ([], []), ([2, 3], [3.0, 2.0])])
    assert x.tolist() == [2, 3]
    ref = np.array([[2.0, 4.0], [3.0, 2.0]])
    np.testing.assert_allclose(mean, ref.mean(0))
    np.testing.assert_allclose(sd, ref.std(0))
