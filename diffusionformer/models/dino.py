r"""``DINO``: self-distillation with no labels on a :class:`DiffusionViT` backbone.

Caron et al., "Emerging Properties in Self-Supervised Vision Transformers" (ICCV 2021). A
student ``g_s`` (backbone + projection head) is trained to match a teacher ``g_t`` of the same
architecture on different views of an image; the teacher is an exponential moving average of
the student and its outputs are *centred* and *sharpened*:

.. math::
    P_t(x) = \mathrm{softmax}\big((g_t(x) - c) / \tau_t\big), \qquad
    P_s(x) = \mathrm{softmax}\big(g_s(x) / \tau_s\big),

.. math::
    \mathcal{L} = \frac{1}{|\mathcal{P}|} \sum_{(i, j) \in \mathcal{P}}
        \frac{1}{B} \sum_b H\big(P_t(x^i_b), P_s(x^j_b)\big), \qquad
    \mathcal{P} = \{(i, j) : i \in \text{global views}, j \in \text{all views}, i \ne j\},

.. math::
    \theta_t \leftarrow m\, \theta_t + (1 - m)\, \theta_s, \qquad
    c \leftarrow m_c\, c + (1 - m_c) \frac{1}{|T|} \sum_{x \in T} g_t(x),

with ``H(p, q) = -sum_k p_k log q_k``, a momentum ``m`` that rises from ``momentum`` to 1 on a
cosine, and ``T`` the teacher's outputs of the batch. Only the student receives gradients.

The backbone's heads follow the model config exactly like :class:`DiffusionViT`'s
(``heads=``, ``laplacian_heads=``), so attention-only and Laplacian-head students compare
under the same recipe. The training step itself (views, EMA, loss, centre) is driven by the
experiment task :class:`diffusionformer.experiments.tasks.DINOTask`; this module holds the
networks, the state (teacher weights and centre are in ``state_dict``, so a checkpoint resumes
exactly) and the pure pieces: :func:`dino_loss`, :func:`knn_classify` and the schedules.
"""

from __future__ import annotations

import copy
import math
import numbers
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from diffusionformer.config import _choice_hint, _python_number, document_fields
from diffusionformer.graph.knn import _pow2_scale
from diffusionformer.models.common import check_positive, check_positive_int, check_probability
from diffusionformer.models.vit import DiffusionViT, ViTConfig
from diffusionformer.nn._weights import _check_reset, _reset_children

__all__ = [
    "DINO",
    "DINOConfig",
    "DINOHead",
    "center_sharpen",
    "cosine_momentum",
    "dino_loss",
    "knn_classify",
    "teacher_temperature",
]


# ----------------------------------------------------------------------------- pure pieces
def cosine_momentum(step: int, base: float, total_steps: int) -> float:
    r"""Teacher EMA momentum after update ``step``: ``1 - (1 - base) (1 + cos(pi step / T)) / 2``.

    DINO's schedule: ``base`` at step 0, rising to 1 at ``step = T = total_steps`` and
    staying there.

    Args:
        step: 0-based update index (``>= 0``).
        base: momentum at step 0, in ``[0, 1]``.
        total_steps: ``T``, length of the schedule.

    Examples:
        >>> cosine_momentum(0, 0.996, 100), cosine_momentum(50, 0.996, 100), cosine_momentum(100, 0.996, 100)
        (0.996, 0.998, 1.0)
    """
    if not step >= 0:  # ``not >=``: NaN too, which gave a NaN momentum
        raise ValueError(f"step must be >= 0, got {step}")
    if isinstance(total_steps, bool) or not isinstance(total_steps, numbers.Integral) or total_steps < 1:
        # else 0 or -5 gave momentum 1 from the first step: a frozen teacher
        raise ValueError(f"total_steps must be a positive int, got {total_steps!r}")
    if isinstance(base, bool) or not 0.0 <= base <= 1.0:  # outside [0, 1] the teacher leaves the student; a bool is no number
        raise ValueError(f"base must lie in [0, 1], got {base}")
    if step >= total_steps:
        return 1.0
    return 1.0 - (1.0 - base) * (1.0 + math.cos(math.pi * step / total_steps)) / 2.0


