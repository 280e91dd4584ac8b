"""Edge probes of the numerical equivalence of 2-process (Gloo, CPU) training with one process holding the whole
batch: the updates, the logged train metrics and the refusals, in float64.

One launch of two ranks runs every scenario (the worker joins the group once; each ``Trainer.fit`` uses it as is)
and writes what it saw; the single-process references are computed in the test process.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
from train_tiny_tasks import launch_gloo_ranks

_COMMON = '''
import torch
from diffusionformer.data import ClassificationData, SequenceTaskData
from diffusionformer.models import DINO, DINOConfig, DiffusionGPT, GPTConfig


def varying():
    """Eight training rows with 1, 3, 0, 2, 0, 1, 4, 2 targets: the targets per row vary within every shard."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 7, (8, 6), generator=g)
    y = torch.full((8, 6), -100)
    for row, cols in enumerate([[5], [1, 3, 5], [], [2, 5], [], [0], [1, 2, 3, 4], [0, 5]]):
        y[row, cols] = torch.randint(0, 7, (len(cols),), generator=g)
    return SequenceTaskData("varying", x, y, x[:2], y[:2], x[2:4], y[2:4], 7)


def gpt(dropout=0.0):
    torch.manual_seed(0)
    return DiffusionGPT(GPTConfig(vocab_size=7, block_size=6, n_layer=1, n_head=2, n_embd=8,
                                  dropout=dropout)).double()


def config(**kw):
    from diffusionformer.train import TrainConfig
    base = dict(max_steps=4, batch_size=8, lr=3e-2, min_lr=1e-3, warmup_steps=1, grad_clip=0.05, eval_interval=2,
                log_interval=2, checkpoint_interval=2, seed=0, device="cpu", progress=False)
    base.update(kw)
    return TrainConfig(**base)


def images():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(12, 1, 8, 8, generator=g)
    y = torch.zeros(12, dtype=torch.long)
    y[::3] = 1
    return ClassificationData("toy", "image", x, y, x[:8].clone(), y[:8], x[4:].clone(), y[4:], num_classes=2,
                              input_shape=(1, 8, 8))


def rings():
    from torch_geometric.data import Data
    from diffusionformer.data.base import GraphSetData
    g = torch.Generator().manual_seed(0)
    graphs = []
    for i in range(12):  # rings of 4..8 nodes, two classes
        n = 4 + i % 5
        src = torch.arange(n)
        dst = (src + 1) % n
        edges = torch.cat([torch.stack([src, dst]), torch.stack([dst, src])], 1)
        graphs.append(Data(x=torch.randn(n, 3, generator=g, dtype=torch.float64), edge_index=edges,
                           y=torch.tensor([i % 2])))
    idx = torch.arange(12)
    return GraphSetData("rings", graphs, idx[:8], idx[8:10], idx[10:], 2, 3)


def gin():
    from diffusionformer.models import GIN, GINConfig
    torch.manual_seed(0)
    return GIN(GINConfig(in_channels=3, num_classes=2, hidden=8, num_layers=3, dropout=0.0)).double()


def graph():
    from torch_geometric.data import Data
    from diffusionformer.data.base import NodeData
    g = torch.Generator().manual_seed(1)
    src = torch.randint(0, 10, (30,), generator=g)
    dst = torch.randint(0, 10, (30,), generator=g)
    masks = {f"{s}_mask": torch.arange(10) % 3 == i for i, s in enumerate(("train", "val", "test"))}
    data = Data(x=torch.randn(10, 4, generator=g, dtype=torch.float64), edge_index=torch.stack([src, dst]),
                y=torch.randint(0, 3, (10,), generator=g), **masks)
    return NodeData(name="hand", data=data, num_classes=3, num_features=4)


def gcn():
    from diffusionformer.models import GCN, GCNConfig
    torch.manual_seed(0)
    return GCN(GCNConfig(in_channels=4, num_classes=3, hidden=8, dropout=0.5)).double()


def recording(draws):
    """SequenceLMTask on varying() recording one draw of torch's global generator (dropout's) per loss call."""
    from diffusionformer.experiments.tasks import SequenceLMTask

    class Recording(SequenceLMTask):
        def loss(self, model, batch):
            draws.append(torch.rand(()).item())
            return super().loss(model, batch)

    return Recording(varying())


