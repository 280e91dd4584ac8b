"""Edge cases left noted by earlier probe rounds, now fixed (each "Bug:" test fails with its fix reverted).

* ``attend_cached`` with no new token (``n = 0``) on an empty cache stored an empty ``(B, H, 0, C)`` cache, which
  fixed the cache's batch size: the real prompt that followed, of another batch size, was refused.
* A folder named ``.lock`` in a run folder was reported as held by "a process that is still writing" it, and once
  older than the grace period a takeover crashed with a bare ``IsADirectoryError``; now ``run`` names the folder
  and ``status`` shows no holder.
* Task or operator-setting names that differ only in case (``"Cora"`` and ``"cora"``) are one run folder on a
  case-insensitive file system (macOS, Windows): the two settings' runs shared checkpoints; now refused.
* ``as_metrics`` read a hand-edited ``true`` metric as 1.0 (an accuracy of 100 %) and crashed on a ``metrics``
  entry that is not a table.
* ``gaussian_blur`` took a negative width as no blur and a NaN one into NaN images; now refused (on CPU).
* ``MetricsLog.truncate`` (every resume) crashed with "Out of range float values are not JSON compliant" on a
  ``metrics.jsonl`` holding a ``NaN`` or ``Infinity`` literal (which ``read_metrics`` reads, as ``json.loads``
  does, from a log written by another tool or by hand): the run could not resume.
* A diverged DINO (NaN features) reported a k-NN accuracy (NaN votes pick class 0); now NaN, as NaN logits.
* ``plan_threads`` refused numpy ints; ``find_adapter`` raised a bare "unhashable" for a list hook.
* ``TextData.get_batch`` with a seed (or a numpy Generator) where a torch.Generator belongs failed inside torch.
* Docstrings held TAB characters where ``\\tilde``/``\\theta`` belong; no control character is left in a source.
"""

from __future__ import annotations

import math
import re
import os
import time

import pytest
import torch

from diffusionformer.experiments import store
from diffusionformer.experiments.config import load_experiment_config
from diffusionformer.experiments.tasks import as_metrics
from diffusionformer.nn import DiffusionAttention
from diffusionformer.nn.kv_cache import LayerKVCache, attend_cached
from diffusionformer.train.metrics import MetricsLog, read_metrics


def _experiment(**kw):
    return {"name": "x", "tasks": [{"name": "d", "dataset": "digits", "model": "vit-digits"}],
            "operators": [{"name": "attention"}], "seeds": [0], **kw}


@pytest.mark.parametrize("heads", [["attention", "laplacian"], ["heat", "ppr"], ["attention", "ppr-exact"]])
def test_bug_an_empty_first_call_leaves_the_cache_empty(heads):
    """Bug: attend_cached(layer, x[:, :0], empty cache) fixed the cache's batch size (and dtype) to the empty
    call's; the next call, the real prompt of another batch size, was refused."""
    torch.manual_seed(0)
    layer = DiffusionAttention(8, 2, causal=True, heads=heads).double().eval()
    cache = LayerKVCache()
    y0 = attend_cached(layer, torch.randn(2, 0, 8, dtype=torch.float64), cache)
    assert y0.shape == (2, 0, 8) and cache.length == 0 and cache.keys is None and cache.powers == []
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    y = attend_cached(layer, x, cache)
    torch.testing.assert_close(y, layer(x))
    assert cache.length == 5


def test_an_empty_call_on_a_filled_cache_changes_nothing():
    torch.manual_seed(1)
    layer = DiffusionAttention(8, 2, causal=True, heads=["heat", "attention"]).double().eval()
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    cache = LayerKVCache()
    attend_cached(layer, x[:, :4], cache)
    assert attend_cached(layer, x[:, 4:4], cache).shape == (2, 0, 8) and cache.length == 4
    torch.testing.assert_close(attend_cached(layer, x[:, 4:], cache), layer(x)[:, 4:])


