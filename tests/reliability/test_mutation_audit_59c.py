"""Mutation audit 59c of ``models/dino.py`` and ``train/checkpoint.py``: tests that kill the mutants the covering tests
let live, each checked against an independent reference (DINO's equations written out in float64, a DINO built anew,
the documented file contract), not against the code itself.

Each test names the mutants it kills (``file: original -> mutant``).
"""

from __future__ import annotations

import math
import zipfile

import pytest
import torch

from diffusionformer.models.dino import (DINO, DINOConfig, center_sharpen, cosine_momentum, dino_loss,
                                         knn_classify, teacher_temperature)
from diffusionformer.train.checkpoint import (CHECKPOINT_FORMAT, load_checkpoint, model_record_differences,
                                              save_checkpoint)
from diffusionformer.train.errors import CheckpointError

TINY = dict(input_size=(8, 8), patch_size=4, dim=8, depth=1, num_heads=2, out_dim=6, head_hidden=8,
            head_bottleneck=4)


def _dino(seed: int = 0, **over) -> DINO:
    torch.manual_seed(seed)
    return DINO(DINOConfig(**{**TINY, **over}))


def _reference_loss(student: torch.Tensor, teacher: torch.Tensor, center: torch.Tensor, ts: float,
                    tt: float) -> float:
    """DINO's loss (Caron et al. 2021, Alg. 1) by loops in float64: H(P_t(x_i), P_s(x_j)) over i != j."""
    s, t, c = student.double(), teacher.double(), center.double().reshape(-1)
    total, pairs = 0.0, 0
    for i in range(t.shape[0]):
        for j in range(s.shape[0]):
            if i == j:
                continue
            for b in range(s.shape[1]):
                pt = [math.exp(v) for v in ((t[i, b] - c) / tt).tolist()]
                pt = [v / sum(pt) for v in pt]
                logits = (s[j, b] / ts).tolist()
                lse = max(logits) + math.log(sum(math.exp(v - max(logits)) for v in logits))
                total += -sum(p * (q - lse) for p, q in zip(pt, logits)) / s.shape[1]
            pairs += 1
    return total / pairs


# ----------------------------------------------------------------------------- dino.py: pure pieces
def test_cosine_momentum_refuses_an_empty_schedule():
    """kills: ``total_steps < 1`` -> ``total_steps < 0`` (a 0-step schedule froze the teacher from step 0)."""
    with pytest.raises(ValueError, match="total_steps"):
        cosine_momentum(0, 0.996, 0)


def test_schedules_refuse_a_nan_step_and_a_negative_warm_up():
    """kills: ``not step >= 0`` -> ``step < 0`` in both schedules (NaN passed: a NaN momentum or temperature) and the
    ``warmup_steps < 0`` / ``warmup_teacher_temp_steps < 0`` checks dropped (-5 read as no warm-up)."""
    with pytest.raises(ValueError, match="step"):
        cosine_momentum(math.nan, 0.996, 10)
    with pytest.raises(ValueError, match="step"):
        teacher_temperature(math.nan, 0.04, 0.02, 10)
    with pytest.raises(ValueError, match="warmup_steps"):
        teacher_temperature(0, 0.04, 0.02, -5)
    with pytest.raises(ValueError, match="warmup_teacher_temp_steps"):
        DINOConfig(**TINY, warmup_teacher_temp_steps=-1)


def test_center_sharpen_refuses_a_per_sample_centre():
    """kills: the ``center.shape[0] != 1`` check dropped (a (B, K) centre acted per sample, by broadcasting)."""
    with pytest.raises(ValueError, match="center must have shape"):
        center_sharpen(torch.zeros(2, 3), torch.zeros(2, 3), 0.04)


def test_dino_loss_sends_no_gradient_into_the_centre():
    """kills: ``center.detach()`` -> ``center`` in dino_loss (the targets take no gradient, DINOLoss detaches them)."""
    torch.manual_seed(0)
    student = torch.randn(3, 2, 5, requires_grad=True)
    center = torch.randn(1, 5, requires_grad=True)
    dino_loss(student, torch.randn(2, 2, 5), center, 0.1, 0.04).backward()
    assert center.grad is None and student.grad is not None


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dino_loss_of_half_logits_is_the_float64_loss_in_float32(dtype):
    """kills: dropping the float32 floor of the loss's dtype (a bf16 loss off by ~0.1%)."""
    torch.manual_seed(0)
    student, teacher, center = torch.randn(4, 3, 7).to(dtype), torch.randn(2, 3, 7).to(dtype), torch.randn(7)
    loss = dino_loss(student, teacher, center, 0.1, 0.04)
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(_reference_loss(student, teacher, center, 0.1, 0.04), rel=1e-5)


