"""Tests written in a mutation-testing audit of DINO, the SSL settings, the task adapters, rotary
embeddings, GRAND-nl and the operator registry.

Each test kills a mutant of the library code that the rest of the suite let through (the
docstring of each test names it) and checks the code against an independent reference
(explicit float64 softmax, centring, sharpening and cross-entropy by hand, explicit 2x2
rotations, hand-worked values, or the documented contract: bad input gets a clear error and
the registries lose nothing). CPU only, deterministic (seeded generators).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn

from diffusionformer.data.base import ClassificationData, NodeData, SequenceTaskData
from diffusionformer.data.ssl import SSLConfig
from diffusionformer.experiments import tasks as T
from diffusionformer.models import DINO, DINOConfig, GCNConfig, ViTConfig, dino_loss, knn_classify
from diffusionformer.models.dino import DINOHead, center_sharpen, cosine_momentum


# ---------------------------------------------------------------------------- helpers
def _softmax64(z: list[float]) -> list[float]:
    m = max(z)
    e = [math.exp(v - m) for v in z]
    return [v / sum(e) for v in e]


def _tiny_dino(**over: Any) -> DINO:
    torch.manual_seed(0)
    cfg = dict(input_size=(8, 8), in_channels=1, patch_size=4, dim=8, depth=1, num_heads=2, pool="mean",
               out_dim=6, head_hidden=8, head_bottleneck=4, momentum=0.5, schedule_steps=4)
    return DINO(DINOConfig(**{**cfg, **over}))


def _images(n: int = 12, seed: int = 0) -> ClassificationData:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 1, 8, 8, generator=g)
    y = torch.randint(0, 3, (n,), generator=g)
    return ClassificationData("toy", "image", x, y, x[:8].clone(), y[:8], x[4:].clone(), y[4:], num_classes=3,
                              input_shape=(1, 8, 8))


def _container(cls: type, **fields: Any) -> Any:
    obj = cls.__new__(cls)
    obj.__dict__.update(fields)
    return obj


class _Model(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config


# ---------------------------------------------------------------------------- dino.py: the pure pieces
def test_cosine_momentum_refuses_a_negative_step():
    """kills: cosine_momentum without its ``step < 0`` check (a negative step silently gives a momentum
    below the base value)"""
    with pytest.raises(ValueError, match="step must be >= 0, got -1"):
        cosine_momentum(-1, 0.9, 10)


def test_center_sharpen_refuses_a_zero_temperature():
    """kills: center_sharpen checking ``temperature < 0`` instead of ``<= 0`` (tau_t = 0 divides by zero)"""
    t = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
    with pytest.raises(ValueError, match="temperature must be positive, got 0.0"):
        center_sharpen(t, torch.zeros(3, dtype=torch.float64), 0.0)


def test_center_sharpen_refuses_a_centre_that_would_broadcast():
    """kills: center_sharpen without its centre-width check (a one-entry centre broadcasts silently)"""
    t = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
    with pytest.raises(ValueError, match="center has 1 entries, the logits 3"):
        center_sharpen(t, torch.zeros(1, dtype=torch.float64), 0.5)


def test_dino_loss_sends_no_gradient_to_the_teacher():
    """kills: dino_loss without ``teacher_logits.detach()`` (only the student receives gradients)"""
    g = torch.Generator().manual_seed(0)
    s = torch.randn(3, 2, 5, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.randn(2, 2, 5, generator=g, dtype=torch.float64, requires_grad=True)
    dino_loss(s, t, torch.zeros(5, dtype=torch.float64), 0.1, 0.04).backward()
    assert t.grad is None
    assert s.grad is not None and s.grad.abs().sum() > 0


def test_dino_loss_refuses_zero_teacher_views():
    """Defect found in the audit (fixed): dino_loss with no teacher view (``(0, B, K)``) averaged over no
    pair and returned NaN silently; it must refuse, naming the view counts"""
    s, t = torch.randn(3, 2, 5), torch.randn(0, 2, 5)
    with pytest.raises(ValueError, match="1 to as many teacher views, got 3 and 0"):
        dino_loss(s, t, torch.zeros(5), 0.1, 0.04)
    assert torch.isfinite(dino_loss(s, t.new_zeros(1, 2, 5), torch.zeros(5), 0.1, 0.04))  # one view is enough


def test_dino_loss_refuses_a_zero_student_temperature():
    """kills: dino_loss checking ``student_temp < 0`` instead of ``<= 0``"""
    s, t = torch.randn(3, 2, 5), torch.randn(2, 2, 5)
    with pytest.raises(ValueError, match="student_temp must be positive, got 0.0"):
        dino_loss(s, t, torch.zeros(5), 0.0, 0.04)


def test_knn_classify_refuses_a_zero_temperature():
    """kills: knn_classify without its ``temperature <= 0`` check (exp(s / 0) votes are inf/nan)"""
    bank = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    with pytest.raises(ValueError, match="temperature > 0"):
        knn_classify(bank, torch.tensor([0, 1]), bank, 2, k=1, temperature=0.0)


@pytest.mark.parametrize("layers", [1, 3])
def test_dino_head_has_no_activation_after_the_last_mlp_layer(layers):
    """kills: DINOHead appending a GELU after the MLP's last linear layer (``i < layers`` instead of
    ``i < layers - 1``); reference: the linear layers, GELUs between them, the l2-normalised bottleneck
    and the weight-normalised prototypes written out in float64"""
    torch.manual_seed(0)
    head = DINOHead(6, 5, hidden=7, bottleneck=4, layers=layers).double()
    with torch.no_grad():  # weights of order 1, so a GELU on the bottleneck changes its direction
        for p in head.parameters():
            p.normal_()
    linears = [m for m in head.mlp if isinstance(m, nn.Linear)]
    assert len(linears) == layers
    h = torch.randn(3, 6, dtype=torch.float64)
    z = h
    for i, lin in enumerate(linears):
        z = z @ lin.weight.T + lin.bias
        if i < layers - 1:
            z = 0.5 * z * (1.0 + torch.erf(z / math.sqrt(2.0)))  # exact GELU
    z = z / z.norm(dim=-1, keepdim=True)
    W = head.prototypes / head.prototypes.norm(dim=-1, keepdim=True)
    torch.testing.assert_close(head(h), z @ W.T, rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------- ssl.py
def test_ssl_config_refuses_a_bool_local_crops():
    """kills: SSLConfig accepting ``local_crops=True`` (a bool is an int in Python: it would mean one crop)"""
    with pytest.raises(ValueError, match="SSLConfig.local_crops must be an int >= 0, got True"):
        SSLConfig(local_crops=True)


# ---------------------------------------------------------------------------- tasks.py: ClassificationTask
def _linear_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 3)).double()


def test_classification_evaluation_loss_is_plain_cross_entropy_under_label_smoothing():
    """kills: ClassificationTask._score passing ``label_smoothing`` to the evaluation loss (documented:
    evaluation losses are plain cross-entropy); reference: -log softmax of the true class, by hand"""
    data = _images()
    data.x_val, data.x_test = data.x_val.double(), data.x_test.double()
    model = _linear_model()
    got = T.ClassificationTask(data, eval_batch_size=3, label_smoothing=0.3).evaluate(model, None)
    for split, key in (("val", "loss"), ("test", "test_loss")):
        x, y = data.split(split)
        with torch.no_grad():
            logits = model(x).tolist()
        nll = [math.log(sum(math.exp(v) for v in row)) - row[int(c)] for row, c in zip(logits, y)]
        assert got[key] == pytest.approx(sum(nll) / len(nll), rel=1e-6)


def test_crop_only_augmentation_does_not_flip():
    """kills: ClassificationTask flipping by default when ``augment`` gives only ``crop_padding``
    (``augment.get("flip", True)``); with padding 0 and no flip the batch is the drawn images"""
    data = _images(n=40)
    task = T.ClassificationTask(data, augment={"crop_padding": 0})
    x, y = task.train_batch(0, torch.Generator().manual_seed(3), 16)
    idx = torch.randint(0, 40, (16,), generator=torch.Generator().manual_seed(3))
    assert torch.equal(x, data.x_train[idx]) and torch.equal(y, data.y_train[idx])


# ---------------------------------------------------------------------------- tasks.py: DINOTask
def test_dino_task_moves_the_teacher_with_the_momentum_of_the_previous_update():
    """kills: DINOTask.loss at update ``s`` using ``momentum_at(s)`` instead of ``momentum_at(s - 1)``;
    reference: base momentum 0.5 at s - 1 = 0, theta_t <- 0.5 theta_t + 0.5 theta_s by hand"""
    model = _tiny_dino(momentum=0.5, schedule_steps=4)
    task = T.DINOTask(_images(), model, ssl=SSLConfig(blur_prob=0.0))
    with torch.no_grad():
        for p in model.student.parameters():
            p.add_(torch.randn_like(p))
    before = {n: b.clone() for n, b in model.teacher.named_buffers()}
    student = {n: p.detach().clone() for n, p in model.student.named_parameters()}
    batch = task.train_batch(1, torch.Generator().manual_seed(0), 4)
    task.loss(model, batch)
    after = dict(model.teacher.named_buffers())
    for name, s in student.items():
        torch.testing.assert_close(after[name], 0.5 * before[name] + 0.5 * s, rtol=0, atol=1e-6)


def test_dino_task_loss_and_metrics_by_hand_during_the_temperature_warmup():
    """kills: DINOTask.loss using the final ``teacher_temp`` instead of ``teacher_temp_at(step)`` during
    the warm-up, and ``teacher_mean_entropy`` taken over the batch only (``p.mean(dim=1)``) instead of
    over views and batch; reference: tau_t = 0.02 + (0.06 - 0.02) * 2 / 4 = 0.04, centring, sharpening,
    the cross-view cross-entropy and the entropies in float64 by hand"""
    model = _tiny_dino(teacher_temp=0.06, warmup_teacher_temp=0.02, warmup_teacher_temp_steps=4,
                       student_temp=0.1).eval()
    with torch.no_grad():  # a non-zero centre, so centring matters
        model.center.copy_(torch.randn(1, 6) * 0.1)
    center = model.center.clone().double()[0].tolist()
    task = T.DINOTask(_images(), model, ssl=SSLConfig(local_crops=1, blur_prob=0.0))
    batch = task.train_batch(2, torch.Generator().manual_seed(0), 3)
    loss, metrics = task.loss(model, batch)
    assert metrics["teacher_temp"] == pytest.approx(0.04, abs=1e-15)
    views = task._views(batch)  # (3, B, C, H, W); the teacher does not move again after the loss
    with torch.no_grad():
        s = model(views.flatten(0, 1), output="student").double().view(3, 3, -1).tolist()
        t = model(views[:2].flatten(0, 1), output="teacher").double().view(2, 3, -1).tolist()
    tau_t, tau_s, K = 0.04, 0.1, 6
    P = [[_softmax64([(t[i][b][k] - center[k]) / tau_t for k in range(K)]) for b in range(3)] for i in range(2)]
    total, pairs = 0.0, 0
    for i in range(2):
        for j in range(3):
            if i == j:
                continue
            for b in range(3):
                logq = [math.log(q) for q in _softmax64([v / tau_s for v in s[j][b]])]
                total += -sum(P[i][b][k] * logq[k] for k in range(K)) / 3
            pairs += 1
    assert float(loss.detach()) == pytest.approx(total / pairs, rel=1e-5)
    rows = [P[i][b] for i in range(2) for b in range(3)]
    ent = sum(-sum(p * math.log(p) for p in row) for row in rows) / len(rows)
    mean = [sum(row[k] for row in rows) / len(rows) for k in range(K)]
    assert float(metrics["teacher_entropy"]) == pytest.approx(ent, rel=1e-5, abs=1e-6)
    assert float(metrics["teacher_mean_entropy"]) == pytest.approx(-sum(p * math.log(p) for p in mean), rel=1e-5)


# ---------------------------------------------------------------------------- tasks.py: other tasks
class _FixedLogits(nn.Module):
    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.logits = logits
        self.w = nn.Parameter(torch.zeros(1))

    def forward(self, *args: Any) -> Any:
        return self.logits, torch.zeros(())


def test_sequence_lm_accuracy_counts_target_positions_only():
    """kills: SequenceLMTask.loss scoring the accuracy over every position (the ``-100`` ones included)
    instead of the target positions; reference: the hand-counted argmax hits on the 3 targets"""
    logits = torch.zeros(2, 4, 5)
    logits[0, 1, 2] = logits[0, 3, 4] = logits[1, 2, 1] = 1.0  # predictions 2, 4 and 1 at the targets
    logits[:, :, 0] += 0.5  # elsewhere the argmax is 0
    y = torch.full((2, 4), -100)
    y[0, 1], y[0, 3], y[1, 2] = 2, 0, 1  # hits at (0, 1) and (1, 2), a miss at (0, 3)
    data = _container(SequenceTaskData, ignore_index=-100, y_train=y)  # the loss scales by its targets per row
    _, metrics = T.SequenceLMTask(data).loss(_FixedLogits(logits), (torch.zeros(2, 4, dtype=torch.long), y))
    assert float(metrics["acc"]) == pytest.approx(2 / 3, abs=1e-7)


def test_node_task_loss_uses_the_training_nodes_only():
    """kills: NodeTask.loss taking the cross-entropy over every node instead of the ``train_mask`` ones
    (the validation and test labels would leak into training); reference: -log softmax by hand"""
    from torch_geometric.data import Data

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 3, generator=g, dtype=torch.float64)
    y = torch.tensor([0, 2, 1, 1, 0, 2])
    mask = torch.tensor([True, False, True, False, False, True])
    batch = Data(x=torch.zeros(6, 1), edge_index=torch.zeros(2, 0, dtype=torch.long), y=y, train_mask=mask)
    model = _FixedLogits(logits)
    model.forward = lambda x, ei: logits  # type: ignore[method-assign]
    loss, _ = T.NodeTask(_container(NodeData)).loss(model, batch)
    rows = logits.tolist()
    nll = [math.log(sum(math.exp(v) for v in rows[i])) - rows[i][int(y[i])] for i in range(6) if mask[i]]
    assert float(loss) == pytest.approx(sum(nll) / 3, rel=1e-6)


def test_text_lm_evaluation_honours_max_batches():
    """kills: TextLMTask.evaluate ignoring ``max_batches`` (always ``eval_batches`` windows per split); the
    trainer's capped evaluations would cost the full protocol"""
    from diffusionformer.data.text import char_text_data

    class Counting(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.zeros(1))
            self.calls = 0

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> Any:
            self.calls += 1
            return None, torch.tensor(float(self.calls))

    data = char_text_data("toy", "abcdefgh" * 40)
    model = Counting()
    out = T.TextLMTask(data, block_size=4, eval_batch_size=2, eval_batches=20).evaluate(model, max_batches=3)
    assert model.calls == 6  # 3 batches of windows for train, then 3 for val
    assert out["train_loss"] == pytest.approx((1 + 2 + 3) / 3) and out["val_loss"] == pytest.approx((4 + 5 + 6) / 3)
    assert out["gap_loss"] == pytest.approx(3.0)


