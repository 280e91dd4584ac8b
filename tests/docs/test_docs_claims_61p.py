"""The docs of the day's changes (61p), held against the code: each test names the page or docstring and the claim.

- ``README.md``, ``api/diffusionformer.rst`` and ``experiments.reload``'s module docstring list what
  ``preprocessing.json`` (``run.preprocessing``) holds: for text and graphs a fingerprint of the data too (61i), which
  a resume and ``analyze`` compare (the three lists named only the pixel statistics and the vocabulary).
- ``design.md``'s ``_NEW_MODEL_FIELDS`` item: ``rope_base`` at the model's default stays out of the identity as
  compared, yet a RoPE model's ``run_config.json`` records it since 61j (the item said only that it stays out).
- ``tutorials/experiments.rst``: ``{half}`` in a head spec is ``floor(H/2)``, as ``"half"`` (it said ``H/2``).
- ``design.md``: under an enabled autocast the ``matrix`` back-end multiplies in autocast's dtype, so
  ``ppr(alpha=0.01, steps=200)`` on a causal graph is 13-38x plain attention's error in bfloat16, 8-28x in float16
  (``test_precision_walk_61g`` bounds it from above only: matmuls in float32, about 1.5x, left the page wrong).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import diffusionformer.functional as F
from diffusionformer.experiments import reload

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _words(text: str) -> str:
    return " ".join(text.split())


# ---------------------------------------------------------------------------- what preprocessing.json holds
def test_every_list_of_what_run_preprocessing_holds_names_the_data_fingerprint():
    from torch_geometric.data import Data

    from diffusionformer.data import NodeData, load_dataset

    text = reload._data_preprocessing(load_dataset("pydoc-chars"))
    assert {"itos", "train_tokens", "train_sha256", "val_tokens", "val_sha256"} <= set(text)
    g = torch.Generator().manual_seed(0)
    graph = Data(x=torch.randn(6, 2, generator=g), edge_index=torch.tensor([[0, 1, 2], [1, 2, 3]]),
                 y=torch.arange(6) % 2, train_mask=torch.arange(6) < 4, val_mask=torch.arange(6) == 4,
                 test_mask=torch.arange(6) == 5)
    node = reload._data_preprocessing(NodeData("g61p", graph, num_classes=2, num_features=2))
    assert {"num_nodes", "num_edges", "edge_index_sha256", "x_sha256", "y_sha256", "train_mask_sha256"} <= set(node)

    readme = _words((ROOT / "README.md").read_text(encoding="utf-8"))
    assert ("`run.preprocessing` says how its inputs were prepared (pixel scale and training statistics, or the "
            "vocabulary; for text and graphs also a fingerprint of the data, which a resume and `analyze` compare)"
            ) in readme
    api = _words((DOCS / "api" / "diffusionformer.rst").read_text(encoding="utf-8"))
    assert ("(pixel scale and per-channel statistics, or the vocabulary; for text and graphs also a fingerprint of the "
            "data, which a resume and ``analyze`` compare)") in api
    assert ("(pixel scale and training statistics of images, the vocabulary of text; for text and graphs also a "
            "fingerprint of the data, which a resume and ``analyze`` compare: ``_data_fingerprint``)"
            ) in _words(reload.__doc__)


# ---------------------------------------------------------------------------- rope_base in run_config.json
def test_a_rope_models_run_config_records_its_default_base_read_without_it_as_design_says():
    from diffusionformer.experiments.results import _normalized_identity
    from diffusionformer.experiments.runner import _with_rope_base
    from diffusionformer.models import DiffusionGPT, GPTConfig

    page = _words((DOCS / "design.md").read_text(encoding="utf-8"))
    assert ("it stays out of a run's identity as compared (a RoPE model's `run_config.json` records its `rope_base` "
            "all the same, read without it at its default)") in page
    model = DiffusionGPT(GPTConfig(vocab_size=5, block_size=4, n_layer=1, n_head=1, n_embd=4, rope=True))
    identity = {"model": "gpt-char-tiny", "model_config": {"n_embd": 4, "rope": True}}
    recorded = _with_rope_base(identity, model)  # what the runner writes to run_config.json
    assert recorded["model_config"]["rope_base"] == 10000.0
    assert _normalized_identity(recorded)["model_config"] == {"n_embd": 4, "rope": True}


# ---------------------------------------------------------------------------- {half} is floor(H / 2)
def test_half_template_of_a_head_spec_is_the_floor_of_half_the_heads_as_the_tutorial_says():
    from diffusionformer.nn.heads import format_head_spec

    page = _words((DOCS / "tutorials" / "experiments.rst").read_text(encoding="utf-8"))
    assert "``{half}`` for :math:`\\lfloor H/2 \\rfloor`" in page and "``{half}`` for :math:`H/2`" not in page
    assert format_head_spec("attention:{half},laplacian:{H}", 3) == "attention:1,laplacian:3"
    assert format_head_spec("attention:{half}", 1) == "attention:0"


# ---------------------------------------------------------------------------- matrix back-end under autocast
def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want.double()).abs().max() / want.double().abs().max()).item()


def _errors(coeffs: list, low: torch.dtype) -> list[float]:
    """``diffuse`` on the matrix back-end, causal, under ``low`` autocast: errors of the output and of the gradients of
    ``q, k, v`` against float64 on the same rounded inputs (as ``test_precision_walk_61g``)."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 8).to(low).float() for _ in range(3))
    ref = [t.double().requires_grad_() for t in (q, k, v)]
    want = F.diffuse(*ref, torch.tensor(coeffs, dtype=torch.float64), is_causal=True, backend="matrix")
    grad = torch.randn_like(want)
    want.backward(grad)
    ins = [t.clone().requires_grad_() for t in (q, k, v)]
    with torch.autocast("cpu", dtype=low):
        got = F.diffuse(*ins, torch.tensor(coeffs), is_causal=True, backend="matrix")
    got.backward(grad.to(low))
    return [_rel(got, want)] + [_rel(a.grad, b.grad) for a, b in zip(ins, ref)]


@pytest.mark.parametrize("low, lo, hi", [(torch.bfloat16, 13, 38), (torch.float16, 8, 28)])
def test_matrix_back_end_long_series_under_autocast_is_the_documented_multiple_of_attentions_error(low, lo, hi):
    from diffusionformer.operators import build_operator

    page = _words((DOCS / "design.md").read_text(encoding="utf-8"))
    assert ("`ppr(alpha=0.01, steps=200)` on a causal graph is 13-38x plain attention's error in bfloat16, 8-28x in "
            "float16") in page
    yardstick = _errors([[0.0, 1.0]], low)
    coeffs = build_operator("ppr", alpha=0.01, steps=200).coefficients().detach().tolist()
    ratios = [e / y for e, y in zip(_errors(coeffs, low), yardstick)]
    # the page's range, rounded (bf16 13.2-37.8, fp16 7.7-28.0 on an x86 CPU): an order of magnitude either way
    assert lo - 1 <= min(ratios) and max(ratios) <= hi + 1, ratios
