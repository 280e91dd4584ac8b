"""Mutation kills (sitting 52d) for the least-audited modules: ``models/_graph_pe.py`` (the graph transformer's
positional-encoding transforms) and ``data/_unpickle.py`` (the restricted NumPy unpickling of CIFAR / Planetoid
files). Each "Pin:" test checks behaviour against an independent expectation (hand-computed values, the
documented contract), so that a mutant of the condition or constant it names fails."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from torch_geometric.data import Data

from diffusionformer.data import _unpickle as up
from diffusionformer.models import GraphTransformerConfig, positional_encoding_transform
from diffusionformer.models._graph_pe import _canonical_signs, _check_pe_edge_weight, _PrivateDraws

_PATH_EI = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])  # undirected path 0 - 1 - 2


def test_pin_edge_weight_values_are_read_only_on_cpu() -> None:
    """Pin: the value checks of the PE's edge_weight run only where ``checks_values`` allows (documented: "read on
    CPU in eager mode"); a meta-device weight (no values) passes the shape checks and is not read (mutant: the
    ``checks_values`` guard dropped, ``bool()`` of a meta tensor raised)."""
    w = torch.full((4,), -1.0, device="meta")
    assert _check_pe_edge_weight(Data(edge_index=_PATH_EI, edge_weight=w, num_nodes=3), "random-walk") is None
    with pytest.raises(ValueError, match="non-negative"):  # the same weights on CPU are refused
        _check_pe_edge_weight(Data(edge_index=_PATH_EI, edge_weight=torch.full((4,), -1.0), num_nodes=3), "x")


def test_pin_edge_weight_shape_and_dtype_are_checked() -> None:
    """Pin: an edge_weight of shape (E, 1) is a ValueError naming (E,) (mutant: only ``shape[0]`` compared), a
    complex one a TypeError (mutant: the complex check dropped, ``w < 0`` raised a RuntimeError)."""
    pe_of = positional_encoding_transform(GraphTransformerConfig(pe="random_walk", pe_dim=2))
    with pytest.raises(ValueError, match=r"shape \(E,\) = \(4,\), got \(4, 1\)"):
        pe_of(Data(edge_index=_PATH_EI, edge_weight=torch.ones(4, 1), num_nodes=3))
    with pytest.raises(TypeError, match="real weights"):
        pe_of(Data(edge_index=_PATH_EI, edge_weight=torch.ones(4, dtype=torch.complex64), num_nodes=3))


def test_pin_private_draws_take_an_explicit_none_generator_too() -> None:
    """Pin: under ``_PrivateDraws`` a random factory given ``generator=None`` draws from the private generator (the
    global one is not advanced), as one given none does (mutant: only a missing ``generator`` key replaced)."""
    state = torch.get_rng_state()
    with _PrivateDraws():
        a = torch.rand(3, generator=None)
        b = torch.randint(0, 10, (4,))
    assert torch.equal(torch.get_rng_state(), state)
    g = torch.Generator().manual_seed(0)
    assert torch.equal(a, torch.rand(3, generator=g)) and torch.equal(b, torch.randint(0, 10, (4,), generator=g))


def test_pin_canonical_signs_of_no_columns_and_of_ties() -> None:
    """Pin: an empty PE (N x 0, 0 x k) comes back as it is (mutant: the empty guard dropped, argmax over 0 rows
    raised; not reachable through the transform, which calls it with N >= 2 rows);
    each column is signed by its first entry of largest magnitude, negatives included (hand-computed)."""
    assert _canonical_signs(torch.zeros(3, 0)).shape == (3, 0) and _canonical_signs(torch.zeros(0, 2)).shape == (0, 2)
    pe = torch.tensor([[0.1, 0.5, -0.2], [-0.7, -0.5, 0.2], [0.3, 0.0, 0.0]])
    want = torch.tensor([[-0.1, 0.5, 0.2], [0.7, -0.5, -0.2], [-0.3, 0.0, 0.0]])  # col 3: -0.2 first
    assert torch.equal(_canonical_signs(pe), want)


def _empty() -> np.ndarray:
    return up._reconstruct(up._NDARRAY, (0,), b"b")


@pytest.mark.parametrize("version", [None, 1])
def test_pin_array_state_of_four_or_five_items(version) -> None:
    """Pin: an array state ``(shape, dtype, fortran, data)`` of 4 items (NumPy's older format) is accepted as well
    as ``(version, ...)`` of 5 (mutant: only 5 items allowed); the data are the declared little-endian int32s."""
    state = ((3,), np.dtype("<i4"), False, np.array([1, -2, 3], "<i4").tobytes())
    arr = _empty()
    arr.__setstate__(state if version is None else (version, *state))
    assert up._plain(arr).tolist() == [1, -2, 3] and type(up._plain(arr)) is np.ndarray
    with pytest.raises(pickle.UnpicklingError, match="4 or 5 items"):
        _empty().__setstate__(state[1:])


def test_pin_codecs_encode_takes_only_str_to_latin1_strict() -> None:
    """Pin: ``_codecs.encode`` turns a str into latin1 bytes under both spellings Python accepts ("latin1",
    "latin-1"; mutant: "latin-1" refused) and refuses another ``errors`` (mutant: ``errors`` ignored) or
    encoding."""
    enc = up._NUMPY_GLOBALS["_codecs", "encode"]
    assert enc("\xe9a", "latin1") == b"\xe9a" and enc("\xff", "latin-1") == b"\xff"
    for args in (("a", "latin1", "ignore"), ("a", "utf-8"), (b"a", "latin1")):
        with pytest.raises(pickle.UnpicklingError, match="not allowed"):
            enc(*args)


def test_pin_scalar_reads_python2_str_data_as_latin1() -> None:
    """Pin: a scalar whose data is a str (Python 2's, read with encoding="latin1") is read as its latin1 bytes
    (mutant: the str case dropped, a str refused): b"\\x01\\x00\\x00\\x00" is int32 1, "\\xff\\xff" int16 -1."""
    scalar = up._NUMPY_GLOBALS["numpy.core.multiarray", "scalar"]
    assert scalar(np.dtype("<i4"), "\x01\x00\x00\x00") == 1
    assert scalar(np.dtype("<i2"), "\xff\xff") == -1
    with pytest.raises(pickle.UnpicklingError, match="raw bytes"):
        scalar(np.dtype("<i4"), [1])


def test_pin_unicode_code_points_read_in_the_declared_byte_order() -> None:
    """Pin: the U+10FFFF check reads the data in the dtype's byte order (mutant: always little-endian, so U+0001
    stored big-endian read as 0x01000000 and refused), and empty unicode data is fine (mutant: ``max`` of no
    codes raised a ValueError)."""
    big = np.array(["\x01A"], ">U2")
    arr = _empty()
    arr.__setstate__((1, (1,), np.dtype(">U2"), False, big.tobytes()))
    assert up._plain(arr).tolist() == ["\x01A"]
    up._check_code_points(np.dtype("<U0"), b"", "an array")  # no codes: nothing to refuse
    with pytest.raises(pickle.UnpicklingError, match="0x110000"):
        up._check_code_points(np.dtype(">U1"), (0x110000).to_bytes(4, "big"), "an array")


def test_pin_plain_turns_arrays_in_lists_and_attributes_into_ndarrays() -> None:
    """Pin: ``_plain`` replaces a checked array inside a list (mutant: list items skipped) and one held as an
    attribute of an object (SciPy's matrices; mutant: attributes skipped) by a plain ndarray of the same values."""

    class Holder:
        pass

    def checked(values):
        a = _empty()
        a.__setstate__((1, (len(values),), np.dtype("<i8"), False, np.array(values, "<i8").tobytes()))
        return a

    out = up._plain({"x": [checked([1, 2]), [checked([3])]]})
    assert [type(v) for v in (out["x"][0], out["x"][1][0])] == [np.ndarray, np.ndarray]
    assert out["x"][0].tolist() == [1, 2] and out["x"][1][0].tolist() == [3]
    h = Holder()
    h.data = checked([5, 6])
    assert type(up._plain(h).data) is np.ndarray and h.data.tolist() == [5, 6]


def test_pin_plain_dtype_is_a_fresh_copy_without_extras() -> None:
    """Pin: an allowed dtype comes back as a fresh dtype of the same ``str`` and nothing else (its metadata, which
    a pickled dtype's state may set, dropped; mutant: the pickled dtype object handed on as it came)."""
    d = np.dtype(">i4", metadata={"x": [1]})
    out = up._plain_dtype(d, "an array")
    assert out == np.dtype(">i4") and out.metadata is None and out.str == ">i4"


def test_pin_random_walk_pe_of_integer_and_bfloat16_weights_is_computed_in_float() -> None:
    """Pin: on the path 0 -1- 1, 1 -2- 0, 1 -3- 2, 2 -4- 1 (directed weights) the 2-step return probabilities are
    P01 P10 = 0.4, P10 P01 + P12 P21 = 1, P21 P12 = 0.6 (hand-computed), for integer and bfloat16 weights alike:
    the walk's matrix is computed in at least the default float dtype (mutant: bfloat16 kept, 0.4 read 0.4004)."""
    pe_of = positional_encoding_transform(GraphTransformerConfig(pe="random_walk", pe_dim=2))
    want = torch.tensor([[0.0, 0.4], [0.0, 1.0], [0.0, 0.6]])
    for w in (torch.tensor([1, 2, 3, 4]), torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.bfloat16)):
        pe = pe_of(Data(edge_index=_PATH_EI, edge_weight=w, num_nodes=3)).pe
        assert pe.dtype == torch.get_default_dtype()
        torch.testing.assert_close(pe, want, rtol=0, atol=1e-6)
