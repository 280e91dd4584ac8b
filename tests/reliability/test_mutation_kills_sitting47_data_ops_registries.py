"""Mutation audit (sitting 47) of data/csbm.py, data/checksums.py, ops/csr.py, train/batch.py, train/metrics.py,
models/registry.py, operators/registry.py and config.py: tests that kill mutants the earlier tests left alive (each
docstring names the mutant). No GPU is used.

79 mutants (csbm.py 11, checksums.py 8, csr.py 9, batch.py 8, metrics.py 10, models/registry.py 11,
operators/registry.py 12, config.py 10): 70 killed by earlier tests (the module's doctests included), 8 survivors
killed here (checksums.py 2, csr.py 2, metrics.py 2, config.py 2), 1 equivalent:

* checksums.py ``verify_file`` ``if expected is not None and actual == expected:`` -> ``if actual == expected:``:
  ``actual`` is a hex string, never ``None``, so with no expected hash the comparison is already false.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import warnings
from typing import Literal

import pytest
import torch

from diffusionformer import config
from diffusionformer.data import checksums
from diffusionformer.ops.csr import EdgeLayout
from diffusionformer.train.metrics import MetricsLog, read_metrics


# ----------------------------------------------------------------------------- data/checksums.py


def test_kills_sha256_file_cache_without_ctime(tmp_path):
    """kills: data/checksums.py ``sha256_file`` ``key = (..., st.st_mtime_ns, st.st_ctime_ns)`` -> ``key = (...,
    st.st_mtime_ns)``: a file rewritten in place (same inode and size) with its mtime put back (``os.utime``) kept
    the old hash in the cache; its ctime changed, and the docstring keys the cache on it. Checked against hashlib."""
    path = tmp_path / "f.bin"
    path.write_bytes(b"aaaa")
    before = path.stat()
    assert checksums.sha256_file(path) == hashlib.sha256(b"aaaa").hexdigest()
    time.sleep(0.05)  # past the kernel's coarse ctime tick
    with open(path, "r+b") as f:  # same inode, same size
        f.write(b"bbbb")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)
    if after.st_ctime_ns == before.st_ctime_ns:
        pytest.skip("the file system kept the ctime")
    assert checksums.sha256_file(path) == hashlib.sha256(b"bbbb").hexdigest()


def test_kills_sha256_file_cache_never_hit(tmp_path, monkeypatch):
    """kills: data/checksums.py ``sha256_file`` ``if key not in _HASH_CACHE:`` -> ``if True:`` (the file was read
    again at every call, though the docstring says its hash is remembered in this process): a second call on the
    unchanged file must not open it."""
    path = tmp_path / "g.bin"
    path.write_bytes(b"abc" * 1000)
    first = checksums.sha256_file(path)
    assert first == hashlib.sha256(b"abc" * 1000).hexdigest()

    def no_open(*args, **kwargs):
        raise AssertionError("sha256_file read a file whose hash it had remembered")

    monkeypatch.setattr(checksums, "open", no_open, raising=False)
    assert checksums.sha256_file(path) == first


# ----------------------------------------------------------------------------- ops/csr.py


def test_kills_edge_layout_sorted_duplicates_are_not_copied():
    """kills: ops/csr.py ``_is_sorted`` ``index[1:] >= index[:-1]`` -> ``index[1:] > index[:-1]``: an input already
    sorted by (target, source) but with a duplicate edge was taken for unsorted and sorted again (``order`` not
    ``None``), though the docstring promises an already sorted input is not copied."""
    ei = torch.tensor([[0, 0, 2, 1], [1, 1, 1, 2]])  # keys dst * N + src: 3, 3, 5, 7
    layout = EdgeLayout(ei, 3)
    assert layout.order is None
    assert layout.src.tolist() == [0, 0, 2, 1] and layout.dst.tolist() == [1, 1, 1, 2]
    assert layout.crow.tolist() == [0, 0, 3, 4]


def test_kills_edge_layout_unstable_sort():
    """kills: ops/csr.py ``EdgeLayout.__init__`` ``torch.sort(key, stable=True)`` -> ``torch.sort(key)``: duplicate
    edges must keep their input order (docstring: "stable, so duplicate edges keep their order"); checked against
    Python's stable ``sorted`` on (target, source)."""
    g = torch.Generator().manual_seed(0)
    N, E = 3, 400  # few distinct edges, many duplicates: the unstable CPU sort reorders equal keys
    ei = torch.randint(0, N, (2, E), generator=g)
    layout = EdgeLayout(ei, N)
    src, dst = ei.tolist()
    expected = sorted(range(E), key=lambda e: (dst[e], src[e]))
    assert layout.order is not None
    assert layout.order.tolist() == expected


