"""Sitting 52 mutation audit (helper 52e): pins for the day's new code (``_files.weights_only_refusal`` and its
callers, ``other_host``, ``--import``'s forgetting, ``_check_context_model``, capture, rivals' biases, ...) that its
own tests left free, and the bugs found on the way."""

from __future__ import annotations

import pickle

import pytest
import torch

from diffusionformer._files import load_error_text, weights_only_refusal
from diffusionformer.data.paths import drop_unsafe_processed, load_cached


# ----------------------------------------------------------------------------------- _files / data.paths
def test_pin_refusal_lines_lose_terminal_escapes_and_a_trailing_full_stop():
    """Pin: torch's escapes are stripped before the refusal's shape is matched (an escape after the global's name
    was taken into it), and a refusal line's closing full stop is dropped."""
    err = pickle.UnpicklingError("Weights only load failed.\nWeightsUnpickler error: Unsupported global: GLOBAL "
                                 "\x1b[1ma.B\x1b[0m was not allowed")
    assert weights_only_refusal(err) == "Unsupported global: GLOBAL a.B"
    err = pickle.UnpicklingError("Can only build Tensor, but got <class 'x'>.")
    assert weights_only_refusal(err) == "Can only build Tensor, but got <class 'x'>"


def test_pin_an_operand_in_a_zip_names_the_protocol_torch_reads(tmp_path):
    """Pin: the whole sentence for an unsupported opcode of a zip archive (the caller vouched for its CRCs), and
    an unknown opcode is named by its number only."""
    path = tmp_path / "w.pt"
    torch.save({"w": torch.ones(1)}, path)
    err = pickle.UnpicklingError("Weights only load failed.\nWeightsUnpickler error: Unsupported operand 149")
    assert weights_only_refusal(err, path) == (
        "Unsupported operand 149 (FRAME, pickle protocol 4): a pickle protocol torch.load(weights_only=True) does "
        "not read; torch.save's default protocol 2 is read")
    err = pickle.UnpicklingError("Unsupported operand 1234")
    assert weights_only_refusal(err, path).startswith("Unsupported operand 1234: a pickle protocol")
    assert weights_only_refusal(err, tmp_path / "missing.pt") is None  # no file: no zip to vouch for it


def test_pin_load_error_text_strips_escapes_and_blanks_of_its_line():
    """Pin: the quoted line has no terminal escapes and no surrounding blanks, with or without torch's preamble."""
    assert load_error_text(RuntimeError("\x1b[1mbad\x1b[0m thing")) == "RuntimeError: bad thing"
    err = pickle.UnpicklingError("Weights only load failed.\nWeightsUnpickler error:   Unsupported operand 120  \n")
    assert load_error_text(err) == "UnpicklingError: Unsupported operand 120"


@pytest.mark.filterwarnings("ignore:Detected pickle protocol 4:UserWarning")
def test_pin_the_data_cache_names_an_operand_and_quotes_damage(tmp_path):
    """Pin: a whole cache file in pickle protocol 4 is named as a refusal with its opcode (the path reaches
    ``weights_only_refusal``); a damaged one quotes the unpickler's own line."""
    path = tmp_path / "cache.pt"
    torch.save({"x": torch.ones(1)}, path, pickle_protocol=4)
    with pytest.warns(UserWarning, match=r"refuses: Unsupported operand 149 \(FRAME, pickle protocol 4\)"):
        assert load_cached(path) is None
    path.write_bytes(b"x")
    with pytest.warns(UserWarning, match=r"cache\.pt: UnpicklingError: Unsupported operand 120$"):
        assert load_cached(path) is None
    folder = tmp_path / "processed"
    folder.mkdir()
    (folder / "data.pt").write_bytes(b"x")
    with pytest.warns(UserWarning):
        (why,) = drop_unsafe_processed(folder)
    assert why.endswith("data.pt: UnpicklingError: Unsupported operand 120")