# ---------------------------------------------------------------------------- tasks.py: the adapter registry
def test_register_task_adapter_registers_nothing_when_one_pair_is_taken(task_adapters):
    """kills: register_task_adapter writing each pair as it checks it (a refused registration would leave
    the pairs before the taken one registered); contract: bad input loses nothing and adds nothing"""

    class FreshData:
        pass

    before = dict(task_adapters)
    with pytest.raises(ValueError, match=r"\(None, ClassificationData\) is already registered"):
        T.register_task_adapter(None, (FreshData, ClassificationData), T.TaskAdapter(task=lambda d, m, b: None))
    assert dict(task_adapters) == before
    assert T.find_adapter(None, FreshData, "task") is None


def test_find_adapter_serves_a_subclass_of_a_registered_data_class():
    """kills: find_adapter matching the data's exact class only (``(type(data), object)`` instead of its
    MRO): a subclass of ClassificationData gets the ViT overrides and the classification task"""

    class MyImages(ClassificationData):
        pass

    data = _container(MyImages, name="mine", kind="image", input_shape=(3, 8, 8), num_classes=4)
    assert T.find_adapter(ViTConfig, MyImages, "overrides") is T.find_adapter(ViTConfig, ClassificationData, "overrides")
    assert T.model_overrides_for_data(data, ViTConfig) == {"in_channels": 3, "input_size": (8, 8), "num_classes": 4}
    assert T.find_adapter(None, data, "task") is T.find_adapter(None, ClassificationData, "task")


