"""Edge probes of the evaluation metrics of the task adapters (diffusionformer.experiments.tasks)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("torch_geometric")

from torch_geometric.data import Batch, Data  # noqa: E402

from diffusionformer.data.base import GraphSetData  # noqa: E402
from diffusionformer.experiments.tasks import GraphClassificationTask  # noqa: E402
from diffusionformer.models import GCN, GIN, GCNConfig, GINConfig  # noqa: E402


def _graphs(sizes: list[int]) -> GraphSetData:
    g = torch.Generator().manual_seed(0)
    graphs = []
    for n in sizes:
        edges = torch.stack([torch.arange(max(n - 1, 0)), torch.arange(1, max(n, 1))])
        graphs.append(Data(x=torch.randn(n, 4, generator=g), edge_index=edges, y=torch.tensor([n % 2])))
    idx = torch.arange(len(sizes))
    return GraphSetData("tiny-graphs", graphs, idx, idx, idx, num_classes=2, num_features=4)


@pytest.mark.parametrize("cls, config", [(GCN, GCNConfig), (GIN, GINConfig)])
@pytest.mark.parametrize("eval_batch_size", [2, 5])
def test_bug_graph_evaluation_scores_a_trailing_empty_graph(cls, config, eval_batch_size) -> None:
    """Bug: GraphClassificationTask called the model without ``num_graphs``, so a batch whose last graph has no
    nodes (no id in ``batch.batch``) pooled one graph too few and evaluate() (and loss()) raised "Expected input
    batch_size (4) to match target batch_size (5)". Now every graph gets one prediction, scored as one graph at a
    time in float64."""
    torch.manual_seed(0)
    data = _graphs([3, 4, 0, 2, 0])
    model = cls(config(in_channels=4, num_classes=2, task="graph")).eval()
    task = GraphClassificationTask(data, eval_batch_size)
    out = task.evaluate(model, None)
    with torch.no_grad():  # reference: one graph per forward, float64 sums over graphs
        logits = torch.cat([model(b.x, b.edge_index, b.batch, num_graphs=1)
                            for b in (Batch.from_data_list([gr]) for gr in data.dataset)]).double()
    y = torch.tensor([gr.y.item() for gr in data.dataset])
    ref_loss = F.cross_entropy(logits, y, reduction="sum").item() / len(y)
    ref_acc = (logits.argmax(-1) == y).double().sum().item() / len(y)
    for split in ("val", "test"):
        assert out[f"{split}_loss"] == pytest.approx(ref_loss, rel=1e-5)
        assert out[f"{split}_acc"] == pytest.approx(ref_acc)
    batch = Batch.from_data_list(list(data.dataset))  # the training loss: one row per graph too
    loss, metrics = task.loss(model, batch)
    assert loss.item() == pytest.approx(ref_loss, rel=1e-5)
    assert metrics["acc"].item() == pytest.approx(ref_acc)
