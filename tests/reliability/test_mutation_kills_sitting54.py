"""Mutation audit (sitting 54, helper 54d) of the least-audited modules: nn/_weights.py, nn/_skip.py,
testing/graphs.py, models/sampling.py, data/recall.py and experiments/reload.py. Each test kills a mutant the
earlier tests let live (its docstring names it, "Kills: ..."), checked against an expectation written out here
(the stored tensor itself, a message's documented text, a hand-made run folder or extra state). No GPU (CUDA is
simulated where named).

150 hand mutants, one at a time, each restored from a cp backup, run against the module's doctests and the test files
that name it (_weights.py 22, _skip.py 10, graphs.py 21, sampling.py 20, recall.py 22, reload.py 30, faults.py 25):
116 killed by earlier tests (reload.py's ``model.task_config`` dropped only by tests/ssl/test_ssl_config.py), 29
survivors killed here (_weights.py 6, graphs.py 2, sampling.py 2, reload.py 10, faults.py 9), 5 equivalent, and one
bug, found by the pin of faults.py's ``.resolve_neg()``: ``assert_same_checkpoint_weights`` failed on a one-element
view of stride 2 (see the "Bug:" test; fixed in testing/faults.py ``_bit_equal``). Equivalent:

* _weights.py ``_stored_weight`` the early ``module._parameters.get(name)`` return dropped: ``getattr(module, name)``
  below returns the same parameter object (a class cannot define ``weight`` beside a registered parameter of that
  name: ``register_parameter`` refuses it).
* sampling.py ``_check_logits`` ``and logits.numel() > 0`` dropped: on an empty tensor the mask is empty and its
  ``any()`` is False, the check's other branch.
* recall.py ``_distinct_keys`` ``max(1, _KEY_BLOCK // num_keys)`` -> ``_KEY_BLOCK // num_keys or 1``: the quotient is
  never negative, so ``or 1`` replaces exactly the 0 that ``max`` does.
* reload.py ``_check_train_identity`` the JSON round trip of ``saved`` dropped: its one caller passes
  ``TrainConfig.to_dict()``, which already lists ``betas`` and ``loggers``; every other field is a str, number, bool
  or None, so the round trip changes nothing.
* faults.py ``_bit_equal`` ``.resolve_neg()`` dropped (since the fix): the dense copy (``clone``) materialises the
  negative bit itself.
"""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize

from diffusionformer.nn._weights import _check_reset, _stored_weight


# ---- nn/_weights.py ------------------------------------------------------------------------------------------------


class _Scale(nn.Module):
    def forward(self, x):
        return 2 * x


def test_stored_weight_of_a_buffer_weight_beside_a_parametrized_bias():
    """Kills: nn/_weights.py ``_stored_weight`` ``if plist is not None and name in plist`` -> ``if plist is not None``
    (a module whose ``bias`` is parametrized and whose ``weight`` is a buffer: ``plist["weight"]`` is a KeyError,
    not the buffer)."""
    m = nn.Linear(3, 2)
    w = m.weight.detach().double()
    del m.weight
    m.register_buffer("weight", w)
    parametrize.register_parametrization(m, "bias", _Scale())
    assert _stored_weight(m) is m._buffers["weight"]


def test_stored_weight_of_a_tensor_weight_is_that_tensor_not_the_first_parameter():
    """Kills: nn/_weights.py ``_stored_weight`` ``if isinstance(w, Tensor): return w`` dropped (a module whose
    ``weight`` is a float64 buffer beside a float32 ``bias`` parameter: the fallback's first floating parameter,
    the bias, was read instead, with another dtype)."""
    m = nn.Linear(3, 2)
    w = m.weight.detach().double()
    del m.weight
    m.register_buffer("weight", w)
    got = _stored_weight(m)
    assert got is m._buffers["weight"] and got.dtype == torch.float64


