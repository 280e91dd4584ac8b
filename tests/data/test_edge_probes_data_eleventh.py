"""Edge probes of the IDX reader, the checksum table, associative recall and MNIST-1D (eleventh pass)."""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import pytest
import torch

from diffusionformer.data.checksums import KNOWN_CONTENT_SHA256, verify_file
from diffusionformer.data.idx import parse_idx, read_idx
from diffusionformer.data.paths import ChecksumError
from diffusionformer.data.recall import load_assoc_recall, make_assoc_recall

_BIG_ENDIAN = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def _idx(type_code: int, dims: tuple[int, ...], payload: bytes) -> bytes:
    return bytes([0, 0, type_code, len(dims)]) + struct.pack(f">{len(dims)}I", *dims) + payload


@pytest.mark.parametrize("type_code", sorted(_BIG_ENDIAN))
@pytest.mark.parametrize("dims", [(), (0,), (3, 0), (0, 28, 28), (2, 3)])
def test_idx_matches_numpy_big_endian_for_every_type_and_zero_sizes(type_code, dims, tmp_path):
    """Every IDX type code, a 0-d file and sizes holding a zero decode as ``np.frombuffer`` with the big-endian dtype."""
    dtype = np.dtype(_BIG_ENDIAN[type_code])
    ref = (np.arange(int(np.prod(dims)), dtype=np.int64) * 37 - 50).astype(dtype).reshape(dims)
    raw = _idx(type_code, dims, ref.tobytes())
    path = tmp_path / "f.idx"
    path.write_bytes(raw)
    for got in (parse_idx(raw), read_idx(path)):
        assert tuple(got.shape) == dims
        assert got.numpy().dtype == dtype.newbyteorder("=")
        np.testing.assert_array_equal(got.numpy(), np.frombuffer(raw, dtype=dtype, offset=4 + 4 * len(dims)).reshape(dims))


def test_bug_verify_file_accepts_an_uncompressed_file_whose_hash_is_the_content_hash(tmp_path):
    """Bug: ``verify_file(path, "mnist/MNIST/raw/t10k-labels-idx1-ubyte")`` (an MNIST file stored uncompressed) without
    ``content=`` raised ``ChecksumError`` for the genuine file: "expected SHA256 X (decompressed content), got X",
    the same hash twice, since the content hash was only compared with ``content``'s."""
    rel = "mnist/MNIST/raw/t10k-labels-idx1-ubyte"
    raw = _idx(0x08, (3,), bytes([7, 2, 1]))
    path = tmp_path / "labels"
    path.write_bytes(raw)
    digest = hashlib.sha256(raw).hexdigest()
    table = {rel: digest}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("diffusionformer.data.checksums.KNOWN_CONTENT_SHA256", table)
        assert verify_file(path, rel) == digest
        assert verify_file(path, rel, content=raw) == digest
        path.write_bytes(raw[:-1] + b"\x08")  # one label changed: still refused
        with pytest.raises(ChecksumError, match="decompressed content"):
            verify_file(path, rel)
    assert rel in KNOWN_CONTENT_SHA256  # the key the test stands in for


def test_bug_load_assoc_recall_keeps_sizes_as_python_ints():
    """Bug: ``load_assoc_recall(vocab_size=np.int64(16))`` returned data whose ``vocab_size`` was a ``numpy.int64``
    (and ``meta["keys"]`` numpy ints), ``num_pairs=torch.tensor(3)`` left a tensor in ``meta["num_pairs"]``, and
    ``num_queries=torch.tensor(2)`` was refused ("must be an int ... got tensor(2)") where ``num_pairs`` took one."""
    data = load_assoc_recall(num_examples=20, num_pairs=torch.tensor(3), vocab_size=np.int64(16),
                             num_queries=torch.tensor(2))
    assert type(data.vocab_size) is int and data.vocab_size == 16
    assert type(data.meta["num_pairs"]) is int and type(data.meta["num_queries"]) is int
    assert all(type(v) is int for v in data.meta["keys"] + data.meta["values"])
    ref = load_assoc_recall(num_examples=20, num_pairs=3, vocab_size=16, num_queries=2)
    assert torch.equal(data.x_train, ref.x_train) and torch.equal(data.y_test, ref.y_test)
    x, y = make_assoc_recall(4, 3, 16, torch.Generator().manual_seed(0), num_queries=torch.tensor(2))
    assert x.shape == y.shape == (4, 8)
    with pytest.raises(ValueError, match="num_queries must be an int"):
        make_assoc_recall(4, 3, 16, torch.Generator(), num_queries=torch.tensor(2.0))


def _reference_recall(N, P, V, g, Q):
    """A hand-written generator with the same draws: keys, values, then the queried pairs."""
    K = V // 2
    keys = torch.rand(N, K, generator=g).argsort(1)[:, :P]
    values = torch.randint(K, V, (N, P), generator=g)
    which = torch.randint(0, P, (N, 1), generator=g) if Q == 1 else torch.rand(N, P, generator=g).argsort(1)[:, :Q]
    x = torch.empty(N, 2 * P + Q, dtype=torch.int64)
    y = torch.full_like(x, -100)
    for n in range(N):
        for p in range(P):
            x[n, 2 * p], x[n, 2 * p + 1] = keys[n, p], values[n, p]
        for q in range(Q):
            x[n, 2 * P + q] = keys[n, which[n, q]]
            y[n, 2 * P + q] = values[n, which[n, q]]
    return x, y


@pytest.mark.parametrize("N,P,V,Q", [(1, 1, 4, 1), (5, 2, 4, 2), (3, 3, 7, 2), (2, 5, 11, 5), (4, 4, 2**21 + 1, 3)])
def test_recall_matches_a_hand_written_reference(N, P, V, Q):
    x, y = make_assoc_recall(N, P, V, torch.Generator().manual_seed(N + P + Q), num_queries=Q)
    rx, ry = _reference_recall(N, P, V, torch.Generator().manual_seed(N + P + Q), Q)
    assert x.dtype == y.dtype == torch.int64
    assert torch.equal(x, rx) and torch.equal(y, ry)


def test_bug_mnist1d_refuses_a_val_fraction_that_empties_the_train_split():
    """Bug: ``load_mnist1d(num_samples=20, val_fraction=0.99)`` returned 0 training examples (all 16 of the package's
    training examples carved into val); the run failed only at its first step, in ``torch.randint(0, 0)``."""
    pytest.importorskip("mnist1d")
    from diffusionformer.data.sequences import load_mnist1d

    with pytest.raises(ValueError, match=r"mnist1d: val_fraction=0.99 leaves the train split empty"):
        load_mnist1d(num_samples=20, val_fraction=0.99)
    data = load_mnist1d(num_samples=20, val_fraction=0.5)
    assert len(data.x_train) == len(data.x_val) == 8
