"""The manifest records which CPU kernel set torch ran (ATen's ``ATEN_CPU_CAPABILITY``), and a comparison
resumed under another set says so.

Why: the README's digits rows differ in the third decimal between machines and were seen to differ between
runs of one commit. Forcing ``ATEN_CPU_CAPABILITY=avx2`` on an AVX-512 machine gives the AVX2 machines' rows
exactly (sitting 32): the kernel set, not the seed or the code, decides the rounding. So the set is recorded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.outputs import manifest, merged_manifest
from diffusionformer.experiments.publish import _kernels_text
from diffusionformer.experiments.runner import run_experiment


def _tiny():
    return load_experiment_config({
        "name": "kernels", "seeds": [0],
        "tasks": [{"name": "digits", "dataset": "digits", "model": "vit-digits",
                   "model_overrides": {"dim": 16, "depth": 1, "num_heads": 2},
                   "train": {"max_steps": 2, "batch_size": 8, "lr": 1e-3, "warmup_steps": 0, "eval_interval": 2,
                             "log_interval": 1, "checkpoint_interval": 2}}],
        "operators": [{"name": "attention"}],
    })


def test_the_manifest_records_the_kernel_set_and_threads_of_this_process():
    m = manifest(_tiny())
    assert m["cpu_kernels"] == torch.backends.cpu.get_cpu_capability()
    assert m["torch_threads"] == torch.get_num_threads()
    assert m["cpu_model"] is None or (isinstance(m["cpu_model"], str) and m["cpu_model"])


def test_the_recorded_kernel_set_is_the_one_torch_runs_not_the_processors():
    """ATEN_CPU_CAPABILITY=default (the scalar kernels, which every x86 and ARM processor runs) in a fresh
    interpreter: the manifest says DEFAULT, whatever the processor offers."""
    code = ("from diffusionformer.experiments.outputs import manifest; "
            "from diffusionformer.experiments import load_experiment_config as l; "
            "print(manifest(l({'name': 'k', 'seeds': [0], 'tasks': [{'name': 'd', 'dataset': 'digits', "
            "'model': 'vit-digits'}], 'operators': [{'name': 'attention'}]}))['cpu_kernels'])")
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "DEFAULT"


def test_merged_manifest_keeps_every_kernel_set_oldest_first():
    first = merged_manifest(None, {"cpu_kernels": "AVX2"})
    assert first["cpu_kernel_sets"] == ["AVX2"]
    again = merged_manifest(first, {"cpu_kernels": "AVX2"})
    assert again["cpu_kernel_sets"] == ["AVX2"]
    both = merged_manifest(again, {"cpu_kernels": "AVX512"})
    assert both["cpu_kernel_sets"] == ["AVX2", "AVX512"] and both["cpu_kernels"] == "AVX512"
    assert merged_manifest(both, {"cpu_kernels": "AVX2"})["cpu_kernel_sets"] == ["AVX2", "AVX512"]
    # a manifest written before the list existed: its one set counts; junk entries do not
    assert merged_manifest({"cpu_kernels": "DEFAULT"}, {"cpu_kernels": "AVX2"})["cpu_kernel_sets"] == ["DEFAULT", "AVX2"]
    assert merged_manifest({"cpu_kernel_sets": [None, 3, "AVX2"]}, {})["cpu_kernel_sets"] == ["AVX2"]


def test_the_page_names_the_kernel_set_and_warns_when_runs_used_several():
    assert _kernels_text({"cpu_kernels": "AVX2", "cpu_kernel_sets": ["AVX2"]}) == "; CPU kernels: AVX2"
    text = _kernels_text({"cpu_kernels": "AVX512", "cpu_kernel_sets": ["AVX2", "AVX512"]})
    assert text.startswith("; CPU kernels: AVX2, AVX512 (runs of this comparison were trained under 2 kernel sets")
    assert _kernels_text({}) == ""  # an older manifest: nothing claimed


def test_a_run_under_another_kernel_set_than_the_earlier_runs_says_so(tmp_path):
    cfg = _tiny()
    out = tmp_path / "kernels"
    out.mkdir()
    (out / "manifest.json").write_text(json.dumps({"git_commit": None, "cpu_kernels": "ELSEWHERE",
                                                   "cpu_kernel_sets": ["ELSEWHERE"]}))
    said: list[str] = []
    run_experiment(cfg, tmp_path, progress=False, log=said.append)
    recorded = json.loads((out / "manifest.json").read_text())
    now = torch.backends.cpu.get_cpu_capability()
    notes = [s for s in said if "CPU kernels" in s]
    if torch.cuda.is_available():  # trained on the GPU: the CPU's kernel set does not decide the numbers
        assert recorded["cpu_kernel_sets"] == ["ELSEWHERE"] and recorded["cpu_kernels"] is None
        assert not notes
    else:
        assert recorded["cpu_kernel_sets"] == ["ELSEWHERE", now] and recorded["cpu_kernels"] == now
        assert len(notes) == 1 and "ELSEWHERE" in notes[0] and now in notes[0]
    # the same set again: nothing to say
    said.clear()
    run_experiment(cfg, tmp_path, progress=False, log=said.append, resume=False)
    assert not [s for s in said if "CPU kernels" in s]
