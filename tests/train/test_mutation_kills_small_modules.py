"""Tests written in a mutation-testing audit of the small modules that no audit had covered: the
full-graph metrics of the task adapters (``experiments/_metrics.py``), the lazy imports of the optional
data packages (``data/_optional.py``), the ahead-of-time Triton builds (``ops/triton/_aot.py``), the
``python -m diffusionformer.experiments`` entry point (``experiments/__main__.py``), the file mode of
temporary files (``_files.py``), the training exceptions (``train/errors.py``), moving batches between
devices (``train/batch.py``) and the learning-rate schedule (``train/schedule.py``, whose every mutant
the existing tests already killed).

Each test kills a mutant of the library code that the rest of the suite let through (its docstring
names it: file and mutation) and checks the code against an independent reference: losses and
accuracies computed by hand with numpy, error messages and PTX listings written out by hand, file
modes from a file that ``open()`` creates, batches moved to the ``meta`` device, and a stand-in for
``triton.compile`` that records what it is given (so no GPU and no ``ptxas`` are needed). Mutants judged
equivalent are listed, with the reason, at the end of the file.
CPU only, deterministic, no network; files only under ``tmp_path``.
"""

from __future__ import annotations

import io
import os
import runpy
import sys
from collections import OrderedDict, defaultdict, namedtuple
from collections.abc import Mapping
from types import MappingProxyType, SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from diffusionformer import _files
from diffusionformer.data._optional import import_optional
from diffusionformer.experiments._metrics import accuracy, full_graph_metrics
from diffusionformer.train import errors as train_errors
from diffusionformer.train.batch import to_device
from diffusionformer.train.errors import CheckpointError, NonFiniteLossError

META = torch.device("meta")


# --------------------------------------------------------------------------- experiments/_metrics.py

# 7 nodes, 3 classes; logits are multiples of 1/4 (exact in bfloat16)
LOGITS = np.array([[2.0, 0.0, -1.0],    # train, label 0 (right)
                   [0.0, 3.0, 0.5],     # train, label 2 (wrong)
                   [1.0, 1.25, 0.0],    # val,   label 1 (right)
                   [0.5, -0.5, 2.0],    # val,   label 0 (wrong)
                   [0.0, 0.0, 1.5],     # val,   label 2 (right)
                   [-1.0, 2.5, 0.25],   # test,  label 1 (right)
                   [3.0, 0.75, 0.0]])   # test,  label 2 (wrong)
LABELS = np.array([0, 2, 1, 0, 2, 1, 2])
SPLIT = {"train": [0, 1], "val": [2, 3, 4], "test": [5, 6]}


def _ce(rows):
    """Mean cross-entropy of ``rows`` by hand: log-sum-exp minus the label's logit."""
    z = LOGITS[rows]
    lse = np.log(np.exp(z).sum(axis=1))
    return float(np.mean(lse - z[np.arange(len(rows)), LABELS[rows]]))


class _FixedLogits(nn.Module):
    """A 'model' that returns the table above (in ``dtype``) and records whether autograd was on."""

    def __init__(self, dtype=torch.float32):
        super().__init__()
        self.w = nn.Parameter(torch.tensor(LOGITS, dtype=torch.float32))
        self.dtype = dtype
        self.grad_enabled = []

    def forward(self, x, edge_index):
        assert x.shape == (7, 4) and edge_index.shape[0] == 2
        self.grad_enabled.append(torch.is_grad_enabled())
        return self.w.to(self.dtype)


def _node_data():
    from torch_geometric.data import Data

    from diffusionformer.data.base import NodeData

    masks = {}
    for split, rows in SPLIT.items():
        m = torch.zeros(7, dtype=torch.bool)
        m[rows] = True
        masks[f"{split}_mask"] = m
    data = Data(x=torch.zeros(7, 4), edge_index=torch.tensor([[0, 1], [1, 0]]), y=torch.tensor(LABELS), **masks)
    return NodeData(name="hand", data=data, num_classes=3, num_features=4)


