"""Edge-case probes of DINO (``models.dino``), ``SSLConfig``, the public test helpers and single-process distributed.

Probed: ``dino_loss`` against a hand-written float64 reference (one teacher view, gradcheck, numpy/tensor
temperatures, B=0, mixed dtypes, bad centres and temperatures), the schedules at their ends (momentum 0 and 1,
warm-ups longer than the run), the teacher EMA by hand (momentum 0/0.7/1), ``update_center`` (by hand, on an
empty batch), ``DINOConfig`` / ``SSLConfig`` with numpy numbers, NaN/inf temperatures and misspelt keys,
``init_distributed`` without env vars and ``shard_batch`` (indivisible batch, B=0, namedtuples, numpy rank),
``interrupt_on_call`` on static/class methods (own, inherited, on instances), ``assert_same_checkpoint_weights``
(-0.0, NaN, non-contiguous), the graph helpers (0/1 nodes) and ``cpu_allocations``.

Found and fixed:
* ``dino_loss`` / ``center_sharpen`` accepted a NaN temperature (``t <= 0`` is False for NaN): a NaN loss.
* ``center_sharpen`` took a ``(B, K)`` centre and broadcast it per sample (a silently wrong loss), and a
  ``(2, K)`` one with another B gave a bare broadcasting RuntimeError; documented: ``(K,)`` or ``(1, K)``.
* ``dino_loss`` with a bf16 (autocast) student and fp32 teacher, or fp32 and fp64: bare einsum RuntimeError.
* ``DINOConfig`` accepted NaN / inf temperatures.
* ``DINO.update_center`` on an empty batch made the centre NaN for the rest of training (0 / 0).
* ``SSLConfig`` refused numpy numbers (``local_crops=np.int64(2)``: "must be an int >= 0, got np.int64(2)")
  that ``DINOConfig`` and ``config_from_dict`` accept.
* ``interrupt_on_call`` on a static or class method inherited from a base class patched in a plain function:
  calling it on an instance then passed the instance as an extra argument (TypeError); ``call=1.5`` was
  accepted and never fired.
"""

from __future__ import annotations

import collections
import math

import numpy as np
import pytest
import torch

from diffusionformer.config import config_from_dict
from diffusionformer.data.ssl import SSLConfig
from diffusionformer.models.dino import (DINO, DINOConfig, center_sharpen, cosine_momentum, dino_loss,
                                         teacher_temperature)
from diffusionformer.testing import (assert_same_checkpoint_weights, causal_edge_index, complete_edge_index,
                                     interrupt_on_call)
from diffusionformer.train.distributed import init_distributed, shard_batch

TINY = dict(input_size=(8, 8), patch_size=2, dim=16, depth=1, num_heads=2, out_dim=8, head_hidden=16,
            head_bottleneck=4)


def _reference_loss(s, t, c, ts, tt):
    """DINO's loss written out: teacher view i vs student view j != i, cross-entropy averaged over b, then pairs."""
    s, t, c = s.double(), t.double(), c.double().reshape(-1)
    total, pairs = 0.0, 0
    for i in range(t.shape[0]):
        for j in range(s.shape[0]):
            if i == j:
                continue
            for b in range(s.shape[1]):
                p = [math.exp((float(t[i, b, k]) - float(c[k])) / tt) for k in range(s.shape[2])]
                z = sum(p)
                logz = math.log(sum(math.exp(float(s[j, b, k]) / ts) for k in range(s.shape[2])))
                total += -sum(p[k] / z * (float(s[j, b, k]) / ts - logz) for k in range(s.shape[2])) / s.shape[1]
            pairs += 1
    return total / pairs


def _logits(vs=4, vt=2, b=3, k=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(vs, b, k, generator=g, dtype=torch.float64), torch.randn(vt, b, k, generator=g, dtype=torch.float64),
            torch.randn(k, generator=g, dtype=torch.float64))