# ----------------------------------------------------------------------------- train/metrics.py


def test_kills_read_metrics_warns_for_a_truncated_last_line(tmp_path):
    """kills: train/metrics.py ``_parse_lines`` ``if number != len(lines):`` -> ``if number != len(lines) + 1:`` (a
    run killed mid-write, whose last line is partial, got a "skipping a malformed metrics line" warning at every
    read; the docstring: a truncated last line is skipped, any other malformed line is skipped with a warning)."""
    path = tmp_path / "metrics.jsonl"
    whole = {"step": 1, "split": "train", "loss": 0.5, "metrics": {}}
    path.write_text(json.dumps(whole) + "\n" + '{"step": 2, "split": "tr')
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_metrics(path) == [whole]
    path.write_text('{"step": 2, "split": "tr\n' + json.dumps(whole) + "\n")  # a partial line inside: warned
    with pytest.warns(UserWarning, match=r"metrics.jsonl:1: skipping a malformed metrics line"):
        assert read_metrics(path) == [whole]


def test_kills_inactive_metrics_log_truncates_nothing(tmp_path):
    """kills: train/metrics.py ``MetricsLog.truncate`` ``if not self.active or not self.path.exists():`` -> ``if not
    self.path.exists():`` (a non-zero DDP rank, whose log is inactive and "writes nothing", rewrote rank 0's file on
    resume, dropping its records past the checkpoint)."""
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": s, "split": "train", "metrics": {}}) + "\n" for s in (1, 2, 3)]
    path.write_text("".join(lines))
    before = path.stat()
    assert MetricsLog(path, active=False).truncate(1) == 0
    assert path.read_text() == "".join(lines)
    assert path.stat().st_ino == before.st_ino  # not replaced either
    assert MetricsLog(path).truncate(1) == 2 and path.read_text() == lines[0]


# ----------------------------------------------------------------------------- config.py


@pytest.mark.parametrize("value", [True, False])
def test_kills_literal_int_choice_refuses_a_bool(value):
    """kills: config.py ``check_value`` ``same_type = isinstance(value, type(choice)) and isinstance(value, bool) ==
    isinstance(choice, bool)`` -> ``same_type = isinstance(value, type(choice))``: ``True`` (an int subclass, equal to
    1) passed for ``Literal[0, 1]`` and was stored as the choice 1; a bool is refused where an int is asked for
    (``check_value(True, int, ...)`` raises), and so in a Literal of ints."""
    with pytest.raises(ValueError, match=r"x: expected one of \[0, 1\], got " + repr(value)):
        config.check_value(value, Literal[0, 1], "x")
    assert config.check_value(1, Literal[0, 1], "x") == 1
    assert config.check_value(value, Literal[True, False], "x") is value


def test_kills_closest_choice_case_insensitive_match_first():
    """kills: config.py ``_closest_choice`` ``close = ([c for c in names if c.lower() == folded] or
    difflib.get_close_matches(value, names, n=1) ...`` -> ``close = (difflib.get_close_matches(value, names, n=1)
    ...``: the docstring asks a case-insensitive match first; without it ``"ADAMw"`` was pointed at ``'ADAM'`` (the
    closer spelling, difflib ratio 8/9) instead of ``'adamw'``, the same name in other case."""
    assert config._closest_choice("ADAMw", ["adamw", "ADAM"]) == "adamw"
    assert config._choice_hint("ADAMw", ("adamw", "ADAM")) == " (did you mean 'adamw'?)"