# ----------------------------------------------------------------------------------- cli._forget_own_modules
def _fake_module(monkeypatch, name: str, file) -> None:
    import sys
    import types

    module = types.ModuleType(name)
    module.__file__ = str(file)
    monkeypatch.setitem(sys.modules, name, module)


def test_pin_forget_own_modules_drops_only_the_users_files_under_the_folder(tmp_path, monkeypatch):
    """Pin: of the modules a failed ``--import`` brought in, those whose files lie under its folder go; ours (an
    editable checkout there), installed ones (a venv inside the folder, a site-packages folder), files elsewhere and
    modules without a file stay."""
    import sys

    from diffusionformer.experiments.cli import _forget_own_modules

    venv = tmp_path / "venv"
    monkeypatch.setattr(sys, "prefix", str(venv))
    files = {"own52e_helper": tmp_path / "helper.py", "own52e_pkg.sub": tmp_path / "pkg" / "sub.py",
             "diffusionformer._fake52e": tmp_path / "diffusionformer" / "_fake52e.py",
             "venv52e_mod": venv / "lib" / "mod.py", "site52e_mod": tmp_path / "x" / "site-packages" / "mod.py",
             "dist52e_mod": tmp_path / "dist-packages" / "mod.py", "else52e_mod": tmp_path.parent / "elsewhere.py"}
    for name, file in files.items():
        _fake_module(monkeypatch, name, file)
    import types

    monkeypatch.setitem(sys.modules, "nofile52e", types.ModuleType("nofile52e"))
    _forget_own_modules(set(files) | {"nofile52e", "gone52e"}, str(tmp_path))
    assert "own52e_helper" not in sys.modules and "own52e_pkg.sub" not in sys.modules
    for name in ("diffusionformer._fake52e", "venv52e_mod", "site52e_mod", "dist52e_mod", "else52e_mod", "nofile52e"):
        assert name in sys.modules, name


def test_pin_a_failed_import_keeps_the_folders_modules_imported_before_it(tmp_path, monkeypatch, capsys):
    """Pin: only the modules the failed ``--import`` brought in are forgotten: a helper of the same folder imported
    before it stays (it was not the failed import's, and its registrations were not undone)."""
    import sys

    from diffusionformer.experiments.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "early52e.py").write_text("X = 1\n")
    (tmp_path / "late52e.py").write_text("Y = 2\n")
    (tmp_path / "regs52e.py").write_text("import early52e, late52e\nraise RuntimeError('my bug')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        __import__("early52e")  # imported before the failed --import

        assert main(["list", "--import", "regs52e"]) == 2
        assert "early52e" in sys.modules and "late52e" not in sys.modules and "regs52e" not in sys.modules
    finally:
        for name in ("early52e", "late52e", "regs52e"):
            sys.modules.pop(name, None)
    capsys.readouterr()


# ----------------------------------------------------------------------------------- models / operators / data
def test_pin_a_complex_batch_is_named_as_edge_weights_too():
    """Pin: a complex third argument of as many entries as nodes gets the edge-weight hint, not "batch.long()"."""
    import torch

    from diffusionformer.models import GCN, GCNConfig

    x = torch.randn(4, 3)
    with pytest.raises(TypeError, match=r"complex64 \(the third positional argument is batch"):
        GCN(GCNConfig(in_channels=3, hidden=4))(x, torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]]),
                                                torch.zeros(4, dtype=torch.complex64))


def test_pin_dino_loss_takes_the_wider_of_the_two_logits():
    """Pin: a float32 student with float64 teacher logits gives a float64 loss (the teacher's dtype counts)."""
    import torch

    from diffusionformer.models.dino import dino_loss

    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(2, 3, 8, generator=g), torch.randn(2, 3, 8, generator=g, dtype=torch.float64)
    assert dino_loss(s, t, torch.zeros(8), 0.1, 0.04).dtype == torch.float64


