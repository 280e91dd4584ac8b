"""Where a comparison's runs trained, as ``manifest.json`` and the published page say it (edge probes, 45).

CUDA is simulated (``torch.cuda.is_available`` / ``get_device_name`` patched): no GPU trains here. Found: the
manifest named the machine's GPU whenever CUDA was available, also for runs trained with ``--device cpu``; and an
invocation that trained on the GPU added its machine's CPU kernel set to ``cpu_kernel_sets``, so a later CPU run
here under another set was told its "earlier runs were trained with <X> CPU kernels" and the page listed two sets.
"""

from __future__ import annotations

import json

import pytest
import torch

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments import runner as runner_mod
from diffusionformer.experiments.outputs import manifest, merged_manifest
from diffusionformer.experiments.publish import _cuda_text, _kernels_text
from diffusionformer.experiments.runner import run_experiment

_GPU = "SIMULATED H100"


def _tiny(name: str = "where", **top):
    return load_experiment_config({
        "name": name, "seeds": [0], **top,
        "tasks": [{"name": "digits", "dataset": "digits", "model": "vit-digits",
                   "model_overrides": {"dim": 8, "depth": 1, "num_heads": 2},
                   "train": {"max_steps": 2, "batch_size": 8, "lr": 1e-3, "warmup_steps": 0, "eval_interval": 2,
                             "log_interval": 1, "checkpoint_interval": 2}}],
        "operators": [{"name": "attention"}],
    })


def _simulate_cuda(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: _GPU)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)


def test_bug_a_cpu_run_on_a_cuda_machine_records_no_gpu(tmp_path, monkeypatch):
    """Bug: ``manifest`` recorded ``cuda: <GPU name>`` whenever CUDA was available, also for ``run --device cpu``
    (or a config's ``device = "cpu"``): the comparison's ``cuda_devices`` and the page's ``CUDA:`` then named a GPU
    its runs never trained on. The manifest records the device the runs train on."""
    _simulate_cuda(monkeypatch)
    said: list[str] = []
    run_experiment(_tiny(), tmp_path, progress=False, log=said.append, device="cpu")
    record = json.loads((tmp_path / "where" / "manifest.json").read_text(encoding="utf-8"))
    assert record["cuda"] is None and "cuda_devices" not in record, record
    assert _cuda_text(record) == "none"
    assert record["cpu_kernel_sets"] == [torch.backends.cpu.get_cpu_capability()]  # trained on this CPU
    # the config's device, and a task's own train.device, likewise
    assert manifest(_tiny(device="cpu"))["cuda"] is None
    on_cpu = _tiny()
    on_cpu.tasks[0].train["device"] = "cpu"
    assert manifest(on_cpu)["cuda"] is None
    # and where the runs do train on CUDA ("auto" on a CUDA machine, or asked for) the GPU is named
    assert manifest(_tiny())["cuda"] == _GPU
    assert manifest(_tiny(), device="cuda")["cuda"] == _GPU


def test_bug_a_gpu_call_adds_no_cpu_kernel_set(tmp_path, monkeypatch):
    """Bug: an invocation training on the GPU recorded its machine's CPU kernel set (``cpu_kernels``) in
    ``cpu_kernel_sets``; a later CPU run here under another set then said "earlier runs of where were trained with
    torch's ELSEWHERE CPU kernels" and ``publish`` listed two kernel sets, though the earlier runs never ran torch's
    CPU kernels. Only invocations that train on the CPU add a kernel set."""
    cfg = _tiny()
    with monkeypatch.context() as m:  # the GPU call: CUDA, another processor; its runs are not trained here
        _simulate_cuda(m)
        m.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "ELSEWHERE")
        m.setattr(runner_mod, "_one_run", lambda *a, **k: None)
        run_experiment(cfg, tmp_path, progress=False, log=lambda s: None)
    gpu_call = json.loads((tmp_path / "where" / "manifest.json").read_text(encoding="utf-8"))
    assert gpu_call["cuda"] == _GPU and "ELSEWHERE" not in gpu_call.get("cpu_kernel_sets", []), gpu_call
    said: list[str] = []
    run_experiment(cfg, tmp_path, progress=False, log=said.append, device="cpu")  # here, on the CPU
    record = json.loads((tmp_path / "where" / "manifest.json").read_text(encoding="utf-8"))
    now = torch.backends.cpu.get_cpu_capability()
    assert record["cpu_kernel_sets"] == [now] and record["cuda_devices"] == [_GPU], record
    assert not [s for s in said if "CPU kernels" in s], said
    assert _kernels_text(record) == f"; CPU kernels: {now}"


def test_bug_the_page_names_the_cpu_runs_kernel_set_when_a_gpu_call_trained_last():
    """Bug: a comparison trained on the CPU under AVX2, then partly by a GPU call (which records no kernel set):
    ``_kernels_text`` printed the last invocation's ``cpu_kernels`` only when one set was recorded, so the page
    named no kernel set (or the GPU machine's) for the CPU-trained runs."""
    cpu = {"cpu_kernels": "AVX2", "cuda": None, "git_commit": "a"}
    record = merged_manifest(merged_manifest(None, cpu), {"cpu_kernels": None, "cuda": _GPU, "git_commit": "a"})
    assert record["cpu_kernel_sets"] == ["AVX2"] and record["cuda_devices"] == [_GPU]
    assert _kernels_text(record) == "; CPU kernels: AVX2"


@pytest.mark.parametrize("old, text", [
    ({"cpu_kernels": "AVX2"}, "; CPU kernels: AVX2"),  # before cpu_kernel_sets existed
    ({"cpu_kernels": "AVX512", "cpu_kernel_sets": ["AVX512"]}, "; CPU kernels: AVX512"),
    ({}, ""),
    ({"cpu_kernels": None, "cuda": _GPU}, ""),  # a GPU call's alone: no CPU kernels trained its runs
])
def test_pins_kernels_text_of_old_and_gpu_manifests(old, text):
    assert _kernels_text(old) == text


def test_bug_an_invocation_training_on_cpu_and_gpu_notes_the_new_kernel_set(tmp_path, monkeypatch):
    """Bug: ``run``'s note of a change of CPU kernel set was given only where the invocation recorded no GPU, so one
    whose first task trains on the CPU (``train.device = "cpu"``) and second on the GPU said nothing though its CPU
    runs ran another kernel set than the earlier runs (and the manifest named no kernel set for them)."""
    cfg = _tiny()
    second = dict(cfg.to_dict()["tasks"][0], name="digits2")
    raw = {**cfg.to_dict(), "tasks": [dict(cfg.to_dict()["tasks"][0], train={**cfg.tasks[0].train, "device": "cpu"}),
                                      second]}
    cfg = load_experiment_config(raw)
    out = tmp_path / "where"
    out.mkdir()
    (out / "manifest.json").write_text(json.dumps({"git_commit": None, "cpu_kernels": "ELSEWHERE",
                                                   "cpu_kernel_sets": ["ELSEWHERE"]}), encoding="utf-8")
    _simulate_cuda(monkeypatch)
    monkeypatch.setattr(runner_mod, "_one_run", lambda *a, **k: None)  # nothing trains: the record and note only
    said: list[str] = []
    run_experiment(cfg, tmp_path, progress=False, log=said.append)
    record = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    now = torch.backends.cpu.get_cpu_capability()
    assert record["cuda"] == _GPU and record["cpu_kernel_sets"] == ["ELSEWHERE", now], record
    assert len([s for s in said if "CPU kernels" in s]) == 1, said