# ----------------------------------------------------------------------------- dino_loss: working edges
@pytest.mark.parametrize("vt", [1, 2])
def test_dino_loss_matches_hand_reference_one_or_two_teacher_views(vt):
    s, t, c = _logits(vt=vt)
    assert float(dino_loss(s, t, c, 0.1, 0.04)) == pytest.approx(_reference_loss(s, t, c, 0.1, 0.04), rel=1e-12)
    # a (1, K) centre, numpy and 0-dim tensor temperatures give the same loss
    ref = dino_loss(s, t, c, 0.1, 0.04)
    torch.testing.assert_close(dino_loss(s, t, c.view(1, -1), np.float64(0.1), torch.tensor(0.04)), ref)


def test_dino_loss_gradcheck_and_no_teacher_gradient():
    s, t, c = _logits()
    s.requires_grad_()
    t.requires_grad_()
    assert torch.autograd.gradcheck(lambda x: dino_loss(x, t, c, 0.1, 0.04), (s,))
    dino_loss(s, t, c, 0.1, 0.04).backward()
    assert t.grad is None


def test_dino_loss_rejects_one_view_and_mismatched_batches():
    with pytest.raises(ValueError, match=">= 2 student views"):
        dino_loss(torch.zeros(1, 2, 4), torch.zeros(1, 2, 4), torch.zeros(4), 0.1, 0.04)
    with pytest.raises(ValueError, match="do not match"):
        dino_loss(torch.zeros(3, 2, 4), torch.zeros(2, 3, 4), torch.zeros(4), 0.1, 0.04)
    with pytest.raises(ValueError, match="center"):
        dino_loss(torch.zeros(3, 2, 4), torch.zeros(2, 2, 4), torch.zeros(3), 0.1, 0.04)


# ----------------------------------------------------------------------------- dino_loss: bugs
@pytest.mark.parametrize("which", ["student", "teacher"])
def test_dino_loss_rejects_nan_temperature(which):
    """Bug: a NaN student or teacher temperature passed the ``<= 0`` check and the loss was NaN."""
    s, t, c = _logits()
    temps = {"student": (float("nan"), 0.04), "teacher": (0.1, float("nan"))}[which]
    with pytest.raises(ValueError, match="must be positive"):
        dino_loss(s, t, c, *temps)
    with pytest.raises(ValueError, match="must be positive"):
        center_sharpen(t, c, float("nan"))


def test_center_of_batch_shape_is_refused():
    """Bug: a (B, K) centre broadcast per sample (a silently different loss), another (n, K) gave a bare
    broadcasting RuntimeError; the documented centre is (K,) or (1, K)."""
    s, t, _ = _logits(b=2)
    with pytest.raises(ValueError, match=r"center must have shape \(K,\) or \(1, K\), got \(2, 5\)"):
        dino_loss(s, t, torch.randn(2, 5, dtype=torch.float64), 0.1, 0.04)
    with pytest.raises(ValueError, match="center must have shape"):
        dino_loss(s, t, torch.zeros(3, 5), 0.1, 0.04)
    with pytest.raises(ValueError, match="center must have shape"):
        center_sharpen(t, torch.zeros(1, 1, 5), 0.04)


@pytest.mark.parametrize("student_dtype,teacher_dtype", [(torch.bfloat16, torch.float32), (torch.float32, torch.float64)])
def test_dino_loss_mixed_dtypes(student_dtype, teacher_dtype):
    """Bug: a bf16 student (autocast) with an fp32 teacher, or fp32 with fp64, raised a bare einsum RuntimeError."""
    s, t, c = _logits()
    s = s.to(student_dtype).requires_grad_()
    loss = dino_loss(s, t.to(teacher_dtype), c, 0.1, 0.04)
    assert loss.dtype == torch.promote_types(student_dtype, teacher_dtype)
    tol = 2e-2 if student_dtype == torch.bfloat16 else 1e-5
    assert float(loss.detach()) == pytest.approx(_reference_loss(s.detach(), t.to(teacher_dtype), c, 0.1, 0.04), rel=tol)
    loss.backward()
    assert s.grad.dtype == student_dtype and torch.isfinite(s.grad.float()).all()