def test_pin_heat_truncation_error_past_the_cap_is_a_probability():
    """Pin: past MAX_STEPS the raised tail is clamped to 1 (a tail of 1 raised by 1e-8 is no probability), and it is
    never below the series' tail at the cap's edge."""
    import torch

    from diffusionformer.operators import heat_truncation_error
    from diffusionformer.operators.heat import MAX_STEPS

    assert heat_truncation_error(torch.tensor([1e6], dtype=torch.float64), MAX_STEPS + 1).tolist() == [1.0]
    t = torch.tensor([200.0, 250.0], dtype=torch.float64)
    series = heat_truncation_error(t, MAX_STEPS)
    past = heat_truncation_error(t, MAX_STEPS + 1)
    assert (past < series).all() and (past > 0).all()


def test_pin_the_context_check_reads_both_text_splits_at_their_boundary():
    """Pin: a text split of exactly ``block_size + 1`` tokens fits (one window and its next token); one of
    ``block_size`` tokens is refused, in the train split and in the val split, naming the split."""
    import torch

    from diffusionformer.data import TextData
    from diffusionformer.experiments.build import _check_context_model
    from diffusionformer.experiments.config import TaskConfig
    from diffusionformer.models import DiffusionGPT, GPTConfig

    model = DiffusionGPT(GPTConfig(vocab_size=2, block_size=8, n_layer=1, n_head=1, n_embd=8))
    task = TaskConfig(name="t", dataset="d", model="m")

    def data(n_train: int, n_val: int) -> TextData:
        return TextData("toy", torch.zeros(n_train, dtype=torch.long), torch.zeros(n_val, dtype=torch.long), 2,
                        ["a", "b"])

    _check_context_model(task, model, data(9, 9))
    with pytest.raises(ValueError, match=r"block_size = 8, but the 'train' split .* holds 8 tokens.*below 8"):
        _check_context_model(task, model, data(8, 9))
    with pytest.raises(ValueError, match=r"the 'val' split .* holds 8 tokens"):
        _check_context_model(task, model, data(9, 8))


# ----------------------------------------------------------------------------------- rivals' biases
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_bug_grand_nl_runs_with_a_dynamically_quantized_qkv():
    """Bug: a layer of GRAND-nl heads whose ``qkv`` was quantized with ``torch.ao.quantization.quantize_dynamic``
    (its ``bias`` is a method) failed on a graph, a masked or a dropout forward with "AttributeError: 'function'
    object has no attribute 'split'": ``_head_biases`` took the method for the bias tensor. It now reads the
    quantized Linear's ``bias()`` and the output follows the float layer's to quantization error."""
    import torch
    from torch import nn
    from torch.ao.quantization import quantize_dynamic

    from diffusionformer.nn import DiffusionAttention

    torch.manual_seed(0)
    layer = DiffusionAttention(16, 2, heads="grand-nl", qk_norm=True).eval()
    x, ei = torch.randn(5, 16), torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])
    xd, mask = torch.randn(2, 5, 16), torch.ones(5, 5, dtype=torch.bool).tril()
    mask[0] = False  # a row without keys
    with torch.no_grad():
        ref, ref_dense = layer(x, edge_index=ei), layer(xd, attn_mask=mask)
        quantized = quantize_dynamic(nn.Sequential(layer), {nn.Linear})[0]
        assert callable(quantized.qkv.bias)
        assert (quantized(x, edge_index=ei) - ref).abs().max() < 0.05
        assert (quantized(xd, attn_mask=mask) - ref_dense).abs().max() < 0.05


# ----------------------------------------------------------------------------------- gpt._ids_hint
@pytest.mark.parametrize("dtype", ["bool", "float32", "complex64"])
def test_pin_no_conversion_hint_for_ids_that_are_no_integers(dtype):
    """Pin: bool, floating and complex ``idx`` get no "idx.long()" hint (they hold no token ids to convert)."""
    import torch

    from diffusionformer.models import DiffusionGPT, GPTConfig

    model = DiffusionGPT(GPTConfig(vocab_size=4, block_size=8, n_layer=1, n_head=1, n_embd=8))
    with pytest.raises(ValueError, match=rf"with dtype torch\.{dtype}$"):
        model(torch.zeros(2, 3, dtype=getattr(torch, dtype)))


