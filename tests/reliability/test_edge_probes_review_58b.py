"""Review probes of sitting 58's newcomer walk (``status`` in seconds, the class-token hint, ``load_run``'s listing).

Found and fixed (tests named ``test_bug_...``):

- ``status`` with exactly 30 s of training left said "about 0 min" (``f"{0.5:.0f}"`` rounds half to even, to 0),
  the very message "less than a minute" replaced: 30 s is less than a minute too.
- A causal dense graph given one token more than its length (a GPT's ``block_size + 1`` tokens, the inputs not
  shifted from the targets) was told "a class token? ... grid(h, w, cls_token=True)": no grid builds a causal graph.
- ``load_run`` of a seed not run listed the seeds there in string order, ``seed0, seed1, seed10, seed11, seed2, ...``
  (cut at 8): the seeds are now listed in numeric order.
"""

from __future__ import annotations

import pytest
import torch

from diffusionformer.experiments import load_run
from diffusionformer.experiments.tables import format_status
from diffusionformer.graph import AttentionGraph


def test_bug_status_of_exactly_30_seconds_left_is_not_about_0_min():
    # one finished run of 4 steps in 30 s, made with another train config: 30 s of training to redo
    row = dict(task="t", operator="att", seed=0, state="completed", step=4, max_steps=4, elapsed=30.0, holder=None,
               changed="train (max_steps: 2 then 4)")
    head = format_status([row]).split("\n")[0]
    assert head == "0 of 1 runs completed; less than a minute of training left on one worker.", head
    row["elapsed"] = 90.0  # 90 s: about 2 min, as before
    assert format_status([row]).startswith("0 of 1 runs completed; about 2 min of training left")


def test_bug_a_causal_graph_one_token_short_names_no_class_token():
    with pytest.raises(ValueError, match=r"expects x of shape \(B, N=8, D\), got \(2, 9, 4\)$"):
        AttentionGraph.dense(8, causal=True).attention_kwargs(torch.zeros(2, 9, 4))
    with pytest.raises(ValueError, match=r"got \(2, 9, 4\) \(one token more than N=8: a class token\?"):
        AttentionGraph.dense(8).attention_kwargs(torch.zeros(2, 9, 4))  # not causal: the hint stays


def test_bug_load_run_of_a_seed_not_run_lists_the_seeds_in_numeric_order(tmp_path):
    setting = tmp_path / "results" / "h" / "runs" / "digits" / "attention"
    for seed in range(12):
        (setting / f"seed{seed}").mkdir(parents=True)
    with pytest.raises(FileNotFoundError) as info:
        load_run(setting / "seed12")
    assert str(info.value).endswith(f"(no 'seed12' in {setting}; it holds seed0, seed1, seed2, seed3, seed4, seed5, "
                                    "seed6, seed7 ...)"), str(info.value)
