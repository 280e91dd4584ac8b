"""Mutation audit (sitting 46, commits f6e3904..d2be57a) of the library and script code changed that day: tests that
kill mutants the day's tests left alive (each docstring names the mutant). No GPU is used.

63 mutants (analyze.py 8, minibatch.py 1, tasks.py 4, dino.py 5, graph_transformer.py 4, vit.py 4, _checks.py 1,
triton/_launch.py 5, triton/_library.py 1, triton/attention.py 3, trainer.py 12, gpu_study.sh 14, gpu_suite.sh 1):
49 killed by earlier tests, 12 survivors killed here, 2 equivalent:

* dino.py ``update_center`` (processes) ``stats[:-1] / count.clamp(min=1)`` -> ``/ count``: with no output on any
  rank the NaN mean is in the branch ``torch.where(count > 0, ...)`` does not take (under no_grad: no gradient).
* analyze.py ``_weightless_cache`` ``not isinstance(final, int) or`` dropped: a cache's step is the run's int step,
  so a summary without an int step (absent: None) already differs from it; only a hand-written ``4.0`` would pass.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


def _fresh(code: str) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


_BUILT = """
import sys
from diffusionformer.models import DiffusionGraphTransformer, GraphBlock, GraphTransformerConfig
assert 'torch_geometric' not in sys.modules
{build}
print('torch_geometric' in sys.modules)
"""


@pytest.mark.parametrize("build", [
    "DiffusionGraphTransformer(GraphTransformerConfig(in_channels=4, num_classes=2, dim=8, depth=1, num_heads=2, "
    "task='graph', self_loops=False))",
    "GraphBlock(8, 2, global_attention=True)",
])
def test_kills_graph_models_import_pyg_when_built(build):
    """kills: models/graph_transformer.py ``if c.self_loops or c.task == "graph":`` -> ``if c.self_loops:`` (a graph
    classifier without self loops imported PyG, for its pool, inside its first, compiled, forward), and ``if
    global_attention: _import_pyg()`` dropped from GraphBlock (a global-attention block built alone imported PyG's
    to_dense_batch under its first compiled call). The promise: PyG is imported when the model or a global-attention
    block is built; checked in a fresh interpreter."""
    assert _fresh(_BUILT.format(build=build)) == "True"


def test_kills_update_center_without_teacher_outputs_keeps_the_centre():
    """kills: models/dino.py ``update_center`` ``if flat.shape[0] == 0: return`` dropped in one process (a batch of no
    teacher output made the centre 0 / 0 = NaN for good, as the docstring's mean over no output)."""
    from diffusionformer.models import DINO, DINOConfig

    torch.manual_seed(0)
    dino = DINO(DINOConfig(input_size=(8, 8), in_channels=1, patch_size=4, dim=8, depth=1, num_heads=2, pool="mean",
                           out_dim=6, head_hidden=8, head_bottleneck=4))
    dino.update_center(torch.randn(3, 6))
    before = dino.center.clone()
    assert before.abs().sum() > 0
    dino.update_center(torch.empty(0, 6))
    torch.testing.assert_close(dino.center, before, rtol=0, atol=0)
    logits = torch.randn(2, 5, 6, dtype=torch.float64)  # the centre's update against its equation, in float64
    m = dino.config.center_momentum
    want = before.double() * m + logits.reshape(-1, 6).mean(0, keepdim=True) * (1 - m)
    dino.update_center(logits)
    torch.testing.assert_close(dino.center.double(), want.view_as(dino.center).double(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_kills_triton_degree_zero_output_keeps_the_value_dtype(dtype):
    """kills: ops/triton/attention.py ``polynomial_attention`` K = 0 ``empty_strided(..., dtype=v.dtype)`` ->
    ``dtype=torch.float32`` (one coefficient returned a float32 ``c0 v`` for half inputs, as no K > 0 output does).
    Reference: ``c0[h] * v`` in float64, rounded once to ``v``'s dtype."""
    from diffusionformer.ops.triton import polynomial_attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4, generator=g).to(dtype) for _ in range(3))
    c0 = torch.tensor([[0.5], [-1.25], [2.0]])
    out = polynomial_attention(q, k, v, c0)
    assert out.dtype == dtype and out.shape == v.shape
    want = (c0.double().view(1, 3, 1, 1) * v.double()).to(dtype)
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    assert out.transpose(1, 2).reshape(2, 5, 12).data_ptr() == out.data_ptr()  # token-major, a free view


def _triton_runs_here() -> bool:
    try:
        from diffusionformer.ops.triton import is_available
        from diffusionformer.ops.triton.backend import _runs_here
    except ImportError:
        return False
    return is_available() and _runs_here(torch.device("cpu"))


@pytest.mark.skipif(not _triton_runs_here(), reason="Triton kernels need CUDA or TRITON_INTERPRET=1 (tests/conftest.py)")
def test_kills_triton_fake_forward_has_the_real_output_strides():
    """kills: ops/triton/_library.py ``_fwd_fake`` ``new_empty_strided((B, H, N, C), (N*H*C, C, H*C, 1))`` ->
    ``new_empty(B, H, N, C)`` (a compiled graph planned the custom operator's output as (B, H, N, C)-contiguous while
    the kernels store it token-major: the module docstring's promise, strides from the fake implementation, broken).
    Checked by ``torch.library.opcheck``'s fake-tensor test against the operator run under the interpreter."""
    import importlib

    importlib.import_module("diffusionformer.ops.triton._library")  # registers the operators

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4, generator=g) for _ in range(3))
    coeffs = torch.rand(3, 3, generator=g)
    for save in (True, False):
        torch.library.opcheck(torch.ops.diffusionformer.triton_polynomial_fwd.default,
                              (q, k, v, coeffs, None, False, 0.5, save, 0.0, None, None), test_utils="test_faketensor")