def test_stored_weight_falls_back_to_the_modules_own_tensors_before_the_owners():
    """Kills: nn/_weights.py ``_stored_weight`` ``for m in (module, owner)`` -> ``(owner, module)`` (an adapter
    without a tensor ``weight`` read its owner's parameter although it holds floating-point tensors of its own)."""

    class Adapter(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Parameter(torch.zeros(2, dtype=torch.float64))

        def weight(self):  # a method, as quantize_dynamic's Linear has
            return self.a

    owner = nn.Linear(2, 2)  # float32
    m = Adapter()
    assert _stored_weight(m, owner=owner) is m.a


def test_reset_refuses_a_hook_based_weight_norm():
    """Kills: nn/_weights.py ``_refuse_reparametrized`` ``WeightNorm`` dropped from the hook kinds (the deprecated
    ``torch.nn.utils.weight_norm``, whose forward pre-hook recomputes ``weight`` from ``weight_g``/``weight_v``:
    the reset initialised the computed weight and left the originals as trained, without a word)."""
    from diffusionformer.models import DiffusionGPT, GPTConfig

    torch.manual_seed(0)
    model = DiffusionGPT(GPTConfig(vocab_size=11, block_size=16, n_layer=2, n_head=2, n_embd=8))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        nn.utils.weight_norm(model.blocks[0].mlp.fc1)
    g = model.blocks[0].mlp.fc1.weight_g.detach().clone()
    with pytest.raises(TypeError, match=re.escape("DiffusionGPT.blocks.0.mlp.fc1 (Linear) is reparametrized (hooks "
                                                  "['WeightNorm'])")):
        model.reset_parameters()
    assert torch.equal(model.blocks[0].mlp.fc1.weight_g, g)


def test_reset_refusal_of_the_model_itself_names_it_without_a_trailing_dot():
    """Kills: nn/_weights.py ``_refuse_reparametrized`` ``name = f"{path}.{sub}" if sub else path`` ->
    ``f"{path}.{sub}"`` (a model whose own parameter is parametrized was named ``ParametrizedDiffusionViT.``, its class name
    under parametrize, with a trailing dot)."""
    from diffusionformer.models import DiffusionViT, ViTConfig

    torch.manual_seed(0)
    vit = DiffusionViT(ViTConfig(input_size=(8, 8), patch_size=4, num_classes=3, dim=8, depth=1, num_heads=2))
    parametrize.register_parametrization(vit, "pos_embed", _Scale())
    with pytest.raises(TypeError, match=re.escape(": ParametrizedDiffusionViT (ParametrizedDiffusionViT) is "
                                                  "reparametrized (parametrizations of ['pos_embed'])")):
        vit.reset_parameters()


def test_dino_refusal_of_a_part_without_reset_names_the_models_reset():
    """Kills: nn/_weights.py ``_check_reset``'s ``collect`` ``{where.split('.', 1)[0]}.reset_parameters`` ->
    ``{where}.reset_parameters`` (DINO checks its student under ``where = "DINO.student"``: the message named a
    ``DINO.student.reset_parameters`` the user never called)."""

    class Plain(nn.Module):
        def __init__(self):
            super().__init__()
            self.p = nn.Parameter(torch.zeros(1))

    student = nn.Module()
    student.head = nn.Module()
    student.head.extra = Plain()
    with pytest.raises(TypeError, match=re.escape("DINO.reset_parameters: DINO.student.head.extra (Plain) holds "
                                                  "parameters ['p']")):
        _check_reset(student, "DINO.student")


# ---- testing/graphs.py ---------------------------------------------------------------------------------------------


def test_dense_allowed_from_edges_stays_on_the_edges_device():
    """Kills: testing/graphs.py ``dense_allowed_from_edges`` ``device=edge_index.device`` dropped (the matrix was
    made on the CPU; with ``meta`` edges, the one other device a CPU machine has, the assignment then did nothing
    and an all-False matrix came back)."""
    from diffusionformer.testing import dense_allowed_from_edges

    got = dense_allowed_from_edges(torch.tensor([[0, 1], [1, 2]], device="meta"), 3)
    assert got.device.type == "meta" and got.shape == (3, 3) and got.dtype == torch.bool


def test_random_qkv_draws_complex_samples():
    """Kills: testing/graphs.py ``random_qkv`` ``not (dtype.is_floating_point or dtype.is_complex)`` ->
    ``not dtype.is_floating_point`` (the documented complex dtypes were refused)."""
    from diffusionformer.testing import random_qkv

    q, k, v = random_qkv(1, 2, 3, 4, dtype=torch.complex128, seed=1)
    assert all(t.dtype == torch.complex128 and t.shape == (1, 2, 3, 4) for t in (q, k, v))
    assert bool((q.imag != 0).any()) and not torch.equal(q, k)


# ---- experiments/reload.py -----------------------------------------------------------------------------------------


def test_loaded_run_repr_of_an_unfinished_run():
    """Kills: experiments/reload.py ``LoadedRun.__repr__`` ``.get("status", "unfinished")`` -> ``.get("status", None)``
    (a run without a summary showed ``status=None``, the documented word is "unfinished")."""
    from pathlib import Path

    from diffusionformer.experiments.reload import LoadedRun

    run = LoadedRun(model=nn.Linear(1, 1), config=None, metrics=[{}, {}], summary=None, train_config=None, step=3,
                    preset="gpt-tiny", path=Path("runs/t/o/seed0"))
    assert repr(run) == ("LoadedRun(path='runs/t/o/seed0', preset='gpt-tiny', model=Linear, step=3, "
                         "status='unfinished', records=2)")


def test_map_location_one_past_the_last_cuda_device_is_refused(monkeypatch):
    """Kills: experiments/reload.py ``_check_cuda_exists`` ``device.index >= count`` -> ``> count`` (on a machine with
    one CUDA device, ``cuda:1`` passed the check; CUDA simulated: ``is_available``/``device_count`` patched)."""
    from diffusionformer.experiments.reload import _check_cuda_exists

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    _check_cuda_exists(torch.device("cuda:0"))
    with pytest.raises(ValueError, match=re.escape("map_location 'cuda:1' asked for, but this machine has 1 CUDA "
                                                  "device(s) (cuda:0 .. cuda:0)")):
        _check_cuda_exists(torch.device("cuda:1"))


def test_map_location_cuda_without_an_index_is_refused_without_cuda(monkeypatch):
    """Kills: experiments/reload.py ``_check_cuda_exists`` ``count == 0 or`` dropped (``map_location="cuda"``, no
    index, on a machine without CUDA passed the check: the whole model was built before ``model.to`` failed)."""
    from diffusionformer.experiments.reload import _check_cuda_exists

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=re.escape("map_location 'cuda' asked for, but this machine has no CUDA "
                                                  "device (torch.cuda.is_available() is False)")):
        _check_cuda_exists(torch.device("cuda"))


