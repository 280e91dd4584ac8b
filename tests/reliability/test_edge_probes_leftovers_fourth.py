"""Left-overs of the earlier probe rounds, fixed in sitting 30 (tests named ``test_bug_...``).

- ``publish_experiment`` removed the earlier published folder, then renamed the complete copy into its place: a
  publish killed between the two left no published folder at all. The earlier folder now steps aside under a
  hidden name and comes back when the rename fails, or at the next ``publish`` after a hard kill.
- ``to_device`` copied GPU tensors to the CPU with ``non_blocking=True`` (the host could read them before the copy
  landed); copies to the CPU block now.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.results import RunResult


def _published(tmp_path, values):
    from diffusionformer.experiments.outputs import write_outputs
    from diffusionformer.experiments.publish import publish_experiment

    cfg = load_experiment_config({
        "name": "probe", "seeds": [0, 1], "operators": [{"name": "base"}, {"name": "x"}],
        "tasks": [{"name": "d", "dataset": "digits", "model": "vit-digits", "train": {"max_steps": 2}}]})
    out, docs = tmp_path / "res", tmp_path / "docs"
    (out / "probe").mkdir(parents=True, exist_ok=True)
    runs = [RunResult("d", op, s, "completed", "test_acc", v + s / 10, {"test_acc": v + s / 10}, 10, 1.0)
            for op, v in values.items() for s in (0, 1)]
    write_outputs(out / "probe", cfg, runs)
    docs.mkdir(exist_ok=True)
    (docs / "index.md").write_text("# R\n\n```{toctree}\nprobe\n```\n")
    return cfg, out, docs, publish_experiment


def test_bug_publish_killed_at_the_rename_keeps_the_published_folder(tmp_path, monkeypatch):
    """Bug: a publish killed after it deleted ``docs/<name>/`` and before the new copy took its name left no
    published folder (the earlier files were gone). A failing rename now puts the earlier folder back."""
    cfg, out, docs, publish = _published(tmp_path, {"base": 0.5, "x": 0.6})
    publish(cfg, out, docs)
    before = (docs / "probe" / "results.json").read_text()
    cfg, out, docs, publish = _published(tmp_path, {"base": 0.3, "x": 0.2})  # new results
    rename = Path.rename

    def killed(self, target):
        if self.name == ".probe.publishing":
            raise KeyboardInterrupt
        return rename(self, target)

    monkeypatch.setattr(Path, "rename", killed)
    try:
        with pytest.raises(KeyboardInterrupt):
            publish(cfg, out, docs)
    except KeyboardInterrupt:  # escaped the raises block: fail, don't stop the session
        pytest.fail("KeyboardInterrupt escaped")
    monkeypatch.setattr(Path, "rename", rename)
    assert (docs / "probe" / "results.json").read_text() == before
    assert not (docs / ".probe.previous").exists()
    publish(cfg, out, docs)  # and the next publish goes through
    assert (docs / "probe" / "results.json").read_text() != before
    assert not list(docs.glob(".probe.*"))


def test_bug_publish_after_a_hard_kill_between_the_renames_recovers_the_earlier_files(tmp_path, monkeypatch):
    """Bug (the same, killed with no chance to clean up): the earlier files left aside as ``.<name>.previous`` are
    put back by the next publish, also when that publish fails while copying."""
    import diffusionformer.experiments.publish as publish_module

    cfg, out, docs, publish = _published(tmp_path, {"base": 0.5, "x": 0.6})
    publish(cfg, out, docs)
    before = (docs / "probe" / "results.json").read_text()
    (docs / "probe").rename(docs / ".probe.previous")  # the state a kill between the two renames leaves

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(publish_module, "_copy_files", full_disk)
    with pytest.raises(OSError, match="No space left"):
        publish(cfg, out, docs)
    assert (docs / "probe" / "results.json").read_text() == before
    assert not list(docs.glob(".probe.*"))


def test_bug_to_device_copies_to_the_cpu_blocking(monkeypatch):
    """Bug: ``to_device`` moved every tensor with ``non_blocking=True``, also from a GPU to the CPU, where the host
    may read the tensor before the copy has landed (PyTorch's docs: a device-to-host non-blocking copy needs a
    synchronize). Copies to the CPU block now; copies to an accelerator stay non-blocking."""
    import torch

    from diffusionformer.train import to_device

    seen = []
    original = torch.Tensor.to

    def spy(self, *args, **kwargs):
        seen.append((str(args[0]), kwargs.get("non_blocking", False)))
        return self if str(args[0]).startswith("cuda") else original(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", spy)
    out = to_device({"x": torch.ones(2), "y": [torch.zeros(1)]}, torch.device("cpu"))
    to_device(torch.ones(1), "cuda:0")
    monkeypatch.undo()
    assert seen == [("cpu", False), ("cpu", False), ("cuda:0", True)]
    assert torch.equal(out["x"], torch.ones(2)) and torch.equal(out["y"][0], torch.zeros(1))
