"""Mutation audit (helper 60d) of ``graph/interop.py``, ``data/_unpickle.py`` and ``experiments/reload.py``.

Each test kills a hand-made mutant that the covering tests let live, against an expectation worked out by hand, from
PyG or from pickle's own semantics:

- ``self_loops=1`` (an int, not a bool) was refused only by the check that a mutant widened to ints;
- the bounds check before PyG's self-loop surgery could go: no test gave an out-of-range *self loop* with
  ``self_loops`` set (``remove_self_loops`` then drops it silently, which the docstring says does not happen);
- ``from_networkx`` could reorder the edges (its docstring: "Edges keep ``G.edges`` order", as PyG's);
- the restricted unpicklers' allow-list could grow (``builtins.getattr``, ``numpy.load``) with no test failing, and
  four of their refusals (a void dtype, a dtype given as a str, ``_reconstruct`` of another type, ``_codecs.encode``
  to another codec) could go, leaving a later or less clear error;
- ``load_run``: the " ..." after three non-finite parameters, the ``absolute()`` that finds the manifest of a
  relative ``load_run("seed0")``, and the hidden folders left out of a missing seed's listing could each go.

Hostile pickles (GLOBAL, STACK_GLOBAL, INST, OBJ, REDUCE, NEWOBJ, protocols 0 to 5) naming ``os.system``,
``builtins.eval``, ``getattr``, ``numpy.load`` and ``torch.storage._load_from_bytes`` are refused by both loaders
(CIFAR batches, Planetoid ``ind.*`` files) with the global's name, and run nothing.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
import torch

from diffusionformer.data import CorruptDataError
from diffusionformer.data.cifar10 import read_cifar_batch
from diffusionformer.data.planetoid import _unpickle_planetoid
from diffusionformer.graph import from_edge_index, from_networkx


# ---------------------------------------------------------------------------------------------------- interop


@pytest.mark.parametrize("self_loops", [1, 0])
def test_self_loops_must_be_a_bool_not_an_int(self_loops: int) -> None:
    pytest.importorskip("torch_geometric")
    # the documented values are None, True and False: an int 1 or 0 is a TypeError naming the argument
    with pytest.raises(TypeError, match="self_loops must be None"):
        from_edge_index(torch.tensor([[0, 1], [1, 0]]), 3, self_loops=self_loops)


@pytest.mark.parametrize("self_loops", [True, False])
def test_an_out_of_range_self_loop_is_refused_not_removed(self_loops: bool) -> None:
    pytest.importorskip("torch_geometric")  # the self-loop surgery is PyG's
    # node 3 of a 3-node graph: remove_self_loops would drop the (3, 3) loop without a word
    edge_index = torch.tensor([[0, 3], [1, 3]])
    with pytest.raises(ValueError, match="num_nodes"):
        from_edge_index(edge_index, 3, self_loops=self_loops)


def test_from_networkx_keeps_the_edge_order_of_g_edges_as_pyg_does() -> None:
    nx = pytest.importorskip("networkx")
    pytest.importorskip("torch_geometric")
    from torch_geometric.utils import from_networkx as pyg_from_networkx

    G = nx.DiGraph([(2, 0), (0, 1), (1, 2)])  # nodes 2, 0, 1 in insertion order: indices 0, 1, 2
    # by hand: (2, 0) -> (0, 1), (0, 1) -> (1, 2), (1, 2) -> (2, 0)
    expected = torch.tensor([[0, 1, 2], [1, 2, 0]])
    assert torch.equal(pyg_from_networkx(G).edge_index, expected)
    assert torch.equal(from_networkx(G).edge_index, expected)


# ---------------------------------------------------------------------------------------------------- unpickling

_MARK_NAME = "ran_60d"


def _s(b: bytes) -> bytes:  # SHORT_BINUNICODE
    return b"\x8c" + bytes([len(b)]) + b


def _u(b: bytes) -> bytes:  # BINUNICODE
    return b"X" + struct.pack("<I", len(b)) + b


def _hostile(mark: Path) -> dict[str, bytes]:
    cmd = f"touch {mark}".encode()
    return {
        "GLOBAL os.system, protocol 0": b"cos\nsystem\n(S'" + cmd + b"'\ntR.",
        "GLOBAL posix.system, protocol 2": b"\x80\x02cposix\nsystem\n" + _u(cmd) + b"\x85R.",
        "STACK_GLOBAL os.system, protocol 4": b"\x80\x04" + _s(b"os") + _s(b"system") + b"\x93" + _s(cmd) + b"\x85R.",
        "STACK_GLOBAL builtins.eval, protocol 5": b"\x80\x05" + _s(b"builtins") + _s(b"eval") + b"\x93"
        + _s(b"__import__('os').system('" + cmd + b"')") + b"\x85R.",
        "INST os.system, protocol 0": b"(S'" + cmd + b"'\nios\nsystem\n.",
        "OBJ subprocess.Popen, protocol 1": b"(csubprocess\nPopen\n(S'touch'\nS'" + str(mark).encode() + b"'\nlo.",
        "NEWOBJ builtins.getattr, protocol 2": b"\x80\x02cbuiltins\ngetattr\n)\x81.",
        "getattr chain, protocol 3": b"\x80\x03cbuiltins\ngetattr\ncbuiltins\n__import__\n" + _u(b"os") + b"\x85R"
        + _u(b"system") + b"\x86R" + _u(cmd) + b"\x85R.",
        "numpy.load allow_pickle, protocol 4": b"\x80\x04" + _s(b"numpy") + _s(b"load") + b"\x93" + _s(b"/x.npy")
        + b"\x88\x86R.",
        "torch.storage._load_from_bytes, protocol 2": b"\x80\x02ctorch.storage\n_load_from_bytes\nC\x01a\x85R.",
        "dotted attribute chain of an allowed global, protocol 4": b"\x80\x04" + _s(b"numpy")
        + _s(b"dtype.__init__.__globals__") + b"\x93.",
    }


_HOSTILE_NAMES = list(_hostile(Path("x")))
_GLOBALS = {"GLOBAL os": "os.system", "GLOBAL posix": "posix.system", "STACK_GLOBAL os": "os.system",
            "STACK_GLOBAL builtins": "builtins.eval", "INST": "os.system", "OBJ": "subprocess.Popen",
            "NEWOBJ": "builtins.getattr", "getattr": "builtins.getattr", "numpy.load": "numpy.load",
            "torch.storage": "torch.storage._load_from_bytes", "dotted": "numpy.dtype.__init__.__globals__"}


@pytest.mark.parametrize("loader", ["cifar", "planetoid"])
@pytest.mark.parametrize("name", _HOSTILE_NAMES)
def test_hostile_pickles_are_refused_by_name_and_run_nothing(tmp_path: Path, name: str, loader: str) -> None:
    mark = tmp_path / _MARK_NAME
    path = tmp_path / "data_batch_1"
    path.write_bytes(_hostile(mark)[name])
    glob = next(g for k, g in _GLOBALS.items() if name.startswith(k))
    with pytest.raises(CorruptDataError, match=f"global {glob} is not allowed"):
        read_cifar_batch(path) if loader == "cifar" else _unpickle_planetoid(path)
    assert not mark.exists()


def _array(dtype_spec: bytes, data: bytes) -> bytes:
    """A protocol-2 pickle of one array as NumPy writes it: ``_reconstruct(ndarray, (0,), b"b")`` then its state."""
    return (b"\x80\x02cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK\x00\x85C\x01b\x87R"
            b"(K\x01K\x01\x85cnumpy\ndtype\n" + _u(dtype_spec) + b"\x85R\x89C" + bytes([len(data)]) + data + b"tb.")


_REFUSED = {
    # a void dtype is neither a boolean, a number nor a fixed-width string (the module's allow-list)
    "void array": (_array(b"V4", b"abcd"), r"dtype\('V4'\) is not allowed"),
    # numpy.core.multiarray.scalar takes a dtype: a str in its place is refused by name, not an AttributeError
    "scalar of a str dtype": (b"\x80\x02cnumpy.core.multiarray\nscalar\n" + _u(b"i4") + b"C\x04\x01\x00\x00\x00\x86R.",
                              "a scalar of dtype 'i4' is not allowed"),
    # NumPy's pickles call _reconstruct(ndarray, (0,), b"b") only
    "_reconstruct of a dtype": (b"\x80\x02cnumpy.core.multiarray\n_reconstruct\ncnumpy\ndtype\nK\x00\x85C\x01b\x87R.",
                                r"_reconstruct\(\w+, \(0,\), \.\.\.\) is not allowed"),
    # Python 3 writes bytes at protocol 2 as _codecs.encode(str, "latin1"): any other codec is refused
    "_codecs.encode to hex": (b"\x80\x02c_codecs\nencode\n" + _u(b"ab") + _u(b"hex") + b"\x86R.",
                              r"_codecs.encode\(str, 'hex'\) is not allowed"),
}


@pytest.mark.parametrize("name", list(_REFUSED))
def test_what_numpy_never_writes_is_refused_by_the_restricted_unpickler(tmp_path: Path, name: str) -> None:
    raw, message = _REFUSED[name]
    path = tmp_path / "data_batch_1"
    path.write_bytes(raw)
    with pytest.raises(CorruptDataError, match=message):
        read_cifar_batch(path)


# ---------------------------------------------------------------------------------------------------- reload


def test_load_run_names_three_non_finite_parameters_and_says_there_are_more(tmp_path: Path, run_folder) -> None:
    from diffusionformer import load_run
    from diffusionformer.train import CheckpointError
    from diffusionformer.train.checkpoint import load_checkpoint, save_checkpoint

    rdir, model = run_folder(tmp_path / "runs" / "digits" / "op" / "seed0")
    payload = load_checkpoint(rdir / "checkpoint.pt")
    names = [n for n, _ in model.named_parameters()][:4]  # four NaN parameters: three named, then " ..."
    for n in names:
        payload["model"][n] = torch.full_like(payload["model"][n], float("nan"))
    save_checkpoint(rdir / "checkpoint.pt", payload)
    with pytest.raises(CheckpointError, match=r"NaN or inf in \['[^]]+'\] \.\.\.$") as info:
        load_run(rdir)
    assert str(names[:3]) in str(info.value) and repr(names[3]) not in str(info.value)


def test_load_run_of_a_relative_seed_folder_names_the_recorded_import(tmp_path: Path, monkeypatch) -> None:
    import json

    from diffusionformer import load_run

    out = tmp_path / "out" / "cmp"  # <out>/<name>/manifest.json above runs/<task>/<operator>/seed<k>
    rdir = out / "runs" / "digits" / "mine" / "seed0"
    rdir.mkdir(parents=True)
    (rdir / "run_config.json").write_text(json.dumps({"model": "no-such-preset-60d", "model_config": {}}))
    (out / "manifest.json").write_text(json.dumps(
        {"command": "python -m diffusionformer.experiments run cfg.toml --import my_presets_60d"}))
    monkeypatch.chdir(rdir.parent)  # load_run("seed0") from inside the operator's folder
    with pytest.raises(ValueError, match="no-such-preset-60d") as info:
        load_run("seed0")
    assert "--import my_presets_60d" in str(info.value)


def test_load_run_of_a_seed_not_run_lists_the_seeds_but_no_hidden_folder(tmp_path: Path) -> None:
    from diffusionformer import load_run

    op = tmp_path / "runs" / "digits" / "mine"
    for name in ("seed0", "seed1", ".seed1.partial"):
        (op / name).mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"no 'seed5' in .*; it holds seed0, seed1\)$"):
        load_run(op / "seed5")
