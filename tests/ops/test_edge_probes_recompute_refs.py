"""Edge probes: recomputed attention (``ops.recompute``), the float64 references (``ops.reference``,
``ops.reference_rivals``) against explicit formulas, and the testing helpers ``testing.memory`` and
``testing.faults`` (misuse, nesting, cleanup)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from diffusionformer import DiffusionAttention
from diffusionformer.ops.recompute import recompute_saved
from diffusionformer.ops.reference import dense_attention_reference, heat_kernel_reference
from diffusionformer.ops.reference_rivals import (attnscale_reference, chebyshev_reference, differential_reference,
                                                  grand_nl_reference, ppr_exact_reference)
from diffusionformer.testing.faults import assert_same_checkpoint_weights, interrupt_on_call
from diffusionformer.testing.memory import cpu_allocations

D64 = torch.float64


# ----------------------------------------------------------------------------------------------- recompute


def test_bug_recompute_accepts_a_recomputation_of_another_shape():
    """Bug: the rebuilt tensor was checked for z's strides and dtype only, so a function returning a larger
    tensor with the same strides handed its first elements out as z (silently wrong gradients) although the
    docstring promises a RuntimeError for a shape that is not z's."""
    a = torch.randn(2, 3, dtype=D64, requires_grad=True)
    w = torch.randn(4, 3, dtype=D64, requires_grad=True)
    z = a * 2.0
    other = torch.randn(5, 3, dtype=D64)  # strides (3, 1), as z's
    with recompute_saved(z, lambda: other * 2.0):
        y = F.linear(z, w)
    with pytest.raises(RuntimeError, match=r"shape \(5, 3\).*\(2, 3\)"):
        y.sum().backward()


@pytest.mark.parametrize("heads", ["attention:3,laplacian:3", "attention:4,heat(t=1.0, steps=4):2",
                                   "polynomial(steps=3):6"])
@pytest.mark.parametrize("frozen", [(), ("qkv",), ("out_proj",)])
def test_recompute_in_float64_with_dropout_and_frozen_parameters_gives_the_plain_bits(heads, frozen):
    torch.manual_seed(0)
    layer = DiffusionAttention(24, 6, heads, causal=True, backend="sdpa", dropout=0.3).double().train()
    for n, p in layer.named_parameters():
        p.requires_grad_(not n.startswith(frozen) if frozen else True)
    x = torch.randn(2, 7, 24, dtype=D64, requires_grad=True)

    def run(recompute: bool) -> list:
        layer.recompute = recompute
        layer.zero_grad(set_to_none=True)
        x.grad = None
        torch.manual_seed(4)  # the same dropout draws; the replay draws none
        y = layer(x)
        (y**2).sum().backward()
        return [y.detach(), x.grad] + [p.grad for p in layer.parameters()]

    on, off = run(True), run(False)
    for a, b in zip(on, off):
        assert (a is None and b is None) or torch.equal(a, b)


def test_recompute_double_backward_and_no_grad_and_inference_mode():
    a = torch.randn(2, 3, dtype=D64, requires_grad=True)
    w = torch.randn(4, 3, dtype=D64, requires_grad=True)

    def grads(recompute: bool) -> tuple:
        z = a.tanh() * 2.0
        if recompute:
            with recompute_saved(z, lambda: a.detach().tanh() * 2.0):
                y = F.linear(z, w)
        else:
            y = F.linear(z, w)
        g, = torch.autograd.grad((y**2).sum(), w, create_graph=True)
        return (g,) + torch.autograd.grad(g.pow(2).sum(), (a, w))

    for x, y in zip(grads(True), grads(False)):
        assert torch.equal(x, y)
    for ctx in (torch.no_grad, torch.inference_mode):
        with ctx():
            z = a * 2.0
            with recompute_saved(z, lambda: a * 2.0):
                assert torch.equal(F.linear(z, w), F.linear(a * 2.0, w))


# ---------------------------------------------------------------------------------------------- references


def _taylor_exp(M: torch.Tensor, terms: int = 60) -> torch.Tensor:
    E = term = torch.eye(M.shape[-1], dtype=D64)
    for n in range(1, terms):
        term = term @ M / n
        E = E + term
    return E