def test_train_identity_of_a_run_config_without_a_train_table():
    """Kills: experiments/reload.py ``_check_train_identity`` ``not isinstance(recorded, Mapping)`` -> ``recorded is
    None`` (a ``train`` entry that is no table, here a list, failed with AttributeError ``'list' object has no
    attribute 'items'`` instead of being left uncompared, as the docstring says of a run without its table)."""
    from pathlib import Path

    from diffusionformer.experiments.reload import _check_train_identity

    assert _check_train_identity(["seed", 1], {"seed": 0}, Path("c.pt"), Path("run_config.json")) is None


def test_model_record_with_a_null_config_is_not_damaged():
    """Kills: experiments/reload.py ``_check_model_record`` ``isinstance(saved.get(k) or {}, Mapping)`` ->
    ``isinstance(saved.get(k), Mapping)`` (a record of a model without a config dataclass holds ``"config": None``,
    as :func:`~diffusionformer.train.checkpoint.model_record` writes it: it was refused as damaged)."""
    from pathlib import Path

    from diffusionformer.experiments.reload import _check_model_record
    from diffusionformer.train.checkpoint import model_record

    model = nn.Linear(2, 3)
    saved = model_record(model)
    assert saved["config"] is None
    _check_model_record(saved, model, Path("c.pt"), Path("run_config.json"))


