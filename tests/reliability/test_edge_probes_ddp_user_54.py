"""Edge probes of a DistributedDataParallel user (helper 54f): 2 Gloo ranks on CPU against one process holding the
whole batch, in float64: learned operator parameters (heat t, PPR alpha, polynomial coefficients, attnscale omega)
under gradient accumulation, heads whose operator has no parameters beside a frozen block, the evaluation of splits
whose size the ranks do not divide, DINO's teacher and centre, a trainable parameter the loss never uses, metrics
that only some ranks report (and a checkpoint that cuts their window), and a rank whose task raises.

One launch of two ranks (``launch_gloo_ranks``, no fork) runs the scenarios of a process group the worker made, each
writing what it saw as soon as it ends; a second launch lets the trainer own the group for the rank that raises. The
single-process references are trained in the test process.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]

_COMMON = '''
import torch
import torch.nn.functional as F
from diffusionformer.data import ClassificationData, SequenceTaskData
from diffusionformer.models import DINO, DINOConfig, DiffusionGPT, DiffusionViT, GPTConfig, ViTConfig
from diffusionformer.train import TrainConfig


def config(**kw):
    base = dict(max_steps=4, batch_size=8, lr=3e-2, min_lr=1e-3, warmup_steps=1, grad_clip=0.0, eval_interval=2,
                log_interval=2, checkpoint_interval=2, seed=0, device="cpu", progress=False)
    base.update(kw)
    return TrainConfig(**base)


def images():
    """13 images, validation and test splits of 7 each (2 ranks do not divide them)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(13, 1, 8, 8, generator=g)
    y = (torch.arange(13) % 3 == 0).long()
    return ClassificationData("toy", "image", x, y, x[:7].clone(), y[:7], x[6:].clone(), y[6:], num_classes=2,
                              input_shape=(1, 8, 8))


def sequences():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 7, (8, 6), generator=g)
    y = torch.randint(0, 7, (8, 6), generator=g)
    return SequenceTaskData("s", x, y, x[:3], y[:3], x[3:6], y[3:6], 7)


def learned_gpt():
    torch.manual_seed(0)
    return DiffusionGPT(GPTConfig(vocab_size=7, block_size=6, n_layer=2, n_head=2, n_embd=8, heads=[
        "heat(learnable=True):1,ppr(learnable=True):1", "polynomial:1,attnscale:1"])).double()


def frozen_vit():
    """Laplacian heads (an operator without parameters), mean pooling (no class token), the first block frozen."""
    torch.manual_seed(0)
    model = DiffusionViT(ViTConfig(input_size=(8, 8), in_channels=1, patch_size=4, num_classes=2, dim=8, depth=2,
                                   num_heads=2, pool="mean", heads="laplacian:2")).double()
    model.blocks[0].requires_grad_(False)
    return model


def dino():
    torch.manual_seed(0)
    return DINO(DINOConfig(input_size=(8, 8), in_channels=1, patch_size=4, dim=8, depth=1, num_heads=2, pool="mean",
                           out_dim=6, head_hidden=8, head_bottleneck=4)).double()


