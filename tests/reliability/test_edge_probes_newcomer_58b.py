"""Edge-case probes of a newcomer's first walk (sitting 58): messages that left the user to find the remedy.

Found and fixed (tests named ``test_bug_...``):

- ``load_run`` of a seed that was not run (``.../seed5``) said "got missing .../seed5", naming neither the seeds
  that were run nor, for a misspelt task or setting, the one meant: it now names the folders beside the first
  missing one, with a "did you mean" for a task or setting.
- A ViT's 17 tokens (16 patches and a class token) on ``grid(4, 4)`` said "expects x of shape (B, N=16, D), got
  (2, 17, 8)": one token more than the graph's now names the class token and ``grid(..., cls_token=True)``.
- ``model(data)`` with a PyG ``Data`` (the graph models take its tensors) was Python's bare "missing 1 required
  positional argument: 'edge_index'": a TypeError now says to call ``model(data.x, data.edge_index, data.batch)``.
- ``status`` said "about 0 min of training left" while runs of a tiny config were to be redone (seconds of
  training): it now says "less than a minute".
- ``laplacian_heads='halve'`` had no "did you mean 'half'?".
"""

from __future__ import annotations

import pytest
import torch

from diffusionformer.experiments import load_run
from diffusionformer.experiments.tables import format_status
from diffusionformer.graph.builders import grid
from diffusionformer.models.gcn import GCN, GCNConfig
from diffusionformer.models.gin import GIN, GINConfig
from diffusionformer.models.graph_transformer import DiffusionGraphTransformer, GraphTransformerConfig
from diffusionformer.models.vit import DiffusionViT, ViTConfig
from diffusionformer.nn.heads import resolve_layer_heads


def _runs(tmp_path):
    """A comparison's ``runs`` folder: task ``digits``, settings ``attention`` and ``laplacian-half``, seeds 0-2."""
    runs = tmp_path / "results" / "h" / "runs"
    for setting in ("attention", "laplacian-half"):
        for seed in range(3):
            (runs / "digits" / setting / f"seed{seed}").mkdir(parents=True)
    return runs


def test_bug_load_run_of_a_seed_not_run_names_the_seeds_there(tmp_path):
    runs = _runs(tmp_path)
    with pytest.raises(FileNotFoundError) as info:
        load_run(runs / "digits" / "laplacian-half" / "seed5")
    assert str(info.value).endswith(f"got missing {runs / 'digits' / 'laplacian-half' / 'seed5'} (no 'seed5' in "
                                    f"{runs / 'digits' / 'laplacian-half'}; it holds seed0, seed1, seed2)")


def test_bug_load_run_of_a_misspelt_setting_or_task_says_which_was_meant(tmp_path):
    runs = _runs(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"\(no 'laplacain-half' in .*digits \(did you mean "
                                                r"'laplacian-half'\?\); it holds attention, laplacian-half\)$"):
        load_run(runs / "digits" / "laplacain-half" / "seed0")
    with pytest.raises(FileNotFoundError, match=r"\(no 'digts' in .*runs \(did you mean 'digits'\?\); it holds "
                                                r"digits\)$"):
        load_run(runs / "digts" / "attention" / "seed0")


def test_load_run_of_a_missing_path_outside_a_runs_folder_lists_nothing(tmp_path):
    (tmp_path / "a").mkdir()
    with pytest.raises(FileNotFoundError) as info:
        load_run(tmp_path / "nowhere" / "seed0")
    assert str(info.value).endswith(f"got missing {tmp_path / 'nowhere' / 'seed0'}")