def test_bug_a_folder_in_the_lock_s_place_is_named(tmp_path):
    """Bug: a folder named .lock was reported as held by "a process that is still writing" it; once older than
    the grace period, acquire_lock crashed with a bare IsADirectoryError from the takeover's unlink."""
    rdir = tmp_path / "run"
    (rdir / store.LOCK_NAME).mkdir(parents=True)
    assert store.live_holder(rdir) is None  # status: no process holds it
    with pytest.raises(IsADirectoryError, match=r"\.lock is a folder, not a lock file.*remove the folder"):
        store.acquire_lock(rdir)
    old = time.time() - 10 * store.UNREADABLE_GRACE_S
    os.utime(rdir / store.LOCK_NAME, (old, old))
    with pytest.raises(IsADirectoryError, match=r"\.lock is a folder, not a lock file"):
        store.acquire_lock(rdir)
    assert (rdir / store.LOCK_NAME).is_dir()  # nothing of the user's is removed
    assert [p.name for p in rdir.iterdir()] == [store.LOCK_NAME]  # and no temporary file is left


def test_bug_names_that_differ_only_in_case_are_refused():
    """Bug: operator settings "attention" and "Attention" (or tasks "d" and "D") loaded; on a case-insensitive
    file system their runs are one folder, so the second setting resumed the first one's checkpoints."""
    with pytest.raises(ValueError, match=r"operator setting names 'attention' and 'Attention' differ only in case"):
        load_experiment_config(_experiment(operators=[{"name": "attention"}, {"name": "Attention"}]))
    task = {"dataset": "digits", "model": "vit-digits"}
    with pytest.raises(ValueError, match=r"task names 'd' and 'D' differ only in case"):
        load_experiment_config(_experiment(tasks=[{"name": "d", **task}, {"name": "D", **task}]))
    assert len(load_experiment_config(_experiment(tasks=[{"name": "d", **task}, {"name": "d2", **task}])).tasks) == 2


def test_bug_as_metrics_skips_bools_and_a_metrics_entry_that_is_no_table():
    """Bug: a hand-edited {"val_acc": true} read as accuracy 1.0; a "metrics": [..] entry raised AttributeError."""
    assert as_metrics({"metrics": {"val_acc": True, "val_loss": 0.5}, "loss": False}) == {"val_loss": 0.5}
    assert as_metrics({"metrics": [1.0], "loss": 2.0}) == {"loss": 2.0}
    assert as_metrics({"metrics": {"loss": 1.5}, "loss": 2.0}) == {"loss": 1.5}


def test_bug_truncating_a_log_with_nan_literals_keeps_the_run_resumable(tmp_path):
    """Bug: MetricsLog.truncate wrote the kept records back with allow_nan=False, and a NaN / Infinity literal read
    from the log raised ValueError: the resume that truncates the log failed."""
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "split": "eval", "loss": NaN, "metrics": {"acc": Infinity, "f1": 0.5}}\n'
                    '{"step": 5, "split": "train", "loss": 1.0, "metrics": {}}\n')
    assert MetricsLog(path).truncate(3) == 1
    assert read_metrics(path) == [{"step": 1, "split": "eval", "loss": None, "metrics": {"acc": None, "f1": 0.5}}]


def test_bug_a_diverged_dino_has_no_knn_accuracy():
    """Bug: DINOTask.evaluate scored NaN features with knn_classify, whose NaN votes pick class 0 (or a NaN
    neighbour's class): a diverged run reported a k-NN accuracy equal to a class's share beside a NaN loss.
    Now both accuracies are NaN, as NaN logits give no accuracy in the other tasks."""
    from diffusionformer.data.base import ClassificationData
    from diffusionformer.experiments.tasks import DINOTask
    from diffusionformer.models.dino import DINO, DINOConfig
    from diffusionformer.experiments.tasks import SSLConfig

    g = torch.Generator().manual_seed(0)
    x = torch.randn(12, 1, 8, 8, generator=g)
    y = torch.zeros(12, dtype=torch.long)  # one class: a NaN vote for class 0 scored 100 %
    y[::3] = 1
    data = ClassificationData("toy", "image", x, y, x[:8].clone(), y[:8], x[4:].clone(), y[4:], num_classes=2,
                              input_shape=(1, 8, 8))
    torch.manual_seed(0)
    model = DINO(DINOConfig(input_size=(8, 8), in_channels=1, patch_size=4, dim=8, depth=1, num_heads=2, pool="mean",
                            out_dim=6, head_hidden=8, head_bottleneck=4))
    task = DINOTask(data, model, ssl=SSLConfig(blur_prob=0.0))
    healthy = task.evaluate(model, None)
    assert all(math.isfinite(v) for v in healthy.values()), healthy
    with torch.no_grad():
        for name, buf in model.teacher.named_buffers():
            if name.endswith("weight") and buf.dim() >= 2:
                buf.fill_(float("nan"))
    out = task.evaluate(model, None)
    assert math.isnan(out["knn_val_acc"]) and math.isnan(out["knn_test_acc"]), out