# ----------------------------------------------------------------------------- schedules and config
def test_schedules_at_their_ends():
    assert [cosine_momentum(s, 0.0, 10) for s in (0, 5, 10, 50)] == pytest.approx([0.0, 0.5, 1.0, 1.0])
    assert [cosine_momentum(s, 1.0, 10) for s in (0, 3)] == [1.0, 1.0]
    # a warm-up longer than the run: still on the line at the last step
    assert teacher_temperature(10, final=0.07, warmup=0.04, warmup_steps=1000) == pytest.approx(0.04 + 0.03 * 10 / 1000)
    cfg = DINOConfig(**TINY, warmup_teacher_temp=0.04, teacher_temp=0.07, warmup_teacher_temp_steps=1000,
                     schedule_steps=5)
    assert cfg.teacher_temp_at(500) == pytest.approx(0.055) and cfg.momentum_at(5) == 1.0


@pytest.mark.parametrize("name", ["student_temp", "teacher_temp", "warmup_teacher_temp"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_dino_config_rejects_non_finite_temperature(name, value):
    """Bug: DINOConfig accepted a NaN or infinite temperature (the loss then was NaN or uniform)."""
    with pytest.raises(ValueError, match=name):
        DINOConfig(**TINY, **{name: value})


def test_ssl_config_accepts_numpy_numbers():
    """Bug: SSLConfig(local_crops=np.int64(2)) said "must be an int >= 0, got np.int64(2)" (knn_k and
    knn_temperature alike), while DINOConfig and config_from_dict read numpy numbers as Python ones."""
    cfg = SSLConfig(local_crops=np.int64(2), knn_k=np.int64(5), knn_temperature=np.float32(0.5),
                    blur_sigma=(np.float64(0.1), 0.6))
    assert cfg == SSLConfig(local_crops=2, knn_k=5, knn_temperature=0.5, blur_sigma=(0.1, 0.6))
    assert type(cfg.knn_k) is int and type(cfg.knn_temperature) is float and type(cfg.blur_sigma[0]) is float
    assert cfg.augmentation().local_crops == 2


def test_ssl_config_misspelt_key_and_bad_values():
    with pytest.raises(ValueError, match="did you mean 'local_crops'"):
        config_from_dict(SSLConfig, {"local_crop": 2})
    with pytest.raises(ValueError, match="knn_temperature"):
        SSLConfig(knn_temperature=float("nan"))
    with pytest.raises(ValueError, match="knn_k"):
        SSLConfig(knn_k=np.float64(5.0))


# ----------------------------------------------------------------------------- the DINO module
@pytest.mark.parametrize("m", [0.0, 0.7, 1.0])
def test_update_teacher_matches_hand_ema(m):
    torch.manual_seed(0)
    dino = DINO(DINOConfig(**TINY))
    with torch.no_grad():
        for p in dino.student.parameters():
            p.add_(torch.randn_like(p))
    t0 = {k: v.clone().double() for k, v in dino.teacher.named_buffers()}
    s0 = {k: v.detach().clone().double() for k, v in dino.student.named_parameters()}
    dino.update_teacher(m)
    for k in s0:
        torch.testing.assert_close(dino.teacher.get_buffer(k).double(), m * t0[k] + (1 - m) * s0[k], atol=1e-6, rtol=0)
    assert sum(p.numel() for p in dino.parameters()) == sum(p.numel() for p in dino.student.parameters())


def test_update_center_by_hand_and_on_empty_batch():
    """Bug: update_center on an empty batch divided 0 by 0 and left the centre NaN for the rest of the run."""
    dino = DINO(DINOConfig(**TINY, center_momentum=0.75))
    logits = torch.arange(2 * 3 * 8, dtype=torch.float32).view(2, 3, 8)
    dino.update_center(logits)
    torch.testing.assert_close(dino.center, 0.25 * logits.reshape(6, 8).mean(0, keepdim=True))
    before = dino.center.clone()
    dino.update_center(torch.zeros(0, 8))
    assert torch.equal(dino.center, before)


# ----------------------------------------------------------------------------- single-process distributed
def test_single_process_distributed(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    ctx = init_distributed("cpu")
    assert (ctx.rank, ctx.world_size, ctx.is_main, ctx.is_distributed, ctx.owns_group) == (0, 1, True, False, False)
    x = torch.arange(3.0)
    assert ctx.all_reduce_mean(x) is x
    ctx.barrier()
    ctx.shutdown()
    NT = collections.namedtuple("NT", "a n")
    out = shard_batch(NT(torch.arange(6).view(3, 2).t(), 3), 1, 2)  # a transposed (non-contiguous) leaf
    assert isinstance(out, NT) and out.n == 3 and torch.equal(out.a, torch.tensor([[1, 3, 5]]))
    assert shard_batch(torch.zeros(0, 3), 1, 2).shape == (0, 3)
    with pytest.raises(ValueError, match="divisible by world_size=2"):
        shard_batch({"x": torch.arange(5)}, 0, 2)
    with pytest.raises(TypeError, match="rank an int"):
        shard_batch(torch.arange(4), 0.0, 2)


# ----------------------------------------------------------------------------- public test helpers
class _Base:
    @staticmethod
    def s(x):
        return ("s", x)

    @classmethod
    def c(cls, x):
        return (cls.__name__, x)


class _Child(_Base):
    pass


@pytest.mark.parametrize("name", ["s", "c"])
def test_interrupt_on_call_inherited_static_and_class_methods(name):
    """Bug: an inherited static or class method was patched as a plain function, so ``instance.method(x)``
    passed the instance as an extra argument (TypeError instead of the original's result)."""
    with interrupt_on_call(_Child, name, 3) as seen:
        first = getattr(_Child, name)(1)
        second = getattr(_Child(), name)(2)
        with pytest.raises(KeyboardInterrupt):
            getattr(_Child(), name)(3)
    assert seen["calls"] == 3
    assert first[1] == 1 and second[1] == 2
    assert name not in _Child.__dict__ and getattr(_Child(), name)(4)[1] == 4  # restored: inherited again


@pytest.mark.parametrize("call", [1.5, True, "2"])
def test_interrupt_on_call_rejects_non_int_call(call):
    """Bug: call=1.5 was accepted and never fired (no simulated kill, silently)."""
    with pytest.raises(TypeError, match="call must be an int"):
        with interrupt_on_call(_Base, "s", call):
            pass


def test_assert_same_checkpoint_weights_bitwise(tmp_path):
    def save(name, t):
        torch.save({"model": {"w": t}}, tmp_path / name)
        return tmp_path / name

    a, b = save("a", torch.tensor([0.0])), save("b", torch.tensor([-0.0]))
    with pytest.raises(AssertionError, match="1 of 1 tensors differ"):
        assert_same_checkpoint_weights(a, b)
    nan = save("nan", torch.tensor([float("nan")]))
    assert_same_checkpoint_weights(nan, save("nan2", torch.tensor([float("nan")])))
    base = torch.arange(6.0).view(2, 3)
    assert_same_checkpoint_weights(save("t", base.t()), save("tc", base.t().contiguous()))
    with pytest.raises(AssertionError, match="different tensors"):
        torch.save({"model": {"v": torch.zeros(1)}}, tmp_path / "v")
        assert_same_checkpoint_weights(a, tmp_path / "v")


def test_graph_helpers_small_graphs():
    assert complete_edge_index(0).shape == (2, 0) and causal_edge_index(0).shape == (2, 0)
    assert complete_edge_index(1, self_loops=False).shape == (2, 0)
    assert complete_edge_index(1).tolist() == [[0], [0]]
    assert causal_edge_index(3).shape[1] == 6  # n (n + 1) / 2


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 0.0])
def test_ssl_knn_temperature_and_dino_head_sizes_must_be_finite(value):
    """Bug: ``SSLConfig(knn_temperature=inf)`` was accepted (every k-NN vote then weighs the same: the evaluation
    silently turns into a majority vote), and the shared ``check_positive`` of the model configs let NaN and inf
    through (a ``DINOHead`` width of inf, a temperature of NaN); now each is named."""
    from diffusionformer.models.common import check_positive

    with pytest.raises(ValueError, match=r"SSLConfig\.knn_temperature must be positive and finite, got "):
        SSLConfig(knn_temperature=value)
    with pytest.raises(ValueError, match=r"^Where\.t must be (positive|a finite float), got "):
        check_positive("Where", t=value)
    check_positive("Where", t=0.07, n=3)