def test_find_adapter_without_any_model_skips_the_adapters_of_any_model():
    """kills: find_adapter ignoring ``any_model=False`` (it would fall back to the adapters registered for
    any model); the ViT family registers only overrides, its task comes from any model's adapter"""
    assert T.find_adapter(ViTConfig, ClassificationData, "task", any_model=False) is None
    assert T.find_adapter(ViTConfig, ClassificationData, "heldout", any_model=False) is None
    anyone = T.find_adapter(None, ClassificationData, "task")
    assert anyone is not None and T.find_adapter(ViTConfig, ClassificationData, "task") is anyone


def test_build_task_refuses_minibatch_together_with_ssl():
    """kills: build_task's minibatch refusal without ``ssl is not None`` (ssl settings silently dropped)"""
    node = _container(NodeData, name="cora", kind="node", num_features=7, num_classes=5)
    with pytest.raises(ValueError, match="minibatch applies to node classification .NodeData. only"):
        T.build_task(node, _Model(GCNConfig.__new__(GCNConfig)), minibatch={"batch_size": 4}, ssl={"knn_k": 3})


def test_build_task_refuses_label_smoothing_for_a_dino_model():
    """kills: build_task's augment/label_smoothing refusal without ``not _is_dino(model)`` (a DINO model on
    images would reach its adapter with a supervised option)"""
    with pytest.raises(ValueError, match="supervised classification only, not to ClassificationData with DINO"):
        T.build_task(_images(), _tiny_dino(), label_smoothing=0.1)
    with pytest.raises(ValueError, match="supervised classification only"):
        T.build_task(_images(), _tiny_dino(), augment={"flip": True})