def teacher_temperature(step: int, final: float, warmup: float, warmup_steps: int) -> float:
    r"""Teacher temperature ``tau_t``: linear from ``warmup`` to ``final`` over ``warmup_steps``, then ``final``.

    Args:
        step: 0-based update index (``>= 0``).
        final: temperature after the warm-up (DINO: 0.04 - 0.07).
        warmup: temperature at step 0.
        warmup_steps: length of the warm-up (0: none).

    Examples:
        >>> [teacher_temperature(s, final=0.08, warmup=0.04, warmup_steps=10) for s in (0, 5, 20)]
        [0.04, 0.06, 0.08]
    """
    if not step >= 0:  # would extrapolate the warm-up line beyond ``warmup``; NaN gave a NaN temperature
        raise ValueError(f"step must be >= 0, got {step}")
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, numbers.Integral) or warmup_steps < 0:
        raise ValueError(f"warmup_steps must be an int >= 0, got {warmup_steps!r}")  # else -5 read as no warm-up
    if step >= warmup_steps:
        return final
    return warmup + (final - warmup) * step / warmup_steps


def center_sharpen(teacher_logits: Tensor, center: Tensor, temperature: float) -> Tensor:
    r"""Teacher targets ``softmax((g_t - c) / tau_t)`` over the last dimension.

    Centring (subtracting the running mean ``c``) keeps one prototype from dominating;
    sharpening (``tau_t`` below the student's ``tau_s``) keeps the targets from going uniform.

    Args:
        teacher_logits: teacher head outputs ``(..., K)``.
        center: the running mean ``(K,)`` or ``(1, K)``.
        temperature: ``tau_t > 0``.

    Shapes:
        ``(..., K) -> (..., K)``, rows summing to 1.

    Examples:
        >>> center_sharpen(torch.tensor([[1.0, 2.0]]), torch.tensor([0.0, 1.0]), 0.5)
        tensor([[0.5000, 0.5000]])
    """
    if isinstance(temperature, bool) or not temperature > 0:  # also refuses NaN, which would turn every target into NaN
        raise ValueError(f"temperature must be positive, got {temperature}")
    if temperature == math.inf:  # else every target was uniform: the teacher taught nothing
        raise ValueError(f"temperature must be finite, got {temperature}")
    if center.dim() not in (1, 2) or (center.dim() == 2 and center.shape[0] != 1):  # (B, K) would act per sample
        raise ValueError(f"center must have shape (K,) or (1, K), got {tuple(center.shape)}")
    if center.shape[-1] != teacher_logits.shape[-1]:
        raise ValueError(f"center has {center.shape[-1]} entries, the logits {teacher_logits.shape[-1]}")
    return torch.softmax((teacher_logits - center.to(teacher_logits.dtype)) / temperature, dim=-1)