def test_bug_no_control_characters_in_the_sources():
    """Bug: attention_rollout's and ChebyshevOperator's docstrings held TAB characters where ``\\tilde``,
    ``\\tfrac``, ``\\text`` and ``\\theta`` belong (an escape read in a non-raw string), so their formulas rendered
    wrong in the API docs. No source file of the package may hold a TAB, bell, backspace, vertical tab or form
    feed (what ``\\t``, ``\\a``, ``\\b``, ``\\v``, ``\\f`` of a LaTeX command become outside a raw string)."""
    from pathlib import Path

    import diffusionformer

    root = Path(diffusionformer.__file__).parent
    bad = [f"{p.relative_to(root)}:{i}" for p in sorted(root.rglob("*.py"))
           for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), start=1)
           if any(c in line for c in "\t\a\b\v\f")]
    assert not bad, bad


def test_bug_gaussian_blur_refuses_negative_nan_and_non_tensor_widths():
    """Bug: gaussian_blur clamped a negative sigma to 1e-6 (no blur, silently), turned a NaN sigma into NaN
    images, took bool widths, and failed on a list sigma with a bare AttributeError."""
    from diffusionformer.data.augment import gaussian_blur

    x = torch.rand(3, 1, 5, 5)
    with pytest.raises(ValueError, match=r"sigma must be finite and >= 0, got \[-1\.0\] \(image 1 first\)"):
        gaussian_blur(x, torch.tensor([1.0, -1.0, 1.0]), 3)
    with pytest.raises(ValueError, match=r"sigma must be finite and >= 0, got \[nan, inf\] \(image 0 first\)"):
        gaussian_blur(x, torch.tensor([float("nan"), 1.0, float("inf")]), 3)
    with pytest.raises(TypeError, match=r"sigma must be a real tensor of widths in pixels, got torch\.bool"):
        gaussian_blur(x, torch.tensor([True, False, True]), 3)
    with pytest.raises(TypeError, match=r"expects tensors images \(N, C, H, W\) and sigma \(N,\), got Tensor and list"):
        gaussian_blur(x, [1.0, 1.0, 1.0], 3)
    torch.testing.assert_close(gaussian_blur(x, torch.zeros(3, dtype=torch.long), 3), x)  # integer widths: no blur


def test_bug_plan_threads_takes_numpy_ints_and_find_adapter_names_a_list_hook():
    """Bug: plan_threads(workers=np.int64(2)) was refused ("expected a positive int, got int64"), against the
    policy that a count takes any integral number; find_adapter(..., hook=["build"]) raised a bare "unhashable
    type: 'list'"."""
    import numpy as np

    from diffusionformer.experiments.tasks import find_adapter
    from diffusionformer.experiments.threads import plan_threads

    plan = plan_threads(cores=np.int64(4), workers=np.int64(2), environ={})
    assert (plan.cores, plan.workers) == (4, 2) and type(plan.workers) is int
    with pytest.raises(TypeError, match=r"expected a positive int, got numpy\.bool$"):
        plan_threads(cores=4, workers=np.True_, environ={})
    with pytest.raises(TypeError, match=r"hook must be the name of an adapter hook \(a str\), got list \(\['build'\]\)"):
        find_adapter(None, object(), ["build"])


def test_bug_text_get_batch_names_a_generator_that_is_not_one():
    """Bug: TextData.get_batch(..., generator=3) (a seed where a generator belongs) failed inside torch.randint with
    "received an invalid combination of arguments", naming nothing of ours."""
    import numpy as np

    from diffusionformer.data.text import char_text_data

    data = char_text_data("t", "hello world, hello diffusion " * 4)
    for bad, got in ((3, "got int (for a seed"), (np.random.default_rng(0), "got numpy.random._generator.Generator")):
        with pytest.raises(TypeError, match=r"get_batch: generator must be a CPU torch.Generator or None, " + re.escape(got)):
            data.get_batch("train", 2, 4, generator=bad)
    x, y = data.get_batch("train", 2, 4, generator=torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (2, 4) and torch.equal(x[:, 1:], y[:, :-1])
