"""Edge probes of the public testing utilities, third pass: the harness's problem sizes and dtypes, checkpoint
comparison of sparse, quantized and oddly keyed state dicts, graph edge cases and the documented names."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import diffusionformer.testing as testing
from diffusionformer.testing import (assert_operator, assert_same_checkpoint_weights, causal_edge_index,
                                     complete_edge_index, dense_allowed_from_edges, interrupt_on_call)

_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("arg, value, exc", [("num_nodes", 0, ValueError), ("batch", 0, ValueError),
                                             ("head_dim", 0, ValueError), ("num_nodes", True, TypeError),
                                             ("batch", 2.0, TypeError)])
def test_bug_assert_operator_checks_its_problem_sizes(arg, value, exc):
    """Bug: ``assert_operator`` passed its sizes on unchecked: ``num_nodes=0`` crashed with ``IndexError: amax():
    Expected reduction dim -1 to have non-zero size``, ``batch=0`` with an ``IndexError``, ``head_dim=0`` with
    ``ZeroDivisionError``, and ``num_nodes=True`` was reported as ``N must be an int``."""
    with pytest.raises(exc, match=f"^{arg} must be"):
        assert_operator("heat", **{arg: value})


def test_bug_assert_operator_refuses_a_dtype_it_has_no_tolerances_for():
    """Bug: any dtype other than float64 got float32's default tolerances, so every operator "failed" in half
    precision (``max abs difference 4.056e-04 exceeds atol=2e-05``), blaming a correct operator; a string dtype was
    read by ``Module.to`` as a device (``Invalid device string: 'float32'``)."""
    with pytest.raises(ValueError, match=r"dtype=torch.float16: .*pass atol and rtol"):
        assert_operator("heat", dtype=torch.float16)
    with pytest.raises(ValueError, match=r"dtype=torch.bfloat16"):
        assert_operator("heat", dtype=torch.bfloat16, atol=1e-2)
    with pytest.raises(TypeError, match=r"dtype must be a floating torch.dtype, got 'float32'"):
        assert_operator("heat", dtype="float32")
    with pytest.raises(TypeError, match=r"got torch.int64"):
        assert_operator("heat", dtype=torch.int64)
    assert_operator("heat", dtype=torch.float16, atol=5e-2, rtol=5e-2)  # with tolerances of its own it runs


def test_the_float32_harness_flags_a_real_mismatch_and_passes_an_exact_operator():
    """Tolerance per dtype: a resolvent off by a relative 1e-3 fails in float32 with the default tolerances."""
    from diffusionformer.operators import DiffusionOperator

    class _Off(DiffusionOperator):  # the polynomial (I + P) / 2, whose matrix hook is off by a relative 1e-3
        name = "off_probe_third"
        degree = 1

        def coefficients(self) -> torch.Tensor:
            return torch.tensor([0.5, 0.5])

        def apply_matrix(self, P, v):
            return (v + P @ v) / 2 * (1 + 1e-3)

    with pytest.raises(AssertionError, match=r"apply_matrix\(P, v\).*exceeds atol=2e-05"):
        assert_operator(_Off(), dtype=torch.float32)
    assert_operator("heat", dtype=torch.float32)


def _save(path: Path, model: dict) -> Path:
    torch.save({"model": model}, path)
    return path


@pytest.mark.parametrize("to_sparse", [torch.Tensor.to_sparse, torch.Tensor.to_sparse_csr])
def test_bug_same_checkpoint_weights_compares_sparse_tensors(tmp_path, to_sparse):
    """Bug: a sparse tensor in a state dict (a registered sparse buffer) made ``assert_same_checkpoint_weights``
    crash with ``RuntimeError: unsupported memory format option Contiguous``, even on two identical files."""
    eye = torch.eye(3)
    a = _save(tmp_path / "a.pt", {"adj": to_sparse(eye)})
    same = _save(tmp_path / "same.pt", {"adj": to_sparse(eye.clone())})
    other = _save(tmp_path / "other.pt", {"adj": to_sparse(2 * eye)})
    dense = _save(tmp_path / "dense.pt", {"adj": eye})
    assert_same_checkpoint_weights(a, same)
    for b in (other, dense):
        with pytest.raises(AssertionError, match=r"1 of 1 tensors differ.*\['adj'\]"):
            assert_same_checkpoint_weights(a, b)


def test_bug_same_checkpoint_weights_compares_quantized_tensors(tmp_path):
    """Bug: a quantized tensor in a state dict crashed the interpreter (a segmentation fault in ``torch.equal`` of
    its byte view) instead of being compared; a different scale is now a difference. Run in a fresh interpreter:
    a crash there is a failure here, not the end of the test session."""
    if not hasattr(torch, "quantize_per_tensor"):
        pytest.skip("this torch has no quantized tensors")
    script = textwrap.dedent(f"""
        import warnings
        warnings.simplefilter("ignore")
        import torch
        from diffusionformer.testing import assert_same_checkpoint_weights
        d = {str(tmp_path)!r}
        x = torch.linspace(-1, 1, 6).view(2, 3)
        torch.save({{"model": {{"w": torch.quantize_per_tensor(x, 0.1, 0, torch.qint8)}}}}, d + "/a.pt")
        torch.save({{"model": {{"w": torch.quantize_per_tensor(x, 0.1, 0, torch.qint8)}}}}, d + "/b.pt")
        torch.save({{"model": {{"w": torch.quantize_per_tensor(x, 0.2, 0, torch.qint8)}}}}, d + "/c.pt")
        s = torch.tensor([0.1, 0.2], dtype=torch.double)
        z = torch.zeros(2, dtype=torch.long)
        torch.save({{"model": {{"w": torch.quantize_per_channel(x, s, z, 0, torch.qint8)}}}}, d + "/p.pt")
        torch.save({{"model": {{"w": torch.quantize_per_channel(x, s * 2, z, 0, torch.qint8)}}}}, d + "/q.pt")
        assert_same_checkpoint_weights(d + "/a.pt", d + "/b.pt")
        assert_same_checkpoint_weights(d + "/p.pt", d + "/p.pt")
        for u, v in (("a", "c"), ("p", "q"), ("a", "p")):
            try:
                assert_same_checkpoint_weights(d + f"/{{u}}.pt", d + f"/{{v}}.pt")
            except AssertionError:
                continue
            raise SystemExit(f"{{u}} and {{v}} compared equal")
        print("compared")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=_ROOT,
                          env={"PYTHONPATH": str(_ROOT), "OMP_NUM_THREADS": "1", "PATH": ""})
    assert proc.returncode == 0 and "compared" in proc.stdout, (proc.returncode, proc.stdout, proc.stderr[-2000:])


