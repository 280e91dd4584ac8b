"""Review of two sitting-57 commits: the gap study's primary quantities taken from the config (``gaps``), and
``GraphBlock`` with ``edge_dim`` taking its edges through the graph's ``attention_kwargs``.

Bugs found (each test named ``test_bug_*``):

* ``gaps.primary_table`` on the config's quantities (``primary_quantities = ["final", "selected"]``) tested the best
  val loss as primary on every primary task once one of them had ``select_by``: a task without it, for which the
  config named no selected contrast (``compare`` tests none), got a primary best-val cell inside Holm's family;
* the primary table's legend said every quantity it tested was "named in the config before the runs", also the
  final val loss it falls back to for a reach-only config and quantities ``--primary`` added;
* the note that a reach-only config is tested on ``final_val`` was printed where no primary task has gap rows
  (no primary table);
* ``GraphBlock(x, edge_index, edge_weight)`` (a PyG convolution's third argument) said only "batch must be an integer
  tensor", where the graph transformer says that the third positional argument is batch, not edge weights.

Checked without finding a bug: the mapping final -> final_val, selected -> best_val and its notes (tasks without
rows get none); ``--set primary_quantities=...`` reaches the default; no caller of ``primary_table`` relied on the old
``("final_val",)`` default (``publish`` does not call it; the published study-overfit pages name ``final`` or pass
``--primary``); ``GraphBlock`` with ``edge_dim`` reads no host value once ``checks_values`` is off (3 more CPU reads
per call: the deferred bounds and block-diagonal checks, as the block without ``edge_dim`` runs them).
"""

from __future__ import annotations

import pytest
import torch

from diffusionformer.experiments import gaps
from diffusionformer.experiments.config import ExperimentConfig, OperatorSetting, TaskConfig
from diffusionformer.models import GraphBlock

OPS = [OperatorSetting("attention"), OperatorSetting("lap", laplacian_heads=1)]


def _rows(tasks: list[str]) -> dict:
    """Gap rows of three seeds per task, the setting 'lap' lower than the baseline on every quantity."""
    def q(v: float) -> dict[str, float]:
        return {"final_val": v, "final_gap": v / 4, "final_train": 1.0, "best_val": v - 0.1, "best_gap": v / 5,
                "best_step": 100.0}
    return {t: {"attention": {s: q(2.0 + 0.01 * s) for s in range(3)},
                "lap": {s: q(1.9 + 0.02 * s) for s in range(3)}} for t in tasks}


def _lines(text: str, start: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(start)]


def test_bug_default_selected_quantity_only_on_tasks_with_select_by():
    selects = TaskConfig("a", "pydoc-chars", "gpt-char-tiny", metric="val_loss", select_by="val_loss")
    plain = TaskConfig("b", "pydoc-chars", "gpt-char-tiny", metric="val_loss")
    config = ExperimentConfig("g", [selects, plain], OPS, seeds=[0, 1, 2], primary=["lap"],
                              primary_quantities=["final", "selected"])
    text = gaps.primary_table(config, "unused", rows=_rows(["a", "b"]))
    assert _lines(text, "| a, lap, best val loss")  # the config's selected contrast of a: primary
    assert not _lines(text, "| b, lap, best val loss")  # b has no selected contrast: not primary ...
    assert _lines(text, "| *exploratory:* b, lap, best val loss")  # ... but exploratory, as for final-only configs
    assert "adjusted over the 3 primary cells" in text  # a final, a best, b final: the config's family
    # quantities asked for explicitly are tested on every task, as before
    text = gaps.primary_table(config, "unused", ("final_val", "best_val"), rows=_rows(["a", "b"]))
    assert _lines(text, "| b, lap, best val loss") and "adjusted over the 4 primary cells" in text


def _legend(text: str) -> str:
    return _lines(text, "Named in the config")[0]


def test_bug_legend_names_only_the_configs_quantities_as_named_before_the_runs():
    task = TaskConfig("t", "pydoc-chars", "gpt-char-tiny", metric="val_loss", reach={"val_loss": 2.0})
    reach_only = ExperimentConfig("g", [task], OPS, seeds=[0, 1, 2], primary=["lap"], primary_quantities=["reach"])
    legend = _legend(gaps.primary_table(reach_only, "unused", rows=_rows(["t"])))
    assert "against attention." in legend and "against attention, on the" not in legend  # reach: no gap quantity
    assert "primary_quantities (reach) do not name the final val loss" in legend
    final = ExperimentConfig("g", [task], OPS, seeds=[0, 1, 2], primary=["lap"], primary_quantities=["final"])
    legend = _legend(gaps.primary_table(final, "unused", ("final_val", "final_gap"), rows=_rows(["t"])))
    assert "against attention, on the final val loss." in legend
    assert "primary_quantities (final) do not name the final gap" in legend
    # the config's own quantities: the legend as it was
    legend = _legend(gaps.primary_table(final, "unused", rows=_rows(["t"])))
    assert "against attention, on the final val loss. Δ:" in legend and "do not name" not in legend


@pytest.mark.parametrize("edge_dim", [None, 3])
@pytest.mark.parametrize("num_edges", [6, 5])  # E != N (a shape error) and E == N (a dtype error)
def test_bug_graph_block_edge_weight_passed_third_is_named(edge_dim, num_edges):
    torch.manual_seed(0)
    x, edge_index = torch.randn(5, 8), torch.tensor([[0, 1, 2, 3, 4, 1], [1, 0, 3, 2, 4, 2]])[:, :num_edges]
    block = GraphBlock(8, 2, edge_dim=edge_dim)
    kwargs = {} if edge_dim is None else {"edge_attr": torch.randn(num_edges, 3)}
    with pytest.raises((TypeError, ValueError), match="third positional argument is batch"):
        block(x, edge_index, torch.rand(num_edges), **kwargs)
    # integer graph ids of any integer dtype still work, as the graph takes them
    out = block(x, edge_index[:, :0], torch.zeros(5, dtype=torch.int16), **(
        {} if edge_dim is None else {"edge_attr": torch.randn(0, 3)}))
    assert out.shape == (5, 8)


def test_bug_no_fallback_note_for_primary_tasks_without_rows():
    # the primary contrasts are on a reach-only task with no gap rows (no primary table): the note that they are
    # tested on final_val was printed for a table that is not there; the text task's rows named no primary contrast
    text = TaskConfig("t", "pydoc-chars", "gpt-char-tiny", metric="val_loss")
    reach = TaskConfig("u", "pydoc-chars", "gpt-char-tiny", metric="val_loss", reach={"val_loss": 2.0})
    config = ExperimentConfig("g", [text, reach], OPS, seeds=[0, 1, 2], primary=["u:lap"], primary_quantities=["reach"])
    assert gaps._config_quantities(config, _rows(["t"])) == ((), [])
    assert gaps.primary_table(config, "unused", rows=_rows(["t"])) == ""
    assert "final_val" in gaps._config_quantities(config, _rows(["t", "u"]))[1][0]  # with its rows: noted