def dino_loss(student_logits: Tensor, teacher_logits: Tensor, center: Tensor, student_temp: float,
              teacher_temp: float) -> Tensor:
    r"""DINO's cross-view cross-entropy, averaged over view pairs and the batch.

    .. math::
        \mathcal{L} = \frac{1}{|\mathcal{P}|} \sum_{(i, j) \in \mathcal{P}} \frac{1}{B} \sum_b
            -\sum_k P_t^{i,b,k} \log P_s^{j,b,k}, \quad
        \mathcal{P} = \{(i, j) : i < V_t,\ j < V_s,\ i \ne j\},

    with ``P_t = center_sharpen(teacher_logits, center, teacher_temp)`` (no gradient) and
    ``P_s = softmax(student_logits / student_temp)``. Student view ``i < V_t`` is the same crop
    as teacher view ``i``, so identical views are never paired. The loss is taken in float32 at
    least (half-precision logits are upcast; float64 ones stay float64), under autocast too.

    Args:
        student_logits: head outputs of the student on all views.
        teacher_logits: head outputs of the teacher on the first ``V_t`` (global) views.
        center: the teacher centre ``(K,)`` or ``(1, K)``.
        student_temp: ``tau_s``.
        teacher_temp: ``tau_t``.

    Shapes:
        ``(V_s, B, K), (V_t, B, K) -> ()``.

    Examples:
        >>> K = 4  # uniform student and teacher: the loss is log K
        >>> round(float(dino_loss(torch.zeros(3, 2, K), torch.zeros(2, 2, K), torch.zeros(K), 0.1, 0.04)), 4)
        1.3863
    """
    if student_logits.dim() != 3 or teacher_logits.dim() != 3:
        raise ValueError(f"dino_loss expects (V, B, K) logits, got student {tuple(student_logits.shape)} "
                         f"and teacher {tuple(teacher_logits.shape)}")
    Vs, B, K = student_logits.shape
    Vt = teacher_logits.shape[0]
    if teacher_logits.shape[1:] != (B, K):
        raise ValueError(f"teacher logits {tuple(teacher_logits.shape)} do not match the student's (V, {B}, {K})")
    if Vt < 1 or Vt > Vs or Vs < 2:
        raise ValueError(f"dino_loss needs >= 2 student views and 1 to as many teacher views, got {Vs} and {Vt}")
    if B < 1 or K < 1:  # the batch mean of an empty batch is 0/0 (NaN), not a loss
        raise ValueError(f"dino_loss needs at least one sample and one output dimension, got B={B}, K={K}")
    if isinstance(student_temp, bool) or not student_temp > 0:  # also refuses NaN; True was read as 1.0
        raise ValueError(f"student_temp must be positive, got {student_temp}")
    if student_temp == math.inf:  # else the student's softmax was uniform: loss log K, zero gradient
        raise ValueError(f"student_temp must be finite, got {student_temp}")
    # e.g. a bf16 student, fp32 teacher; float32 at least: half-precision logits (a bf16 model, or CPU autocast, which
    # leaves softmax in bf16) gave a bf16 loss, off by ~0.1% (its gradient rounded too), where CUDA autocast gave float32
    dtype = torch.promote_types(torch.promote_types(student_logits.dtype, teacher_logits.dtype), torch.float32)
    # the centre detached too: a centre computed from the teacher's logits (a tensor with a history) sent a
    # gradient through the targets into the teacher, as DINOLoss detaches the whole targets
    targets = center_sharpen(teacher_logits.detach().to(dtype), center.detach(), teacher_temp)  # (Vt, B, K)
    log_probs = torch.log_softmax(student_logits.to(dtype) / student_temp, dim=-1)  # (Vs, B, K)
    # autocast off: it ran the einsum as a bf16/fp16 matrix product (a bf16 loss, its gradient rounded too), where
    # the loss must stay in float32 (``dtype``)
    with torch.autocast(targets.device.type, enabled=False):
        cross = -torch.einsum("ibk,jbk->ij", targets, log_probs) / B  # (Vt, Vs): mean over the batch
    keep = ~torch.eye(Vt, Vs, dtype=torch.bool, device=cross.device)
    return cross[keep].mean()