def test_pin_one_int32_sequence_is_told_to_add_its_batch_dimension():
    """Pin: a 1-D int32 prompt is of an accepted dtype: the hint is the batch dimension, not a conversion."""
    import torch

    from diffusionformer.models import DiffusionGPT, GPTConfig

    model = DiffusionGPT(GPTConfig(vocab_size=4, block_size=8, n_layer=1, n_head=1, n_embd=8))
    with pytest.raises(ValueError, match=r"torch\.int32 \(one sequence: add the batch dimension, idx\[None\]\)$"):
        model(torch.zeros(3, dtype=torch.int32))


# ----------------------------------------------------------------------------------- analysis
def test_pin_a_cut_tuple_batch_keeps_scalars_and_moves_only_tensors():
    """Pin: cutting a tuple batch to ``k`` sequences passes a 0-d tensor (a flag) as it is, and moving one to a
    device passes a ``None`` and a number as they are."""
    import torch

    from diffusionformer.analysis.capture import _head, _to_device

    x, flag = torch.zeros(3, 4), torch.tensor(2.0)
    (cut_x, cut_flag), labels = _head((x, flag), torch.arange(3), 2)
    assert cut_x.shape == (2, 4) and cut_flag is flag and labels.tolist() == [0, 1]
    moved = _to_device((x, None, 3), torch.device("cpu"))
    assert moved[0] is x and moved[1] is None and moved[2] == 3


def test_pin_plot_metric_by_depth_refuses_a_frozenset_and_takes_a_dict():
    """Pin: a frozenset is refused as a set is; a ``{layer: value}`` dict is drawn at its layers."""
    import matplotlib

    matplotlib.use("Agg")
    from diffusionformer.analysis.plots import plot_metric_by_depth

    with pytest.raises(TypeError, match=r"one per layer, or a \{layer: value\} dict, got frozenset$"):
        plot_metric_by_depth({"a": frozenset({1.0, 2.0})}, "m")
    assert plot_metric_by_depth({"a": {0: 1.0, 3: 2.0}}, "m").lines[0].get_xdata().tolist() == [0, 3]


def test_pin_global_centering_scales_the_batch_as_one():
    """Pin: with ``center="global"`` and ``pool=False`` the batch mean is subtracted, so the batch is scaled as one
    (per-sequence scales would subtract a mean of differently scaled sequences): the spectra match float64's."""
    import torch

    from diffusionformer.analysis.spectral import token_singular_values

    g = torch.Generator().manual_seed(0)
    X = torch.randn(2, 5, 3, generator=g, dtype=torch.float64)
    X[1] *= 1000.0
    want = torch.linalg.svdvals(X - X.mean(dim=(0, 1)))
    got = token_singular_values(X, center="global", pool=False)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("kind", ["sparse", "dense"])
def test_pin_grand_nl_biases_of_grouped_kv_heads_in_a_later_head_group(kind):
    """Pin: with grouped key/value heads (query head h reads kv head h // 2) and two GRAND-nl head groups, each head
    gets its own query bias and its kv head's key/value biases (expanded as the layer's k, v), the second group
    those of heads 2, 3: every head follows GRAND's model-space equation on a graph with a node without incoming
    edges (the case where the biases are handed over)."""
    import torch

    from diffusionformer.nn import DiffusionAttention
    from tests.reliability.test_edge_probes_rivals_authors_52 import _grand_f, _integrate

    f64, D, H, G, N = torch.float64, 16, 4, 2, 5
    C = D // H
    torch.manual_seed(3)
    layer = DiffusionAttention(D, H, heads="grand-nl(t=1.0, steps=2):2,grand-nl(t=1.5, steps=3):2", num_kv_heads=G,
                               bias=True).double().eval()
    with torch.no_grad():
        layer.qkv.bias.normal_(0, 1.0)
    x = torch.randn(N, D, dtype=f64)
    edge_index = torch.tensor([[0, 1, 2, 3, 4, 1], [1, 2, 3, 4, 1, 1]])  # (source, target): node 0 has no incoming
    if kind == "sparse":
        got = layer(x, edge_index=edge_index)
    else:
        allowed = torch.zeros(N, N, dtype=torch.bool)
        allowed[edge_index[1], edge_index[0]] = True
        got = layer(x[None], attn_mask=allowed)[0]
    W, b = layer.qkv.weight, layer.qkv.bias
    heads = []
    for h in range(H):
        g, (t, steps) = h // (H // G), ((1.0, 2) if h < 2 else (1.5, 3))
        q_rows, k_rows = slice(h * C, (h + 1) * C), slice(H * C + g * C, H * C + (g + 1) * C)
        v_rows = slice(H * C + G * C + g * C, H * C + G * C + (g + 1) * C)
        X = _integrate(lambda s: _grand_f(s, edge_index.flip(0), W[q_rows], b[q_rows], W[k_rows], b[k_rows]), x, t,
                       steps, "euler")
        heads.append(X @ W[v_rows].T + b[v_rows])
    want = layer.out_proj(torch.cat(heads, dim=-1))
    assert float((got - want).detach().abs().max()) < 1e-10