def test_full_graph_metrics_are_the_masked_losses_and_accuracies_computed_by_hand():
    """kills: _metrics.py ``for split in ("val", "test")`` -> ``("val", "val")``; ``out["loss"] = out["val_loss"]``
    -> ``test_loss`` or dropped; the masks ignored (``logits``/``d.y`` for ``logits[m]``/``d.y[m]``, both for the
    loss and the accuracy) or the train mask used; ``reduction="sum"``; ``F.nll_loss`` for ``F.cross_entropy``."""
    out = full_graph_metrics(_FixedLogits(), _node_data())
    assert sorted(out) == ["loss", "test_acc", "test_loss", "val_acc", "val_loss"]
    assert out["val_loss"] == pytest.approx(_ce(SPLIT["val"]), rel=1e-6)
    assert out["test_loss"] == pytest.approx(_ce(SPLIT["test"]), rel=1e-6)
    assert out["val_acc"] == pytest.approx(2 / 3)
    assert out["test_acc"] == pytest.approx(1 / 2)
    assert out["loss"] == out["val_loss"]


def test_full_graph_metrics_compute_in_float32_without_autograd():
    """kills: _metrics.py ``logits = model(...).float()`` -> without ``.float()`` (a bfloat16 model's loss came
    out rounded to bfloat16) and ``@torch.no_grad()`` dropped (the evaluation forward built a graph)."""
    model = _FixedLogits(torch.bfloat16)
    out = full_graph_metrics(model, _node_data())
    assert out["val_loss"] == pytest.approx(_ce(SPLIT["val"]), rel=1e-6)
    assert out["test_loss"] == pytest.approx(_ce(SPLIT["test"]), rel=1e-6)
    assert model.grad_enabled == [False]


@pytest.mark.parametrize("split", ["train", "val", "test"])
def test_bug_node_data_with_an_empty_split_is_refused(split):
    """Bug: a ``NodeData`` whose val or test mask selected no node was accepted, and every evaluation of
    ``full_graph_metrics`` then reported NaN loss and accuracy without a word (an empty train mask gave a NaN
    training loss). ``NodeData`` now refuses an empty split, naming the dataset and the mask, as the loaders'
    split checks do."""
    from torch_geometric.data import Data

    from diffusionformer.data.base import NodeData

    data = _node_data().data.clone()
    getattr(data, f"{split}_mask").zero_()
    with pytest.raises(ValueError, match=f"hand: {split}_mask selects no node"):
        NodeData(name="hand", data=data, num_classes=3, num_features=4)
    one = Data(**{k: v for k, v in _node_data().data.items()})
    m = torch.zeros(7, dtype=torch.bool)
    m[SPLIT[split][0]] = True
    one[f"{split}_mask"] = m  # one node is enough
    assert int(NodeData(name="hand", data=one, num_classes=3, num_features=4).data[f"{split}_mask"].sum()) == 1


def test_accuracy_is_the_fraction_of_rows_whose_argmax_is_the_label():
    """kills: _metrics.py ``accuracy``: ``argmax(-1)`` -> ``argmax(0)``/``argmin(-1)``, ``==`` -> ``!=``, ``mean`` -> ``sum``."""
    acc = accuracy(torch.tensor(LOGITS, dtype=torch.float32), torch.tensor(LABELS))
    assert acc.dtype == torch.float32 and acc.dim() == 0
    assert acc.item() == pytest.approx(4 / 7)


# --------------------------------------------------------------------------- data/_optional.py

def test_missing_package_message_names_the_dataset_the_package_the_module_and_the_extra(monkeypatch):
    """kills: _optional.py message without the dataset, with the module for the package, without
    ``(module ...)``, without the install hint or with another hint; ``from err`` -> ``from None``; the
    ImportError turned into another error type."""
    monkeypatch.setitem(sys.modules, "df_absent_pkg", None)
    with pytest.raises(ImportError) as info:
        import_optional("df_absent_pkg.sub", package="df-absent", dataset="toy")
    assert str(info.value) == ("dataset 'toy' needs the optional package 'df-absent' (module 'df_absent_pkg.sub'), "
                               'which is not installed: pip install "diffusionformer[data]"')
    assert isinstance(info.value.__cause__, ImportError)


