"""Edge probes, fifth round of leftovers: the items earlier probe rounds found and left.

What was wrong, one test each: ``forward_cached``/``attend_cached`` in training mode with dropout on ``P``
skipped that dropout silently (a training forward that is not one); ``load_run`` said "the run has not saved a
step yet" when ``checkpoint.pt`` is a folder; a blank ``WORLD_SIZE`` (an unset variable exported empty) was
refused by ``dist_env`` although the runner and the rank-zero check read it as one process; ``plan_threads``
named a numpy bool count "bool" ("expected a positive int, got bool", a contradiction to read).
"""

from __future__ import annotations

import json
import os
from unittest import mock

import numpy as np
import pytest
import torch


def test_bug_forward_cached_refuses_training_mode_dropout_on_p():
    """Bug: ``model.forward_cached`` on a model in training mode with attention dropout returned logits with no
    dropout on P (the cached rows of P^k v cannot be drawn again), silently unlike the training forward; it is now
    a ValueError that says to call .eval(). In eval mode, or with dropout 0 in training mode, it decodes as
    before and matches the full forward."""
    from diffusionformer.models import DiffusionGPT, GPTConfig

    torch.manual_seed(0)
    model = DiffusionGPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8, dropout=0.2,
                                   heads="attention:1,laplacian:1"))
    idx = torch.randint(0, 11, (2, 5))
    model.train()
    with pytest.raises(ValueError, match=r"attend_cached: the layer is in training mode with dropout=0\.2 .*"
                                         r"call \.eval\(\) before decoding"):
        model.forward_cached(idx, model.new_cache())
    model.eval()
    cached = model.forward_cached(idx, model.new_cache())
    torch.testing.assert_close(cached, model(idx)[0])
    for block in model.blocks:  # no dropout on P: training mode decodes (residual dropout is drawn per token)
        block.attn.dropout = 0.0
    model.train()
    assert model.forward_cached(idx, model.new_cache()).shape == (2, 5, 11)


def test_bug_load_run_names_a_checkpoint_that_is_a_folder(tmp_path):
    """Bug: ``load_run`` of a run whose ``checkpoint.pt`` is a directory said "got none (the run has not saved a
    step yet)", sending the user to wait for a step; it now says the path is not a file."""
    from diffusionformer.experiments.reload import load_run
    from diffusionformer.models.registry import model_config

    import dataclasses

    cfg = dataclasses.asdict(model_config("gpt-char-tiny", n_layer=1, n_head=2, n_embd=16, block_size=8))
    (tmp_path / "run_config.json").write_text(json.dumps({"model": "gpt-char-tiny", "model_config": cfg}))
    (tmp_path / "checkpoint.pt").mkdir()
    with pytest.raises(FileNotFoundError, match=r"checkpoint\.pt to be a file, got a directory"):
        load_run(tmp_path)
    (tmp_path / "checkpoint.pt").rmdir()
    with pytest.raises(FileNotFoundError, match=r"the run has not saved a step yet"):
        load_run(tmp_path)


@pytest.mark.parametrize("world", ["", "  "])
def test_bug_dist_env_reads_a_blank_world_size_as_one_process(world):
    """Bug: ``dist_env()`` with ``WORLD_SIZE=""`` raised "expected integer RANK, WORLD_SIZE and LOCAL_RANK",
    while the runner's ``_distributed`` and ``_rank_zero`` read a blank value as one process: the same environment
    was single-process to the runner and an error to ``init_distributed``. Blank is now unset everywhere; a
    malformed value is still named."""
    from diffusionformer.train.distributed import dist_env, init_distributed

    with mock.patch.dict(os.environ, {"WORLD_SIZE": world}):
        os.environ.pop("RANK", None)
        assert dist_env() is None
        ctx = init_distributed("cpu")
        assert (ctx.rank, ctx.world_size) == (0, 1)
    with mock.patch.dict(os.environ, {"WORLD_SIZE": "two", "RANK": "0"}):
        with pytest.raises(ValueError, match=r"WORLD_SIZE='two'"):
            dist_env()


def test_bug_plan_threads_names_a_numpy_bool_count_by_its_module():
    """Bug: ``plan_threads(threads=np.True_)`` said "--threads: expected a positive int, got bool" (numpy's bool
    type is named ``bool``): it now names ``numpy.bool``, as the package's flag checks do."""
    from diffusionformer.experiments.threads import plan_threads

    with pytest.raises(TypeError, match=r"^--threads: expected a positive int, got numpy\.bool$"):
        plan_threads(threads=np.True_, cores=4, environ={})
    with pytest.raises(TypeError, match=r"^cores: expected a positive int, got float$"):
        plan_threads(cores=2.0, environ={})


def test_bug_a_config_key_in_other_case_gets_a_did_you_mean():
    """Bug: ``model_config("gpt-char-tiny", N_EMBD=64)`` listed the valid keys with no "did you mean" (difflib is
    case-sensitive and finds "N_EMBD" far from "n_embd"); unknown config keys now get the package's one hint,
    ``config._choice_hint``, which matches case-blind first."""
    from diffusionformer.models.registry import model_config

    with pytest.raises(ValueError, match=r"unknown key 'N_EMBD'; valid keys: \[.*\] \(did you mean 'n_embd'\?\)"):
        model_config("gpt-char-tiny", N_EMBD=64)
    with pytest.raises(ValueError, match=r"unknown key 'n_emdb'; valid keys: \[.*\] \(did you mean 'n_embd'\?\)"):
        model_config("gpt-char-tiny", n_emdb=64)