def test_bug_a_grid_graph_without_the_vit_class_token_names_cls_token():
    model = DiffusionViT(ViTConfig(input_size=(8, 8), patch_size=2, num_classes=3, dim=8, depth=1, num_heads=2))
    images = torch.randn(2, 1, 8, 8)  # 16 patches and the class token: 17 tokens
    with pytest.raises(ValueError, match=r"expects x of shape \(B, N=16, D\), got \(2, 17, 8\) \(one token more "
                                         r"than N=16: a class token\? .*grid\(h, w, cls_token=True\)"):
        model(images, graph=grid(4, 4))
    assert model(images, graph=grid(4, 4, cls_token=True)).shape == (2, 3)
    with pytest.raises(ValueError, match=r"got \(2, 17, 8\)$"):  # two tokens more than the graph's: no guess
        model(images, graph=grid(3, 5))


def _graph_models():
    gt = GraphTransformerConfig(in_channels=3, num_classes=2, dim=8, num_heads=2)
    return [DiffusionGraphTransformer(gt), GCN(GCNConfig(in_channels=3, num_classes=2)),
            GIN(GINConfig(in_channels=3, num_classes=2))]


@pytest.mark.parametrize("index", [0, 1, 2])
def test_bug_a_graph_model_given_a_pyg_data_says_how_to_call_it(index):
    data_mod = pytest.importorskip("torch_geometric.data")
    model = _graph_models()[index]
    data = data_mod.Data(x=torch.randn(4, 3), edge_index=torch.tensor([[0, 1, 2], [1, 2, 3]]))
    name = type(model).__name__
    for given in (data, data_mod.Batch.from_data_list([data, data])):
        with pytest.raises(TypeError, match=rf"^{name} takes the tensors of a graph, not a PyG \w+: call "
                                            r"model\(data\.x, data\.edge_index, data\.batch\)"):
            model(given)
    with pytest.raises(TypeError, match=rf"^{name}: edge_index is required .*model\(x, edge_index, batch\)"):
        model(data.x)
    assert model(data.x, data.edge_index).shape[-1] == 2  # the call with its tensors works


def test_a_graph_transformer_given_a_pyg_data_names_the_inputs_its_config_asks_for():
    data_mod = pytest.importorskip("torch_geometric.data")
    model = DiffusionGraphTransformer(GraphTransformerConfig(in_channels=3, num_classes=2, dim=8, num_heads=2,
                                                             edge_dim=2))
    hetero = data_mod.HeteroData()
    hetero["a"].x = torch.randn(2, 3)
    with pytest.raises(TypeError, match=r"not a PyG HeteroData: merge its node and edge types with "
                                        r"data\.to_homogeneous\(\), then call model\(data\.x, data\.edge_index, "
                                        r"data\.batch, edge_attr=data\.edge_attr\)"):
        model(hetero)


def _row(seed, changed=None, state="completed", step=4, elapsed=2.0):
    return dict(task="t", operator="att", seed=seed, state=state, step=step, max_steps=4, elapsed=elapsed,
                holder=None, changed=changed)


def test_bug_status_of_runs_to_redo_in_seconds_is_not_about_0_min():
    # three finished runs of 4 steps in 2 s each, made with another train config: 6 s of training to redo
    rows = [_row(seed, changed="train (max_steps: 2 then 4)") for seed in range(3)]
    head = format_status(rows).split("\n")[0]
    assert head == "0 of 3 runs completed; less than a minute of training left on one worker.", head
    # nothing left: as before
    assert format_status([_row(0)]).startswith("1 of 1 runs completed; about 0 min of training left on one worker.")


def test_bug_laplacian_heads_halve_suggests_half():
    with pytest.raises(ValueError, match=r"got 'halve' \(did you mean 'half'\?\)$"):
        resolve_layer_heads(2, 4, laplacian_heads="halve")
    with pytest.raises(ValueError, match=r"laplacian_heads\[1\] must be an int in \[0, 4\], got 'Half' \(did you "
                                         r"mean 'half'\?\)$"):
        resolve_layer_heads(2, 4, laplacian_heads=[1, "Half"])
    with pytest.raises(ValueError, match=r"got 'xyz'$"):
        resolve_layer_heads(2, 4, laplacian_heads="xyz")
