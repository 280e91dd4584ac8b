"""Edge probes fixed or pinned in sitting 56 by the integrator (not by a helper round)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from diffusionformer.train import CheckpointError, TrainConfig, Trainer


class _Regression:
    def __init__(self) -> None:
        self.w = torch.randn(4, 2, generator=torch.Generator().manual_seed(0))

    def train_batch(self, step, generator, batch_size):
        x = torch.randn(batch_size, 4, generator=generator)
        return {"x": x, "y": x @ self.w}

    def loss(self, model, batch):
        return F.mse_loss(model(batch["x"]), batch["y"]), {}

    def evaluate(self, model, max_batches):
        return {"loss": 0.0}


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 2))


def _config(max_steps: int) -> TrainConfig:
    return TrainConfig(max_steps=max_steps, lr_decay_steps=6, batch_size=8, lr=1e-2, warmup_steps=1, eval_interval=0,
                       log_interval=1, checkpoint_interval=2, seed=0, device="cpu", progress=False)


def _damage_groups(path, damage) -> None:
    payload = torch.load(path, weights_only=True)
    damage(payload["optimizer"])
    torch.save(payload, path)


@pytest.mark.parametrize("damage", ["drop_group", "merge_groups"])
def test_a_damaged_optimizer_file_whose_groups_miss_moments_reads_as_damaged(tmp_path, damage):
    """Pins the trainer's resume check for a changed number of optimizer groups (two mutants of its ``whole``
    condition lived): another number of groups is read as "a run that optimised other parameters" only where the
    groups still hold every saved moment (a group emptied or filled by freezing); a file whose groups lost entries
    the state still holds (a group dropped by hand) is a damaged file, refused as one that does not fit, file
    unchanged."""
    Trainer(_mlp(), _Regression(), _config(2), tmp_path).fit()
    path = tmp_path / "checkpoint.pt"

    def drop_group(opt):  # the no-decay group gone, its moments still in the state
        assert len(opt["param_groups"]) == 2 and len(opt["state"]) == 6
        del opt["param_groups"][1]

    def merge_groups(opt):  # one group naming every parameter: the moments all held, the names changed
        first, second = opt["param_groups"]
        first["params"] = first["params"] + second["params"]
        first["names"] = first["names"] + second["names"]
        del opt["param_groups"][1]

    _damage_groups(path, {"drop_group": drop_group, "merge_groups": merge_groups}[damage])
    before = path.read_bytes()
    if damage == "drop_group":
        with pytest.raises(CheckpointError, match=r"does not fit"):
            Trainer(_mlp(), _Regression(), _config(4), tmp_path, resume=True).fit()
    else:
        with pytest.raises(ValueError, match=r"optimised other parameters \(decay groups: checkpoint \[\["):
            Trainer(_mlp(), _Regression(), _config(4), tmp_path, resume=True).fit()
    assert path.read_bytes() == before