def test_heat_and_ppr_references_against_a_taylor_series_and_a_solve():
    torch.manual_seed(0)
    P = torch.softmax(torch.randn(2, 3, 5, 5, dtype=D64), -1)
    v = torch.randn(2, 3, 5, 4, dtype=D64)
    t = torch.tensor([0.3, 1.0, 2.5], dtype=D64)  # one time per head
    eye = torch.eye(5, dtype=D64)
    ref = torch.stack([torch.stack([_taylor_exp(-t[h] * (eye - P[b, h])) @ v[b, h] for h in range(3)])
                       for b in range(2)])
    torch.testing.assert_close(heat_kernel_reference(P, v, t), ref, rtol=0, atol=1e-12)
    alpha = 0.15
    torch.testing.assert_close(ppr_exact_reference(P, v, alpha),
                               alpha * torch.linalg.solve(eye - (1 - alpha) * P, v), rtol=0, atol=1e-12)


def test_differential_and_grand_references_against_the_published_equations():
    torch.manual_seed(1)
    B, H, N, C = 1, 1, 5, 6
    q, k, v = (torch.randn(B, H, N, C, dtype=D64) for _ in range(3))
    lq1, lk1, lq2, lk2 = (torch.randn(C // 2, dtype=D64) * 0.3 for _ in range(4))
    gain = torch.rand(C, dtype=D64) + 0.5
    allowed = torch.ones(N, N, dtype=torch.bool).tril()
    h = C // 2
    mask = torch.zeros(N, N, dtype=D64).masked_fill(~allowed, -math.inf)
    P1 = torch.softmax(q[..., :h] @ k[..., :h].transpose(-1, -2) / math.sqrt(h) + mask, -1)
    P2 = torch.softmax(q[..., h:] @ k[..., h:].transpose(-1, -2) / math.sqrt(h) + mask, -1)
    lam = math.exp(float(lq1 @ lk1)) - math.exp(float(lq2 @ lk2)) + 0.4
    y = (P1 - lam * P2) @ v
    expected = 0.6 * gain * y / torch.sqrt(y.pow(2).mean(-1, keepdim=True) + 1e-5)
    got = differential_reference(q, k, v, lq1, lk1, lq2, lk2, gain, 0.4, allowed)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    # GRAND-nl, one Euler step of size t: X + t (P(X) - I) X, P from the q and k parts, scale 1/sqrt(C)
    X = torch.cat([q, k, v], -1)
    P = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(C), -1)
    torch.testing.assert_close(grand_nl_reference(q, k, v, 0.7, 1), (X + 0.7 * (P @ X - X))[..., 2 * C:],
                               rtol=0, atol=1e-12)


def test_bug_attnscale_reference_with_fewer_queries_than_keys():
    """Bug: without a mask the uniform map was built square from the number of keys, (M, M): one query against
    M keys (a decoding step) returned an (M, C) output per head instead of (1, C), and N != M queries raised a
    broadcasting error."""
    torch.manual_seed(2)
    q, k, v = torch.randn(2, 3, 1, 4, dtype=D64), torch.randn(2, 3, 6, 4, dtype=D64), torch.randn(2, 3, 6, 4, dtype=D64)
    omega = torch.tensor([0.5, -0.2, 1.0], dtype=D64)
    P = dense_attention_reference(q, k)
    DC = torch.full_like(P, 1.0 / 6)
    expected = (DC + (1 + omega.view(1, -1, 1, 1)) * (P - DC)) @ v
    torch.testing.assert_close(attnscale_reference(q, k, v, omega), expected, rtol=0, atol=1e-14)
    assert attnscale_reference(torch.randn(2, 3, 4, 4, dtype=D64), k, v, omega).shape == (2, 3, 4, 4)


def test_bug_rival_references_build_their_identity_on_the_cpu():
    """Bug: ppr_exact_reference and chebyshev_reference built I on the CPU, and attnscale_reference its uniform
    map, so inputs on another device (here the meta device) failed with a device mismatch where the
    references of ops.reference follow their inputs."""
    P = torch.softmax(torch.randn(1, 2, 4, 4, dtype=D64), -1).to("meta")
    v = torch.randn(1, 2, 4, 3, dtype=D64).to("meta")
    assert ppr_exact_reference(P, v, 0.2).device.type == "meta"
    assert chebyshev_reference(P, v, torch.randn(2, 3).to("meta")).device.type == "meta"
    q = torch.randn(1, 2, 4, 3).to("meta")
    assert attnscale_reference(q, q, v, torch.zeros(2).to("meta")).device.type == "meta"


# ------------------------------------------------------------------------------------------ testing helpers


def test_bug_cpu_allocations_inside_a_running_profiler():
    """Bug: cpu_allocations inside another (its own or torch.profiler.profile) started a second profiler; the
    inner one stopped the session, and the outer one's exit crashed the interpreter with a segmentation
    fault. It is refused now, before the inner profiler starts, and the outer one ends normally."""
    with pytest.raises(RuntimeError, match="a profiler is already running"):
        cpu_allocations(lambda: cpu_allocations(lambda: torch.empty(8)))
    _, changes, _ = cpu_allocations(lambda: torch.empty(256))
    assert sum(changes) == 1024  # the profiler still works after the refusal
    with pytest.raises(TypeError, match="fn must be callable"):
        cpu_allocations(3)


class _Base:
    @classmethod
    def make(cls, x):
        return cls.__name__, x

    @property
    def size(self):
        return 1


class _Sub(_Base):
    pass


def test_bug_interrupt_on_call_binds_a_class_method_to_the_patched_class():
    """Bug: a class method patched on a class called the original bound to that class, so a subclass calling it
    before the kill got the patched class as ``cls`` (``_Sub.make`` returned ``_Base``'s result)."""
    with interrupt_on_call(_Base, "make", 3) as seen:
        assert _Sub.make(1) == ("_Sub", 1)
        assert _Base.make(2) == ("_Base", 2)
        with pytest.raises(KeyboardInterrupt):
            _Sub.make(3)
        assert seen["calls"] == 3
    assert isinstance(_Base.__dict__["make"], classmethod) and _Sub.make(4) == ("_Sub", 4)
    with interrupt_on_call(_Sub, "make", 1, after=True):  # inherited: removed again on exit
        with pytest.raises(KeyboardInterrupt):
            _Sub.make(5)
    assert "make" not in _Sub.__dict__


def test_bug_interrupt_on_call_replaces_a_property_with_a_method():
    """Bug: a property (or any attribute that is not a method) was replaced by the wrapper: it was never called
    (no kill), and reading the attribute returned a bound method instead of its value."""
    with pytest.raises(TypeError, match=r"size must be a method, got property"):
        with interrupt_on_call(_Base, "size", 1):
            pass
    assert _Base().size == 1


def test_bug_checkpoint_weights_of_conjugate_views(tmp_path):
    """Bug: a checkpoint holding a conjugate (or negative) view, which torch.save keeps as such, made
    assert_same_checkpoint_weights raise a RuntimeError from its byte view, even against the same file."""
    x, y = torch.tensor([1 + 2j, 3 - 1j]), torch.tensor([2 - 1j, 0.5 + 4j])
    torch.save({"model": {"c": x.conj(), "n": y.conj().imag}}, tmp_path / "a.pt")
    torch.save({"model": {"c": x.conj().resolve_conj(), "n": y.conj().imag.resolve_neg()}}, tmp_path / "b.pt")
    torch.save({"model": {"c": x, "n": y.imag}}, tmp_path / "c.pt")
    assert_same_checkpoint_weights(tmp_path / "a.pt", tmp_path / "a.pt")
    assert_same_checkpoint_weights(tmp_path / "a.pt", tmp_path / "b.pt")
    with pytest.raises(AssertionError, match="2 of 2 tensors differ"):
        assert_same_checkpoint_weights(tmp_path / "a.pt", tmp_path / "c.pt")


def test_bug_checkpoint_weights_entry_that_is_not_a_state_dict(tmp_path):
    """Bug: an entry that is not a dict (a tensor, a list) was iterated as one: a file compared with itself
    failed with "checkpoints hold different tensors" listing tensors, not saying what was wrong."""
    torch.save({"model": torch.ones(3)}, tmp_path / "t.pt")
    with pytest.raises(TypeError, match=r"entry 'model' must be a state dict, got Tensor"):
        assert_same_checkpoint_weights(tmp_path / "t.pt", tmp_path / "t.pt")
