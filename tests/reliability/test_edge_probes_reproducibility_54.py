"""Reproducibility audit (helper 54e): published numbers bit for bit, killed runs resumed exactly.

Probed and found sound (no test added where ``tests/reliability/test_edge_probes_resume_matrix.py``,
``tests/train/test_train_resume.py`` or the runner's tests already pin it): one config and seed trained twice gives
the same weights, RNG states and metrics for ViT with crop/flip augmentation, label smoothing, dropout and drop path,
character GPT with dropout, the graph transformer on nodes, neighbour-sampled node mini-batches with sampled
evaluation, and DINO; a comparison trained whole, trained one seed at a time (``--set seeds=[1]``) or with its tasks
and settings in reverse order gives every run the same bits; ``load_run`` + the task's ``evaluate`` gives every
run's final evaluation exactly; a second ``run`` of a finished comparison retrains nothing and rewrites no byte
(results.json, results.md, plots, summaries); ``analyze`` writes the same bytes twice, from its cache and afresh
(PNG figures carry no date). Killed runs resume bit for bit in every task kind (the resume matrix above).

Thread counts: the docs promise no equality across them (the README gives the one-thread rows apart), and indeed a
tiny GPT or ViT trained under 1 and 2 torch threads ends with other weights. The manifest recorded only the last
invocation's count, which the Bug: test below is about.
"""

from __future__ import annotations

import json

import pytest
import torch

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.outputs import merged_manifest
from diffusionformer.experiments.publish import _threads_text
from diffusionformer.experiments.runner import run_dir, run_experiment
from diffusionformer.train import load_checkpoint

_TRAIN = {"max_steps": 3, "batch_size": 8, "warmup_steps": 1, "eval_interval": 2, "log_interval": 1,
          "checkpoint_interval": 2}


def _tiny(name="threads", seeds=(0,)):
    return load_experiment_config({
        "name": name, "seeds": list(seeds),
        "tasks": [{"name": "digits", "dataset": "digits", "model": "vit-digits",
                   "augment": {"crop_padding": 1, "flip": True},
                   "model_overrides": {"dim": 8, "depth": 1, "num_heads": 2, "dropout": 0.1, "drop_path": 0.1},
                   "train": _TRAIN}],
        "operators": [{"name": "attention"}],
    })


def test_bug_the_manifest_keeps_every_cpu_thread_count_and_run_says_when_it_changes(tmp_path):
    """Bug: ``manifest.json`` kept only the last training invocation's ``torch_threads``, though the thread count
    decides a CPU run's rounding as the kernel set does (a tiny GPT or ViT ends with other weights under 1 and 2
    threads): a comparison trained half under ``--workers 2`` (1 thread each on 2 cores) and resumed by a plain
    ``run`` (2 threads) recorded 2 alone, ``run`` said nothing, and the published page claimed one machine setting.
    Now ``torch_thread_counts`` lists every count of the invocations that trained on the CPU, ``run`` notes a new
    one, and ``publish`` names them."""
    # the merge: oldest first, each once; a GPU call's count (no cpu_kernels) is not one of the CPU runs'
    first = merged_manifest(None, {"cpu_kernels": "AVX2", "torch_threads": 1})
    assert first["torch_thread_counts"] == [1]
    both = merged_manifest(first, {"cpu_kernels": "AVX2", "torch_threads": 2})
    assert both["torch_thread_counts"] == [1, 2] and both["torch_threads"] == 2
    assert merged_manifest(both, {"cpu_kernels": None, "torch_threads": 16})["torch_thread_counts"] == [1, 2]
    # a manifest written before the list: its one count, where it trained on the CPU
    assert merged_manifest({"cpu_kernels": "AVX2", "torch_threads": 4},
                           {"cpu_kernels": "AVX2", "torch_threads": 1})["torch_thread_counts"] == [4, 1]
    assert "torch_thread_counts" not in merged_manifest({"cpu_kernels": None, "torch_threads": 4}, {})
    assert _threads_text(both).startswith("; torch threads: 1, 2 (runs of this comparison were trained on the CPU")
    assert _threads_text(first) == "" and _threads_text({}) == ""

    # through run: an earlier invocation's other count is kept beside this one's, and said
    if torch.cuda.is_available():
        pytest.skip("trained on the GPU: the CPU thread count does not decide the numbers")
    cfg = _tiny()
    out = tmp_path / cfg.name
    out.mkdir()
    now, other = torch.get_num_threads(), torch.get_num_threads() + 1
    cap = torch.backends.cpu.get_cpu_capability()
    (out / "manifest.json").write_text(json.dumps({"git_commit": None, "cpu_kernels": cap, "torch_threads": other}))
    said: list[str] = []
    run_experiment(cfg, tmp_path, progress=False, log=said.append)
    recorded = json.loads((out / "manifest.json").read_text())
    assert recorded["torch_thread_counts"] == [other, now] and recorded["torch_threads"] == now
    notes = [s for s in said if "thread" in s]
    assert len(notes) == 1 and f"trained with {other} torch thread(s), these with {now}" in notes[0]
    said.clear()  # the same count again: nothing to say
    run_experiment(cfg, tmp_path, progress=False, log=said.append, resume=False)
    assert not [s for s in said if "thread" in s]
    assert json.loads((out / "manifest.json").read_text())["torch_thread_counts"] == [other, now]


