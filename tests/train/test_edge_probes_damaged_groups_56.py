"""The trainer's resume check of a changed number of optimizer groups, on damaged files (sitting 56)."""

from __future__ import annotations

import pytest
import torch
from train_tiny_tasks import RegressionTask, TinyMLP, tiny_config

from diffusionformer.train import CheckpointError, Trainer


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
    torch.manual_seed(0)
    Trainer(TinyMLP(), RegressionTask(), tiny_config(max_steps=3, lr_decay_steps=10), tmp_path).fit()
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
    torch.manual_seed(0)
    resumed = Trainer(TinyMLP(), RegressionTask(), tiny_config(max_steps=6, lr_decay_steps=10), tmp_path, resume=True)
    if damage == "drop_group":
        with pytest.raises(CheckpointError, match=r"does not fit"):
            resumed.fit()
    else:
        with pytest.raises(ValueError, match=r"optimised other parameters \(decay groups: checkpoint \[\["):
            resumed.fit()
    assert path.read_bytes() == before