class WithSpare(torch.nn.Module):
    """A regression net with an auxiliary head (``spare``) the task never calls."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Linear(3, 4, dtype=torch.float64)
        self.spare = torch.nn.Linear(4, 2, dtype=torch.float64)

    def forward(self, x):
        return self.body(x)


class Regression:
    """``y = x W``; ``extra()`` adds metrics to every loss call; ``stop_at``: the batch of that update raises (a
    kill)."""

    def __init__(self, extra=None, stop_at=None):
        self.extra = extra or (lambda: {})
        self.stop_at = stop_at

    def train_batch(self, step, generator, batch_size):
        if step == self.stop_at:
            raise KeyboardInterrupt(f"killed at update {step}")
        x = torch.randn(batch_size, 3, generator=generator, dtype=torch.float64)
        return {"x": x, "y": x @ torch.arange(12.0, dtype=torch.float64).view(3, 4)}

    def loss(self, model, batch):
        return F.mse_loss(model(batch["x"]), batch["y"]), dict(self.extra())

    def evaluate(self, model, max_batches):
        return {}
'''

_WORKER = _COMMON + textwrap.dedent('''
    import datetime, json, os, sys
    import torch.distributed as dist
    from diffusionformer.data.ssl import SSLConfig
    from diffusionformer.experiments.tasks import ClassificationTask, DINOTask, SequenceLMTask
    from diffusionformer.train import Trainer, read_metrics

    RANK = int(os.environ["RANK"])
    OUT = sys.argv[1]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))


    def scenario(name, fn):
        """Run one scenario and write what it returned (or raised) at once: a later one that aborts the process
        leaves the earlier ones' files."""
        try:
            got = {"ok": fn()}
        except Exception as err:
            got = {"error": f"{type(err).__name__}: {err}"}
        with open(os.path.join(OUT, f"{name}_rank{RANK}.json"), "w") as f:
            json.dump(got, f)


    def fit(name, model, task, **kw):
        summary = Trainer(model, task, config(**kw), os.path.join(OUT, name)).fit()
        torch.save(model.state_dict(), os.path.join(OUT, f"{name}_rank{RANK}.pt"))
        return summary["eval"]["metrics"] if summary["eval"] else None


    scenario("learned", lambda: fit("learned", learned_gpt(), SequenceLMTask(sequences()), grad_accum_steps=2))
    scenario("frozen", lambda: fit("frozen", frozen_vit(), ClassificationTask(images())))
    model = dino()
    scenario("dino", lambda: fit("dino", model, DINOTask(images(), model, ssl=SSLConfig(blur_prob=0.0))))
    spare = WithSpare()
    spare.spare.requires_grad_(False)
    scenario("spare_frozen", lambda: fit("spare_frozen", spare, Regression()))
    scenario("spare", lambda: fit("spare", WithSpare(), Regression(), max_steps=1))

    # metrics by rank: "r<rank>" on each rank, "rare" on rank 1 only; a whole run and one cut at 2 and resumed
    extra = lambda: {f"r{RANK}": 5.0 + RANK, **({"rare": 7.0} if RANK == 1 else {})}
    def names():
        logs = {}
        for name, stop_at, resume in (("whole", None, False), ("cut", 3, False), ("cut", None, True)):
            try:  # "cut" is killed at update 3, after the checkpoint of update 2 cut the log window of 4
                Trainer(WithSpare().body, Regression(extra, stop_at), config(log_interval=4),
                        os.path.join(OUT, name), resume=resume).fit()
            except KeyboardInterrupt:
                pass
        for name in ("whole", "cut"):
            logs[name] = [r["metrics"] for r in read_metrics(os.path.join(OUT, name)) if r["split"] == "train"]
        return logs
    scenario("names", names)
    sys.stdout.flush()
    os._exit(0)
''')

_RAISING = _COMMON + textwrap.dedent('''
    import json, os, sys, time

    from diffusionformer.train import Trainer

    RANK = int(os.environ["RANK"])
    OUT = sys.argv[1]
    torch.set_num_threads(1)


    class BadShard(Regression):
        """Rank 1's shard of update 1 holds a sample its loss refuses."""

        def loss(self, model, batch):
            self.calls = getattr(self, "calls", 0) + 1
            if RANK == 1 and self.calls == 2:
                raise ValueError("sample 17 of rank 1's shard has no label")
            return super().loss(model, batch)


    start = time.monotonic()
    try:  # the trainer joins the group (and owns it)
        Trainer(WithSpare().body, BadShard(), config(), os.path.join(OUT, "run")).fit()
        got = "completed"
    except Exception as err:
        got = f"{type(err).__name__}: {err}"
    with open(os.path.join(OUT, f"rank{RANK}.json"), "w") as f:
        json.dump({"error": got, "seconds": time.monotonic() - start}, f)
    sys.stdout.flush()
    os._exit(0)
