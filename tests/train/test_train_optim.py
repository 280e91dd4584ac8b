from __future__ import annotations

import pytest
import torch
from torch import nn

from diffusionformer.train import TrainConfig, build_optimizer, param_groups


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(11, 8)
        self.pos_embed = nn.Parameter(torch.zeros(1, 5, 8))
        self.proj = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)
        self.conv = nn.Conv1d(8, 8, 3)
        self.head = nn.Linear(8, 11, bias=False)
        self.head.weight = self.wte.weight  # tied
        self.frozen = nn.Linear(8, 8)
        self.frozen.requires_grad_(False)

    def no_weight_decay(self) -> set[str]:
        return {"pos_embed"}


def _groups(model: nn.Module, wd: float = 0.1) -> dict[float, list[str]]:
    return {g["weight_decay"]: g["names"] for g in param_groups(model, wd)}


def test_split_by_dim_embedding_and_hook():
    groups = _groups(TinyLM())
    assert groups[0.1] == ["proj.weight", "conv.weight"]
    assert groups[0.0] == ["pos_embed", "wte.weight", "proj.bias", "norm.weight", "norm.bias", "conv.bias"]


def test_every_trainable_parameter_exactly_once():
    model = TinyLM()
    ids = [id(p) for g in param_groups(model, 0.1) for p in g["params"]]
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    assert len(ids) == len(set(ids)) == len(trainable) and set(ids) == trainable


def test_bad_no_weight_decay_hook():
    class Bad(nn.Linear):
        def no_weight_decay(self) -> set[str]:
            return {"missing"}

    with pytest.raises(ValueError, match=r"expected names of parameters, got unknown \['missing'\]"):
        param_groups(Bad(2, 2), 0.1)


def test_build_optimizer_uses_config():
    cfg = TrainConfig(lr=2e-3, weight_decay=0.05, betas=(0.8, 0.9), device="cpu")
    opt = build_optimizer(TinyLM(), cfg, torch.device("cpu"))
    assert isinstance(opt, torch.optim.AdamW)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.05, 0.0]
    assert all(g["lr"] == 2e-3 and g["betas"] == (0.8, 0.9) for g in opt.param_groups)
    with pytest.raises(ValueError, match="trainable parameters"):
        build_optimizer(nn.Linear(2, 2).requires_grad_(False), cfg, torch.device("cpu"))


def test_weight_decay_acts_only_on_decayed_group():
    # With zero gradients AdamW's update is pure decay: p <- p (1 - lr wd).
    model = nn.Sequential(nn.Linear(3, 3), nn.LayerNorm(3))
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(1.0)
    cfg = TrainConfig(lr=0.1, weight_decay=0.5, device="cpu")
    opt = build_optimizer(model, cfg, torch.device("cpu"))
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    assert torch.allclose(model[0].weight, torch.full((3, 3), 0.95))
    for p in (model[0].bias, model[1].weight, model[1].bias):
        assert torch.equal(p, torch.ones(3))
