"""Edge-case probes of the task adapters (``experiments/tasks.py``) and their metrics (``experiments/_metrics.py``),
third pass.

Probed: text evaluation against nanoGPT's ``estimate_loss`` (float64 on the same seeded windows), classification,
graph and sequence evaluation against float64 references for eval batch sizes that do not divide the split (the
last partial batch weighted per example), sequence targets under ``ignore_index`` -100, -1 and 0, sampled node
evaluation with all neighbours against a float64 full-graph reference, DINO's k-NN accuracies against a NumPy
weighted vote, empty splits, evaluation and the training trajectory (an evaluation every update against one at the
end, bit for bit, for the stateful DINO and a batch-normalised GIN), and the label dtypes and shapes a node task
is given.

Found and fixed (tests named ``test_bug_...``):

- ``data.base.NodeData`` checked only that ``y`` has one row per node: int32, uint8 or float labels, ``(N, 1)``
  labels (OGB's layout) and a label of a train/val/test node outside ``[0, num_classes)`` were accepted, and the
  node task then failed in its loss ("expected target dtype to be Long or Byte", "0D or 1D target tensor
  expected") or, for a val/test label, only at the first evaluation after training had run ("Target 5 is out of
  bounds"; a device-side assert on a GPU). ``y`` must now be int64 of shape ``(N,)`` with the labels of the
  split nodes in ``[0, num_classes)``, as ``ClassificationData`` requires of its labels.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch_geometric.data import Data

from diffusionformer.data.base import ClassificationData, GraphSetData, NodeData
from diffusionformer.experiments.tasks import build_task, model_overrides_for_data
from diffusionformer.models import create_model, model_config


def _node_data(y: torch.Tensor) -> NodeData:
    N = 6
    g = torch.Generator().manual_seed(0)
    data = Data(x=torch.randn(N, 2, generator=g), edge_index=torch.tensor([[0, 1, 2], [1, 2, 3]]), y=y,
                train_mask=torch.tensor([1, 1, 0, 0, 0, 0]).bool(), val_mask=torch.tensor([0, 0, 1, 1, 0, 0]).bool(),
                test_mask=torch.tensor([0, 0, 0, 0, 1, 1]).bool())
    return NodeData("n", data, 3, 2)


_LABELS = torch.tensor([0, 1, 2, 0, 1, 2])


@pytest.mark.parametrize("y, words", [
    (_LABELS.int(), "int64 tensor of shape (6,)"),
    (_LABELS.to(torch.uint8), "int64 tensor of shape (6,)"),
    (_LABELS.float(), "int64 tensor of shape (6,)"),
    (_LABELS.view(-1, 1), "int64 tensor of shape (6,)"),  # OGB's (N, 1) labels
    (torch.tensor([0, 1, 5, 0, 1, 2]), "must lie in [0, 3)"),  # a val node's label beyond the classes
    (torch.tensor([0, -1, 2, 0, 1, 2]), "must lie in [0, 3)"),  # a training node's negative label
])
def test_bug_node_labels_the_task_cannot_score_are_refused(y, words):
    """Bug: NodeData took int32/uint8/float, (N, 1) and out-of-range labels; the node task failed in its loss or at
    the first evaluation after training (a device-side assert on a GPU)."""
    with pytest.raises(ValueError, match="y") as err:
        _node_data(y)
    assert words in str(err.value)


def test_pins_unlabelled_nodes_outside_the_splits_may_hold_any_label():
    """Only the nodes of a split are scored: a -1 on a node no mask selects is no label (PyG's convention); the
    full-graph metrics equal float64 cross-entropy and accuracy over each split's nodes."""
    y = _LABELS.clone()
    y[1] = -1
    data = _node_data(torch.tensor([0, 0, 2, 0, 1, 2]))
    data.data.train_mask[1] = False
    data.data.y = y
    NodeData("n", data.data, 3, 2)  # accepted
    torch.manual_seed(0)
    model = create_model("gcn-2layer", **model_overrides_for_data(data, type(model_config("gcn-2layer")))).eval()
    out = build_task(data, model).evaluate(model, None)
    with torch.no_grad():
        logits = model(data.data.x, data.data.edge_index).double()
    for split in ("val", "test"):
        m = getattr(data.data, f"{split}_mask")
        lp = logits[m] - logits[m].logsumexp(-1, keepdim=True)
        assert out[f"{split}_loss"] == pytest.approx(float(-lp[torch.arange(int(m.sum())), y[m]].mean()), rel=1e-6)
        assert out[f"{split}_acc"] == pytest.approx(float((logits[m].argmax(-1) == y[m]).double().mean()), rel=1e-6)


def test_pins_dino_knn_accuracies_equal_a_numpy_weighted_vote_for_any_max_batches():
    """k-NN accuracy (DINO's protocol: cosine top-k, exp(s / T) weights) by hand in float64, with max_batches
    capping the bank and the queries to its first ``max_batches * eval_batch_size`` images."""
    g = torch.Generator().manual_seed(0)

    def imgs(n):
        return torch.rand(n, 1, 8, 8, generator=g), torch.randint(0, 3, (n,), generator=g)

    (a, b), (c, d), (e, f) = imgs(9), imgs(7), imgs(5)
    data = ClassificationData("i", "image", a, b, c, d, e, f, 3, (1, 8, 8))
    torch.manual_seed(0)
    model = create_model("dino-digits", **model_overrides_for_data(data, type(model_config("dino-digits")))).eval()
    task = build_task(data, model, eval_batch_size=2)
    k, T = task.ssl.knn_k, task.ssl.knn_temperature

    def reference(max_batches):
        def feats(x):
            n = x.shape[0] if max_batches is None else min(x.shape[0], 2 * max_batches)
            with torch.no_grad():
                return model(x[:n]).double().numpy()

        bank = feats(data.x_train)
        bank_y = data.y_train[: bank.shape[0]].numpy()
        bank /= np.linalg.norm(bank, axis=1, keepdims=True)
        out = {}
        for split in ("val", "test"):
            x, y = data.split(split)
            q = feats(x)
            sims = (q / np.linalg.norm(q, axis=1, keepdims=True)) @ bank.T
            preds = []
            for row in sims:
                scores = np.zeros(3)
                for i in np.argsort(-row, kind="stable")[: min(k, len(row))]:
                    scores[bank_y[i]] += np.exp(row[i] / T)
                preds.append(int(np.argmax(scores)))
            out[f"knn_{split}_acc"] = float(np.mean(np.array(preds) == y[: len(preds)].numpy()))
        return out

    for max_batches in (None, 1, 2):
        with torch.no_grad():
            got = task.evaluate(model, max_batches)
        for key, value in reference(max_batches).items():
            assert got[key] == pytest.approx(value, abs=1e-6), (max_batches, key)  # a float32 mean


def _train(preset, data, eval_interval, tmp_path, **overrides):
    from diffusionformer.train import Trainer, TrainConfig
    from diffusionformer.train.rng import seed_everything

    seed_everything(0)
    model = create_model(preset, **{**model_overrides_for_data(data, type(model_config(preset))), **overrides})
    cfg = TrainConfig(max_steps=3, batch_size=4, lr=1e-2, eval_interval=eval_interval, log_interval=1,
                      checkpoint_interval=0, seed=0, device="cpu", progress=False, eval_steps=2)
    Trainer(model, build_task(data, model), cfg, tmp_path / f"every{eval_interval}").fit()
    return model.state_dict()


def test_pins_evaluating_every_update_leaves_dino_and_gin_training_bit_exact(tmp_path):
    """DINO's evaluation runs its teacher and student on seeded views next to a centre it must not move; GIN's
    batch norms would update their running statistics in training mode: the weights (and buffers) after an
    evaluation at every update equal those of a run that evaluates only at its end."""
    g = torch.Generator().manual_seed(0)

    def imgs(n):
        return torch.rand(n, 1, 8, 8, generator=g), torch.randint(0, 3, (n,), generator=g)

    (a, b), (c, d), (e, f) = imgs(12), imgs(5), imgs(3)
    images = ClassificationData("i", "image", a, b, c, d, e, f, 3, (1, 8, 8))
    graphs = [Data(x=torch.randn(4, 2, generator=g), edge_index=torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]]),
                   y=torch.tensor([i % 2])) for i in range(11)]
    graph_set = GraphSetData("g", graphs, torch.arange(0, 6), torch.arange(6, 9), torch.arange(9, 11), 2, 2)
    for preset, data in (("dino-digits", images), ("gin-graph", graph_set)):
        every = _train(preset, data, 1, tmp_path / preset)
        at_end = _train(preset, data, 3, tmp_path / preset)
        assert every.keys() == at_end.keys()
        for name in every:
            assert torch.equal(every[name], at_end[name]), (preset, name)