def dino():
    torch.manual_seed(0)
    return DINO(DINOConfig(input_size=(8, 8), in_channels=1, patch_size=4, dim=8, depth=1, num_heads=2, pool="mean",
                           out_dim=6, head_hidden=8, head_bottleneck=4)).double()
'''

_WORKER = _COMMON + textwrap.dedent('''
    import datetime, json, math, os, sys
    import torch.distributed as dist
    from diffusionformer.experiments.tasks import DINOTask, GraphClassificationTask, NodeTask, SequenceLMTask
    from diffusionformer.data.ssl import SSLConfig
    from diffusionformer.train import Trainer, shard_batch

    RANK = int(os.environ["RANK"])
    OUT = sys.argv[1]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    out = {}

    # 1. SequenceLMTask with varying targets per row, grad_accum_steps=2 x 2 ranks, clipping active, float64
    model = gpt()
    Trainer(model, SequenceLMTask(varying()), config(grad_accum_steps=2), os.path.join(OUT, "seq")).fit()
    torch.save(model.state_dict(), os.path.join(OUT, f"seq_rank{RANK}.pt"))

    # 2. a batch that does not split into the ranks: refused, on every rank, naming the remedy
    try:
        Trainer(gpt(), SequenceLMTask(varying()), config(batch_size=7), os.path.join(OUT, "odd")).fit()
        out["odd"] = None
    except ValueError as err:
        out["odd"] = str(err)

    # 3. DINOTask's training metrics on each rank's half of one global batch
    torch.manual_seed(0)
    model = dino()
    task = DINOTask(images(), model, ssl=SSLConfig(blur_prob=0.0))
    batch = task.train_batch(0, torch.Generator().manual_seed(5), 8)
    loss, metrics = task.loss(model, shard_batch(batch, RANK, 2))
    out["dino"] = {"loss": loss.item(), **{k: float(v) for k, v in metrics.items()}}

    # 4. GIN (BatchNorm) on graph classification, no dropout
    model = gin()
    summary = Trainer(model, GraphClassificationTask(rings()), config(grad_clip=0.0), os.path.join(OUT, "gin")).fit()
    out["gin_eval"] = summary["eval"]["metrics"]
    torch.save(model.state_dict(), os.path.join(OUT, f"gin_rank{RANK}.pt"))

    # 5. full-batch node task with dropout 0.5: the same graph on every rank, each rank's own dropout draws
    model = gcn()
    Trainer(model, NodeTask(graph()), config(), os.path.join(OUT, "gcn")).fit()
    torch.save(model.state_dict(), os.path.join(OUT, f"gcn_rank{RANK}.pt"))

    # 6. a dropout GPT run of 4 updates, whole and as 2 + 2 resumed (both 2-rank)
    draws = []
    for name, steps, resume in (("whole", 4, False), ("cut", 2, False), ("cut", 4, True)):
        model = gpt(dropout=0.2)
        Trainer(model, recording(draws), config(max_steps=steps, lr_decay_steps=4), os.path.join(OUT, name),
                resume=resume).fit()
    torch.save(model.state_dict(), os.path.join(OUT, f"cut_rank{RANK}.pt"))
    out["draws"] = draws

    # 6b. a checkpoint of one process (written by the test before the launch) resumed by 2 ranks
    draws = []
    Trainer(gpt(dropout=0.2), recording(draws), config(max_steps=4, lr_decay_steps=4), os.path.join(OUT, "solo"),
            resume=True).fit()
    out["solo_draws"] = draws

    # 7. an infinite gradient (fp16: a skipped update) or a NaN loss on rank 1's shard only
    class InfGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return torch.zeros_like(x)

        @staticmethod
        def backward(ctx, g):
            return torch.full_like(g, float("inf"))

    class OneRankBad:
        def __init__(self, kind):
            self.kind = kind

        def train_batch(self, step, generator, batch_size):
            x = torch.randn(batch_size, 3, generator=generator)
            return {"x": x, "y": x.sum(1, keepdim=True), "step": step}

        def loss(self, model, batch):
            loss = torch.nn.functional.mse_loss(model(batch["x"]).float(), batch["y"]) * 1e-4  # no fp16 overflow
            if RANK == 1 and int(batch["step"]) == 1:
                loss = loss + InfGrad.apply(loss) if self.kind == "inf" else loss + math.nan  # finite grads
            return loss, {}

        def evaluate(self, model, max_batches):
            return {}

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    Trainer(model, OneRankBad("inf"), config(amp="fp16", grad_clip=1.0), os.path.join(OUT, "fp16")).fit()
    torch.save(model.state_dict(), os.path.join(OUT, f"fp16_rank{RANK}.pt"))
    from diffusionformer.train import NonFiniteLossError
    try:
        Trainer(torch.nn.Linear(3, 1), OneRankBad("nan"), config(grad_clip=0.0), os.path.join(OUT, "nan")).fit()
        out["nan"] = None
    except NonFiniteLossError as err:
        out["nan"] = [err.step, err.last_checkpoint_step]

    with open(os.path.join(OUT, f"rank{RANK}.json"), "w") as f:
        json.dump(out, f)
    sys.stdout.flush()
    os._exit(0)