# --- pins of what was found sound -------------------------------------------------------------------------------

def _study(seeds=(0, 1)):
    """Two tasks whose runs draw from every stream: ViT with crop/flip augmentation, label smoothing, dropout and drop
    path (the batch generator, torch's global one), and neighbour-sampled node mini-batches with sampled evaluation;
    a learned heat setting beside attention."""
    mb = {"batch_size": 8, "num_neighbors": [3], "eval": "sampled"}
    return load_experiment_config({
        "name": "repro", "seeds": list(seeds),
        "tasks": [{"name": "vit", "dataset": "digits", "model": "vit-digits", "select_by": "val_acc",
                   "augment": {"crop_padding": 1, "flip": True}, "label_smoothing": 0.1,
                   "model_overrides": {"dim": 8, "depth": 1, "num_heads": 2, "dropout": 0.1, "drop_path": 0.1},
                   "train": _TRAIN},
                  {"name": "mb", "dataset": "karate", "model": "graph-node-small", "minibatch": mb,
                   "eval_batch_size": 8, "model_overrides": {"dim": 8, "depth": 1, "num_heads": 2, "dropout": 0.1},
                   "train": _TRAIN}],
        "operators": [{"name": "attention"},
                      {"name": "heat", "heads": "attention:1,heat(t=0.5, learnable=True, steps=1):1"}],
    })


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("repro")
    run_experiment(_study(), root, progress=False, log=lambda _: None)
    return root


def _files(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_pins_a_comparison_trained_whole_or_one_seed_at_a_time_gives_every_run_the_same_bits(study, tmp_path):
    """`--set seeds=[1]` (one GPU call per seed) trains seed 1 of every task and setting as the whole comparison
    did: weights, optimizer, every generator state and the final evaluation, bit for bit."""
    run_experiment(_study(seeds=(1,)), tmp_path, progress=False, log=lambda _: None)
    cfg = _study()
    for task in cfg.tasks:
        for setting in cfg.operators:
            a = load_checkpoint(run_dir(study / "repro", task.name, setting.name, 1) / "checkpoint.pt")
            b = load_checkpoint(run_dir(tmp_path / "repro", task.name, setting.name, 1) / "checkpoint.pt")
            where = f"{task.name}/{setting.name}"
            assert a["model"].keys() == b["model"].keys(), where
            assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"]), where
            assert torch.equal(a["rng"]["torch"], b["rng"]["torch"]), where
            assert torch.equal(a["rng"]["generator"], b["rng"]["generator"]), where
            assert a["last_eval"]["metrics"] == b["last_eval"]["metrics"], where


def test_pins_a_second_run_of_a_finished_comparison_rewrites_no_byte_and_analyze_repeats_its_bytes(study):
    """A finished comparison run again retrains nothing and leaves every file as it was (results.json, results.md,
    the plots, every run's files); `analyze` writes the same bytes from its cache and measured afresh (the PNGs carry
    no date)."""
    from diffusionformer.experiments.analyze import analyze_experiment

    out = study / "repro"
    before = _files(out)
    said: list[str] = []
    run_experiment(_study(), study, progress=False, log=said.append)
    assert _files(out) == before and not said

    cfg = _study()

    def analysis():
        analyze_experiment(cfg, study, max_examples=16, max_attention_examples=4, progress=False)
        return _files(out / "analysis")

    first = analysis()
    assert "metrics.json" in first and any(name.endswith(".png") for name in first)
    assert analysis() == first  # from the runs' caches
    for cache in out.rglob("analysis_cache.pt"):
        cache.unlink()
    assert analysis() == first  # measured again


def test_pins_only_differential_heads_move_the_shared_initial_weights_of_a_seed():
    """The result pages pair settings over seeds because "a seed fixes the initial weights": under one seed a model
    whose heads use any registered operator gets the attention model's weights wherever the two have the same
    parameter, except the differential operator, whose constructor draws its lambda vectors from the global generator
    (N(0, 0.1), as the paper) before the model's initialisation draws the rest. Left as it is: changing it would
    change the initialisation of the published differential runs (study-rivals), so the pages say it instead (their
    pairing sentence, written by ``publish``); a new operator that draws in its constructor shows up here."""
    import warnings

    from diffusionformer.models import create_model
    from diffusionformer.operators import list_operators, operator_class
    from diffusionformer.train import seed_everything

    def state(heads=None):
        seed_everything(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return create_model("gpt-char-tiny", n_layer=2, n_embd=16, n_head=4, vocab_size=12, block_size=8,
                                heads=heads).state_dict()

    base = state()
    moved = []
    for name in list_operators():
        if not operator_class(name).__module__.startswith("diffusionformer."):  # a test's registration left behind
            continue
        try:
            sd = state(f"attention:2,{name}:2")
        except (ValueError, TypeError):  # an operator that needs arguments or does not fit a causal model
            continue
        shared = [k for k in base if k in sd and base[k].shape == sd[k].shape]
        assert len(shared) >= len(base) - 2, name
        if any(not torch.equal(base[k], sd[k]) for k in shared):
            moved.append(name)
    assert moved == ["differential"]
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "results" / "study-rivals.md").read_text()
    assert "a model with differential heads draws their lambda vectors first" in page
