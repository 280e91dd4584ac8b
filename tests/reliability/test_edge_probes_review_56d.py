"""Review of four commits of sitting 56 (gpu_study.sh's ``--precision``, ``status``'s pace, the blank ``LOCAL_RANK``
and ``default_factory`` fill, the GPU configs' one primary quantity):

- ``init_distributed`` with a process group the caller initialised refused a blank ``LOCAL_RANK`` in one process,
  where ``dist_env`` (no group) now reads it as unset: the same environment ran or not by who made the group.
- ``_predated_fields_at_default`` wrote a nested dataclass default (``field(default_factory=Sub)`` or a frozen
  ``Sub()`` default) as its ``str()``, where ``model_record`` writes ``dataclasses.asdict``'s dict: resuming a
  checkpoint that predates such a field was refused ("config sub: checkpoint 'Sub(a=1)', now {'a': 1}").
- ``gpu_study.sh run ... --set tasks=[a] --precision P`` gave ``analyze`` (which covers every task: the selections
  are dropped) the ``train.amp`` of task ``a`` only: the other tasks' runs, which earlier calls trained with the same
  ``--precision``, were read as "made with another train".
- ``primary_quantities = ["selected"]`` (as the GPU configs now name it) with a primary contrast of a task without
  ``select_by`` (or ``["reach"]`` without ``reach``) tested that contrast on nothing, while the page named it primary.
"""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import torch
import torch.distributed as dist

from diffusionformer.experiments import load_experiment_config
from diffusionformer.train.checkpoint import _predated_fields_at_default, model_record, model_record_differences
from diffusionformer.train.distributed import init_distributed
from experiments_tiny_configs import run_gpu_study_stand_in



# ---------------------------------------------------------------------------- init_distributed
@pytest.mark.parametrize("blank", ["", "  "])
def test_bug_a_blank_local_rank_in_a_one_process_group_is_unset(monkeypatch, blank):
    """Bug: a caller's one-process group with ``LOCAL_RANK=""`` was refused ("expected LOCAL_RANK an int >= 0"),
    where ``dist_env`` reads a blank ``LOCAL_RANK`` of one process as unset (the one process never reads it)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        monkeypatch.setenv("LOCAL_RANK", blank)
        ctx = init_distributed("cpu")
        assert (ctx.rank, ctx.world_size, ctx.local_rank, ctx.owns_group) == (0, 1, 0, False)
        monkeypatch.setenv("LOCAL_RANK", "x")  # a malformed one is still named
        with pytest.raises(ValueError, match="got LOCAL_RANK='x'"):
            init_distributed("cpu")
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------------------- checkpoint: predated fields
@dataclasses.dataclass(frozen=True)
class _Sub:
    a: int = 1
    b: tuple = (1, 2)


@dataclasses.dataclass
class _NestedConfig:
    width: int = 4
    sub: _Sub = dataclasses.field(default_factory=_Sub)  # fields added after a run was saved
    frozen: _Sub = _Sub()
    subs: list = dataclasses.field(default_factory=lambda: [_Sub(a=2)])


class _Nested(torch.nn.Module):
    def __init__(self, config: _NestedConfig) -> None:
        super().__init__()
        self.config = config
        self.lin = torch.nn.Linear(config.width, 1)


def test_bug_a_checkpoint_predating_a_nested_dataclass_field_reads_it_at_its_default():
    """Bug: a predated field whose default is a dataclass (a ``default_factory`` or a frozen default) was filled as
    its ``str()``: resuming the same model was refused ("config sub: checkpoint '_Sub(a=1, b=(1, 2))', now {'a': 1,
    'b': [1, 2]}"); it is filled as ``model_record`` writes it."""
    model = _Nested(_NestedConfig())
    saved = model_record(model)
    for name in ("sub", "frozen", "subs"):
        del saved["config"][name]
    assert model_record_differences(_predated_fields_at_default(saved, model), model_record(model)) == []
    other = _Nested(_NestedConfig(sub=_Sub(a=3)))  # a model that set it is another
    assert model_record_differences(_predated_fields_at_default(saved, other), model_record(other)) == [
        "config sub: checkpoint {'a': 1, 'b': [1, 2]}, now {'a': 3, 'b': [1, 2]}"]


# ---------------------------------------------------------------------------- experiments/scripts/gpu_study.sh


@pytest.mark.slow  # the script reads the config in fresh pythons
@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_bug_gpu_study_gives_analyze_the_amp_of_every_task_under_a_task_selection(tmp_path):
    """Bug: with ``--set tasks=[a] --precision fp32`` the ``analyze`` of every task (the selections dropped) got the
    ``train.amp`` of ``a`` only: the runs of ``b`` that an earlier call made with ``--precision fp32`` were read as
    "made with another train (amp ...)". ``status`` keeps the selection and the ``--set`` of its tasks."""
    task = 'dataset = "digits"\nmodel = "vit-digits"\n'
    config = tmp_path / "c.toml"
    config.write_text(f'name = "p"\nseeds = [0]\n[[tasks]]\nname = "a"\n{task}[[tasks]]\nname = "b"\n{task}'
                      '[[operators]]\nname = "o"\nheads = "attention:4"\n')
    done, out = run_gpu_study_stand_in(tmp_path, config, "--set", 'tasks=["a"]', "--precision", "fp32")
    assert done.returncode == 0, done.stderr
    analyze = (out / "analyze.log").read_text().splitlines()
    assert 'tasks.a.train.amp="off"' in analyze and 'tasks.b.train.amp="off"' in analyze
    assert 'tasks=["a"]' not in analyze
    status = (out / "status.md").read_text().splitlines()
    assert 'tasks=["a"]' in status and 'tasks.a.train.amp="off"' in status
    assert 'tasks.b.train.amp="off"' not in status  # a --set of b after the selection would be refused
    # status reads its argv as given: the config loads with it
    sets = [v for k, v in zip(status, status[1:]) if k == "--set"]
    assert [t.name for t in load_experiment_config(config, sets).tasks] == ["a"]


# ---------------------------------------------------------------------------- primary_quantities
def _config(quantities, **task):
    return {"name": "q", "seeds": [0], "primary": ["lap"], "primary_quantities": quantities,
            "operators": [{"name": "attention"}, {"name": "lap", "laplacian_heads": 1}],
            "tasks": [{"name": "t", "dataset": "digits", "model": "vit-digits", **task}]}


@pytest.mark.parametrize("quantity, needs", [("selected", {"select_by": "val_acc"}),
                                             ("reach", {"reach": {"val_acc": 0.5}})])
def test_bug_a_primary_quantity_the_primary_task_lacks_is_refused(quantity, needs):
    """Bug: ``primary_quantities = ["selected"]`` with a primary contrast of a task without ``select_by`` was read:
    the contrast had no selected value, so nothing was tested as primary, while the page named it primary on the
    metric at the best evaluation. It is refused, naming the task and what the quantity needs."""
    with pytest.raises(ValueError, match=rf"primary_quantities \['{quantity}'\]: task\(s\) \['t'\].*none of them"):
        load_experiment_config(_config([quantity]))
    assert load_experiment_config(_config([quantity], **needs)).primary_quantities == [quantity]
    assert load_experiment_config(_config([quantity, "final"])).primary_quantities == [quantity, "final"]
