"""The adapters' evaluation loops read their sums on the host once per split, not once per batch.

A ``.item()`` (or ``bool``/``int``/``float`` of a tensor) per batch is a device-to-host synchronisation on a GPU:
the host waits for each batch's forward before it queues the next, so the device idles between batches. The
sums stay on the device in float64 (the same bits as a Python float's running sum, checked below against
float64 references) and are read once. On CPU the count of host reads stands in for the syncs a GPU would do:
the tests count every read of a tensor's value during ``evaluate`` and require it not to grow with the number of
batches. The CPU-only value checks of ``SequenceLMTask`` (``checks_values``, skipped on a GPU) are turned off
here as a GPU turns them off.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch_geometric.data import Data

from diffusionformer.data.base import GraphSetData, SequenceTaskData, TextData
from diffusionformer.experiments import tasks as tasks_module
from diffusionformer.experiments._metrics import _num_correct
from diffusionformer.experiments.tasks import (ClassificationTask, GraphClassificationTask, SequenceLMTask,
                                               TextLMTask)
from experiments_eval_models import LM, GraphSum, Signal, signals  # tests/experiments/conftest.py's path

_READS = ("item", "__bool__", "__int__", "__float__", "tolist")


class _Reads(list):
    """One entry per read of a tensor's value on the host, except while ``paused`` (host-side batching)."""

    paused = False


@pytest.fixture
def host_reads(monkeypatch):
    """A list that gets one entry per read of a tensor's value on the host while the fixture is active; PyG's
    ``Batch.from_data_list`` (host work on CPU graphs, before the batch moves to the device) is not counted."""
    seen = _Reads()
    for name in _READS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _name=name, _original=original, **kwargs):
            if not seen.paused:
                seen.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    from torch_geometric.data import Batch

    batch_of = Batch.from_data_list

    def uncounted(data_list, *args, **kwargs):
        seen.paused = True
        try:
            return batch_of(data_list, *args, **kwargs)
        finally:
            seen.paused = False

    monkeypatch.setattr(Batch, "from_data_list", uncounted)
    monkeypatch.setattr(tasks_module, "checks_values", lambda t: False)  # as on a GPU
    return seen


def _sequences(n):
    g = torch.Generator().manual_seed(n)
    xs = [torch.randint(0, 5, (n, 4), generator=g) for _ in range(3)]
    ys = [torch.randint(0, 5, (n, 4), generator=g) for _ in range(3)]
    for y in ys:
        y[0, :2] = -100  # ignored positions
    return SequenceTaskData("q", xs[0], ys[0], xs[1], ys[1], xs[2], ys[2], 5)


def _graphs(n):
    g = torch.Generator().manual_seed(n)
    edges = torch.tensor([[0, 1], [1, 2]])
    graphs = [Data(x=torch.randn(3, 2, generator=g), edge_index=edges, y=torch.tensor([i % 2])) for i in range(3 * n)]
    split = torch.arange(3 * n).view(3, n)
    return GraphSetData("g", graphs, split[0], split[1], split[2], 2, 2)


def _reads_during(fn, seen):
    before = len(seen)
    out = fn()
    return out, len(seen) - before


@pytest.mark.parametrize("make", [
    lambda n: (ClassificationTask(signals(n), 1), Signal()),
    lambda n: (SequenceLMTask(_sequences(n), 1), LM()),
    lambda n: (GraphClassificationTask(_graphs(n), 1), GraphSum()),
], ids=["classification", "sequence", "graphs"])
def test_evaluation_reads_the_host_once_per_split_not_per_batch(make, host_reads):
    """Pin: batches of one over splits of 2 and of 8 examples take the same number of host reads (before: two or
    three per batch: the loss's ``.item()``, the NaN check's ``bool`` and the count)."""
    counts = []
    for n in (2, 8):
        torch.manual_seed(0)
        task, model = make(n)
        out, reads = _reads_during(lambda: task.evaluate(model, None), host_reads)
        assert all(isinstance(v, float) for v in out.values()), out
        counts.append(reads)
    assert counts[0] == counts[1] and counts[0] <= 8, counts


def test_text_lm_evaluation_reads_each_split_once(host_reads):
    """Pin: TextLMTask's ``eval_batches`` losses are summed on the device; the host reads grow with the number of
    batches only by the window sampler's own (CPU) reads, the same for 2 and 8 batches per batch."""
    torch.manual_seed(0)
    data = TextData("t", torch.randint(0, 5, (64,)), torch.randint(0, 5, (64,)), 5, list("abcde"))
    counts, outs = [], []
    for batches in (2, 8):
        task = TextLMTask(data, 4, eval_batch_size=2, eval_batches=batches)
        sampler_reads = []
        g = torch.Generator().manual_seed(0)
        _, r = _reads_during(lambda: data.get_batch("val", 2, 4, g), host_reads)
        sampler_reads.append(r)
        out, reads = _reads_during(lambda: task.evaluate(LM(), None), host_reads)
        counts.append(reads - 2 * batches * sampler_reads[0])
        outs.append(out)
    assert counts[0] == counts[1] and counts[0] <= 4, counts


def test_sums_on_the_device_equal_float64_references():
    """Pin: the float64 device sums give the mean loss and accuracy of a float64 pass over the whole split, for
    batches of one and of many (so the change of where the sum lives changed no value)."""
    data = signals(7)
    model = Signal()
    with torch.no_grad():
        logits = model(data.x_val).double()
    lp = logits - logits.logsumexp(-1, keepdim=True)
    loss = float(-lp[torch.arange(7), data.y_val].mean())
    acc = float((logits.argmax(-1) == data.y_val).double().mean())
    for size in (1, 3, 512):
        out = ClassificationTask(data, size).evaluate(model, None)
        assert out["loss"] == pytest.approx(loss, rel=1e-6) and out["val_acc"] == pytest.approx(acc, abs=1e-12)


def test_num_correct_is_a_device_tensor_and_nan_for_nan_logits():
    """Pin: ``_num_correct`` counts hits as a 0-d float64 tensor (NaN when a logit is NaN: no prediction)."""
    logits = torch.tensor([[1.0, 2.0], [3.0, 0.0], [0.0, 1.0]])
    hits = _num_correct(logits, torch.tensor([1, 0, 0]))
    assert hits.shape == () and hits.dtype == torch.float64 and float(hits) == 2.0
    logits[2, 0] = math.nan
    assert math.isnan(float(_num_correct(logits, torch.tensor([1, 0, 0]))))
    assert float(_num_correct(torch.empty(0, 3), torch.empty(0, dtype=torch.long))) == 0.0
