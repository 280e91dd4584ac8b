"""Edge-case probes of mixed precision (bf16/fp16 autocast, explicit half inputs, the trainer's ``amp``).

Probed on the CPU against float64 references: every registered operator's layer output under bf16
autocast (K-step heads, a 64-step PPR series, a polynomial with large alternating coefficients),
dense (SDPA and materialised ``P``) and sparse; the float32 dtype, finiteness and accuracy of the
learned operator parameters' gradients under autocast; explicit bf16/fp16 modules and inputs with
``-inf`` float masks and fully masked rows (no NaN); ``I - P`` with ``P`` near one-hot (error stays
at bf16's epsilon relative to ``|v|``; relative to the tiny output it is not, an inherent limit of a
bf16 ``P v``); misspelt ``amp``/``precision`` strings (did-you-mean); the fp16 scaler's state in
checkpoints and bf16 resumes (already covered by ``test_train_accum.py`` and
``test_edge_probes_train_fourth.py``).

Found and fixed (tests whose docstring starts with "Bug:"):

* ``amp="auto"`` resolves per device (bf16 on CUDA, off elsewhere), but a resume compared only the
  written ``"auto"``: a run started in bf16 on CUDA and resumed with ``device="cpu"`` went on in
  float32 (and its summary said ``"amp": "off"`` for the whole run), against the documented rule that
  a run resumes in the precision it started with. Checkpoints now record the resolved precision and a
  resume compares it.
"""

from __future__ import annotations

import copy

import pytest
import torch
from train_tiny_tasks import RegressionTask, SimulatedKill, TinyMLP, tiny_config

import diffusionformer.train.trainer as trainer_module
from diffusionformer import DiffusionAttention
from diffusionformer.operators import build_operator, list_operators, operator_class
from diffusionformer.train import CheckpointError, Trainer
from diffusionformer.train.checkpoint import load_checkpoint, save_checkpoint


def _auto_is_bf16(monkeypatch):
    """Resolve ``amp="auto"`` as on a CUDA device (bf16) while the run stays on the CPU."""
    real = trainer_module.resolve_amp
    monkeypatch.setattr(trainer_module, "resolve_amp",
                        lambda spec, device: torch.bfloat16 if spec == "auto" else real(spec, device))
    return real


def _cut_auto_run_on_cuda(tmp_path, monkeypatch):
    real = _auto_is_bf16(monkeypatch)
    torch.manual_seed(0)
    with pytest.raises(SimulatedKill):
        Trainer(TinyMLP(), RegressionTask(fail_at=4), tiny_config(amp="auto"), tmp_path).fit()
    monkeypatch.setattr(trainer_module, "resolve_amp", real)  # "now on the CPU": auto is float32


def test_bug_auto_amp_resumed_on_another_device_keeps_its_precision(tmp_path, monkeypatch):
    """Bug: a run with ``amp="auto"`` checkpointed in bf16 (on CUDA) and resumed on the CPU, where
    ``"auto"`` means no autocast, went on in float32 without a word (the config compared equal:
    ``"auto"`` both times) and its summary reported ``"amp": "off"`` for the whole run."""
    _cut_auto_run_on_cuda(tmp_path, monkeypatch)
    torch.manual_seed(0)
    with pytest.raises(ValueError, match=r"amp \(resolved on the run's device\): checkpoint 'bf16' \(amp='auto'\), "
                                         r"now 'off' \(amp='auto' on cpu\); set amp='bf16'"):
        Trainer(TinyMLP(), RegressionTask(), tiny_config(amp="auto"), tmp_path, resume=True).fit()


def test_auto_amp_run_resumed_with_its_resolved_precision_equals_the_uninterrupted_run(tmp_path, monkeypatch):
    """The advice of the error works: ``amp="bf16"`` continues a bf16 ``"auto"`` run bit for bit."""
    _cut_auto_run_on_cuda(tmp_path / "cut", monkeypatch)
    torch.manual_seed(0)
    resumed = TinyMLP()
    summary = Trainer(resumed, RegressionTask(), tiny_config(amp="bf16"), tmp_path / "cut", resume=True).fit()
    assert summary["amp"] == "bf16" and summary["resumed_from"] == 3
    _auto_is_bf16(monkeypatch)
    torch.manual_seed(0)
    whole = TinyMLP()
    Trainer(whole, RegressionTask(), tiny_config(amp="auto"), tmp_path / "whole").fit()
    assert all(torch.equal(a, b) for a, b in zip(whole.parameters(), resumed.parameters()))


