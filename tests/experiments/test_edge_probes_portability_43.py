"""Portability beyond this Linux box (edge probes, 43): what a user on Windows, macOS or an HPC cluster hits.

Probed: the command line under a stdout that cannot encode every character (a Windows pipe or redirect in the
ANSI code page, ``LC_ALL=C``), results folders and config files whose paths hold spaces and non-ASCII characters,
the run lock's liveness probe on Windows and its claim on a file system without hard links, the neighbour loader's
DataLoader workers under the ``spawn`` start method. Also tried, no bug: ``python -O``, ``HOME`` unset, ``fcntl``
missing, ``DIFFUSIONFORMER_DATA``/``_CACHE`` with spaces and non-ASCII under ``LC_ALL=C``.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

from diffusionformer.experiments.cli import main
from experiments_tiny_configs import TINY_DIGITS_TOML as TINY_TOML


def test_bug_cli_tables_on_a_stdout_in_a_windows_code_page(tmp_path, monkeypatch, capsys):
    """Bug: ``run`` trained every run, then printed its table (``mean ± std``, ``Δ vs attention``) to a stdout in
    the locale's encoding: redirected on Windows (cp1252 has no ``Δ``) or under ``LC_ALL=C`` (ASCII) the print
    raised ``UnicodeEncodeError``, so the command ended in ``error: 'charmap' codec can't encode character`` with
    exit 2 after the runs were done (each ``--workers`` worker, whose stdout is a log file, exited 2 alike). Also in a folder whose path holds spaces
    and non-ASCII characters (config, results folder), and ``summary`` of those results after it."""
    root = tmp_path / "résultats ü Δ"
    root.mkdir()
    cfg = root / "tiny config é.toml"
    cfg.write_text(TINY_TOML, encoding="utf-8")
    out = root / "out dir"
    for argv in (["run", str(cfg), "--out", str(out), "--no-progress"], ["summary", str(cfg), "--out", str(out)]):
        raw = io.BytesIO()
        stream = io.TextIOWrapper(raw, encoding="cp1252", errors="strict", newline="\n")
        monkeypatch.setattr(sys, "stdout", stream)
        code = main(argv)
        stream.flush()
        monkeypatch.undo()
        text = raw.getvalue().decode("cp1252")
        err = capsys.readouterr().err
        assert code == 0, (argv[0], err[-2000:])
        assert "lap" in text and ("+/-" in text and "delta vs attention" in text) == (argv[0] == "run"), text
    assert (out / "tiny" / "results.json").is_file()


class _FakeKernel32:
    """``ctypes.WinDLL("kernel32")`` of a Windows where the processes ``alive`` run (exit code 259 = STILL_ACTIVE)."""

    def __init__(self, alive):
        self.alive, self.closed = set(alive), 0

    def OpenProcess(self, access, inherit, pid):
        return 1000 + pid if pid in self.alive else 0

    def GetExitCodeProcess(self, handle, code_ref):
        code_ref._obj.value = 259
        return 1

    def CloseHandle(self, handle):
        self.closed += 1
        return 1


def test_bug_run_lock_liveness_on_windows_does_not_terminate_the_holder(monkeypatch):
    """Bug: whether a run's ``.lock`` holder still runs was asked with ``os.kill(pid, 0)``, which on Windows is no
    probe but ``TerminateProcess(pid, 0)``: a ``status`` or a second ``run --workers`` worker looking at a run
    killed the process training it (and the dead holder then read as alive). Simulated: ``os.name == "nt"`` with
    ``os.kill`` behaving as Windows' (recorded, not sent) and a stand-in ``kernel32``."""
    import ctypes

    from diffusionformer.experiments import store

    me = os.getpid()
    killed = []
    kernel32 = _FakeKernel32({me})
    monkeypatch.setattr(os, "kill", lambda pid, sig: killed.append((pid, sig)))  # Windows: TerminateProcess
    monkeypatch.setattr(ctypes, "WinDLL", lambda name, use_last_error=False: kernel32, raising=False)
    monkeypatch.setattr(ctypes, "get_last_error", lambda: 87, raising=False)  # ERROR_INVALID_PARAMETER: no such pid
    monkeypatch.setattr(os, "name", "nt")  # only around the probes: pathlib reads it too
    try:
        alive = store._pid_alive(me)
        kernel32.alive.clear()  # the holder exits: its lock is stale
        after = store._pid_alive(me)
    finally:
        monkeypatch.undo()
    assert killed == []
    assert alive and not after
    assert kernel32.closed == 1


