"""Edge probes of a newcomer's walk through the README and the tutorials (sitting 58): the commands and snippets as
shown, then the next thing a new user types after each of them (a misspelt config path, an operator handed to
``diffuse`` where the quickstart hands it the operator's coefficients)."""

from __future__ import annotations

import pytest
import torch

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.cli import main
from diffusionformer.functional import diffuse, diffuse_sparse
from diffusionformer.operators import build_operator
from experiments_tiny_configs import TINY_DIGITS_TOML


@pytest.mark.parametrize("typed", ["defualt.toml", "default", "Default.toml"])
def test_bug_misspelt_config_path_suggests_the_config_beside_it(tmp_path, typed):
    """Bug: ``show experiments/configs/defualt.toml`` (or ``.../default`` without the suffix) said only
    ``experiment config '...' not found``, though ``default.toml`` sat in that folder; every other name a command reads
    (command, task, operator setting, key, dataset, preset) gets a "did you mean"."""
    (tmp_path / "default.toml").write_text(TINY_DIGITS_TOML)
    (tmp_path / "study_text.toml").write_text(TINY_DIGITS_TOML)
    expected = str(tmp_path / "default.toml")
    with pytest.raises(FileNotFoundError) as info:
        load_experiment_config(tmp_path / typed)
    assert str(info.value) == f"experiment config {str(tmp_path / typed)!r} not found (did you mean {expected!r}?)"


def test_bug_misspelt_config_path_on_the_command_line_names_the_config(tmp_path, capsys):
    (tmp_path / "default.toml").write_text(TINY_DIGITS_TOML)
    assert main(["show", str(tmp_path / "defualt.toml")]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: experiment config {str(tmp_path / 'defualt.toml')!r} not found "
                   f"(did you mean {str(tmp_path / 'default.toml')!r}?)\n")


def test_config_path_with_nothing_close_or_no_folder_stays_plain_not_found(tmp_path):
    (tmp_path / "default.toml").write_text(TINY_DIGITS_TOML)
    for path in (tmp_path / "xyz.toml", tmp_path / "missing" / "default.toml"):
        with pytest.raises(FileNotFoundError) as info:
            load_experiment_config(path)
        assert str(info.value) == f"experiment config {str(path)!r} not found"


def _qkv():
    return torch.randn(3, 2, 4, 6, 8).unbind(0)  # (B, H, N, C) each


@pytest.mark.parametrize("op", ["heat", "laplacian", "ppr"])
def test_bug_diffuse_given_an_operator_says_to_pass_its_coefficients(op):
    """Bug: the quickstart passes ``build_operator("heat", ...).coefficients()`` to ``diffuse``; passing the operator
    itself (the obvious next try) said only ``coeffs must be a tensor ... got HeatOperator``, not how to get one."""
    q, k, v = _qkv()
    operator = build_operator(op)
    with pytest.raises(TypeError, match=r"got \w+Operator \(an operator: pass its \.coefficients\(\)\)$"):
        diffuse(q, k, v, operator)
    edge_index = torch.tensor([[0, 1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 0]])
    with pytest.raises(TypeError, match=r"\(an operator: pass its \.coefficients\(\)\)$"):
        diffuse_sparse(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), edge_index, operator)
    # the hint is right: what it names is accepted
    assert diffuse(q, k, v, operator.coefficients()).shape == v.shape


def test_bug_diffuse_given_an_operator_name_says_how_to_build_its_coefficients():
    q, k, v = _qkv()
    with pytest.raises(TypeError) as info:
        diffuse(q, k, v, "laplacian")
    assert str(info.value) == ("coeffs must be a tensor of shape (K+1,) or (H, K+1), got str "
                               "(an operator's coefficients are build_operator(name).coefficients())")
    with pytest.raises(TypeError) as info:
        diffuse(q, k, v, 1.0)  # neither: the message as before
    assert str(info.value) == "coeffs must be a tensor of shape (K+1,) or (H, K+1), got float"


@pytest.mark.parametrize("backend", ["matrix", "sdpa"])
@pytest.mark.parametrize("static", [False, True])
def test_bug_one_row_of_coefficients_is_shared_by_every_head(backend, static):
    """Bug: ``build_operator("polynomial").coefficients()`` is ``(1, K+1)`` (heat's, ppr's are ``(K+1,)``); ``diffuse``
    with H=4 refused it ("coeffs has 1 rows but the inputs have H=4") though its docs say "one row shared by all
    heads". One row is now broadcast to every head, as torch broadcasting reads it; checked against an explicit
    float64 sum of powers of P."""
    from diffusionformer.functional import diffuse
    from diffusionformer.operators import build_operator

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 5, 3, generator=g, dtype=torch.float64) for _ in range(3))
    row = build_operator("polynomial", steps=2, init=[0.5, -0.25, 0.75]).coefficients().detach()
    assert row.shape == (1, 3)
    coeffs = [row[0].tolist()] if static else row
    out = diffuse(q, k, v, coeffs, backend=backend)
    P = torch.softmax(q @ k.transpose(-1, -2) / 3 ** 0.5, dim=-1)
    ref = sum(c * torch.linalg.matrix_power(P, i) @ v for i, c in enumerate(row[0].tolist()))
    torch.testing.assert_close(out, ref)
    with pytest.raises(ValueError, match="has 2 rows but the inputs have H=4"):
        diffuse(q, k, v, row.expand(2, -1).tolist() if static else row.expand(2, -1), backend=backend)