@torch.no_grad()
def knn_classify(bank: Tensor, bank_labels: Tensor, queries: Tensor, num_classes: int, k: int = 20,
                 temperature: float = 0.07, chunk_size: int = 1024) -> Tensor:
    r"""Weighted k-nearest-neighbour vote on cosine similarity (Wu et al., 2018; DINO's protocol).

    For a query ``q`` with neighbours ``N_k(q)`` (the ``k`` bank features of largest cosine
    similarity ``s_i``), class ``c`` scores ``sum_{i in N_k(q)} [y_i = c] exp(s_i / T)``; the
    prediction is the highest score (ties: the smaller class index). The cosines are taken in
    float64 when either input is float64, else in float32, of rows first scaled by a power of two
    (exact: huge or tiny finite features neither overflow nor underflow); non-finite features and
    zero-width features (``D = 0``) are refused. An all-zero feature vector has cosine 0 with every other
    feature (as ``sklearn``'s cosine metric, which leaves zero vectors unnormalised), so an all-zero
    query's neighbours are among tied cosines and the order of ``topk`` picks them.

    Args:
        bank: features of the labelled bank (need not be normalised).
        bank_labels: their classes in ``[0, num_classes)``.
        queries: features to classify.
        num_classes: number of classes ``C``.
        k: neighbours (clipped to the bank size).
        temperature: ``T`` of the vote weights.
        chunk_size: queries per similarity block (memory ``chunk_size x N``).

    Shapes:
        ``(N, D), (N,), (Q, D) -> (Q,)`` int64.

    Examples:
        >>> bank = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0]])
        >>> knn_classify(bank, torch.tensor([0, 0, 1]), torch.tensor([[1.0, 0.2], [0.1, 1.0]]), 2, k=1)
        tensor([0, 1])
    """
    if bank.dim() != 2 or queries.dim() != 2 or bank.shape[1] != queries.shape[1]:
        raise ValueError(f"knn_classify expects bank (N, D) and queries (Q, D), got {tuple(bank.shape)} and "
                         f"{tuple(queries.shape)}")
    if bank_labels.shape != (bank.shape[0],):
        raise ValueError(f"bank_labels must have shape ({bank.shape[0]},), got {tuple(bank_labels.shape)}")
    if bank_labels.is_floating_point() or bank_labels.is_complex() or bank_labels.dtype == torch.bool:
        raise TypeError(f"bank_labels must be integer class labels, got dtype {bank_labels.dtype}")
    if bank.shape[0] == 0:
        raise ValueError("knn_classify needs a non-empty bank")
    if bank.shape[1] == 0:  # every cosine would be 0: the neighbours were picked among ties, with no error
        raise ValueError(f"knn_classify needs features of width D >= 1, got bank {tuple(bank.shape)} and "
                         f"queries {tuple(queries.shape)}")
    k, num_classes, temperature, chunk_size = (_python_number(v) for v in (k, num_classes, temperature, chunk_size))
    for name, value in (("k", k), ("num_classes", num_classes)):  # else torch's topk/zeros fail on a float
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"knn_classify: {name} must be an int, got {type(value).__name__} {value!r}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise TypeError(f"knn_classify: temperature must be a float, got {type(temperature).__name__} {temperature!r}")
    lo, hi = int(bank_labels.min()), int(bank_labels.max())  # once per evaluation: the sync is cheap
    if lo < 0 or hi >= num_classes:
        raise ValueError(f"bank_labels must lie in [0, num_classes={num_classes}), got labels in [{lo}, {hi}]")
    if k < 1 or not temperature > 0:  # ``not > 0`` refuses NaN too, which made every vote NaN and every prediction 0
        raise ValueError(f"k must be >= 1 and temperature > 0, got k={k}, temperature={temperature}")
    check_positive_int("knn_classify", chunk_size=chunk_size)
    for name, feats in (("bank", bank), ("queries", queries)):  # a NaN or inf feature voted silently for class 0
        if not bool(torch.isfinite(feats).all()):
            raise ValueError(f"knn_classify: {name} holds non-finite features (NaN or inf)")
    # float64 features stay float64: in float32 the cosines of nearly parallel features (angles below ~3e-4 rad)
    # round to the same value, and the neighbours were picked among ties
    dtype = torch.float64 if torch.float64 in (bank.dtype, queries.dtype) else torch.float32
    # each row scaled by a power of two first (exact): the squared norms of finite features of size ~1e20 (float32)
    # overflowed, normalising them to 0, and those of ~1e-20 underflowed: every cosine ~0, the neighbours among ties
    bank_n = _unit_rows(bank.to(dtype))
    labels = bank_labels.to(device=bank.device, dtype=torch.long)  # scatter_add_ takes int64 (or int32) indices only
    k = min(k, bank.shape[0])
    out = []
    for start in range(0, queries.shape[0], chunk_size):
        q = _unit_rows(queries[start : start + chunk_size].to(dtype))
        sim, idx = (q @ bank_n.T).topk(k, dim=1)  # (q, k)
        votes = torch.zeros(q.shape[0], num_classes, device=q.device, dtype=sim.dtype)
        # exp((s - s_max) / T): the same argmax, while exp(s / T) overflows float32 for T < ~0.0113 (inf votes tie)
        votes.scatter_add_(1, labels[idx], torch.exp((sim - sim.amax(dim=1, keepdim=True)) / temperature))
        out.append(votes.argmax(dim=1))
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.long, device=queries.device)


def _unit_rows(x: Tensor) -> Tensor:
    """``F.normalize(_pow2_scale(x, (1,)), dim=1)`` (bit for bit) in ``x``'s scaled copy: one tensor of the size of
    ``x``, not two (a 50k x 384 bank's normalisation took twice as long). ``x`` has ``D >= 1`` columns; no gradient
    (``out=``: :func:`knn_classify` runs under ``no_grad``)."""
    scaled = _pow2_scale(x, (1,))  # a new tensor for D >= 1: dividing it in place leaves the caller's x as it was
    return F.normalize(scaled, dim=1, out=scaled)