def test_build_in_saved_dtype_with_no_parameter_in_the_state_builds_as_is():
    """Kills: experiments/reload.py ``_build_in_saved_dtype`` ``len(saved) != 1`` -> ``len(saved) > 1`` (a state
    holding none of the model's parameters, for ``load_state_dict`` to name, failed with ``pop from an empty set``)."""
    from diffusionformer.experiments.reload import _build_in_saved_dtype

    model = _build_in_saved_dtype(lambda config: nn.Linear(2, 2), None, {"other": torch.zeros(1, dtype=torch.float64)})
    assert isinstance(model, nn.Linear) and model.weight.dtype == torch.float32


def test_runs_below_names_the_shallowest_runs_only(tmp_path):
    """Kills: experiments/reload.py ``_runs_below`` ``if found: break`` dropped (the runs one level down and those
    two levels down were listed together, shallowest first is the documented order: only the shallowest level)."""
    from diffusionformer.experiments.reload import _runs_below

    for run in ("a/seed0", "b/c/seed1"):
        (tmp_path / run).mkdir(parents=True)
        (tmp_path / run / "run_config.json").write_text("{}")
    assert _runs_below(tmp_path) == f" (did you mean a run directory below it: {tmp_path / 'a' / 'seed0'}?)"


def test_summary_step_warning_points_at_the_caller_of_load_run(tmp_path, run_folder):
    """Kills: experiments/reload.py ``_check_summary_step`` ``stacklevel=3`` -> ``stacklevel=2`` (the warning of a
    summary of another step named reload.py's own line, not the caller's)."""
    from diffusionformer.experiments import load_run

    rdir, _ = run_folder(tmp_path / "run", dim=8, summary={"status": "completed", "step": 100})
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        load_run(rdir)
    steps = [w for w in seen if "reports step 100" in str(w.message)]
    assert len(steps) == 1 and steps[0].filename == __file__


def test_load_run_names_a_run_config_link_to_a_missing_file(tmp_path):
    """Kills: experiments/reload.py ``load_run`` ``ident_path.exists() or ident_path.is_symlink()`` ->
    ``ident_path.exists()`` (a ``run_config.json`` linking to a missing file was reported as no file at all)."""
    import os

    from diffusionformer.experiments import load_run

    rdir = tmp_path / "seed0"
    rdir.mkdir()
    os.symlink(tmp_path / "gone.json", rdir / "run_config.json")
    with pytest.raises(FileNotFoundError, match=r"run_config\.json to be a file, got a symbolic link to a missing file"):
        load_run(rdir)


def test_load_run_lists_three_non_finite_parameters_without_an_ellipsis(tmp_path, run_folder):
    """Kills: experiments/reload.py ``load_run`` ``' ...' if len(bad) > 3`` -> ``>= 3`` (exactly three NaN tensors,
    all named, were followed by `` ...`` as if more were left out)."""
    from diffusionformer.experiments import load_run
    from diffusionformer.train import CheckpointError
    from diffusionformer.train.checkpoint import save_checkpoint

    rdir, _ = run_folder(tmp_path / "run", dim=8)
    payload = torch.load(rdir / "checkpoint.pt", weights_only=True)
    names = list(payload["model"])[:3]
    for name in names:
        payload["model"][name] = torch.full_like(payload["model"][name], float("nan"))
    save_checkpoint(rdir / "checkpoint.pt", payload)
    with pytest.raises(CheckpointError, match=re.escape(f"NaN or inf in {names}") + "$"):
        load_run(rdir)


# ---- models/sampling.py --------------------------------------------------------------------------------------------


