"""Leftovers 61v.

- A comparison run under torchrun (``torchrun --nproc_per_node 2 -m diffusionformer.experiments run c.toml``)
  recorded in ``manifest.json`` a ``command`` without the launcher (``python -m diffusionformer.experiments run
  c.toml``): re-run as recorded, each run trained in one process, whose seeds draw and average otherwise (the manifest
  and each run's summary record the world size). The command now names torchrun and its process counts.
- A graph transformer with ``heat-exact`` heads is refused by the runner: rightly, the library's own graph
  transformer refuses it at its first forward (it attends over the graph's edges, and the exact heat kernel
  ``matrix_exp`` needs a dense ``P``); pinned.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
import torch
from experiments_tiny_configs import TINY_DIGITS_TOML, tiny_digits_config

from diffusionformer.experiments import outputs
from diffusionformer.experiments.cli import main

# what torchrun's agent sets in each process it starts (torch/distributed/elastic/agent/server/local_elastic_agent.py)
TORCHRUN = {"TORCHELASTIC_RUN_ID": "none", "LOCAL_WORLD_SIZE": "2", "GROUP_WORLD_SIZE": "1", "WORLD_SIZE": "2",
            "RANK": "0", "LOCAL_RANK": "0", "GROUP_RANK": "0", "TORCHELASTIC_RESTART_COUNT": "0"}


def _package_main() -> str:
    return str(Path(outputs.__file__).with_name("__main__.py"))


def _torchrun_args(command: str):
    """``command`` as torchrun's own parser reads it (the launcher's options, the script or module, its arguments)."""
    from torch.distributed.run import get_args_parser

    words = shlex.split(command)
    assert words[0] == "torchrun", command
    return get_args_parser().parse_args(words[1:])


def _under_torchrun(monkeypatch, **env: str) -> None:
    for key, value in {**TORCHRUN, **env}.items():
        monkeypatch.setenv(key, value)


# ------------------------------------------------------------------------------------- the command under torchrun
def test_bug_python_m_under_torchrun_records_the_launcher(monkeypatch):
    """Bug: ``python -m diffusionformer.experiments run c.toml --import ops.py`` (one process when re-run)."""
    _under_torchrun(monkeypatch)
    monkeypatch.setattr(sys, "argv", [_package_main(), "run", "my c.toml", "--import", "ops.py"])
    command = outputs._command()
    assert command == ("torchrun --nproc_per_node 2 -m diffusionformer.experiments run 'my c.toml' "
                       "--import ops.py")
    args = _torchrun_args(command)
    assert (args.nproc_per_node, args.nnodes, args.module, args.no_python) == ("2", "1:1", True, False)
    assert (args.training_script, args.training_script_args) == ("diffusionformer.experiments",
                                                                 ["run", "my c.toml", "--import", "ops.py"])
    monkeypatch.setattr(outputs, "git_commit", lambda path=None: "abc")
    record = outputs.manifest(tiny_digits_config(), world_size=2)
    assert record["command"] == command and record["imports"] == ["ops.py"] and record["world_size"] == 2


def test_bug_several_nodes_are_named(monkeypatch):
    """Bug: two nodes of 4 processes each recorded no launcher either; ``--nnodes`` now names the nodes."""
    _under_torchrun(monkeypatch, LOCAL_WORLD_SIZE="4", GROUP_WORLD_SIZE="2", WORLD_SIZE="8")
    token = outputs._MAIN_ARGV.set(("run", "c.toml"))  # main(argv) called from Python in a torchrun process
    try:
        command = outputs._command()
    finally:
        outputs._MAIN_ARGV.reset(token)
    assert command == "torchrun --nproc_per_node 4 --nnodes 2 -m diffusionformer.experiments run c.toml"
    args = _torchrun_args(command)
    assert (args.nproc_per_node, args.nnodes, args.training_script) == ("4", "2", "diffusionformer.experiments")


@pytest.mark.parametrize("script, expected", [
    # the console script is no file of the working folder: torchrun runs it as a program
    ("/venv/bin/diffusionformer", "torchrun --nproc_per_node 2 --no-python diffusionformer run c.toml"),
    ("/home/me/study.py", "torchrun --nproc_per_node 2 study.py run c.toml"),
])
def test_bug_a_script_under_torchrun_records_the_launcher(monkeypatch, script, expected):
    _under_torchrun(monkeypatch)
    monkeypatch.setattr(sys, "argv", [script, "run", "c.toml"])
    assert outputs._command() == expected
    args = _torchrun_args(expected)
    assert args.training_script == Path(script).name and args.training_script_args == ["run", "c.toml"]
    assert args.no_python == (not script.endswith(".py"))


@pytest.mark.parametrize("env", [
    {"WORLD_SIZE": "2", "RANK": "0"},  # set by hand or by another launcher: no torchrun to name
    {"TORCHELASTIC_RUN_ID": "none", "LOCAL_WORLD_SIZE": "two"},  # not torchrun's (no integer)
    {"TORCHELASTIC_RUN_ID": "", "LOCAL_WORLD_SIZE": "2"},
])
def test_a_process_torchrun_did_not_start_records_the_command_as_before(monkeypatch, env):
    for key in TORCHRUN:
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(sys, "argv", [_package_main(), "run", "c.toml"])
    assert outputs._command() == "python -m diffusionformer.experiments run c.toml"
    monkeypatch.setattr(sys, "argv", ["/venv/bin/diffusionformer", "run", "c.toml"])
    assert outputs._command() == "diffusionformer run c.toml"


def test_bug_the_runner_records_the_launcher_in_manifest_json(tmp_path, monkeypatch):
    """The whole path: ``run`` started by ``torchrun --nproc_per_node 1`` writes that command (and its world size)."""
    _under_torchrun(monkeypatch, LOCAL_WORLD_SIZE="1", WORLD_SIZE="1")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.toml").write_text(TINY_DIGITS_TOML)
    assert main(["run", "c.toml", "--out", "out", "--set", "operators=attention", "--no-progress"]) == 0
    manifest = json.loads((tmp_path / "out" / "tiny" / "manifest.json").read_text())
    assert manifest["command"] == ("torchrun --nproc_per_node 1 -m diffusionformer.experiments run c.toml --out out "
                                   "--set operators=attention --no-progress")
    assert manifest["world_size"] == 1 and manifest["world_sizes"] == [1]


# ------------------------------------------------------------------------ heat-exact heads in a graph transformer
KARATE = """name = "probe"
seeds = [0]
[[tasks]]
name = "k"
dataset = "karate"
model = "graph-node-small"
model_overrides = { dim = 8, depth = 1, num_heads = 2 }
[tasks.train]
max_steps = 1
[[operators]]
name = "exact"
heads = "heat-exact:2"
"""


def test_pin_the_runner_refuses_heat_exact_heads_as_the_graph_transformer_does(tmp_path, monkeypatch, capsys):
    """Pin: not a combination the library supports: the graph transformer builds with ``heat-exact`` heads, but its
    forward refuses them (it attends over the graph's edges, the sparse back-end, and the exact heat kernel is the
    ``matrix_exp`` of a dense ``P``). ``run`` refuses the setting before anything trains, naming the task, the
    layer, the operator and what to use instead; no run folder is written."""
    from diffusionformer.models import create_model

    model = create_model("graph-node-small", in_channels=3, num_classes=2, dim=8, depth=1, num_heads=2,
                         heads="heat-exact:2")
    with pytest.raises(ValueError, match=r"^operator 'heat-exact' does not support the sparse back-end \(it needs "
                                         r"a dense P\)"):
        model(torch.randn(4, 3), torch.tensor([[0, 1, 2], [1, 2, 3]]))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "k.toml").write_text(KARATE)
    capsys.readouterr()
    assert main(["run", "k.toml", "--out", "out", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert ("task 'k' / setting 'exact': model 'graph-node-small' layer 0 has operator 'heat-exact', which needs a "
            "dense P, and a graph transformer attends over the graph's edges (the sparse back-end); use a polynomial "
            "operator such as 'heat' or 'ppr'") in err, err
    assert not (tmp_path / "out" / "probe" / "runs").exists()