def _rows_over_ranks(rows: Tensor) -> tuple[Tensor, Tensor]:
    """The sum ``(K,)`` and the count (a 0-d tensor) of the rows ``(N, K)`` of every process, in float64, with one
    ``all_reduce`` (in one process: this process's). A mean over the ranks' rows, not over the ranks: a rank with
    more rows weighs more, as one process holding them all would."""
    stats = torch.cat([rows.sum(0).double(), rows.new_full((1,), rows.shape[0], dtype=torch.float64)])
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(stats)
    return stats[:-1], stats[-1]


# ----------------------------------------------------------------------------- config
@document_fields
@dataclass
class DINOConfig(ViTConfig):
    """Configuration of :class:`DINO`: the :class:`ViTConfig` fields of the backbone, plus the head,
    the loss and the teacher's schedule. The views and the k-NN evaluation are settings of the
    self-supervised task, :class:`~diffusionformer.data.ssl.SSLConfig`.

    ``num_classes`` must stay 0 (the backbone has no classifier; labels are only used by the
    k-NN evaluation). ``schedule_steps`` is the length of the teacher's momentum schedule: set it
    to the run's ``max_steps``.
    """

    num_classes: int = 0  #: must be 0: DINO's backbone has no classifier
    out_dim: int = 256  #: K, prototypes of the projection head
    head_hidden: int = 256  #: hidden width of the head's MLP
    head_bottleneck: int = 64  #: l2-normalised bottleneck before the prototypes
    head_layers: int = 3  #: linear layers of the MLP (DINO: 3)
    student_temp: float = 0.1  #: tau_s
    teacher_temp: float = 0.04  #: tau_t after the warm-up
    warmup_teacher_temp: float = 0.04  #: tau_t at step 0
    warmup_teacher_temp_steps: int = 0  #: linear warm-up of tau_t
    center_momentum: float = 0.9  #: m_c of the centre's EMA
    momentum: float = 0.996  #: teacher EMA momentum at step 0 (cosine to 1)
    schedule_steps: int = 1000  #: length of the momentum schedule (set to train.max_steps)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_classes != 0:
            raise ValueError(f"DINOConfig.num_classes must be 0 (no classifier head), got {self.num_classes}")
        if len(self.input_size) != 2:
            raise ValueError(f"DINOConfig.input_size must be (H, W): DINO views are image crops, got {self.input_size}")
        check_positive_int("DINOConfig", out_dim=self.out_dim, head_hidden=self.head_hidden,
                           head_bottleneck=self.head_bottleneck, head_layers=self.head_layers,
                           schedule_steps=self.schedule_steps)
        check_positive("DINOConfig", student_temp=self.student_temp, teacher_temp=self.teacher_temp,
                       warmup_teacher_temp=self.warmup_teacher_temp)
        check_probability("DINOConfig", center_momentum=self.center_momentum)
        if isinstance(self.momentum, bool) or not isinstance(self.momentum, (int, float)) or not 0.0 <= self.momentum <= 1.0:
            raise ValueError(f"DINOConfig.momentum must lie in [0, 1], got {self.momentum!r}")
        v = self.warmup_teacher_temp_steps
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"DINOConfig.warmup_teacher_temp_steps must be an int >= 0, got {v!r}")

    def vit_config(self) -> ViTConfig:
        """The backbone's :class:`ViTConfig` (the shared fields, ``num_classes=0``)."""
        return ViTConfig(**{f.name: getattr(self, f.name) for f in fields(ViTConfig)})

    def momentum_at(self, step: int) -> float:
        """Teacher momentum of the EMA update that follows optimiser step ``step``."""
        return cosine_momentum(step, self.momentum, self.schedule_steps)

    def teacher_temp_at(self, step: int) -> float:
        """``tau_t`` at update ``step``."""
        return teacher_temperature(step, self.teacher_temp, self.warmup_teacher_temp, self.warmup_teacher_temp_steps)