def test_sampling_filters_name_the_first_bad_logit():
    """Kills: models/sampling.py ``_check_logits`` ``bad.nonzero()[0]`` -> ``bad.nonzero()[-1]`` (of two bad logits
    the message named the last, not the first in row-major order)."""
    from diffusionformer.models.sampling import top_k_filter, top_p_filter

    logits = torch.tensor([[0.0, float("nan")], [float("inf"), 1.0]])
    for name, filt, arg in (("top_k", top_k_filter, 1), ("top_p", top_p_filter, 0.5)):
        with pytest.raises(ValueError, match=re.escape(f"{name}: logits must be finite or -inf (a removed token), got "
                                                       "nan at index (0, 1)")):
            filt(logits, arg)


def test_sampling_filters_run_under_vmap():
    """Kills: models/sampling.py ``_check_logits`` ``checks_values(logits) and`` dropped (under ``torch.func.vmap``
    the NaN check's ``bad.any()`` is data-dependent control flow, which vmap refuses: the filters failed there)."""
    from diffusionformer.models.sampling import top_k_filter, top_p_filter

    logits = torch.tensor([[1.0, 3.0, 2.0], [0.5, 0.25, 4.0]]).log()
    got_k = torch.func.vmap(lambda row: top_k_filter(row, 2))(logits)
    assert torch.equal(got_k, top_k_filter(logits, 2))
    got_p = torch.func.vmap(lambda row: top_p_filter(row, 0.5))(logits)
    assert torch.equal(got_p, top_p_filter(logits, 0.5))


# ---- testing/faults.py ---------------------------------------------------------------------------------------------


def test_interrupt_on_call_names_a_name_that_is_no_str():
    """Kills: testing/faults.py ``interrupt_on_call`` ``if not isinstance(name, str)`` check dropped (``hasattr``'s
    bare "attribute name must be string" came instead of the message naming the argument)."""
    from diffusionformer.testing import interrupt_on_call

    with pytest.raises(TypeError, match=re.escape("name must be a str (the method's name), got int 3")):
        with interrupt_on_call(nn.Linear, 3, 1):
            pass


def test_interrupt_on_call_patches_a_modules_special_getattr():
    """Kills: testing/faults.py ``interrupt_on_call`` ``not isinstance(owner, (type, types.ModuleType))`` ->
    ``not isinstance(owner, type)`` (a module's ``__getattr__``, which Python looks up on the module itself (PEP 562),
    was refused as a special method patched on an instance)."""
    import types

    from diffusionformer.testing import interrupt_on_call

    mod = types.ModuleType("sitting54_module")
    mod.__getattr__ = lambda attr: f"lazy {attr}"
    with interrupt_on_call(mod, "__getattr__", 2) as seen:
        assert mod.first == "lazy first"
        with pytest.raises(KeyboardInterrupt):
            mod.second
    assert seen["calls"] == 2 and mod.third == "lazy third"


def test_interrupt_on_call_patches_a_class_method_on_an_instance():
    """Kills: testing/faults.py ``interrupt_on_call`` ``class_method = isinstance(owner, type) and ...`` ->
    ``isinstance(static, classmethod)`` (a class method patched on an instance was stored there as a ``classmethod``
    object, which an instance's dict does not bind: "'classmethod' object is not callable")."""
    from diffusionformer.testing import interrupt_on_call

    class Task:
        @classmethod
        def make(cls, x):
            return (cls.__name__, x)

    task = Task()
    with interrupt_on_call(task, "make", 2):
        assert task.make(1) == ("Task", 1)
        with pytest.raises(KeyboardInterrupt):
            task.make(2)
    assert task.make(3) == ("Task", 3)


def test_bit_equal_compares_extra_state_types_keys_and_lengths():
    """Kills: testing/faults.py ``_bit_equal`` ``if type(x) is not type(y): return False`` dropped (``1`` and ``1.0``,
    ``True`` and ``1`` were equal), ``x.keys() == y.keys() and`` dropped (a dict with an extra key was equal) and
    ``len(x) == len(y) and`` dropped (a list with an extra item was equal)."""
    from diffusionformer.testing.faults import _bit_equal

    assert _bit_equal({"a": [1, 2.0]}, {"a": [1, 2.0]})
    assert not _bit_equal(1, 1.0) and not _bit_equal(True, 1)
    assert not _bit_equal({"a": 1}, {"a": 1, "b": 2})
    assert not _bit_equal([1], [1, 2]) and not _bit_equal((1,), (1, 2))


