"""Edge probes of a fresh-eyes review of sitting 54's commits (helper 54g)."""
from __future__ import annotations

import gzip
import struct
import sys

import pytest

from diffusionformer.data import checksums, mnist
from diffusionformer.data.paths import CorruptDataError


@pytest.mark.skipif(sys.platform != "linux", reason="sparse files as on Linux")
def test_bug_mnist_sparse_gzip_refused_before_it_is_hashed(tmp_path, monkeypatch):
    """Bug: ``load_mnist(verify=True)`` hashed each file before reading it (sitting 54: the rewrite check), so a
    sparse ``.gz`` of a terabyte, which :func:`~diffusionformer.data.idx.read_idx_bytes` refuses at once as larger
    than any IDX archive (sitting 41), was first hashed whole (minutes of zeros) before that refusal. The size cap of
    a gzipped file now runs before any hash of it."""
    raw = tmp_path / mnist.RAW
    raw.mkdir(parents=True)
    for stem in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                 "t10k-labels-idx1-ubyte"):
        (raw / f"{stem}.gz").write_bytes(gzip.compress(struct.pack(">II", 0x801, 0)))
    big = raw / "train-images-idx3-ubyte.gz"
    with open(big, "r+b") as f:
        f.truncate((1 << 30) + 1)  # sparse: a gzip member, then zeros past the 1 GiB cap

    def no_whole_hash(path, *args, **kwargs):
        if path.stat().st_size > 1 << 30:
            raise AssertionError(f"{path} hashed whole before its size was checked")
        return real(path, *args, **kwargs)

    real = checksums.sha256_file
    monkeypatch.setattr(checksums, "sha256_file", no_whole_hash)
    monkeypatch.setattr(mnist, "sha256_file", no_whole_hash)
    with pytest.raises(CorruptDataError, match="train-images-idx3-ubyte.gz.*more than any IDX archive"):
        mnist.load_mnist(root=tmp_path, verify=True)