''')


def _namespace() -> dict:
    ns: dict = {}
    exec(compile(_COMMON, "<common>", "exec"), ns)
    return ns


@functools.cache
def _tiny_tasks() -> Any:
    """tests/train/train_tiny_tasks.py (loaded by path: tests/train is not on this folder's path)."""
    spec = importlib.util.spec_from_file_location("_tiny_tasks_54f", REPO / "tests" / "train" / "train_tiny_tasks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _launch(script: Path, out: Path, cwd: Path) -> None:
    _tiny_tasks().launch_gloo_ranks(script, [str(out)], cwd, timeout=90.0)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> Path:
    return _tiny_tasks().launch_scenarios(_WORKER, tmp_path_factory.mktemp("ddp54f"))


def _scenario(out: Path, name: str) -> list[dict]:
    return _tiny_tasks().read_scenario(out, name)


def _check_weights(out: Path, tag: str, single: torch.nn.Module) -> None:
    r0 = torch.load(out / f"{tag}_rank0.pt", weights_only=True)
    r1 = torch.load(out / f"{tag}_rank1.pt", weights_only=True)
    assert r0.keys() == r1.keys() == single.state_dict().keys()
    for name, want in single.state_dict().items():
        assert torch.equal(r0[name], r1[name]), name  # the replicas, bit for bit
        torch.testing.assert_close(r0[name], want, rtol=1e-9, atol=1e-11, msg=name)


@pytest.mark.slow
def test_pins_learned_operator_parameters_match_one_process_under_accumulation(ranks, tmp_path):
    """Pin: heat t, PPR alpha (learnable), polynomial coefficients and attnscale omega, 2 micro-batches x 2 ranks
    (``no_sync`` on the first): after 4 updates every weight equals one process's on the whole batch (float64), the
    learned operator parameters moved and are bit-identical on both ranks."""
    from diffusionformer.experiments.tasks import SequenceLMTask
    from diffusionformer.train import Trainer

    ns = _namespace()
    got = _scenario(ranks, "learned")
    assert "ok" in got[0] and "ok" in got[1], got
    single = ns["learned_gpt"]()
    Trainer(single, SequenceLMTask(ns["sequences"]()), ns["config"](grad_accum_steps=2), tmp_path / "one").fit()
    _check_weights(ranks, "learned", single)
    init = ns["learned_gpt"]().state_dict()
    learned = [n for n in init if n.endswith((".t", ".alpha_logit", ".theta", ".omega"))]
    assert len(learned) == 4, learned
    assert all(not torch.equal(single.state_dict()[n], init[n]) for n in learned), learned


@pytest.mark.slow
def test_pins_operator_without_parameters_frozen_block_and_odd_eval_splits(ranks, tmp_path):
    """Pin: a ViT of Laplacian heads (no operator parameters), mean pooling and a frozen first block trains under DDP
    as one process (the frozen block untouched); its evaluation of validation and test splits of 7 images (2 ranks do
    not divide them) scores every image once: the accuracies and losses of both ranks are one process's."""
    from diffusionformer.experiments.tasks import ClassificationTask
    from diffusionformer.train import Trainer

    ns = _namespace()
    got = _scenario(ranks, "frozen")
    single = ns["frozen_vit"]()
    summary = Trainer(single, ClassificationTask(ns["images"]()), ns["config"](), tmp_path / "one").fit()
    _check_weights(ranks, "frozen", single)
    init = ns["frozen_vit"]().state_dict()
    assert all(torch.equal(v, init[k]) for k, v in single.state_dict().items() if k.startswith("blocks.0."))
    want = summary["eval"]["metrics"]
    for rank in got:
        assert rank["ok"].keys() == want.keys()
        for k in want:
            assert rank["ok"][k] == pytest.approx(want[k], rel=1e-9), k
    assert want["val_acc"] * 7 == pytest.approx(round(want["val_acc"] * 7))  # a count of 7 images


@pytest.mark.slow
def test_pins_dino_teacher_and_centre_match_one_process(ranks, tmp_path):
    """Pin: DINO trained by 2 ranks: the student, the EMA teacher (buffers) and the centre (all-reduced over the
    ranks' rows) equal one process's on the whole batch after 4 updates, bit-identical across the replicas."""
    from diffusionformer.data.ssl import SSLConfig
    from diffusionformer.experiments.tasks import DINOTask
    from diffusionformer.train import Trainer

    ns = _namespace()
    got = _scenario(ranks, "dino")
    assert "ok" in got[0] and got[0] == got[1], got
    single = ns["dino"]()
    Trainer(single, DINOTask(ns["images"](), single, ssl=SSLConfig(blur_prob=0.0)), ns["config"](),
            tmp_path / "one").fit()
    _check_weights(ranks, "dino", single)
    assert single.center.abs().sum() > 0


@pytest.mark.slow
def test_bug_a_trainable_parameter_the_loss_never_uses_is_named_on_every_rank(ranks, tmp_path):
    """Bug: a model with a trainable parameter the task's loss never uses (an auxiliary head) trains in one process
    (AdamW skips it), but DistributedDataParallel (built without find_unused_parameters) all-reduces a bucket only
    once every parameter in it has a gradient: the update was each rank's own shard's, so a 1-step run ended
    "completed" with replicas that differ (rank 0's checkpoint not the whole batch's update), and a longer one failed
    at the next forward advising an argument the Trainer does not take. Now every rank refuses it before the
    optimiser step, naming the parameters and the remedy; frozen, the head trains as one process's."""
    from diffusionformer.train import Trainer

    got = _scenario(ranks, "spare")
    for rank, result in enumerate(got):
        error = result.get("error", "")
        assert error.startswith("ValueError:"), result
        assert "['spare.weight', 'spare.bias']" in error and f"rank {rank}" in error, error
        assert "requires_grad_(False)" in error, error
    assert not (ranks / "spare" / "checkpoint.pt").exists()
    ns = _namespace()
    single = ns["WithSpare"]()
    single.spare.requires_grad_(False)
    Trainer(single, ns["Regression"](), ns["config"](), tmp_path / "one").fit()
    assert "ok" in _scenario(ranks, "spare_frozen")[0]
    _check_weights(ranks, "spare_frozen", single)


@pytest.mark.slow
def test_bug_metrics_only_some_ranks_report_are_each_their_own_mean(ranks):
    """Bug: the train log averaged the stacked window means of every rank position by position, under each rank's own
    sorted names: a metric returned on rank 1 only (a class's accuracy where the shard holds that class) made tensors
    of unlike sizes and Gloo aborted rank 0 ("terminate called after throwing gloo::EnforceNotMet"), and two ranks'
    differently named metrics were averaged into one ("r0" logged 5.5, the mean of rank 0's r0 = 5 and rank 1's
    r1 = 6; r1 lost). Now the names are agreed and each metric is the mean over the ranks that report it; a
    checkpoint that cuts the window resumes to the same records."""
    got = _scenario(ranks, "names")
    assert got[0] == got[1] and "ok" in got[0], got
    logs = got[0]["ok"]
    assert [{k: m[k] for k in ("r0", "r1", "rare")} for m in logs["whole"]] == [{"r0": 5.0, "r1": 6.0, "rare": 7.0}]
    assert logs["cut"] == logs["whole"]


@pytest.mark.slow
def test_pins_a_rank_whose_task_raises_ends_every_rank(tmp_path):
    """Pin: rank 1's task.loss raises at update 1 (bad data in its shard) under a group the trainer made: rank 1 stops
    with its own error, and rank 0, waiting for rank 1's gradients, stops with an error within seconds once that
    process ends (the group's connection closes), not a hang; no summary is written."""
    script = tmp_path / "raising.py"
    script.write_text(_RAISING)
    out = tmp_path / "out"
    out.mkdir()
    _launch(script, out, tmp_path)
    r0, r1 = (json.loads((out / f"rank{r}.json").read_text()) for r in range(2))
    assert r1["error"] == "ValueError: sample 17 of rank 1's shard has no label", r1
    assert r0["error"] != "completed" and r0["seconds"] < 30, r0
    assert not (out / "run" / "summary.json").exists()


def test_parameters_frozen_after_the_optimiser_was_built_are_not_refused():
    """The DDP gradient check reads the optimiser's parameters: one frozen since (``requires_grad_(False)``, so no
    gradient) is no update's concern and passes; a trainable one without a gradient is named."""
    from types import SimpleNamespace

    from diffusionformer.train.trainer import Trainer

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    fake = SimpleNamespace(_params=list(model.parameters()), model=model,
                           ctx=SimpleNamespace(world_size=2, rank=1))
    model(torch.ones(1, 2)).sum().backward()
    Trainer._refuse_parameters_without_gradient(fake, 3)  # every parameter has a gradient
    model[1].weight.grad = None
    with pytest.raises(ValueError, match=r"got none for \['1\.weight'\] at step 3 on rank 1"):
        Trainer._refuse_parameters_without_gradient(fake, 3)
    model[1].weight.requires_grad_(False)
    Trainer._refuse_parameters_without_gradient(fake, 3)