def test_dino_loss_refuses_zero_prototypes():
    """kills: the ``K < 1`` check dropped (K = 0 gave a loss of 0 with no error)."""
    with pytest.raises(ValueError, match="K=0"):
        dino_loss(torch.zeros(2, 1, 0), torch.zeros(1, 1, 0), torch.zeros(0), 0.1, 0.04)


def test_knn_with_a_small_temperature_votes_as_the_float64_weights_do():
    """kills: ``exp((s - s_max) / T)`` -> ``exp(s / T)``: at T = 0.005 every float32 weight overflowed to inf and the
    tie went to class 0. Reference: the weighted vote sum exp(s_i / T) in float64, where exp(200) is finite."""
    bank = torch.tensor([[1.0, 0.0], [0.8, 0.6]])
    labels = torch.tensor([0, 1])
    query = torch.tensor([[0.8, 0.6]])
    T = 0.005
    cos = [float(bank[i].double() @ query[0].double()) / float(bank[i].double().norm() * query[0].double().norm())
           for i in range(2)]
    votes = [sum(math.exp(c / T) for c, y in zip(cos, labels.tolist()) if y == cls) for cls in range(2)]
    assert votes[1] > votes[0] and math.isfinite(votes[1])
    assert knn_classify(bank, labels, query, 2, k=2, temperature=T).tolist() == [1]


def test_knn_refuses_a_label_equal_to_num_classes_bool_labels_and_a_nan_temperature():
    """kills: ``hi >= num_classes`` -> ``hi > num_classes`` (a bare scatter index error instead of the message),
    the bool-label check dropped (True/False voted as classes 1/0) and ``not temperature > 0`` -> ``temperature <= 0``
    (a NaN temperature made every vote NaN and every prediction 0)."""
    with pytest.raises(ValueError, match="num_classes=2"):
        knn_classify(torch.eye(2), torch.tensor([0, 2]), torch.eye(2), 2, k=1)
    with pytest.raises(TypeError, match="integer class labels"):
        knn_classify(torch.eye(2), torch.tensor([True, False]), torch.eye(2), 2, k=1)
    with pytest.raises(ValueError, match="temperature"):
        knn_classify(torch.eye(2), torch.tensor([0, 1]), torch.eye(2), 2, k=1, temperature=math.nan)


# ----------------------------------------------------------------------------- dino.py: the model
def test_dino_config_defaults_are_the_papers():
    """kills: a changed default of the recipe (momentum 0.996, centre momentum 0.9, tau_s 0.1, tau_t 0.04, 3 layers:
    Caron et al. 2021, Sec. 3.1 and Appendix; facebookresearch/dino main_dino.py)."""
    f = DINOConfig.__dataclass_fields__
    assert (f["momentum"].default, f["center_momentum"].default, f["student_temp"].default,
            f["teacher_temp"].default, f["warmup_teacher_temp"].default, f["head_layers"].default) == \
        (0.996, 0.9, 0.1, 0.04, 0.04, 3)


@pytest.mark.parametrize("layers", [1, 2])
def test_dino_head_has_the_configured_number_of_layers(layers):
    """kills: ``head_layers`` not passed to DINOHead (every head got the default 3 layers)."""
    model = _dino(head_layers=layers, head_hidden=12)
    widths = [8] + [12] * (layers - 1) + [4]  # dim, hidden..., bottleneck
    for branch in (model.student, model.teacher):
        linears = [m for m in branch.head.mlp if isinstance(m, torch.nn.Linear)]
        assert [(m.in_features, m.out_features) for m in linears] == list(zip(widths[:-1], widths[1:]))


