"""Second edge-case pass over the vision models: ``DiffusionViT``, ``DINO`` and their presets, against independent
float64 references.

Probed (and found right): the ViT forward against a float64 ViT written from the equations (patches cut by an explicit
reshape, class token, learned position embedding or axial 2-D RoPE at ``(row + 1, col + 1)``, pre-norm blocks with
hand-written per-head attention and q/k LayerNorm, LayerScale, final norm, class-token or mean pooling) on non-square
RGB and grey images, with dropout, attention dropout and drop path set but the model in eval mode; DINO's loss, centre
and EMA against a line-by-line port of ``DINOLoss`` / the EMA of ``main_dino.py`` (facebookresearch/dino), local
crops going through the student only and the centre moving by the teacher's global views only (DINOTask); the
cosine momentum against DINO's ``cosine_scheduler`` formula; the AdamW groups of a DINO model (biases, norms,
LayerScale, class token and position embedding undecayed; no teacher tensor in any group).

Found and fixed:
* ``dino_loss`` detached the teacher's logits but not the centre: a centre computed from the teacher's logits (a
  tensor with a history) sent a gradient through the "no gradient" targets into the teacher.
* ``DiffusionViT.forward`` / ``forward_features`` / ``forward_patch_tokens`` passed ``return_intermediates=True`` on
  to ``forward_tokens`` and sliced its ``(z, intermediates)`` tuple: a bare "tuple indices" ``TypeError``.
* ``DINO.update_center`` on meta logits with a CPU centre silently dropped the batch mean (``c <- m c``: torch's
  in-place add of a meta tensor is a no-op), and a 0-d tensor failed with a bare ``IndexError``.
* (docstring) ``DiffusionViT``'s formula said ``W Norm(pool(z))``; the model pools the normed tokens,
  ``W pool(Norm(z))``, which differs for ``pool="mean"`` (pinned below).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from diffusionformer.data.base import ClassificationData
from diffusionformer.data.ssl import SSLConfig
from diffusionformer.experiments.tasks import DINOTask
from diffusionformer.models.dino import DINO, DINOConfig, cosine_momentum, dino_loss
from diffusionformer.models.vit import DiffusionViT, ViTConfig
from diffusionformer.train.optim import param_groups

TINY_DINO = dict(input_size=(8, 8), patch_size=4, dim=8, depth=1, num_heads=2, out_dim=6, head_hidden=8,
                 head_bottleneck=4)


def _perturb(model: nn.Module, scale: float = 0.3) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn_like(p))


def _vit_reference(m: DiffusionViT, x: torch.Tensor, rotate) -> torch.Tensor:
    """A float64 ViT from the equations, reading ``m``'s weights only (images ``(B, C, H, W)``)."""
    c = m.config
    B, p, D, H = x.shape[0], c.patch_size, c.dim, c.num_heads
    C = D // H
    gh, gw = c.input_size[0] // p, c.input_size[1] // p
    patches = x.reshape(B, c.in_channels, gh, p, gw, p).permute(0, 2, 4, 1, 3, 5).reshape(B, gh * gw, -1)
    z = patches @ m.patch_embed.weight.reshape(D, -1).T + m.patch_embed.bias  # row-major patches, (C, p, p) each
    cls = c.pool == "cls"
    if cls:
        z = torch.cat([m.cls_token.expand(B, -1, -1), z], dim=1)
    if c.rope:  # class token at (0, 0), patch (r, col) at (r + 1, col + 1); rows rotate [0, C/2), columns the rest
        grid = [(0, 0)] * cls + [(r + 1, q + 1) for r in range(gh) for q in range(gw)]
        pos = torch.tensor(grid, dtype=torch.float64)
        freq = c.rope_base ** (-torch.arange(0, C // 2, 2, dtype=torch.float64) / (C // 2))
        angles = torch.cat([pos[:, :1] * freq, pos[:, 1:] * freq], dim=1)
    else:
        z = z + m.pos_embed
    for blk in m.blocks:
        g1 = blk.ls1.gamma if c.layer_scale is not None else 1.0
        g2 = blk.ls2.gamma if c.layer_scale is not None else 1.0
        h = F.layer_norm(z, (D,), blk.norm1.weight, blk.norm1.bias)
        q, k, v = (t.reshape(B, -1, H, C) for t in F.linear(h, blk.attn.qkv.weight, blk.attn.qkv.bias).split(D, -1))
        if c.qk_norm:
            q = F.layer_norm(q, (C,), blk.attn.q_norm.weight, blk.attn.q_norm.bias)
            k = F.layer_norm(k, (C,), blk.attn.k_norm.weight, blk.attn.k_norm.bias)
        if c.rope:
            q, k = rotate(q, angles), rotate(k, angles)
        P = torch.softmax(torch.einsum("bnhc,bmhc->bhnm", q, k) / math.sqrt(C), dim=-1)
        heads = torch.einsum("bhnm,bmhc->bnhc", P, v).reshape(B, -1, D)
        z = z + g1 * F.linear(heads, blk.attn.out_proj.weight, blk.attn.out_proj.bias)
        h = F.layer_norm(z, (D,), blk.norm2.weight, blk.norm2.bias)
        z = z + g2 * F.linear(F.gelu(F.linear(h, blk.mlp.fc1.weight, blk.mlp.fc1.bias)), blk.mlp.fc2.weight,
                              blk.mlp.fc2.bias)
    z = F.layer_norm(z, (D,), m.norm.weight, m.norm.bias)
    feat = z[:, 0] if cls else z.mean(dim=1)  # pool(Norm(z))
    return F.linear(feat, m.head.weight, m.head.bias)


@pytest.mark.parametrize("cfg", [
    dict(input_size=(6, 10), in_channels=3, pool="cls", rope=True, qk_norm=True),
    dict(input_size=(6, 10), in_channels=3, pool="mean", rope=True),
    dict(input_size=(10, 4), in_channels=1, pool="cls", layer_scale=0.5, qk_norm=True),
    dict(input_size=(4, 8), in_channels=3, pool="mean", layer_scale=0.5),
])
def test_vit_equals_a_float64_reference_from_the_equations_with_dropout_off_in_eval(cfg, rotate_pairs):
    torch.manual_seed(0)
    m = DiffusionViT(ViTConfig(patch_size=2, dim=16, depth=2, num_heads=2, num_classes=3, dropout=0.4,
                               attn_dropout=0.4, drop_path=0.5, **cfg)).double()
    _perturb(m)
    x = torch.randn(2, cfg["in_channels"], *cfg["input_size"], dtype=torch.float64)
    assert not torch.equal(m.train()(x), m(x))  # the dropouts are live in training mode
    torch.testing.assert_close(m.eval()(x), _vit_reference(m, x, rotate_pairs), rtol=0, atol=1e-12)


def test_mean_pooling_pools_the_normed_tokens():
    """The documented ``y = W pool(Norm(z^L))``: for ``pool="mean"`` the mean of the normed patch tokens, which is not
    the norm of the mean token."""
    torch.manual_seed(0)
    m = DiffusionViT(ViTConfig(input_size=(4, 4), patch_size=2, dim=8, depth=1, num_heads=2, pool="mean",
                               num_classes=0)).double().eval()
    _perturb(m)
    x = torch.randn(3, 1, 4, 4, dtype=torch.float64)
    _, inter = m.forward_tokens(x, return_intermediates=True)
    last = inter.hidden_states[-1]
    torch.testing.assert_close(m.forward_features(x), m.norm(last).mean(dim=1), rtol=0, atol=1e-14)
    assert (m.forward_features(x) - m.norm(last.mean(dim=1))).abs().max() > 1e-3
    assert "pool}(\\mathrm{Norm}" in DiffusionViT.__doc__


def test_bug_vit_return_intermediates_outside_forward_tokens_is_refused_clearly():
    """Bug: ``vit(x, return_intermediates=True)`` (as GPT and the graph transformer take it), ``forward_features`` and
    ``forward_patch_tokens`` passed the flag on to ``forward_tokens`` and sliced the ``(z, intermediates)`` tuple it
    returned: ``TypeError: tuple indices must be integers or slices, not tuple``."""
    torch.manual_seed(0)
    m = DiffusionViT(ViTConfig(input_size=(4, 4), patch_size=2, dim=8, depth=1, num_heads=2, num_classes=3))
    x = torch.randn(2, 1, 4, 4)
    for name in ("forward", "forward_features", "forward_patch_tokens"):
        with pytest.raises(ValueError, match=rf"^DiffusionViT\.{name}: return_intermediates=True is an argument of "
                                             r"forward_tokens.*call forward_tokens\(x, return_intermediates=True\)"):
            getattr(m, name)(x, return_intermediates=True)
        assert torch.equal(getattr(m, name)(x, return_intermediates=False), getattr(m, name)(x))
    with pytest.raises(TypeError, match="return_intermediates must be a bool"):  # a non-bool: forward_tokens' check
        m.forward_features(x, return_intermediates="yes")
    z, inter = m.forward_tokens(x, return_intermediates=True)
    assert torch.equal(z[:, 0], m.forward_features(x)) and len(inter.hidden_states) == 1


# ----------------------------------------------------------------------------- DINO against main_dino.py
class _DINOLossPort:
    """``DINOLoss`` of facebookresearch/dino ``main_dino.py``, line by line (one process, one epoch's temperature)."""

    def __init__(self, out_dim: int, ncrops: int, teacher_temp: float, student_temp: float = 0.1,
                 center_momentum: float = 0.9) -> None:
        self.student_temp, self.center_momentum, self.ncrops = student_temp, center_momentum, ncrops
        self.teacher_temp = teacher_temp
        self.center = torch.zeros(1, out_dim, dtype=torch.float64)

    def __call__(self, student_output: torch.Tensor, teacher_output: torch.Tensor) -> torch.Tensor:
        student_out = (student_output / self.student_temp).chunk(self.ncrops)
        teacher_out = F.softmax((teacher_output - self.center) / self.teacher_temp, dim=-1).detach().chunk(2)
        total_loss, n_loss_terms = 0, 0
        for iq, q in enumerate(teacher_out):
            for v in range(len(student_out)):
                if v == iq:
                    continue
                total_loss += torch.sum(-q * F.log_softmax(student_out[v], dim=-1), dim=-1).mean()
                n_loss_terms += 1
        total_loss /= n_loss_terms
        with torch.no_grad():
            batch_center = torch.sum(teacher_output, dim=0, keepdim=True) / len(teacher_output)
            self.center = self.center * self.center_momentum + batch_center * (1 - self.center_momentum)
        return total_loss


def test_dino_loss_centre_and_ema_equal_main_dino_over_several_steps_with_local_crops():
    torch.manual_seed(0)
    V, B, K = 6, 3, 7  # 2 global + 4 local crops
    dino = DINO(DINOConfig(**{**TINY_DINO, "out_dim": K}, center_momentum=0.8)).double()
    port = _DINOLossPort(K, V, teacher_temp=0.05, center_momentum=0.8)
    for _ in range(3):
        s = torch.randn(V, B, K, dtype=torch.float64, requires_grad=True)
        t = torch.randn(2, B, K, dtype=torch.float64)
        ours = dino_loss(s, t, dino.center, 0.1, 0.05)
        ref = port(s.flatten(0, 1), t.flatten(0, 1))  # DINO's views are chunks of one (V * B, K) batch
        torch.testing.assert_close(ours, ref, rtol=0, atol=1e-13)
        g_ours, = torch.autograd.grad(ours, s)
        g_ref, = torch.autograd.grad(ref, s)
        torch.testing.assert_close(g_ours, g_ref, rtol=0, atol=1e-13)
        dino.update_center(t)
        torch.testing.assert_close(dino.center, port.center, rtol=0, atol=1e-15)
    # the EMA of main_dino.py: param_k.data.mul_(m).add_((1 - m) * param_q.detach().data), over the parameters
    _perturb(dino.student)
    names = [n for n, _ in dino.student.named_parameters()]  # the teacher's copies are buffers of the same names
    teacher = {n: dino.teacher.get_buffer(n).clone() for n in names}
    for n, sq in dino.student.named_parameters():
        teacher[n].mul_(0.93).add_((1 - 0.93) * sq.detach())
    dino.update_teacher(0.93)
    for n in names:
        torch.testing.assert_close(dino.teacher.get_buffer(n), teacher[n], rtol=0, atol=1e-15)


def test_cosine_momentum_equals_dino_cosine_scheduler_and_ends_at_one():
    base, T = 0.996, 40
    # utils.cosine_scheduler(base, 1, ...) without warm-up: 1 + 0.5 (base - 1) (1 + cos(pi it / len(iters)))
    for step in range(T):
        assert cosine_momentum(step, base, T) == pytest.approx(1 + 0.5 * (base - 1) * (1 + math.cos(math.pi * step / T)),
                                                               rel=0, abs=1e-15)
    assert cosine_momentum(0, base, T) == base and cosine_momentum(T, base, T) == 1.0 == cosine_momentum(T + 7, base, T)
    assert all(cosine_momentum(s, base, T) <= cosine_momentum(s + 1, base, T) for s in range(T + 2))


def test_bug_dino_loss_centre_sends_no_gradient_to_the_teacher():
    """Bug: ``dino_loss`` detached the teacher's logits but not the centre; a centre computed from them (here their
    mean, with its history) made the "no gradient" targets differentiable and the teacher's logits got a gradient
    (DINO's ``DINOLoss`` detaches the whole targets)."""
    torch.manual_seed(0)
    s = torch.randn(4, 3, 5, dtype=torch.float64, requires_grad=True)
    t = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    center = t.mean(dim=(0, 1))
    loss = dino_loss(s, t, center, 0.1, 0.04)
    loss.backward()
    assert t.grad is None and s.grad is not None
    port = _DINOLossPort(5, 4, teacher_temp=0.04)
    port.center = center.detach()[None]
    torch.testing.assert_close(loss.detach(), port(s.detach().flatten(0, 1), t.detach().flatten(0, 1)), rtol=0,
                               atol=1e-13)
    learned = nn.Parameter(torch.randn(5, dtype=torch.float64))  # a centre that is a leaf with requires_grad
    dino_loss(s, t.detach(), learned, 0.1, 0.04).backward()
    assert learned.grad is None


def test_bug_update_center_refuses_logits_on_another_device_and_0d_logits():
    """Bug: ``update_center`` with meta logits and a CPU centre gave ``c <- m c`` (torch's in-place add of a meta
    tensor to a CPU one is a silent no-op: the batch mean was dropped), and a 0-d tensor a bare ``IndexError``."""
    dino = DINO(DINOConfig(**TINY_DINO))
    with torch.no_grad():
        dino.center.fill_(1.0)
    with pytest.raises(ValueError, match=r"^update_center: expected teacher logits on the centre's device cpu, "
                                         r"got meta$"):
        dino.update_center(torch.randn(2, 6, device="meta"))
    with pytest.raises(ValueError, match=r"^update_center: expected teacher logits \(\.\.\., out_dim=6\), got \(\)$"):
        dino.update_center(torch.zeros(()))
    assert torch.equal(dino.center, torch.ones(1, 6))
    dino.update_center(torch.zeros(2, 6))
    torch.testing.assert_close(dino.center, torch.full((1, 6), 0.9))


def _images(n: int = 6) -> ClassificationData:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 1, 8, 8, generator=g)
    y = torch.randint(0, 2, (n,), generator=g)
    return ClassificationData("toy", "image", x, y, x.clone(), y, x.clone(), y, num_classes=2, input_shape=(1, 8, 8))


def test_dino_task_local_crops_reach_the_student_only_and_the_centre_moves_by_the_global_views():
    torch.manual_seed(0)
    dino = DINO(DINOConfig(**TINY_DINO, center_momentum=0.5))
    task = DINOTask(_images(), dino, ssl=SSLConfig(local_crops=3, blur_prob=0.0))
    seen = {}
    for branch in ("student", "teacher"):
        getattr(dino, branch).register_forward_pre_hook(
            lambda mod, args, kw, name=branch: seen.setdefault(name, []).append(args[0].clone()), with_kwargs=True)
    batch = task.train_batch(0, torch.Generator().manual_seed(1), 4)
    views = task._views(batch)  # (5, 4, 1, 8, 8): global views 0, 1 first
    loss, _ = task.loss(dino, batch)
    assert [v.shape[0] for v in seen["student"]] == [5 * 4] and [v.shape[0] for v in seen["teacher"]] == [2 * 4]
    assert torch.equal(seen["teacher"][0], views[:2].flatten(0, 1))
    assert torch.equal(seen["student"][0], views.flatten(0, 1))
    with torch.no_grad():
        teacher = dino(views[:2].flatten(0, 1), output="teacher")
    torch.testing.assert_close(dino.center, 0.5 * teacher.mean(dim=0, keepdim=True), rtol=0, atol=1e-7)
    loss.backward()
    assert all(b.grad is None and not b.requires_grad for b in dino.teacher.buffers())
    assert all(p.grad is not None for p in dino.student.parameters())


def test_dino_weight_decay_groups_exempt_norms_biases_and_tokens_and_hold_no_teacher_tensor():
    dino = DINO(DINOConfig(**TINY_DINO, layer_scale=0.1, qk_norm=True))
    decay, no_decay = (set(g["names"]) for g in param_groups(dino, 0.04))
    assert not any(n.startswith("teacher") for n in decay | no_decay)
    assert decay | no_decay == {n for n, _ in dino.named_parameters()}
    params = dict(dino.named_parameters())
    expected_free = {n for n, p in params.items() if p.dim() < 2} | {"student.backbone.cls_token",
                                                                     "student.backbone.pos_embed"}
    assert no_decay == expected_free
    assert {n for n in no_decay if "norm" in n or n.endswith(".bias") or n.endswith(".gamma")} == no_decay - {
        "student.backbone.cls_token", "student.backbone.pos_embed"}
    assert "student.head.prototypes" in decay and "student.backbone.patch_embed.weight" in decay