# ---------------------------------------------------------------------------- rotary.py
def test_apply_rotary_refuses_angles_for_the_wrong_number_of_positions():
    """kills: apply_rotary without its ``angles.shape[0] != N`` check (one row of angles broadcasts over
    every position silently: all tokens rotated as position 0's)"""
    from diffusionformer.nn.rotary import apply_rotary

    x = torch.randn(3, 1, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"expected angles of shape \(N, C/2\) = \(3, 2\), got \(1, 2\)"):
        apply_rotary(x, torch.zeros(1, 2, dtype=torch.float64))


def test_rotary_head_dims_must_be_whole_multiples():
    """kills: _check_dim without ``head_dim % multiple`` (an odd 1-D head dim, or a 2-D head dim that is not
    a multiple of 4, would be accepted and its last channel left unrotated)"""
    from diffusionformer.nn.rotary import RotaryEmbedding, RotaryEmbedding2D

    with pytest.raises(ValueError, match="positive multiple of 2, got 5"):
        RotaryEmbedding(5)
    with pytest.raises(ValueError, match="positive multiple of 4, got 6"):
        RotaryEmbedding2D(6)


# ---------------------------------------------------------------------------- grand.py
def test_grand_nl_refuses_a_negative_time():
    """kills: NonlinearDiffusionOperator accepting ``t < 0`` (backward nonlinear diffusion is ill-posed;
    documented: t is a finite non-negative float)"""
    from diffusionformer.operators.grand import NonlinearDiffusionOperator

    with pytest.raises(ValueError, match="t must be a finite non-negative float, got -0.5"):
        NonlinearDiffusionOperator(t=-0.5)
    assert NonlinearDiffusionOperator(t=0.0).t == 0.0  # t = 0 (the identity) stays allowed