def test_update_teacher_at_momentum_one_keeps_the_teacher_whatever_the_student_holds():
    """kills: the ``momentum == 1.0`` early return dropped (1 * t + 0 * inf is NaN: the documented 'unchanged')."""
    model = _dino()
    before = {n: b.clone() for n, b in model.teacher.named_buffers()}
    with torch.no_grad():
        next(model.student.parameters()).fill_(math.inf)
    model.update_teacher(1.0)
    assert all(torch.equal(b, before[n]) for n, b in model.teacher.named_buffers())


def test_update_teacher_at_momentum_zero_copies_over_a_non_finite_teacher():
    """kills: the ``momentum == 0.0`` copy dropped (0 * NaN + s is NaN: the documented copy of the student)."""
    model = _dino()
    with torch.no_grad():
        for b in model.teacher.buffers():
            if b.is_floating_point():
                b.fill_(math.nan)
    model.update_teacher(0.0)
    teacher = dict(model.teacher.named_buffers())
    assert all(torch.equal(teacher[n], p) for n, p in model.student.named_parameters())


def test_update_teacher_names_a_parametrized_student():
    """kills: the ``moved`` check of _ema_pairs dropped (a bare KeyError from a renamed parameter)."""
    model = _dino()
    torch.nn.utils.parametrize.register_parametrization(model.student.head.mlp[0], "weight", torch.nn.Identity())
    with pytest.raises(ValueError, match="no longer has the parameters"):
        model.update_teacher(0.5)


def test_a_new_dino_teacher_is_in_eval_mode():
    """kills: ``self.teacher.eval()`` dropped from the constructor (a teacher with live dropout until ``train()``)."""
    model = _dino()
    assert model.student.training and not model.teacher.training
    assert not any(m.training for m in model.teacher.modules())


def test_teacher_output_has_no_graph_even_for_an_input_that_requires_grad():
    """kills: ``torch.no_grad()`` dropped from ``forward(output="teacher")`` (only the student receives gradients)."""
    model = _dino()
    x = torch.randn(2, 1, 8, 8, requires_grad=True)
    assert not model(x, output="teacher").requires_grad
    assert model(x, output="student").requires_grad


def test_update_center_refuses_logits_on_another_device():
    """kills: the device check of update_center dropped (meta logits left the CPU centre silently unchanged)."""
    model = _dino()
    with pytest.raises(ValueError, match="device"):
        model.update_center(torch.zeros(2, 6, device="meta"))


def test_reset_parameters_gives_the_state_of_a_dino_built_anew():
    """kills: ``self.center.zero_()`` dropped and ``teacher.copy_(student)`` dropped from DINO.reset_parameters.
    Reference: a DINO constructed under the same seed."""
    fresh = _dino(seed=3).state_dict()
    model = _dino(seed=1)
    with torch.no_grad():
        for p in model.student.parameters():
            p.add_(1.0)
    model.update_teacher(0.5)
    model.update_center(torch.randn(4, 6))
    torch.manual_seed(3)
    model.reset_parameters()
    state = model.state_dict()
    assert state.keys() == fresh.keys()
    assert [k for k in fresh if not torch.equal(state[k], fresh[k])] == []


# ----------------------------------------------------------------------------- checkpoint.py
_DROP = object()  # a key _payload leaves out


def _payload(**over) -> dict:
    payload = {"format": CHECKPOINT_FORMAT, "step": 3, "model": {"w": torch.full((64,), 1.5)}, "optimizer": {},
               "rng": {}, "config": {}}
    payload.update(over)
    return {k: v for k, v in payload.items() if v is not _DROP}


