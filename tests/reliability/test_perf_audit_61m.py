"""Task 61m: a performance audit of the library commits of 61a-61i against their parent 1ca5cad (ratios in the
task's report). What these tests pin is work counted, not time: ``knn_classify`` (2bb1fad's power-of-two scaling)
made three copies of the size of its bank (``|bank|``, the scaled bank, the normalised one) where one does, which
doubled the normalisation of a 50k x 384 bank; the results stay bit for bit. No GPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from diffusionformer.graph.knn import _pow2_scale
from diffusionformer.models.dino import knn_classify


class _NewTensors(TorchDispatchMode):
    """Counts the float tensors of ``numel`` elements that ops allocate (outputs sharing no input's storage: no views,
    no in-place results; not the boolean masks of the finiteness checks), naming their ops in ``ops``."""

    def __init__(self, numel: int):
        super().__init__()
        self.numel, self.count, self.ops = numel, 0, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {a.untyped_storage().data_ptr() for a in torch.utils._pytree.tree_leaves((args, kwargs))
                  if isinstance(a, torch.Tensor)}
        for t in torch.utils._pytree.tree_leaves(out):
            if (isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() == self.numel
                    and t.untyped_storage().data_ptr() not in inputs):
                self.count += 1
                self.ops.append(str(func))
        return out


def test_pow2_scale_makes_no_copy_of_abs_x():
    """``_pow2_scale`` took ``|x|.amax`` through ``x.abs()``, a copy the size of ``x``: its one copy is its result."""
    x = torch.randn(40, 7) * torch.logspace(-30, 30, 40).unsqueeze(1)
    with _NewTensors(x.numel()) as mode:
        y = _pow2_scale(x, (1,))
    assert mode.count == 1
    for dims in ((1,), (0, 1)):  # per row (knn_classify's), over the whole (knn's per graph): as through |x|
        exp = torch.frexp(x.abs().amax(dim=dims, keepdim=True))[1]
        assert torch.equal(_pow2_scale(x, dims), x * torch.exp2(-exp.float()))
    assert torch.equal(y.abs().amax(dim=1) >= 0.5, torch.ones(40, dtype=torch.bool)) and y.abs().max() < 1


def test_knn_classify_normalises_the_bank_in_one_copy():
    """The bank (50 x 6 here) is scaled and normalised in one tensor of its size (three before: ``|bank|``, the scaled
    bank, ``F.normalize``'s result), each query chunk likewise; predictions, bit for bit, and the caller's tensors as
    before."""
    g = torch.Generator().manual_seed(0)
    bank = torch.randn(50, 6, generator=g) * torch.logspace(-25, 25, 50).unsqueeze(1)  # huge and tiny rows
    queries = torch.randn(7, 6, generator=g) * 1e20
    labels = torch.randint(0, 3, (50,), generator=g)
    bank0, queries0 = bank.clone(), queries.clone()
    with _NewTensors(bank.numel()) as on_bank:
        knn_classify(bank, labels, queries, 3, k=5)
    with _NewTensors(queries.numel()) as on_queries:
        pred = knn_classify(bank, labels, queries, 3, k=5)
    # torch.isfinite's |x| in the finiteness check (as before 2bb1fad), then the scaled copy, normalised in place
    # (was also |x| for the power of two and F.normalize's result)
    assert on_bank.ops == on_queries.ops == ["aten.abs.default", "aten.mul.Tensor"]
    assert torch.equal(bank, bank0) and torch.equal(queries, queries0)  # normalised in place, never the caller's
    sim = F.normalize(_pow2_scale(queries, (1,)), dim=1) @ F.normalize(_pow2_scale(bank, (1,)), dim=1).T  # by hand
    s, idx = sim.topk(5, dim=1)
    votes = torch.zeros(7, 3).scatter_add_(1, labels[idx], torch.exp((s - s[:, :1]) / 0.07))
    assert torch.equal(pred, votes.argmax(dim=1))


def test_analyze_fingerprints_a_tasks_data_once(tmp_path, monkeypatch):
    """``analyze`` compared each run's ``preprocessing.json`` with its data's record (f36f491's fingerprint: hashes of
    the tokens or the graph, 8 ms on Cora) computed again for every run of the same data: 18% of analysing four tiny
    Cora runs. Once per task's data now; a run whose record differs is still refused."""
    import diffusionformer.experiments.analyze as analyze_mod
    import diffusionformer.experiments.reload as reload_mod
    from diffusionformer.experiments import load_experiment_config
    from diffusionformer.experiments.results import run_dir
    from diffusionformer.experiments.runner import run_experiment

    train = {"max_steps": 2, "batch_size": 4, "warmup_steps": 0, "eval_interval": 2, "log_interval": 1,
             "checkpoint_interval": 2}
    task = {"name": "t", "dataset": "pydoc-chars", "model": "gpt-char-tiny", "metric": "val_loss", "train": train,
            "model_overrides": {"n_embd": 8, "n_layer": 1, "n_head": 2, "block_size": 8}}
    config = load_experiment_config({"name": "tiny", "seeds": [0, 1, 2], "tasks": [task],
                                     "operators": [{"name": "attention"}]})
    run_experiment(config, tmp_path, progress=False, log=lambda s: None)
    calls = []
    real = reload_mod._data_preprocessing
    monkeypatch.setattr(reload_mod, "_data_preprocessing", lambda data: calls.append(data) or real(data))
    analyze_mod.analyze_experiment(config, tmp_path, progress=False, plots=False, max_examples=4,
                                   max_attention_examples=2)
    assert len(calls) == 1  # three runs of one data: was 3
    record = run_dir(tmp_path / "tiny", "t", "attention", 2) / "preprocessing.json"
    record.write_text(record.read_text(encoding="utf-8").replace('"val_tokens": ', '"val_tokens": 1'),
                      encoding="utf-8")
    with pytest.raises(ValueError, match=r"seed2.*prepared otherwise than this data's \(val_tokens"):
        analyze_mod.analyze_experiment(config, tmp_path, progress=False, plots=False, max_examples=4,
                                       max_attention_examples=2)


def test_run_fingerprints_a_tasks_data_once(tmp_path, monkeypatch):
    """The runner recorded each run's preprocessing (its fingerprint hashes the tokens or the graph: 8 ms on Cora, 1.6 s
    for a user's set of 40,000 graphs) computed again for every setting and seed of the same data: once per task's
    data now, every run's record the same."""
    import diffusionformer.experiments.reload as reload_mod
    import diffusionformer.experiments.runner as runner_mod
    from diffusionformer.experiments import load_experiment_config
    from diffusionformer.experiments.results import run_dir

    train = {"max_steps": 2, "batch_size": 4, "warmup_steps": 0, "eval_interval": 2, "log_interval": 1,
             "checkpoint_interval": 2}
    task = {"name": "t", "dataset": "pydoc-chars", "model": "gpt-char-tiny", "metric": "val_loss", "train": train,
            "model_overrides": {"n_embd": 8, "n_layer": 1, "n_head": 2, "block_size": 8}}
    config = load_experiment_config({"name": "tiny", "seeds": [0, 1], "tasks": [task],
                                     "operators": [{"name": "attention"}, {"name": "lap", "laplacian_heads": 1}]})
    calls = []
    real = reload_mod._data_preprocessing
    monkeypatch.setattr(reload_mod, "_data_preprocessing", lambda data: calls.append(data) or real(data))
    runner_mod.run_experiment(config, tmp_path, progress=False, log=lambda s: None)
    assert len(calls) == 1  # four runs of one data: was 4
    records = {(op, seed): (run_dir(tmp_path / "tiny", "t", op, seed) / "preprocessing.json").read_text("utf-8")
               for op in ("attention", "lap") for seed in (0, 1)}
    assert len(set(records.values())) == 1 and '"train_sha256"' in records["lap", 1]