''')


def _namespace() -> dict:
    ns: dict = {}
    exec(compile(_COMMON, "<common>", "exec"), ns)
    return ns


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> tuple[Path, list[dict]]:
    tmp = tmp_path_factory.mktemp("ddp46")
    script = tmp / "worker.py"
    script.write_text(_WORKER)
    out = tmp / "out"
    out.mkdir()
    from diffusionformer.train import Trainer

    ns = _namespace()  # 6b: one process's checkpoint at step 2, for the two ranks to resume
    Trainer(ns["gpt"](dropout=0.2), ns["recording"]([]), ns["config"](max_steps=2, lr_decay_steps=4),
            out / "solo").fit()
    launch_gloo_ranks(script, [str(out)], tmp)
    return out, [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.slow
def test_pins_sequence_lm_accum_ddp_matches_one_process_float64(ranks, tmp_path):
    """Pin: rows with 1, 3, 0, 2, 0, 1, 4, 2 targets, 2 micro-batches x 2 ranks (one micro-batch of a rank has no
    target), clipping active: the weights after 4 updates and every logged train value (loss, acc, grad_norm) equal
    the single process's on the whole batch in float64; the replicas are bit-identical."""
    from diffusionformer.experiments.tasks import SequenceLMTask
    from diffusionformer.train import Trainer, read_metrics

    out, _ = ranks
    ns = _namespace()
    single = ns["gpt"]()
    Trainer(single, SequenceLMTask(ns["varying"]()), ns["config"](), tmp_path / "single").fit()
    r0 = torch.load(out / "seq_rank0.pt", weights_only=True)
    r1 = torch.load(out / "seq_rank1.pt", weights_only=True)
    init = ns["gpt"]().state_dict()
    moved = False
    for name, want in single.state_dict().items():
        assert torch.equal(r0[name], r1[name]), name
        torch.testing.assert_close(r0[name], want, rtol=1e-9, atol=1e-11, msg=name)
        moved |= not torch.equal(want, init[name])
    assert moved
    got = [r for r in read_metrics(out / "seq") if r["split"] == "train"]
    want = [r for r in read_metrics(tmp_path / "single") if r["split"] == "train"]
    assert [r["step"] for r in got] == [r["step"] for r in want] == [2, 4]
    for a, b in zip(got, want):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-10)
        assert a["metrics"].keys() == b["metrics"].keys() == {"acc", "grad_norm"}
        for k in a["metrics"]:
            # acc is a float32 count ratio: its rounding differs with the shard size
            assert a["metrics"][k] == pytest.approx(b["metrics"][k], rel=1e-6 if k == "acc" else 1e-10), k
        assert b["metrics"]["grad_norm"] > 0.05  # clipping was active
    # evaluation: the whole held-out splits once (rank 0's record), as the single process scores the same weights
    got = [r for r in read_metrics(out / "seq") if r["split"] == "eval"]
    want = [r for r in read_metrics(tmp_path / "single") if r["split"] == "eval"]
    assert [r["step"] for r in got] == [r["step"] for r in want] == [2, 4]
    for a, b in zip(got, want):
        assert a["metrics"].keys() == b["metrics"].keys()
        for k in a["metrics"]:
            assert a["metrics"][k] == pytest.approx(b["metrics"][k], rel=1e-9), k


@pytest.mark.slow
def test_pins_batch_not_divisible_by_the_ranks_is_refused(ranks):
    """Pin: batch_size=7 on 2 ranks is refused on every rank with a ValueError naming batch_size."""
    _, outs = ranks
    for out in outs:
        assert out["odd"] is not None and "batch_size" in out["odd"] and "divisible" in out["odd"], out["odd"]


@pytest.mark.slow
def test_bug_dino_train_metrics_are_the_global_batch_values(ranks):
    """Bug: DINOTask.loss logged ``teacher_mean_entropy``, the entropy of the teacher targets' batch mean, from each
    rank's shard; the trainer averages the ranks' values, and a mean of entropies of shard means is not the entropy
    of the global mean (lower by Jensen), so the collapse signal read differently under DDP than in one process."""
    from diffusionformer.data.ssl import SSLConfig
    from diffusionformer.experiments.tasks import DINOTask

    _, outs = ranks
    ns = _namespace()
    torch.manual_seed(0)
    model = ns["dino"]()
    task = DINOTask(ns["images"](), model, ssl=SSLConfig(blur_prob=0.0))
    batch = task.train_batch(0, torch.Generator().manual_seed(5), 8)
    loss, metrics = task.loss(model, batch)
    want = {"loss": loss.item(), **{k: float(v) for k, v in metrics.items()}}
    got = {k: (outs[0]["dino"][k] + outs[1]["dino"][k]) / 2 for k in want}  # the trainer's mean over ranks
    for out in outs:  # the whole batch's value on every rank
        assert out["dino"]["teacher_mean_entropy"] == pytest.approx(want["teacher_mean_entropy"], rel=1e-9)
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-9, abs=1e-12), (k, got, want)


def _weights(ranks, tag):
    out, _ = ranks
    r0 = torch.load(out / f"{tag}_rank0.pt", weights_only=True)
    r1 = torch.load(out / f"{tag}_rank1.pt", weights_only=True)
    return r0, r1


@pytest.mark.slow
def test_bug_batchnorm_buffers_of_every_rank_are_rank0s_after_fit(ranks):
    """Bug: DDP broadcasts rank 0's buffers at each forward, then every rank updates its BatchNorm running statistics
    from its own shard; the trainer evaluated (and left) each rank's own, so after fit() a GIN's running_mean/var on
    rank 1 differed from rank 0's (the checkpoint's), and rank 1's fit() returned evaluation metrics that were not
    those of summary.json (rank 0's)."""
    out, outs = ranks
    r0, r1 = _weights(ranks, "gin")
    assert r0.keys() == r1.keys()
    for name in r0:
        assert torch.equal(r0[name], r1[name]), name
    written = json.loads((out / "gin" / "summary.json").read_text())["eval"]["metrics"]
    assert outs[0]["gin_eval"] == outs[1]["gin_eval"] == written


@pytest.mark.slow
def test_bug_every_rank_draws_dropout_from_its_own_stream(ranks, tmp_path):
    """Bug: every rank seeded torch's global generator with the config's seed, so dropout drew the same masks on every
    rank: row i of rank 1's shard got rank 0's row-i masks (nanoGPT seeds each rank apart). Now rank 0 draws as one
    process with the seed (single-process runs unchanged) and every other rank from a stream of its own; a full-batch
    node task then averages independent draws (its replicas still equal)."""
    from diffusionformer.train import Trainer, read_metrics

    out, outs = ranks
    ns = _namespace()
    draws: list = []
    Trainer(ns["gpt"](dropout=0.2), ns["recording"](draws), ns["config"](max_steps=4, lr_decay_steps=4),
            tmp_path / "single").fit()
    # the first draw: after it dropout draws as many numbers as the process has rows (rank 0 half of one process's)
    assert outs[0]["draws"][0] == draws[0]
    assert not set(outs[1]["draws"]) & (set(draws) | set(outs[0]["draws"]))
    r0, r1 = _weights(ranks, "gcn")
    single = ns["gcn"]()
    Trainer(single, _node_task(ns), ns["config"](), tmp_path / "gcn").fit()
    assert all(torch.equal(r0[n], r1[n]) for n in r0)
    assert any(not torch.allclose(r0[n], w) for n, w in single.state_dict().items())
    assert [r["step"] for r in read_metrics(out / "gcn") if r["split"] == "train"] == [2, 4]


def _node_task(ns):
    from diffusionformer.experiments.tasks import NodeTask

    return NodeTask(ns["graph"]())


@pytest.mark.slow
def test_pins_two_rank_resume_with_dropout_continues_exactly(ranks):
    """Pin: a 2-rank dropout run of 4 updates and one cut at 2 and resumed by 2 ranks end with the same weights,
    bit for bit; each rank's global-generator draws (dropout's) are replayed on resume, from the checkpoint's
    ``rank_rng`` (every rank's states)."""
    from diffusionformer.train import load_checkpoint, read_metrics

    out, outs = ranks
    for rank in range(2):
        draws = outs[rank]["draws"]
        assert len(draws) == 8 and draws[4:] == draws[:4] and len(set(draws[:4])) == 4, rank
    assert outs[0]["draws"] != outs[1]["draws"]
    payload = load_checkpoint(out / "cut" / "checkpoint.pt")
    assert len(payload["rank_rng"]) == 2
    whole = load_checkpoint(out / "whole" / "checkpoint.pt")["model"]
    cut = payload["model"]
    r0, r1 = _weights(ranks, "cut")
    for name in whole:
        assert torch.equal(whole[name], cut[name]) and torch.equal(r0[name], r1[name]), name
    assert [(r["step"], r["split"], r["loss"]) for r in read_metrics(out / "whole")] == \
        [(r["step"], r["split"], r["loss"]) for r in read_metrics(out / "cut")]


@pytest.mark.slow
def test_pins_a_one_process_checkpoint_resumed_by_two_ranks(ranks, tmp_path):
    """Pin: a checkpoint written by one process (no ``rank_rng``) resumed by 2 ranks: rank 0 continues one process's
    stream (its first draw is one process's resuming it), rank 1 draws from a stream of its own."""
    import shutil

    from diffusionformer.train import Trainer

    out, outs = ranks
    ns = _namespace()
    shutil.rmtree(tmp_path / "solo", ignore_errors=True)
    Trainer(ns["gpt"](dropout=0.2), ns["recording"]([]), ns["config"](max_steps=2, lr_decay_steps=4),
            tmp_path / "solo").fit()
    draws: list = []
    Trainer(ns["gpt"](dropout=0.2), ns["recording"](draws), ns["config"](max_steps=4, lr_decay_steps=4),
            tmp_path / "solo", resume=True).fit()
    assert outs[0]["solo_draws"][0] == draws[0] and len(draws) == 2  # the first draw: see the test above
    assert not set(outs[1]["solo_draws"]) & (set(draws) | set(outs[0]["solo_draws"]))


@pytest.mark.slow
def test_pins_one_rank_non_finite_is_agreed_by_every_rank(ranks):
    """Pin: an infinite gradient on rank 1's shard alone at update 1 (fp16): both ranks skip that update (the
    all-reduced gradient is inf on both), the replicas stay identical and the log counts 1 skip; a NaN loss on rank 1
    alone (its gradient finite) stops both ranks with NonFiniteLossError naming step 1 (no checkpoint yet)."""
    from diffusionformer.train import read_metrics

    out, outs = ranks
    r0, r1 = _weights(ranks, "fp16")
    for name in r0:
        assert torch.equal(r0[name], r1[name]), name
    train = [r for r in read_metrics(out / "fp16") if r["split"] == "train"]
    assert [(r["step"], r["metrics"]["skipped_updates"]) for r in train] == [(2, 1), (4, 0)]
    assert outs[0]["nan"] == outs[1]["nan"] == [1, None]