def test_save_checkpoint_removes_the_temporaries_a_killed_save_left():
    """kills: the ``leftover_temps`` cleanup dropped (a checkpoint-sized file stayed per hard kill)."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        stale = Path(d) / ".checkpoint.pt.abcd1234.tmp"
        other = Path(d) / ".checkpoint.pt.best.abcd1234.tmp"  # another file's temporary: kept
        stale.write_bytes(b"x" * 10)
        other.write_bytes(b"x")
        save_checkpoint(Path(d) / "checkpoint.pt", _payload())
        assert sorted(p.name for p in Path(d).iterdir()) == [other.name, "checkpoint.pt"]


@pytest.mark.parametrize("key", ["format", "rng"])
def test_load_checkpoint_names_a_missing_key(tmp_path, key):
    """kills: ``"rng"`` dropped from _REQUIRED (the trainer's bare KeyError later), and _REQUIRED[1:] (no "format":
    a bare KeyError at the format check)."""
    torch.save(_payload(**{key: _DROP}), tmp_path / "c.pt")
    with pytest.raises(CheckpointError, match=rf"missing \['{key}'\]"):
        load_checkpoint(tmp_path / "c.pt")


def test_load_checkpoint_refuses_another_format(tmp_path):
    """kills: the format check dropped."""
    torch.save(_payload(format="diffusionformer.train/0"), tmp_path / "c.pt")
    with pytest.raises(CheckpointError, match="expected format"):
        load_checkpoint(tmp_path / "c.pt")


def test_load_checkpoint_steps_zero_loads_and_a_bool_does_not(tmp_path):
    """kills: ``step < 0`` -> ``step <= 0`` (a checkpoint of step 0 refused) and the bool check dropped."""
    torch.save(_payload(step=0), tmp_path / "c.pt")
    assert load_checkpoint(tmp_path / "c.pt")["step"] == 0
    torch.save(_payload(step=True), tmp_path / "c.pt")
    with pytest.raises(CheckpointError, match="int step"):
        load_checkpoint(tmp_path / "c.pt")


@pytest.mark.parametrize("over, match", [({"config": [1]}, "'config' to be a dict"),
                                         ({"model": {0: torch.ones(1)}}, "the key 0"),
                                         ])
def test_load_checkpoint_refuses_a_bad_layout(tmp_path, over, match):
    """kills: ``("model", "config")`` -> ``("model",)`` and the non-string state-dict key check dropped."""
    torch.save(_payload(**over), tmp_path / "c.pt")
    with pytest.raises(CheckpointError, match=match):
        load_checkpoint(tmp_path / "c.pt")


def test_load_checkpoint_of_a_list_says_it_wanted_a_dict(tmp_path):
    """kills: the ``isinstance(payload, dict)`` check dropped (a list was reported as missing every key)."""
    torch.save([1, 2], tmp_path / "c.pt")
    with pytest.raises(CheckpointError, match="got list"):
        load_checkpoint(tmp_path / "c.pt")


def test_a_flipped_byte_in_a_tensor_is_refused_not_loaded(tmp_path):
    """kills: the ``zip_damage`` check dropped: torch.load does not check the records' CRCs, so a flipped bit in
    the weights loaded silently as another value (lost data)."""
    path = save_checkpoint(tmp_path / "c.pt", _payload())
    raw = bytearray(path.read_bytes())
    needle = torch.full((1,), 1.5).numpy().tobytes() * 64
    at = raw.find(needle)
    assert at >= 0 and zipfile.is_zipfile(path)
    raw[at + 2] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="corrupt"):
        load_checkpoint(path)


def test_save_checkpoint_refuses_a_non_mapping_before_making_folders(tmp_path):
    """kills: the Mapping check dropped (a bare TypeError after mkdir)."""
    with pytest.raises(TypeError, match="mapping"):
        save_checkpoint(tmp_path / "new" / "c.pt", None)
    assert not (tmp_path / "new").exists()


def test_model_record_differences_count_and_limit():
    """kills: ``len(diffs) > limit`` -> ``>=`` ("... and 0 more") and ``diffs[:limit]`` -> ``diffs[:limit + 1]``."""
    six = model_record_differences({"config": {f"k{i}": 0 for i in range(6)}},
                                   {"config": {f"k{i}": 1 for i in range(6)}})
    assert len(six) == 6 and not any("more" in d for d in six)
    eight = model_record_differences({"config": {f"k{i}": 0 for i in range(8)}},
                                     {"config": {f"k{i}": 1 for i in range(8)}})
    assert len(eight) == 7 and eight[-1] == "... and 2 more"


def test_model_record_differences_see_the_class_and_read_names_as_read():
    """kills: the class comparison dropped, and ``_names_as_read`` dropped (``"RMSNorm"`` is ``"rmsnorm"``)."""
    assert model_record_differences({"class": "a.A"}, {"class": "b.B"}) == ["class: checkpoint a.A, now b.B"]
    assert model_record_differences({"config": {"norm": "RMSNorm"}}, {"config": {"norm": "rmsnorm"}}) == []