def test_bit_equal_compares_dtypes_of_the_same_bytes():
    """Kills: testing/faults.py ``_bit_equal`` ``x.dtype != y.dtype or`` dropped (float32 and int32 zeros have the same
    bytes: they were called equal)."""
    from diffusionformer.testing.faults import _bit_equal

    assert not _bit_equal(torch.zeros(2), torch.zeros(2, dtype=torch.int32))


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning")
def test_bit_equal_compares_quantization_parameters():
    """Kills: testing/faults.py ``_bit_equal`` the quantization parameters dropped from the quantized comparison
    (two tensors of the same integers at different scales, so different values, were equal)."""
    from diffusionformer.testing.faults import _bit_equal

    x = torch.tensor([1.0, 2.0])
    a = torch.quantize_per_tensor(x, 0.5, 0, torch.qint8)
    b = torch._make_per_tensor_quantized_tensor(a.int_repr(), 0.25, 0)
    assert torch.equal(a.int_repr(), b.int_repr())
    assert _bit_equal(a, torch.quantize_per_tensor(x, 0.5, 0, torch.qint8)) and not _bit_equal(a, b)


def test_bit_equal_reads_a_negative_view():
    """Pin: a negative view (the imaginary part of a conjugate view) is compared by value. Written for the mutant
    testing/faults.py ``_bit_equal`` ``.resolve_neg()`` dropped; it found the bug of the next test instead (this
    one-element view has stride 2), and since that fix the dense copy materialises the negative bit too, so the mutant
    is equivalent now."""
    from diffusionformer.testing.faults import _bit_equal

    imag = torch.tensor([1 + 2j]).conj().imag
    assert imag.is_neg() and imag.is_contiguous()
    assert _bit_equal(imag, torch.tensor([-2.0])) and not _bit_equal(imag, torch.tensor([2.0]))


def test_checkpoint_weights_are_read_weights_only(tmp_path):
    """Kills: testing/faults.py ``_checkpoint_entry`` ``weights_only=True`` -> ``weights_only=False`` (a checkpoint
    holding an object outside torch's weights-only allowlist, here a ``datetime.date``, was unpickled: any code a
    pickle names could run)."""
    import datetime
    import pickle

    from diffusionformer.testing import assert_same_checkpoint_weights

    path = tmp_path / "c.pt"
    torch.save({"model": {"w": torch.zeros(1)}, "when": datetime.date(2020, 1, 1)}, path)
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        assert_same_checkpoint_weights(path, path)


def test_bug_checkpoint_weights_compare_a_one_element_view_of_stride_two(tmp_path):
    """Bug: ``assert_same_checkpoint_weights`` of a checkpoint holding a one-element view of stride 2 (``torch.save``
    keeps a view's strides: here ``arange(4.)[::2][:1]``) failed with torch's RuntimeError "self.stride(-1) must be 1
    to view Float as Byte": ``contiguous()`` returns such a tensor as it is (one element is contiguous whatever its
    stride), and the byte view needs unit stride. Compared now (a dense copy is viewed)."""
    from diffusionformer.testing import assert_same_checkpoint_weights

    view = torch.arange(4.0)[::2][:1]
    assert view.stride() == (2,) and view.is_contiguous()
    a, b, c = tmp_path / "a.pt", tmp_path / "b.pt", tmp_path / "c.pt"
    torch.save({"model": {"w": view}}, a)
    torch.save({"model": {"w": torch.tensor([0.0])}}, b)
    torch.save({"model": {"w": torch.tensor([1.0])}}, c)
    assert torch.load(a, weights_only=True)["model"]["w"].stride() == (2,)
    assert_same_checkpoint_weights(a, b)
    with pytest.raises(AssertionError, match="1 of 1 tensors differ"):
        assert_same_checkpoint_weights(a, c)