_SPAWN_SCRIPT = """
import torch
from torch_geometric.data import Data
from diffusionformer.data.neighbors import neighbor_loader

def draws(**kwargs):
    g = torch.Generator().manual_seed(0)
    data = Data(x=torch.randn(40, 3, generator=g), edge_index=torch.randint(0, 40, (2, 200), generator=g))
    loader = neighbor_loader(data, [3, 2], batch_size=8, generator=torch.Generator().manual_seed(5), force_torch=True,
                             shuffle=True, num_workers=2, **kwargs)
    return [b.n_id.tolist() for _ in range(2) for b in loader]

if __name__ == "__main__":
    torch.multiprocessing.set_sharing_strategy("file_descriptor")  # Linux' default
    spawned = draws(multiprocessing_context="spawn")
    print(spawned == draws(multiprocessing_context="fork"), spawned[:5] != spawned[5:])
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="compares spawn with fork workers, on Linux")
def test_bug_neighbor_loader_with_a_generator_in_spawn_workers(tmp_path):
    """Bug: ``neighbor_loader(..., generator=g, num_workers=2, multiprocessing_context="spawn")`` (the start method
    of macOS and Windows, and the one CUDA users on Linux must take) crashed every worker: a ``torch.Generator``
    pickles its state as a temporary tensor, sent to a spawn worker by file descriptor (Linux' sharing strategy)
    and freed before the worker starts ("bad value(s) in fds_to_keep" / "unable to resize file"). Both the
    sampler's generator and the DataLoader's (pickled with the loader, whose method is the collate_fn) now travel
    as bytes; the spawn workers draw what fork workers draw. In a fresh interpreter, as tests here do not fork."""
    script = tmp_path / "spawn_probe.py"
    script.write_text(_SPAWN_SCRIPT, encoding="utf-8")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["True", "True"], out.stdout


def test_pins_torch_neighbor_sampler_pickles_its_generator_state():
    """A pickled ``TorchNeighborSampler`` draws what the original draws from the same state, and the original keeps
    the caller's generator object (its draws advance the caller's generator)."""
    import pickle

    import torch
    from torch_geometric.data import Data

    from diffusionformer.data.neighbors import TorchNeighborSampler, neighbor_batch

    g = torch.Generator().manual_seed(0)
    data = Data(x=torch.randn(30, 2, generator=g), edge_index=torch.randint(0, 30, (2, 120), generator=g))
    gen = torch.Generator().manual_seed(7)
    torch.rand(3, generator=gen)  # not a fresh seed's state
    sampler = TorchNeighborSampler(data, [2, 2], gen)
    copy = pickle.loads(pickle.dumps(sampler))
    assert sampler.generator is gen and copy.generator is not gen
    seeds = torch.tensor([0, 5, 9])
    for _ in range(2):
        a, b = neighbor_batch(data, sampler, seeds), neighbor_batch(data, copy, seeds)
        assert a.n_id.tolist() == b.n_id.tolist() and a.e_id.tolist() == b.e_id.tolist()
    assert torch.equal(gen.get_state(), copy.generator.get_state())


def test_bug_run_lock_on_a_file_system_without_hard_links(tmp_path, monkeypatch):
    """Bug: a run's ``.lock`` was claimed by ``os.link`` only; on a results folder on a file system without hard
    links (FAT/exFAT drives, some network and FUSE mounts of clusters) it failed with a bare
    ``PermissionError: [Errno 1] Operation not permitted: '.lock.<pid>.<hex>.tmp' -> '.lock'`` and no run could
    start. Now the lock is created exclusively there, with the same record, and still refuses a second holder."""
    import errno
    import platform

    from diffusionformer.experiments import store

    def no_links(src, dst):
        raise PermissionError(errno.EPERM, "Operation not permitted", str(src), None, str(dst))

    monkeypatch.setattr(os, "link", no_links)
    rdir = tmp_path / "run"
    assert store.acquire_lock(rdir) is None
    assert store.read_lock(rdir) == (os.getpid(), platform.node())
    assert store.live_holder(rdir) == (os.getpid(), platform.node())
    assert [p.name for p in rdir.iterdir()] == [store.LOCK_NAME]  # no claim temporary left
    assert store.acquire_lock(rdir) is None  # held already, by this process
    store.release_lock(rdir)
    assert list(rdir.iterdir()) == []
    # a live holder of another process: refused, as with hard links
    other = rdir / store.LOCK_NAME
    other.write_text('{"pid": %d, "host": "%s"}' % (os.getppid(), platform.node()), encoding="utf-8")
    assert store.acquire_lock(rdir) == f"process {os.getppid()} on {platform.node()}"
    assert other.read_text(encoding="utf-8").startswith('{"pid": %d' % os.getppid())