# ---------------------------------------------------------------------------- operators/registry.py
def _halfway_class(**init_kwargs: Any) -> type:
    """A fresh operator class with coefficients (I + P) / 2 (its constructor takes ``**options`` on request)."""
    from diffusionformer.operators import DiffusionOperator

    class Halfway(DiffusionOperator):
        degree = 1

        def coefficients(self):
            return torch.tensor([0.5, 0.5])

    if init_kwargs.get("var_keyword"):
        def __init__(self, num_heads: int = 1, **options: Any) -> None:
            DiffusionOperator.__init__(self, num_heads)
            self.options = options

        Halfway.__init__ = __init__  # type: ignore[method-assign]
    return Halfway


def test_unregister_operator_removes_its_aliases():
    """kills: unregister_operator leaving the aliases behind (a stale alias would point at a removed name
    and block re-registering it)"""
    from diffusionformer.operators import build_operator, register_operator, unregister_operator

    cls = _halfway_class()
    register_operator(cls, name="audit-walk", aliases=("audit-lazy",))
    unregister_operator("audit-walk")
    with pytest.raises(ValueError, match="unknown operator 'audit-lazy'"):
        build_operator("audit-lazy")
    register_operator(cls, name="audit-walk-2", aliases=("audit-lazy",))  # the alias is free again
    unregister_operator("audit-lazy")