def test_kills_rank_seeds_of_two_seeds_do_not_meet():
    """kills: train/trainer.py ``_rank_seed`` ``(seed + 0x9E3779B9 * rank) % 2**32`` -> ``(seed + rank) % 2**32``
    (seed 1's rank 0 drew the dropout stream of seed 0's rank 1, as the docstring says it must not); rank 0 keeps the
    seed (one process's stream)."""
    from diffusionformer.train.trainer import _rank_seed

    seeds = {(s, r): _rank_seed(s, r) for s in range(16) for r in range(8)}
    assert all(seeds[(s, 0)] == s for s in range(16))
    assert len(set(seeds.values())) == len(seeds)
    assert all(0 <= v < 2**32 for v in seeds.values())


_DDP_COMMON = '''
import torch
from diffusionformer.train import TrainConfig


class Recording:
    """A regression task that records one draw of the global generator (dropout's) per loss call."""

    def __init__(self, draws):
        self.draws = draws

    def train_batch(self, step, generator, batch_size):
        x = torch.randn(batch_size, 3, generator=generator)
        return {"x": x, "y": x.sum(1, keepdim=True)}

    def loss(self, model, batch):
        self.draws.append(torch.rand(()).item())
        return torch.nn.functional.mse_loss(model(batch["x"]), batch["y"]), {}

    def evaluate(self, model, max_batches):
        return {}


class Seen(torch.nn.Module):
    """A linear model with a non-contiguous buffer set from each training forward's rows (as BatchNorm's statistics)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(3, 1)
        self.register_buffer("seen", torch.zeros(2, 3).t())

    def forward(self, x):
        if self.training:
            self.seen.copy_(x.mean(0).unsqueeze(1).expand(3, 2))
        return self.lin(x)


def config(**kw):
    base = dict(max_steps=4, batch_size=8, lr=1e-2, warmup_steps=0, lr_decay_steps=4, eval_interval=2,
                log_interval=2, checkpoint_interval=2, seed=0, device="cpu", progress=False)
    base.update(kw)
    return TrainConfig(**base)
'''