def test_pin_grand_nl_at_time_zero_is_its_values_exactly():
    """Pin: ``t = 0`` returns the values themselves, also where the biases are handed over (a sparse graph): not
    ``(v - b_v) + b_v``, rounded."""
    import torch

    from diffusionformer.nn import DiffusionAttention

    torch.manual_seed(4)
    layer = DiffusionAttention(8, 2, heads="grand-nl(t=0.0, steps=2)", bias=True).eval()
    with torch.no_grad():
        layer.qkv.bias.normal_(0, 3.0)
    x = torch.randn(5, 8)
    got = layer(x, edge_index=torch.tensor([[0, 1, 2], [1, 2, 3]]))
    assert torch.equal(got, layer.out_proj(layer.qkv(x).split(8, dim=-1)[2]))


def test_bug_a_failed_import_keeps_c_extensions_built_in_place(tmp_path, monkeypatch):
    """Bug: a failed ``--import`` forgot every module under its folder outside an installed prefix, C extensions
    included: an editable project's extension built in place (``build_ext --inplace``, beside the user's files) was
    dropped from ``sys.modules`` and imported a second time by the next ``main()``, which a Cython module refuses
    ("has already been imported. Re-initialisation is not supported"), against the promise that no C extension is
    imported twice. Extension modules now stay; the user's Python files around them are still forgotten."""
    import importlib.machinery
    import sys

    from diffusionformer.experiments.cli import _forget_own_modules

    ext = tmp_path / "mylib52e" / f"_speedups{importlib.machinery.EXTENSION_SUFFIXES[0]}"
    _fake_module(monkeypatch, "mylib52e._speedups", ext)
    _fake_module(monkeypatch, "mylib52e.core", tmp_path / "mylib52e" / "core.py")
    _forget_own_modules({"mylib52e._speedups", "mylib52e.core"}, str(tmp_path))
    assert "mylib52e._speedups" in sys.modules and "mylib52e.core" not in sys.modules


def test_pin_capture_reads_a_block_through_three_wrappers():
    """Pin: the block's signature is read through nested ``(*args, **kwargs)`` wrappers (torch.compile of a
    checkpoint_wrapper of an FSDP unit: three deep), not the first one's alone."""
    import inspect

    from torch import nn

    from diffusionformer.analysis.capture import _forward_signature

    class Block(nn.Module):
        def forward(self, x, mask=None):  # noqa: ANN001, ANN201
            return x

    class Wrapper(nn.Module):
        def __init__(self, inner: nn.Module, attr: str) -> None:
            super().__init__()
            setattr(self, attr, inner)

        def forward(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201
            raise AssertionError

    block = Wrapper(Wrapper(Wrapper(Block(), "_fsdp_wrapped_module"), "_checkpoint_wrapped_module"), "_orig_mod")
    assert list(_forward_signature(block).parameters) == ["x", "mask"]
    assert inspect.signature(block.forward) != _forward_signature(block)