def test_unknown_operator_suggests_the_name_behind_a_close_alias():
    """kills: operator_class's "did you mean" looking at the registered names only, not the aliases
    (a typo of the alias 'appnp' must suggest its operator 'ppr')"""
    from diffusionformer.operators import build_operator

    with pytest.raises(ValueError, match=r"unknown operator 'apnp' \(did you mean 'ppr'\?\)"):
        build_operator("apnp")


def test_build_operator_passes_any_keyword_to_a_constructor_with_var_keyword():
    """kills: _unknown_arguments without its ``**kwargs`` early return (a constructor that takes any
    keyword would have its options refused as unknown)"""
    from diffusionformer.operators import build_operator, register_operator, unregister_operator

    register_operator(_halfway_class(var_keyword=True), name="audit-options")
    try:
        op = build_operator("audit-options(scale=2, label='x')", num_heads=2)
        assert op.options == {"scale": 2, "label": "x"} and op.num_heads == 2
    finally:
        unregister_operator("audit-options")


def test_knn_classify_refuses_bank_labels_outside_the_classes():
    """defect (fixed): a bank label >= num_classes failed inside ``scatter_add_`` with a bare
    "index 5 is out of bounds" RuntimeError (a negative one likewise), naming neither argument"""
    from diffusionformer.models import knn_classify

    bank = torch.eye(3, dtype=torch.float64)
    for labels in ([0, 1, 5], [0, -1, 1]):
        with pytest.raises(ValueError, match=r"bank_labels must lie in \[0, num_classes=3\)"):
            knn_classify(bank, torch.tensor(labels), bank, num_classes=3, k=1)
    pred = knn_classify(bank, torch.tensor([0, 1, 2]), bank, num_classes=3, k=1)
    assert pred.tolist() == [0, 1, 2]  # each query is its own nearest neighbour