def test_bug_same_checkpoint_weights_reports_non_str_keys(tmp_path):
    """Bug: when the entries held different keys and some were not strings (``{1: ..., "x": ...}``), building the
    message ran ``sorted`` over mixed types and raised ``TypeError: '<' not supported between instances of 'int'
    and 'str'`` instead of the ``AssertionError`` naming the keys."""
    a = _save(tmp_path / "a.pt", {1: torch.ones(1), "x": torch.ones(1), "w": torch.ones(1)})
    b = _save(tmp_path / "b.pt", {"w": torch.ones(1)})
    with pytest.raises(AssertionError, match=r"only in .*a\.pt: \[1, 'x'\], only in .*b\.pt: \[\]"):
        assert_same_checkpoint_weights(a, b)


def test_interrupt_on_call_restores_the_method_when_the_original_raises():
    class _Task:
        def loss(self, x):
            raise ValueError(f"own failure {x}")

    original = vars(_Task)["loss"]
    with pytest.raises(ValueError, match="own failure 1"):
        with interrupt_on_call(_Task, "loss", 1, after=True):
            _Task().loss(1)  # the original runs first and raises its own error, not the kill
    assert vars(_Task)["loss"] is original


@pytest.mark.parametrize("n", [0, 1, 2, 5])
def test_tiny_graphs_have_the_promised_edges(n):
    full = complete_edge_index(n)
    assert full.shape == (2, n * n) and full.dtype == torch.int64
    assert dense_allowed_from_edges(full, n).all()
    loopless = complete_edge_index(n, self_loops=False)
    assert loopless.shape == (2, n * (n - 1)) and not (loopless[0] == loopless[1]).any()
    causal = causal_edge_index(n)
    assert torch.equal(dense_allowed_from_edges(causal, n), torch.ones(n, n, dtype=torch.bool).tril())


def test_documented_testing_names_match_the_exports():
    text = (_ROOT / "docs" / "api" / "testing.rst").read_text()
    documented = set(re.findall(r"^   ([a-z_]+)$", text, flags=re.M))
    assert documented == set(testing.__all__)
    assert all(callable(getattr(testing, name)) for name in testing.__all__)