def test_precision_recorded_in_the_checkpoint_is_checked(tmp_path):
    Trainer(TinyMLP(), RegressionTask(), tiny_config(max_steps=3, amp="bf16"), tmp_path).fit()
    path = tmp_path / "checkpoint.pt"
    payload = load_checkpoint(path)
    assert payload["amp"] == "bf16"
    # without a recorded precision (an older checkpoint) amp is compared as written
    save_checkpoint(path, {k: v for k, v in payload.items() if k != "amp"})
    with pytest.raises(ValueError, match="amp: checkpoint 'bf16', now 'off'"):
        Trainer(TinyMLP(), RegressionTask(), tiny_config(max_steps=4, amp="off"), tmp_path, resume=True).fit()
    save_checkpoint(path, {**payload, "amp": "float8"})
    with pytest.raises(CheckpointError, match="got amp='float8'"):
        Trainer(TinyMLP(), RegressionTask(), tiny_config(max_steps=4, amp="bf16"), tmp_path, resume=True).fit()


def _specs():
    specs = [build_operator(n, **dict(operator_class(n).example_kwargs)).spec() for n in list_operators()]
    return specs + ["ppr(alpha=0.05, steps=64)", "polynomial(steps=4, init=[30.0, -60.0, 40.0, -20.0, 11.0])",
                    "heat(t=2.0, steps=32, learnable=True)"]


@pytest.mark.parametrize("spec", _specs())
@pytest.mark.parametrize("mode", ["sdpa", "matrix", "sparse"])
def test_bf16_autocast_layer_and_operator_gradients_match_float64(spec, mode):
    torch.manual_seed(0)
    layer = DiffusionAttention(16, 2, heads=f"{spec}:2", backend="matrix" if mode == "matrix" else "auto")
    if mode == "sparse":
        if not all(op.supports_sparse for op in layer.operators):
            pytest.skip("a dense-only operator")
        x, kwargs = torch.randn(12, 16), {"edge_index": torch.randint(0, 12, (2, 40))}
    else:
        mask = torch.zeros(2, 12, dtype=torch.bool)
        mask[0, -3:] = True
        x, kwargs = torch.randn(2, 12, 16), {"key_padding_mask": mask}
    ref = copy.deepcopy(layer).double()
    want = ref(x.double(), **kwargs)
    want.square().sum().backward()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = layer(x, **kwargs)
    assert got.dtype == torch.bfloat16
    got.float().square().sum().backward()
    assert (got.double() - want).abs().max() <= 3e-2 * want.abs().max()
    for (name, p), q in zip(layer.named_parameters(), ref.parameters()):
        if name.startswith("operators."):
            assert p.dtype == torch.float32 and p.grad.dtype == torch.float32 and torch.isfinite(p.grad).all()
            assert (p.grad.double() - q.grad).abs().max() <= 5e-2 * q.grad.abs().max() + 1e-6, name


@pytest.mark.parametrize("value, hint", [("fp32", "off"), ("float32", "off"), ("None", "off"), ("float16", "fp16"),
                                         ("bfloat16", "bf16")])
def test_bug_amp_spelt_as_a_precision_points_at_its_amp_value(value, hint):
    """Bug: ``TrainConfig(amp="fp32")`` (``--precision``'s word for float32) got no hint, and the spelling
    closest to it is ``'fp16'``; ``--precision off`` (amp's word) got none either (sitting 33)."""
    from diffusionformer.train import TrainConfig

    with pytest.raises(ValueError, match=rf"got '{value}' \(did you mean '{hint}'\?\)"):
        TrainConfig(amp=value)


@pytest.mark.parametrize("value, hint", [("off", "fp32"), ("float32", "fp32"), ("bfloat16", "bf16")])
def test_bug_precision_spelt_as_an_amp_value_points_at_its_precision(value, hint):
    """Bug: ``--precision off`` (amp's word for float32) got no hint (sitting 33)."""
    from diffusionformer.experiments.gpu import precision_amp

    with pytest.raises(ValueError, match=rf"got '{value}' \(did you mean '{hint}'\?\)"):
        precision_amp(value)