def test_an_installed_package_that_fails_to_import_is_reported_too(tmp_path, monkeypatch):
    """kills: _optional.py ``except ImportError`` -> ``except ModuleNotFoundError`` (a package that is there but
    whose import fails, e.g. a missing shared library, escaped without the install hint)."""
    (tmp_path / "df_broken_pkg.py").write_text("raise ImportError('libfoo.so: cannot open shared object file')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "df_broken_pkg", raising=False)
    with pytest.raises(ImportError, match=r"needs the optional package 'broken'.*diffusionformer\[data\]") as info:
        import_optional("df_broken_pkg", package="broken", dataset="toy")
    assert "libfoo.so" in str(info.value.__cause__)


def test_other_errors_of_an_import_are_not_reported_as_a_missing_package(tmp_path, monkeypatch):
    """kills: _optional.py ``except ImportError`` -> ``except (ImportError, AttributeError)`` (a bug inside an
    installed package would read as 'not installed')."""
    (tmp_path / "df_buggy_pkg.py").write_text("import os\nos.no_such_attribute\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "df_buggy_pkg", raising=False)
    with pytest.raises(AttributeError, match="no_such_attribute"):
        import_optional("df_buggy_pkg", package="buggy", dataset="toy")


def test_import_optional_returns_the_submodule_it_was_asked_for():
    """kills: _optional.py ``import_module(module)`` -> ``import_module(module.split('.')[0])`` (the top package)."""
    import json.decoder

    assert import_optional("json.decoder", package="json", dataset="demo") is json.decoder


# --------------------------------------------------------------------------- ops/triton/_aot.py

def _fn(*names):
    return SimpleNamespace(arg_names=list(names))


def test_signature_types_every_kind_of_argument():
    """kills: _aot.py ``signature``: a constexpr typed ``i32``; the MASK_KIND test ``== 2`` -> ``== 1`` or a
    bool mask always; the fp32 fallback of ``OUT`` -> ``*bf16``; ``drop_p``/``inv_keep`` or ``*scale``
    no longer fp32; sizes ``i64``; ``SEED`` ``*i32``; ``PAD`` ``*bf16``; ``X`` dropped from TENSORS."""
    from diffusionformer.ops.triton._aot import signature

    fn = _fn("Q", "K", "V", "X", "OUT", "PAD", "SEED", "LSE", "MASK", "sm_scale", "drop_p", "inv_keep",
             "N", "stride_qm", "CAUSAL", "BLOCK_M")
    common = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "X": "*bf16", "OUT": "*bf16", "PAD": "*u8",
              "SEED": "*i64", "LSE": "*fp32", "sm_scale": "fp32", "drop_p": "fp32", "inv_keep": "fp32",
              "N": "i32", "stride_qm": "i32", "CAUSAL": "constexpr", "BLOCK_M": "constexpr"}
    consts = {"CAUSAL": True, "BLOCK_M": 64}
    assert signature(fn, dict(consts, MASK_KIND=1)) == dict(common, MASK="*u8")
    assert signature(fn, dict(consts, MASK_KIND=2)) == dict(common, MASK="*bf16")
    assert signature(fn, consts) == dict(common, MASK="*u8")


def test_signature_of_the_dropout_scale_writer_has_a_float32_output():
    """kills: _aot.py ``writes_scales = fn.arg_names[:2] == ["SEED", "OUT"]`` -> ``False`` (OUT typed bf16) or
    ``"OUT" in fn.arg_names`` (every kernel's output typed fp32)."""
    from diffusionformer.ops.triton._aot import signature

    assert signature(_fn("SEED", "OUT", "N", "BLOCK_M"), {"BLOCK_M": 32}) == {
        "SEED": "*i64", "OUT": "*fp32", "N": "i32", "BLOCK_M": "constexpr"}
    assert signature(_fn("Q", "OUT", "SEED"), {})["OUT"] == "*bf16"


def test_compile_kernel_passes_the_target_the_options_and_only_the_kernels_constexprs(monkeypatch):
    """kills: _aot.py ``compile_kernel``: the default ``arch`` 90 -> 80, ``num_warps`` 4 -> 8; ``arch`` ignored;
    ``num_stages`` not passed; constexprs the kernel does not take kept."""
    triton = pytest.importorskip("triton")
    import triton.compiler

    from diffusionformer.ops.triton._aot import compile_kernel

    seen = {}

    class _Source:
        def __init__(self, fn, signature, constexprs):
            seen.update(fn=fn, signature=signature, constexprs=constexprs)

    def _compile(src, target, options):
        seen.update(target=target, options=options)
        return "compiled"

    monkeypatch.setattr(triton.compiler, "ASTSource", _Source)
    monkeypatch.setattr(triton, "compile", _compile)
    fn = _fn("Q", "N", "BLOCK_M")
    assert compile_kernel(fn, {"BLOCK_M": 64, "CAUSAL": True}) == "compiled"
    assert seen["fn"] is fn and seen["constexprs"] == {"BLOCK_M": 64}
    assert seen["signature"] == {"Q": "*bf16", "N": "i32", "BLOCK_M": "constexpr"}
    assert (seen["target"].backend, seen["target"].arch, seen["target"].warp_size) == ("cuda", 90, 32)
    assert seen["options"] == {"num_warps": 4, "num_stages": 2}
    compile_kernel(fn, {}, arch=80, num_warps=2, num_stages=3)
    assert seen["target"].arch == 80 and seen["options"] == {"num_warps": 2, "num_stages": 3}


PTX = """//
// Generated by LLVM NVPTX Back-End
//

.version 8.4
.target sm_90a
.address_size 64

\t// .globl\t_first_step
.visible .entry _first_step(
\t.param .u64 _first_step_param_0
)
{
\t.reg .pred \t%p<3>;
$L__BB0_1:
\tld.param.u64 \t%rd1, [_first_step_param_0];
\t@%p1 bra \t$L__BB0_2;
\tmov.u32 \t%r1, %tid.x;
LBB0_2:
$L__tmp0:
\tret;
}
"""


def test_ptx_instructions_keep_only_the_instruction_lines():
    """kills: _aot.py ``ptx_instructions``: labels (``endswith(":")``: ``LBB0_2:``) kept,
    predicated ``@`` lines dropped, lines not stripped, and ``if not s`` dropped (an IndexError on blank lines)."""
    from diffusionformer.ops.triton._aot import ptx_instructions

    assert ptx_instructions(SimpleNamespace(asm={"ptx": PTX})) == [
        "ld.param.u64 \t%rd1, [_first_step_param_0];", "@%p1 bra \t$L__BB0_2;", "mov.u32 \t%r1, %tid.x;", "ret;"]


# --------------------------------------------------------------------------- experiments/__main__.py

def test_python_dash_m_exits_with_the_status_of_the_cli(monkeypatch):
    """kills: experiments/__main__.py ``sys.exit(main())`` -> ``main()`` or an exit status of 0 whatever ``main``
    returned (a failed command exited 0)."""
    from diffusionformer.experiments import cli

    monkeypatch.setattr(cli, "main", lambda: 3)
    monkeypatch.delitem(sys.modules, "diffusionformer.experiments.__main__", raising=False)
    with pytest.raises(SystemExit) as info:
        runpy.run_module("diffusionformer.experiments", run_name="__main__")
    assert info.value.code == 3


# --------------------------------------------------------------------------- _files.py

def _fake_status(monkeypatch, text):
    def _open(path, *args, **kwargs):
        assert path == "/proc/self/status"
        if text is None:
            raise FileNotFoundError(path)
        return io.StringIO(text)

    monkeypatch.setattr(_files, "open", _open, raising=False)


@pytest.mark.parametrize("umask, mode", [("0022", 0o644), ("0027", 0o640), ("0077", 0o600), ("0002", 0o664),
                                         ("0000", 0o666)])
def test_new_file_mode_is_0666_less_the_octal_umask_of_proc_self_status(monkeypatch, umask, mode):
    """kills: _files.py ``int(..., 8)`` -> base 10; ``0o666 & ~umask`` -> ``0o666 & umask``, ``0o777 & ~umask``,
    ``0o666 | ~umask``; the ``Umask:`` test inverted."""
    _fake_status(monkeypatch, f"Name:\tpython\nState:\tR (running)\nUmask:\t{umask}\nPid:\t1\n")
    assert _files.new_file_mode() == mode


@pytest.mark.parametrize("text", [None, "Name:\tpython\n", "Umask:\tzz\n", "Umask:\n"],
                         ids=["no-proc", "no-umask-line", "not-octal", "no-value"])
def test_new_file_mode_falls_back_to_0644(monkeypatch, text):
    """kills: _files.py the fallback ``0o644`` -> ``0o600``/``0o666``; ``except (OSError, ValueError, IndexError)``
    without ``ValueError`` or without ``IndexError`` (a malformed line raised)."""
    _fake_status(monkeypatch, text)
    assert _files.new_file_mode() == 0o644


def test_new_file_mode_is_the_mode_open_gives_a_new_file(tmp_path):
    """The real ``/proc`` reading against the reference: the mode of a file that ``open()`` creates."""
    path = tmp_path / "f"
    path.write_text("x")
    assert _files.new_file_mode() == path.stat().st_mode & 0o777


@pytest.mark.skipif(not hasattr(os, "fchmod"), reason="no os.fchmod")
def test_set_new_file_mode_gives_an_open_temporary_the_new_file_mode(tmp_path, monkeypatch):
    """kills: _files.py ``set_new_file_mode``: the ``fchmod`` dropped or under ``if not hasattr``, and a fixed
    ``0o644`` for ``new_file_mode()`` (a private umask 027 was not kept)."""
    import tempfile

    _fake_status(monkeypatch, "Umask:\t0027\n")
    fd, name = tempfile.mkstemp(dir=tmp_path)
    try:
        assert os.stat(name).st_mode & 0o777 == 0o600
        _files.set_new_file_mode(fd)
        assert os.stat(name).st_mode & 0o777 == 0o640
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- train/errors.py

def test_non_finite_loss_error_keeps_its_message_and_both_steps():
    """kills: errors.py ``super().__init__(message)`` dropped or given ``step`` too (``str(err)`` lost the
    message), ``step``/``last_checkpoint_step`` swapped into each other, and ``RuntimeError`` -> ``ArithmeticError``."""
    err = NonFiniteLossError("loss is nan at step 7", step=7, last_checkpoint_step=5)
    assert str(err) == "loss is nan at step 7" and err.args == ("loss is nan at step 7",)
    assert (err.step, err.last_checkpoint_step) == (7, 5)
    assert isinstance(err, RuntimeError)
    assert NonFiniteLossError("m", step=0, last_checkpoint_step=None).last_checkpoint_step is None


def test_checkpoint_error_is_a_runtime_error_and_both_are_exported():
    """kills: errors.py ``CheckpointError(RuntimeError)`` -> ``(ValueError)`` and ``CheckpointError`` dropped from
    ``__all__``."""
    assert issubclass(CheckpointError, RuntimeError) and not issubclass(CheckpointError, ValueError)
    assert sorted(train_errors.__all__) == ["CheckpointError", "NonFiniteLossError"]


# --------------------------------------------------------------------------- train/batch.py

Pair = namedtuple("Pair", ["a", "b"])


class _Movable:
    def __init__(self):
        self.moved_to = None

    def to(self, device):
        self.moved_to = device
        return self


class _Str(str):
    def to(self, device):  # a string that happens to have a .to method
        raise AssertionError("strings are returned as they are")


class _Bytes(bytes):
    def to(self, device):
        raise AssertionError("bytes are returned as they are")


def test_to_device_moves_every_tensor_of_a_nested_batch():
    """kills: batch.py a tensor returned unmoved; dict values not moved; a named tuple's fields not moved or
    the named-tuple branch dropped (``Pair(<generator>)`` raised); a list/tuple rebuilt from the unmoved items;
    a tuple turned into a list; objects with ``.to`` not moved; lists only (tuples returned unmoved)."""
    obj = _Movable()
    batch = {"x": torch.ones(2), "pair": Pair(torch.zeros(1), [torch.ones(3), 4]), "t": (torch.ones(1), "s"),
             "obj": obj, "n": None}
    out = to_device(batch, META)
    assert out["x"].device == META and out["x"].shape == (2,)
    assert type(out["pair"]) is Pair and out["pair"].a.device == META
    assert type(out["pair"].b) is list and out["pair"].b[0].device == META and out["pair"].b[1] == 4
    assert type(out["t"]) is tuple and out["t"][0].device == META and out["t"][1] == "s"
    assert out["obj"] is obj and obj.moved_to == META
    assert out["n"] is None


def test_to_device_rebuilds_a_mapping_with_its_type():
    """kills: batch.py ``isinstance(batch, Mapping)`` -> ``dict`` (a read-only mapping came back unmoved), the copy of
    a dict subclass / UserDict -> ``type(batch)(moved)`` (a defaultdict lost its factory) and the fallback for a
    mapping that cannot be built from a dict."""
    out = to_device(MappingProxyType({"x": torch.ones(1)}), META)
    assert type(out) is MappingProxyType and out["x"].device == META
    out = to_device(OrderedDict(y=torch.ones(1)), META)
    assert type(out) is OrderedDict and list(out) == ["y"] and out["y"].device == META
    src = defaultdict(list, z=torch.ones(1))
    out = to_device(src, META)
    assert type(out) is defaultdict and out.default_factory is list and out["z"].device == META
    assert src["z"].device.type == "cpu"  # the caller's batch is not touched

    class Frozen(Mapping):  # a mapping whose constructor takes no dict
        def __init__(self):
            self._d = {"w": torch.ones(1)}

        def __getitem__(self, k):
            return self._d[k]

        def __iter__(self):
            return iter(self._d)

        def __len__(self):
            return len(self._d)

    out = to_device(Frozen(), META)
    assert type(out) is dict and out["w"].device == META


def test_to_device_does_not_copy_a_tensor_already_on_the_device():
    """kills: batch.py ``batch.to(device, non_blocking=True)`` -> ``....clone()`` (every batch copied once more)."""
    t = torch.arange(4.0)
    assert to_device({"t": t}, torch.device("cpu"))["t"].data_ptr() == t.data_ptr()


def test_to_device_leaves_strings_and_non_callable_to_attributes_alone():
    """kills: batch.py ``callable(to) and not isinstance(batch, (str, bytes))`` -> ``callable(to)`` or
    ``isinstance(batch, str)`` only (a str/bytes subclass with a ``.to`` method was 'moved'), and ``callable(to)``
    -> ``to is not None`` (an object whose ``to`` is a plain value was called)."""
    s, b = _Str("label"), _Bytes(b"raw")
    assert to_device(s, META) is s and to_device(b, META) is b
    route = SimpleNamespace(to="berlin")
    assert to_device(route, META) is route


# --------------------------------------------------------------------------- equivalent mutants
#
# - _aot.py ``ptx_instructions``: ``s.startswith(("//", ".", "{", "}", "$"))`` without ``"$"`` or without
#   ``"."``: a line starting with ``$`` or ``.`` is neither a letter nor ``@``, so the last clause
#   (``not s[0].isalpha() and s[0] != "@"``) skips it anyway; the two prefixes only make the intent explicit.
# - _files.py ``line.startswith("Umask:")`` -> ``line.startswith("Umask")``: no other field of
#   ``/proc/self/status`` starts with ``Umask`` (proc(5)), so the same line is found.
# - _files.py ``line.split()[1]`` -> ``line.split()[-1]``: a ``Umask:`` line has exactly two fields; with one
#   field ``[-1]`` is ``"Umask:"``, whose ``int(..., 8)`` raises a ValueError that is caught as the IndexError
#   was, so the fallback ``0o644`` is the same.