# ----------------------------------------------------------------------------- modules
class DINOHead(nn.Module):
    r"""DINO's projection head: MLP, l2-normalised bottleneck, weight-normalised prototypes.

    .. math::
        z = \mathrm{MLP}(h), \qquad \hat z = z / \lVert z \rVert_2, \qquad
        g(h) = \hat W \hat z, \quad \hat W_k = W_k / \lVert W_k \rVert_2,

    i.e. ``weight_norm`` on the last layer with its gain fixed to 1 (``norm_last_layer=True``).
    The MLP has ``layers`` linear layers with GELU between them.

    Args:
        in_dim: backbone feature width ``D``.
        out_dim: prototypes ``K``.
        hidden: hidden width.
        bottleneck: bottleneck width.
        layers: linear layers of the MLP (``>= 1``).

    Shapes:
        ``(B, D) -> (B, K)``, every output in ``[-1, 1]``.

    Examples:
        >>> head = DINOHead(8, 5, hidden=16, bottleneck=4)
        >>> out = head(torch.randn(3, 8))
        >>> out.shape, bool(out.abs().max() <= 1.0)
        (torch.Size([3, 5]), True)
    """

    def __init__(self, in_dim: int, out_dim: int, hidden: int = 256, bottleneck: int = 64, layers: int = 3) -> None:
        super().__init__()
        check_positive_int("DINOHead", in_dim=in_dim, out_dim=out_dim, hidden=hidden, bottleneck=bottleneck, layers=layers)
        widths = [in_dim] + [hidden] * (layers - 1) + [bottleneck]
        mods: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
            mods.append(nn.Linear(a, b))
            if i < layers - 1:
                mods.append(nn.GELU())
        self.mlp = nn.Sequential(*mods)
        self.prototypes = nn.Parameter(torch.empty(out_dim, bottleneck))
        self._initialise()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Initialise every parameter again, in place, as the constructor did (truncated normal, zero biases)."""
        _reset_children(self, type(self).__name__)  # the draws the constructor's layers made, before the trunc normals
        self._initialise()

    def _initialise(self) -> None:
        for m in self.mlp:
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)
        nn.init.trunc_normal_(self.prototypes, std=0.02)

    def forward(self, h: Tensor) -> Tensor:
        z = F.normalize(self.mlp(h), dim=-1)
        return F.linear(z, F.normalize(self.prototypes, dim=-1))


class _Branch(nn.Module):
    """Backbone + projection head: ``head(backbone.forward_features(x))``."""

    def __init__(self, backbone: DiffusionViT, head: DINOHead) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.backbone.forward_features(x))


def _parameters_to_buffers(module: nn.Module) -> None:
    """Turn every parameter of ``module`` into a buffer of the same name (state, not trained)."""
    for sub in module.modules():
        for name, p in list(sub.named_parameters(recurse=False)):
            delattr(sub, name)
            sub.register_buffer(name, p.detach())


class DINO(nn.Module):
    r"""Student/teacher pair of DINO (Caron et al., ICCV 2021) on :class:`DiffusionViT` backbones.

    ``student = (DiffusionViT, DINOHead)`` is trained; ``teacher`` starts as a copy of it and
    follows it by EMA (:meth:`update_teacher`); ``center`` is the running mean of the
    teacher's outputs (:meth:`update_center`). The teacher's weights are *buffers*, not
    parameters: they are in ``state_dict`` (checkpoints resume exactly) but not in
    ``parameters()``, so optimisers, parameter counts and learned-operator listings see the
    student only. The teacher always runs in eval mode.

    :attr:`backbone` is the **teacher's** ViT: DINO evaluates (k-NN, attention and PCA maps)
    with the teacher, which is the better network of the two. ``forward(x)`` returns its pooled
    features, so generic code (``model(x)``, token capture on ``model.backbone``) works.

    Args:
        config: a :class:`DINOConfig`.

    Shapes:
        ``forward(x, output="features")``: ``(B, C, H, W) -> (B, D)``; ``"student"`` and
        ``"teacher"``: ``(B, C, H, W) -> (B, K)`` head outputs (logits before the
        temperatures). :meth:`forward_patch_tokens`: ``(B, num_patches, D)`` of the teacher.

    Examples:
        >>> dino = DINO(DINOConfig(input_size=(8, 8), patch_size=2, dim=16, depth=2, num_heads=2,
        ...                        laplacian_heads=1, out_dim=32, head_hidden=16, head_bottleneck=8))
        >>> x = torch.randn(3, 1, 8, 8)
        >>> dino(x).shape, dino(x, output="student").shape
        (torch.Size([3, 16]), torch.Size([3, 32]))
        >>> dino.backbone.blocks[0].attn.heads_spec()
        'attention:1,laplacian:1'
        >>> torch.equal(dino(x, output="teacher"), dino(x, output="student"))  # the teacher starts as a copy
        True
    """

    def __init__(self, config: DINOConfig) -> None:
        super().__init__()
        if not isinstance(config, DINOConfig):
            raise TypeError(f"config must be a DINOConfig, got {type(config).__name__}")
        self.config = c = config
        backbone = DiffusionViT(c.vit_config())
        head = DINOHead(c.dim, c.out_dim, c.head_hidden, c.head_bottleneck, c.head_layers)
        self.student = _Branch(backbone, head)
        self.teacher = copy.deepcopy(self.student)
        _parameters_to_buffers(self.teacher)
        self.teacher.eval()
        self.register_buffer("center", torch.zeros(1, c.out_dim))
        self._ema_names = [name for name, _ in self.student.named_parameters()]

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Initialise the student again, in place, as the constructor did (its ViT's and head's
        ``reset_parameters``), make the teacher its copy again and zero ``center``: under one seed the state of
        a DINO built anew."""
        resets = _check_reset(self.student, "DINO.student")  # refused before the backbone moves, not after
        pairs = self._ema_pairs("DINO.reset_parameters")
        for reset in resets:  # the backbone's, then the head's
            reset()
        for teacher, student in pairs:
            teacher.copy_(student)
        self.center.zero_()

    def _ema_pairs(self, where: str) -> list[tuple[Tensor, Tensor]]:
        """(teacher buffer, student parameter) of every parameter the teacher copied at construction."""
        teacher = dict(self.teacher.named_buffers())
        student = dict(self.student.named_parameters())
        moved = [n for n in self._ema_names if n not in student]
        if moved:  # torch.nn.utils.parametrize or prune renamed them: a bare KeyError, the teacher left half-updated
            raise ValueError(f"{where}: the student no longer has the parameters the teacher copied at "
                             f"construction ({moved[:3]}{' ...' if len(moved) > 3 else ''}); a student "
                             f"parametrized or pruned after DINO was built has no EMA partner in the teacher")
        resized = [n for n in self._ema_names if teacher[n].shape != student[n].shape]
        if resized:  # DiffusionViT.set_input_size on one side: a bare "size of tensor a" error, or a silent broadcast
            n = resized[0]
            raise ValueError(f"{where}: expected the teacher's and the student's {n} of one shape, got "
                             f"{tuple(teacher[n].shape)} and {tuple(student[n].shape)}; after set_input_size on one "
                             "backbone (DINO.backbone is the teacher's) call it on the other too "
                             "(dino.student.backbone.set_input_size)")
        return [(teacher[n], student[n]) for n in self._ema_names]

    @property
    def config(self) -> DINOConfig:
        """The :class:`DINOConfig`, its ``input_size`` the student backbone's: after
        :meth:`~diffusionformer.models.DiffusionViT.set_input_size` on both backbones the new size, so
        ``DINO(dino.config)`` takes ``dino.state_dict()`` and a checkpoint records the size its weights fit."""
        size = self.student.backbone.config.input_size
        if self._config.input_size != size:  # resized: the built size's position embedding no longer fits
            self._config = replace(self._config, input_size=size)
        return self._config

    @config.setter
    def config(self, config: DINOConfig) -> None:
        self._config = config

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "config" in state:  # pickled whole (torch.save(dino)) before config was a property: the getter found no
            state = dict(state)  # _config, and every dino.config raised "'DINO' object has no attribute 'config'"
            state["_config"] = state.pop("config")
        super().__setstate__(state)

    @property
    def backbone(self) -> DiffusionViT:
        """The teacher's ViT: the network that evaluation and analysis inspect."""
        return self.teacher.backbone  # type: ignore[return-value]

    def train(self, mode: bool = True) -> "DINO":
        super().train(mode)
        self.teacher.train(False)
        return self

    def no_weight_decay(self) -> set[str]:
        """Student parameters excluded from weight decay (position embedding, class token)."""
        return {f"student.backbone.{n}" for n in self.student.backbone.no_weight_decay()}  # type: ignore[operator]

    @torch.no_grad()
    def update_teacher(self, momentum: float) -> None:
        r"""EMA step ``theta_t <- m theta_t + (1 - m) theta_s`` on every student parameter: at ``m = 0`` a copy of the
        student, at ``m = 1`` the teacher unchanged (whatever the other side holds, NaN or inf included)."""
        if isinstance(momentum, bool) or not 0.0 <= momentum <= 1.0:  # a bool is no number
            raise ValueError(f"momentum must lie in [0, 1], got {momentum!r}")
        pairs = self._ema_pairs("update_teacher")
        if momentum == 1.0:  # 0 * inf is NaN: an inf in the student made the teacher of the schedule's end NaN
            return
        teachers, students = [t for t, _ in pairs], [s.detach() for _, s in pairs]
        if momentum == 0.0:  # the documented copy: 0 * NaN is NaN, so a non-finite teacher stayed non-finite
            if teachers:  # no pair: _foreach_copy_ refuses an empty list
                torch._foreach_copy_(teachers, students)
            return
        # a float16/bfloat16 teacher per parameter: _foreach_mul_ rounds a Python momentum to its dtype (0.99 to 0.98828
        # in bfloat16, on CPU), so m + (1 - m) != 1 and the teacher drifted off a student that stood still
        half = (torch.float16, torch.bfloat16)
        for teacher, student in zip(teachers, students):
            if teacher.dtype in half:
                teacher.mul_(momentum).add_(student, alpha=1.0 - momentum)
        wide = [(t, s) for t, s in zip(teachers, students) if t.dtype not in half]
        if wide:  # one multi-tensor kernel per step on a GPU, not two kernels per parameter (the same values)
            torch._foreach_mul_([t for t, _ in wide], momentum)
            torch._foreach_add_([t for t, _ in wide], [s for _, s in wide], alpha=1.0 - momentum)

    @torch.no_grad()
    def update_center(self, teacher_logits: Tensor) -> None:
        r"""``c <- m_c c + (1 - m_c) mean(teacher_logits)``, the mean taken over all processes (over all their
        teacher outputs: a rank with more outputs weighs more, as one process holding the whole batch would)."""
        if teacher_logits.dim() == 0 or teacher_logits.shape[-1] != self.config.out_dim:  # 0-d: a bare IndexError
            raise ValueError(f"update_center: expected teacher logits (..., out_dim={self.config.out_dim}), "
                             f"got {tuple(teacher_logits.shape)}")
        if teacher_logits.device != self.center.device:  # meta logits on a CPU centre: the mean silently dropped
            raise ValueError(f"update_center: expected teacher logits on the centre's device {self.center.device}, "
                             f"got {teacher_logits.device}")
        flat = teacher_logits.detach().reshape(-1, self.config.out_dim).to(self.center.dtype)
        m = self.config.center_momentum
        # over the processes the counts are summed too (DINO's reference multiplies one rank's count by the world
        # size: a task whose shard_batch splits unevenly got a centre weighted by the ranks, not by their outputs);
        # one all_reduce, no host sync; with no output anywhere the centre is kept (0 / 0 would make it NaN for good)
        total, count = _rows_over_ranks(flat)
        mean = (total / count.clamp(min=1)).to(self.center.dtype).view_as(self.center)
        self.center.copy_(torch.where(count > 0, self.center * m + mean * (1.0 - m), self.center))

    def forward(self, x: Tensor, *, output: Literal["features", "student", "teacher"] = "features") -> Tensor:
        if output == "features":
            return self.backbone.forward_features(x)
        if output == "student":
            return self.student(x)
        if output == "teacher":
            with torch.no_grad():
                return self.teacher(x)
        raise ValueError(f"output must be 'features', 'student' or 'teacher', got {output!r}"
                         f"{_choice_hint(output, ('features', 'student', 'teacher'))}")

    def forward_patch_tokens(self, x: Tensor) -> Tensor:
        """The teacher backbone's patch tokens ``(B, num_patches, D)`` (PCA maps)."""
        return self.backbone.forward_patch_tokens(x)