_DDP_WORKER = _DDP_COMMON + '''
import datetime, json, os, sys
import torch.distributed as dist
from diffusionformer.train import Trainer

RANK = int(os.environ["RANK"])
OUT = sys.argv[1]
torch.set_num_threads(1)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
out = {}
for name, steps in (("fresh", 4), ("other", 4)):  # "other": the test's checkpoint of "3 processes" at step 2
    draws = []
    torch.manual_seed(0)
    Trainer(torch.nn.Linear(3, 1), Recording(draws), config(max_steps=steps), os.path.join(OUT, name),
            resume=name == "other").fit()
    out[name] = draws
model = Seen()
Trainer(model, Recording([]), config(), os.path.join(OUT, "seen")).fit()
out["seen"] = model.seen.tolist()
out["seen_contiguous"] = model.seen.is_contiguous()
with open(os.path.join(OUT, f"rank{RANK}.json"), "w") as f:
    json.dump(out, f)
'''


def _load_launcher():
    import importlib.util

    spec = importlib.util.spec_from_file_location("_tiny_tasks_46", REPO / "tests" / "train" / "train_tiny_tasks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.launch_gloo_ranks


@pytest.mark.slow
def test_kills_ddp_resume_of_another_world_size_and_non_contiguous_buffers(tmp_path):
    """kills (one 2-rank Gloo launch):

    * train/trainer.py ``own = ... isinstance(ranks, list) and len(ranks) == self.ctx.world_size`` -> without the
      length check (a checkpoint of 3 processes resumed by 2: rank 1 took the 3-process run's rank-1 states, not
      "rank 0's, then a stream of its own" as documented; here its rank 1 states are rank 0's, so rank 1 drew rank 0's
      dropout masks);
    * ``_rank_seed((self.config.seed + int(payload["step"])) % 2**32, rank)`` -> ``_rank_seed(self.config.seed,
      rank)`` (rank 1 of such a resume replayed the dropout draws of its run's first steps);
    * ``_sync_buffers`` ``if flat is not buffer.data: buffer.data.copy_(flat)`` dropped (a non-contiguous buffer,
      broadcast through a contiguous copy, kept rank 1's own value after fit: not the checkpoint's, rank 0's).
    """
    import json

    from diffusionformer.train import Trainer, load_checkpoint, save_checkpoint

    worker_ns: dict = {}
    exec(compile(_DDP_COMMON, "<common>", "exec"), worker_ns)
    out = tmp_path / "out"
    out.mkdir()
    solo: list = []
    torch.manual_seed(0)
    Trainer(torch.nn.Linear(3, 1), worker_ns["Recording"](solo), worker_ns["config"](max_steps=2), out / "other").fit()
    path = out / "other" / "checkpoint.pt"
    payload = load_checkpoint(path)
    assert payload["rank_rng"] is None and payload["step"] == 2
    payload["rank_rng"] = [payload["rng"]] * 3  # as 3 ranks had written it (rank 0's states for all: a marker)
    save_checkpoint(path, payload)
    script = tmp_path / "worker.py"
    script.write_text(_DDP_WORKER)
    _load_launcher()(script, [str(out)], tmp_path)

    r0, r1 = (json.loads((out / f"rank{r}.json").read_text()) for r in range(2))
    assert len(r0["other"]) == len(r1["other"]) == 2 and len(r0["fresh"]) == len(r1["fresh"]) == 4
    assert not set(r1["other"]) & set(r0["other"]), (r0["other"], r1["other"])  # rank 1: a stream of its own
    assert not set(r1["other"]) & set(r1["fresh"]), (r1["other"], r1["fresh"])  # ... not its run's start replayed
    assert r0["seen"] == r1["seen"] and not r0["seen_contiguous"]
    assert r0["seen"] != [[0.0, 0.0]] * 3


def _module(path: Path, name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.skipif(__import__("shutil").which("bash") is None or __import__("shutil").which("tar") is None,
                    reason="needs bash and tar")
def test_kills_gpu_study_budget_counts_the_setup_without_analysis(tmp_path):
    """kills: experiments/scripts/gpu_study.sh ``left=$(( BUDGET - ANALYZE_RESERVE - ($(date +%s) - t0) ))`` ->
    ``left=$(( BUDGET - ANALYZE_RESERVE ))`` (the training got the whole budget after the setup, past the device
    call's limit; the day's test of it ran with the default 90 s reserve above its 30 s budget, where the clamp to 1 s
    hid the setup's share). Here ``ANALYZE=0``: the training's time is the budget less the setup's 3 s."""
    rehearsal = _module(REPO / "tests" / "experiments" / "test_edge_probes_gpu_rehearsal_46.py", "_rehearsal_46")
    config, fake = rehearsal._probe_files(tmp_path)
    data = tmp_path / "data"
    (data / "tiny").mkdir(parents=True)
    (data / "tiny" / "input.txt").write_text("text")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("FAKE_", "ANALYZE"))}, "PY": str(fake),
           "ALLOW_CPU": "1", "OUT": str(tmp_path / "out"), "RESULTS": str(tmp_path / "res"), "DATA": str(data),
           "UNPACKED": str(tmp_path / "unpacked"), "BUDGET": "30", "DIFFUSIONFORMER_CACHE": str(tmp_path / "cache"),
           "FAKE_SETUP_SLEEP": "3", "ANALYZE": "0"}
    res = subprocess.run(["bash", str(REPO / "experiments" / "scripts" / "gpu_study.sh"), "run", str(config), "1"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    line = next(x for x in res.stdout.splitlines() if x.startswith("setup: "))
    setup = int(line.split()[1])
    left = int(line.split("for at most ")[1].split()[0])
    assert setup >= 3 and 30 - setup <= left <= 27, line  # the setup's seconds read again after left's


@pytest.mark.slow
@pytest.mark.skipif(__import__("shutil").which("bash") is None or __import__("shutil").which("tar") is None
                    or __import__("shutil").which("timeout") is None, reason="needs bash, tar and timeout")
def test_kills_gpu_study_analysis_is_cut_at_the_budget_from_the_start(tmp_path):
    """kills: experiments/scripts/gpu_study.sh ``timeout -s INT -k 10 "$aleft"`` -> ``"$BUDGET"`` (an analysis
    started after a long training ran a whole budget more, past the device call's limit; the day's test started it at
    once, where both limits end within seconds). The training here takes 8 s of a 30 s budget, 12 s kept for the
    analysis, which never ends: the script's own report says it was cut at the budget (about 40 s after the start
    with the mutant)."""
    import ast
    import stat

    tree = ast.parse((REPO / "tests" / "experiments" / "test_edge_probes_gpu_analyze_46.py").read_text())
    fake_py = next(n.value.value for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "_FAKE_PY")
    at = '  exit 0\nfi\nif [ "$1" = "-m" ] && [ "$3" = "analyze" ]'
    assert fake_py.count(at) == 1
    fake = tmp_path / "py"
    fake.write_text(fake_py.replace(at, "  sleep 8\n" + at) % sys.executable)  # the training takes 8 s
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    config = tmp_path / "c.toml"
    config.write_text('name = "probe"\nseeds = [0]\n[[tasks]]\nname = "t"\ndataset = "digits"\n'
                      'model = "vit-digits"\n[[operators]]\nname = "a"\nheads = "attention:4"\n')
    (tmp_path / "data").mkdir()
    calls = tmp_path / "calls.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_", "ANALYZE"))}
    env.update(PY=str(fake), ALLOW_CPU="1", OUT=str(tmp_path / "out"), RESULTS=str(tmp_path / "res"),
               DATA=str(tmp_path / "data"), UNPACKED=str(tmp_path / "unpacked"), BUDGET="30", ANALYZE_RESERVE="12",
               DIFFUSIONFORMER_CACHE=str(tmp_path / "cache"), FAKE_CALLS=str(calls), FAKE_ANALYZE_SLEEP="300")
    res = subprocess.run(["bash", str(REPO / "experiments" / "scripts" / "gpu_study.sh"), "run", str(config), "1"],
                         env=env, capture_output=True, text=True, timeout=120)
    calls = calls.read_text().splitlines()
    assert res.returncode == 0, res.stdout + res.stderr
    assert [c.split()[0] for c in calls] == ["run", "analyze"], calls
    line = next(x for x in res.stdout.splitlines() if x.startswith("analyze exit code"))
    assert line.split()[3] == "124", line
    assert int(line.split(" after ")[1].split()[0]) <= 30 + 4, line
