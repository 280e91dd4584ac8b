"""Edge probes: resource leaks (temporary files left behind on error paths)."""

from __future__ import annotations

import errno

import pytest
import torch

from diffusionformer.experiments import analyze, store


def _full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_bug_acquire_lock_leaves_no_temporary_when_its_write_fails(tmp_path, monkeypatch):
    """Bug: ``acquire_lock`` wrote its ``.lock.<pid>.<random>.tmp`` outside the ``try`` whose ``finally`` removes it:
    a write or fsync that failed (a full disk) left the temporary in the run's folder, a new one (a new random
    name) on every try. The run's folder now holds nothing after the error."""
    rdir = tmp_path / "run"
    monkeypatch.setattr(store.os, "fsync", _full_disk)
    for _ in range(2):
        with pytest.raises(OSError, match="No space left"):
            store.acquire_lock(rdir)
    assert sorted(p.name for p in rdir.iterdir()) == []
    monkeypatch.undo()
    assert store.acquire_lock(rdir) is None  # the lock still works once the disk has room
    assert sorted(p.name for p in rdir.iterdir()) == [store.LOCK_NAME]
    store.release_lock(rdir)
    assert sorted(p.name for p in rdir.iterdir()) == []


def test_bug_analyze_cache_store_leaves_no_partial_temporary(tmp_path, monkeypatch):
    """Bug: ``analyze``'s cache writer (``_store``) ``torch.save``-d to ``<cache>.tmp`` and renamed it, with no
    cleanup: a save that failed half way (a full disk, an interrupt) left the partial ``analysis_cache.pt.tmp`` in
    the run's folder. Now it is removed and the error raised; the earlier cache stays whole."""
    path = tmp_path / analyze._CACHE_NAME
    analyze._store(path, {"k": 1}, {"r": 1.0})
    before = path.read_bytes()

    def partial_save(obj, f, *args, **kwargs):
        with open(f, "wb") as out:
            out.write(b"PK\x03\x04partial")
        _full_disk()

    monkeypatch.setattr(analyze.torch, "save", partial_save)
    with pytest.raises(OSError, match="No space left"):
        analyze._store(path, {"k": 2}, {"r": 2.0})
    assert sorted(p.name for p in tmp_path.iterdir()) == [analyze._CACHE_NAME]
    assert path.read_bytes() == before
    monkeypatch.undo()
    assert analyze._cached(path, {"k": 1}) == {"r": 1.0}
    assert isinstance(torch.load(path, weights_only=True), dict)
