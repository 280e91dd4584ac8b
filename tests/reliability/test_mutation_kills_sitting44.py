"""Mutation audit (sitting 44, commits a40071f..47b1cb1) of the library code changed that day: tests that kill
mutants the day's tests left alive (each docstring names the mutant). No GPU is used.
"""

from __future__ import annotations

import pytest
import torch


def _path_graph():
    from torch_geometric.data import Data

    return Data(x=torch.arange(5.0).view(5, 1), edge_index=torch.tensor([[1, 2, 3, 4], [0, 0, 1, 2]]), num_nodes=5)


def test_kills_callers_sampler_takes_repeated_input_nodes():
    """kills: data/neighbors.py ``neighbor_loader`` ``own = kwargs.get("neighbor_sampler") is None and (...)`` ->
    ``own = (...)``, and ``_check_loader_seeds(..., distinct=own)`` -> ``distinct=True`` (a caller's own
    ``neighbor_sampler``, used as is, was held to TorchNeighborSampler's distinct-seeds rule: input_nodes that
    repeat a node across batches refused when the loader was built). The batches are checked against the graph's
    in-neighbourhoods (node 0 <- 1, 2; node 1 <- 3)."""
    from diffusionformer.data.neighbors import TorchNeighborSampler, neighbor_loader

    data = _path_graph()
    loader = neighbor_loader(data, [-1], batch_size=1, input_nodes=torch.tensor([0, 0, 1]),
                             neighbor_sampler=TorchNeighborSampler(data, [-1]))
    assert [sorted(b.n_id.tolist()) for b in loader] == [[0, 1, 2], [0, 1, 2], [1, 3]]


def test_kills_neighbor_loader_refuses_a_bool_batch_size():
    """kills: data/neighbors.py ``_check_loader_seeds`` ``isinstance(batch_size, bool) or ...`` dropped
    (``batch_size=True`` taken as 1 seed per batch, as a flag passed in the wrong place would be)."""
    from diffusionformer.data.neighbors import neighbor_loader

    with pytest.raises(ValueError, match=r"neighbor_loader: expected batch_size a positive int .*got bool \(True\)"):
        neighbor_loader(_path_graph(), [-1], batch_size=True, force_torch=True)
    assert [b.batch_size for b in neighbor_loader(_path_graph(), [-1], batch_size=2, force_torch=True)] == [2, 2, 1]


def test_kills_publish_refuses_a_page_alone_whose_name_is_a_twin(tmp_path):
    """kills: experiments/config.py ``_folder_twin`` ``stem = entry.removesuffix(suffix) if suffix else entry`` ->
    ``stem = entry`` (a published page ``Default.md`` whose folder is absent, as in a docs tree that keeps the pages
    only, was no twin of ``default``: publish wrote ``default.md``, the same file on macOS and Windows)."""
    import json

    from diffusionformer.experiments import load_experiment_config
    from diffusionformer.experiments.publish import publish_experiment
    from diffusionformer.experiments.results import RunResult, run_dir

    out = tmp_path / "results"
    rdir = run_dir(out / "default", "a", "attention", 0)
    rdir.mkdir(parents=True)
    record = {"step": 4, "split": "eval", "metrics": {"test_acc": 0.5}}
    (rdir / "metrics.jsonl").write_text(json.dumps(record) + "\n")
    (rdir / "summary.json").write_text(json.dumps({"status": "completed", "eval": record}))
    row = RunResult("a", "attention", 0, "completed", "test_acc", 0.5, {"test_acc": 0.5}, 4, 1.0)
    (out / "default" / "results.json").write_text(json.dumps({"runs": [row.__dict__], "summary": []}))
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Results\n\n```{toctree}\n:maxdepth: 1\n```\n")
    (docs / "Default.md").write_text("the other comparison's page\n")
    cfg = load_experiment_config({"name": "default", "seeds": [0],
                                  "tasks": [{"name": "a", "dataset": "digits", "model": "vit-digits"}],
                                  "operators": [{"name": "attention"}]})
    with pytest.raises(ValueError, match=r"Default\.md'? is published already, and differs from 'default' only"):
        publish_experiment(cfg, out, docs)
    assert sorted(p.name for p in docs.iterdir()) == ["Default.md", "index.md"]
    assert (docs / "Default.md").read_text() == "the other comparison's page\n"


@pytest.mark.parametrize("existing, name", [("study", "\u017ftudy"), ("\u03bcs", "\u00b5s")])
def test_kills_results_twin_by_case_folding_not_lowercasing(tmp_path, existing, name):
    """kills: experiments/config.py ``_folded`` ``.casefold()`` -> ``.lower()`` (a results folder ``study`` was no
    twin of a comparison ``\u017ftudy`` (long s), nor Greek ``\u03bcs`` of ``\u00b5s`` (micro sign), though
    Windows' case-insensitive names compare upper-cased and both upper-case alike: one folder there; ``lower()``
    leaves ``\u017f`` and ``\u00b5`` as they are). Reference: ``str.upper``."""
    import unicodedata

    from diffusionformer.experiments.config import _refuse_results_twin

    assert unicodedata.normalize("NFC", name) != existing and name.upper() == existing.upper()
    (tmp_path / existing).mkdir()
    with pytest.raises(ValueError, match="differs from .* only in case or in Unicode normalization"):
        _refuse_results_twin(tmp_path, name)
    _refuse_results_twin(tmp_path, existing)  # its own folder: no twin


@pytest.mark.parametrize("heads", ["attnscale:2", "neutreno:1,laplacian:1"])
def test_kills_context_heads_dropout_with_matrix_backend(heads):
    """kills: ops/rivals.py ``RivalContext.attend`` (materialised P, ``backend="matrix"``) ``if self.dropout_p > 0.0:
    P = F.dropout(P, ...)`` dropped (context heads of a ``dropout=0.5`` layer ran without attention dropout in
    training). Reference: dropout of the probabilities is unbiased, so the mean of 3000 independent training outputs
    of one input is its eval output, while each differs from it."""
    from diffusionformer.nn.attention import DiffusionAttention

    torch.manual_seed(0)
    layer = DiffusionAttention(8, 2, heads=heads, dropout=0.5, backend="matrix").double()
    x = torch.randn(1, 5, 8, dtype=torch.float64).expand(3000, 5, 8)
    want = layer.eval()(x[:1])[0]
    got = layer.train()(x)
    assert (got - want).abs().amax(dim=(1, 2)).min() > 0.01  # each draw dropped some probabilities
    torch.testing.assert_close(got.mean(0), want, rtol=0, atol=0.03)


def test_kills_elapsed_mean_near_the_float_maximum():
    """kills: experiments/tables.py ``aggregate`` ``"elapsed_mean": (_fmean(...)`` -> ``statistics.fmean(...)``
    (recorded training times near the float maximum, as a damaged summary.json may hold, raised ``OverflowError:
    intermediate overflow in fsum`` and took every table down; their mean is finite). Reference: the mean of the
    values scaled by 1e308, in exact fractions."""
    from fractions import Fraction

    from diffusionformer.experiments.results import RunResult
    from diffusionformer.experiments.tables import aggregate

    times = [1.7e308, 1.6e308, 1.0e308]
    runs = [RunResult("t", "a", s, "completed", "acc", 0.5, elapsed=e) for s, e in enumerate(times)]
    (row,) = aggregate(runs)
    assert row["elapsed_mean"] == pytest.approx(float(sum(map(Fraction, times)) / 3), rel=1e-15)


@pytest.mark.parametrize("bad", ["tuple", "none", "parameters"])
def test_kills_module_type_checks_name_any_non_module(bad):
    """kills: models/common.py ``learned_operator_parameters`` ``not isinstance(model, nn.Module)`` -> ``isinstance(
    model, dict)`` and nn/attention.py ``set_recompute`` ``not isinstance(module, nn.Module)`` -> ``isinstance(module,
    list)`` (a tuple of blocks, ``None`` or a parameter generator still raised a bare AttributeError)."""
    from diffusionformer.models.common import learned_operator_parameters
    from diffusionformer.nn import Block, set_recompute

    block = Block(8, 2, heads="attention:1,laplacian:1")
    value = {"tuple": (block,), "none": None, "parameters": block.parameters()}[bad]
    name = type(value).__name__
    with pytest.raises(TypeError, match=rf"^set_recompute: expected module to be an nn\.Module, got {name}$"):
        set_recompute(value)
    with pytest.raises(TypeError,
                       match=rf"^learned_operator_parameters: expected model to be an nn\.Module, got {name}$"):
        learned_operator_parameters(value)
    assert set_recompute(block) == 1


def test_kills_meta_built_layer_loaded_under_inference_mode_trains():
    """kills: operators/base.py ``_materialise_caches`` and operators/polynomial.py ``_materialise_caches`` ``with
    torch.inference_mode(False):`` dropped (a layer built on the meta device and given its checkpoint by
    ``load_state_dict(..., assign=True)`` inside ``torch.inference_mode()`` rebuilt the fixed coefficients ``_c``
    and the Chebyshev basis as inference tensors: a later training step failed). Reference: the same layer built
    on the CPU, float64, exact."""
    import copy

    from diffusionformer.nn import DiffusionAttention

    torch.manual_seed(0)
    spec = "polynomial(steps=3, basis='chebyshev'):1,laplacian:1"
    fresh = DiffusionAttention(8, 2, heads=spec).double()
    state = copy.deepcopy(fresh.state_dict())
    with torch.device("meta"):
        layer = DiffusionAttention(8, 2, heads=spec)
    with torch.inference_mode():
        layer.load_state_dict(state, assign=True)
    caches = [getattr(op, n) for op in layer.operators for n in ("_c", "_basis") if hasattr(op, n)]
    assert len(caches) == 2 and not any(t.is_inference() or t.is_meta for t in caches)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    y = layer(x)
    y.square().sum().backward()  # raised "Inference tensors cannot be saved for backward"
    y_ref = fresh(x)
    y_ref.square().sum().backward()
    assert torch.equal(y, y_ref)
    for (name, p), p_ref in zip(layer.named_parameters(), fresh.parameters()):
        assert torch.equal(p.grad, p_ref.grad), name


def test_kills_compiled_mixed_heads_call_no_cache_of_ours():
    """kills: ops/engine.py ``_cache`` ``fn(*args) if uncached() else cached(*args)`` -> ``cached(*args)`` (dynamo
    warned "Dynamo detected a call to a `functools.lru_cache`-wrapped function at 'engine.py:...'" at each of the
    engine's cached helpers, an error under ``-W error``). Only warnings naming a file of the package count here
    (torch's own, e.g. typing.py's cache, are not ours); the compiled output is the eager one."""
    import re
    import warnings
    from pathlib import Path

    import diffusionformer
    from diffusionformer.models import DiffusionGPT, GPTConfig

    ours = {p.name for p in Path(diffusionformer.__file__).parent.rglob("*.py")}
    torch.manual_seed(0)
    idx = torch.randint(0, 11, (2, 8))
    model = DiffusionGPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16, laplacian_heads=1))
    model.eval()
    torch._dynamo.reset()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = torch.compile(model)(idx, idx)[0]
    finally:
        torch._dynamo.reset()
    sites = [m.group(1) for w in caught
             for m in [re.search(r"lru_cache`-wrapped function at '([^':]+):\d+'", str(w.message))] if m]
    assert [s for s in sites if s in ours] == [], sites
    torch.testing.assert_close(out, model(idx, idx)[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("runs", [((1, 2, 0.3, 0.7),), ((0, 1, -0.5, 2.0), (2, 3, 0.25, 0.5)), ((3, 4, 0.1, 0.9),)])
def test_kills_affine_heads_batched_backward_keeps_trailing_heads(runs):
    """kills: ops/engine.py ``_affine_heads_backward_stock`` ``for ... in (*runs, (H, H, 0.0, 1.0))`` -> ``for ...
    in runs`` (heads after the last run, where ``out = y``, were dropped from the batched gradients: a shape error
    or gradients of the wrong heads). Reference: the explicit derivatives of ``out = y`` off the runs and
    ``out = c0 v + c1 y`` on them, for each of a batch of output gradients."""
    from diffusionformer.ops.engine import AffineHeads

    g = torch.Generator().manual_seed(0)
    y = torch.randn(3, 4, 2, dtype=torch.float64, generator=g, requires_grad=True)
    v = torch.randn(3, 4, 2, dtype=torch.float64, generator=g, requires_grad=True)
    grads = torch.randn(5, 3, 4, 2, dtype=torch.float64, generator=g)
    out = AffineHeads.apply(y, v, runs)
    dy, dv = torch.autograd.grad(out, (y, v), grads, is_grads_batched=True)
    want_dy, want_dv = grads.clone(), torch.zeros_like(grads)
    for start, stop, c0, c1 in runs:
        want_dy[..., start:stop, :] = grads[..., start:stop, :] * c1
        want_dv[..., start:stop, :] = grads[..., start:stop, :] * c0
    torch.testing.assert_close(dy, want_dy, rtol=0, atol=0)
    torch.testing.assert_close(dv, want_dv, rtol=0, atol=0)


@pytest.mark.parametrize("payload", [[("step", 3)], "ab", 3])
def test_kills_save_checkpoint_refuses_any_non_mapping(tmp_path, payload):
    """kills: train/checkpoint.py ``save_checkpoint`` ``not isinstance(payload, Mapping)`` -> ``payload is None``
    (a list of pairs was saved silently as a dict, a str or an int failed in ``dict(payload)`` after the folder was
    made); the documented payload is a mapping, and nothing is written otherwise."""
    from diffusionformer.train.checkpoint import save_checkpoint

    target = tmp_path / "sub" / "ckpt.pt"
    with pytest.raises(TypeError, match=rf"^save_checkpoint: expected payload to be a mapping .*got "
                                        rf"{type(payload).__name__}$"):
        save_checkpoint(target, payload)
    assert not target.parent.exists()


def test_kills_csr_construction_silences_the_invariants_warning(monkeypatch):
    """kills: ops/csr.py ``_quiet_csr`` ``warnings.filterwarnings("ignore", message=_CSR_INVARIANTS)`` dropped
    (torch 2.11 warns once "Sparse invariant checks are implicitly disabled" though ``check_invariants=False`` is
    passed: an error under ``python -W error``). torch 2.11's warning is simulated around the real constructor
    (this torch may not give it); the matrix equals the dense reference, and other warnings still pass through."""
    import warnings

    from diffusionformer.ops import csr

    real = torch.sparse_csr_tensor

    def warns_like_torch_2_11(*args, **kwargs):
        warnings.warn("Sparse invariant checks are implicitly disabled. Memory errors (e.g. SEGFAULT) will occur "
                      "when operating on a sparse tensor which violates the invariants", UserWarning)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "sparse_csr_tensor", warns_like_torch_2_11)
    crow, col, values = torch.tensor([0, 1, 3]), torch.tensor([1, 0, 1]), torch.tensor([2.0, 3.0, 4.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = csr._quiet_csr(crow, col, values, (2, 2))
    assert torch.equal(out.to_dense(), torch.tensor([[0.0, 2.0], [3.0, 4.0]]))

    def warns_other(*args, **kwargs):
        warnings.warn("some other sparse warning", UserWarning)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "sparse_csr_tensor", warns_other)
    with pytest.warns(UserWarning, match="some other sparse warning"):
        csr._quiet_csr(crow, col, values, (2, 2))


def test_kills_tensor_cache_bypassed_under_a_dispatch_mode():
    """kills: ops/engine.py ``_tensors_traced`` ``... or is_in_torch_dispatch_mode()`` dropped (a coefficient table
    built under a dispatch mode, e.g. ``FakeTensorMode`` while a model is traced for export, was cached: the next
    eager call got the fake tensor back). Reference: the rows themselves."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    from diffusionformer.ops.engine import static_tensor

    rows = ((0.125, 0.375, -2.5), (1.0, 0.0, 0.0))  # a layout no other test builds
    cpu = torch.device("cpu")
    with FakeTensorMode():
        fake = static_tensor(rows, cpu, torch.float32)
    assert isinstance(fake, FakeTensor)
    real = static_tensor(rows, cpu, torch.float32)
    assert not isinstance(real, FakeTensor)
    assert torch.equal(real, torch.tensor(rows, dtype=torch.float32))


def _flip_a_data_byte(path) -> None:
    """Flip one byte inside the largest member's stored bytes of the zip ``path`` (the zip stays readable: only
    that member's CRC-32 fails)."""
    import struct
    import zipfile

    with zipfile.ZipFile(path) as archive:
        info = max(archive.infolist(), key=lambda i: i.compress_size)
    data = bytearray(path.read_bytes())
    name_len, extra_len = struct.unpack("<HH", data[info.header_offset + 26:info.header_offset + 30])
    at = info.header_offset + 30 + name_len + extra_len + info.compress_size // 2
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def test_kills_crc_refused_cache_warning_names_the_users_line(tmp_path, monkeypatch):
    """kills: data/paths.py ``load_cached`` (a member failing its CRC-32) ``stacklevel=user_stacklevel()`` ->
    ``stacklevel=2`` (the warning named the loader's line in diffusionformer/data/cifar10.py, not the user's
    ``load_dataset(...)``; the day's test damaged the files past reading, the other branch). The rebuilt data
    equal the first load's."""
    import importlib.util
    import sys
    import warnings
    from pathlib import Path

    pytest.importorskip("PIL", reason="Pillow decodes the JPEG archives")
    from diffusionformer.data import load_dataset

    name = "diffusionformer_tests_data_writers"
    if name not in sys.modules:
        writers = Path(__file__).resolve().parents[1] / "data" / "data_writers.py"
        spec = importlib.util.spec_from_file_location(name, writers)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    w = sys.modules[name]
    w.write_image_zip(tmp_path / "cifar10_jpg" / "train.zip", "train", per_class=2)
    w.write_image_zip(tmp_path / "cifar10_jpg" / "test.zip", "test", per_class=2)
    cache = tmp_path / "cache"
    monkeypatch.setenv("DIFFUSIONFORMER_CACHE", str(cache))
    opts = dict(root=tmp_path, verify=False, normalize=False, val_size=2, source="jpg")
    first = load_dataset("cifar10", **opts)
    files = sorted((cache / "cifar10").glob("*.pt"))
    assert len(files) == 2
    for f in files:
        _flip_a_data_byte(f)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = load_dataset("cifar10", **opts)
    refused = [w for w in caught if "cached file refused" in str(w.message)]
    assert len(refused) == 2 and all("fails its CRC-32 check" in str(w.message) for w in refused)
    assert [(w.category, w.filename) for w in refused] == [(UserWarning, __file__)] * 2
    assert torch.equal(first.x_test, again.x_test) and torch.equal(first.x_train, again.x_train)


def test_kills_neighbor_loader_checks_list_input_nodes_when_built():
    """kills: data/neighbors.py ``_check_loader_seeds`` ``if isinstance(seeds, (list, tuple, range)):`` (read as a
    tensor) -> ``if False:`` (a list, tuple or range of seed ids past the graph was accepted when the loader was
    built, and failed only at the batch that held it)."""
    from diffusionformer.data.neighbors import neighbor_loader

    for seeds in ([0, 5], (5,), range(3, 7)):
        with pytest.raises(ValueError, match=r"neighbor_loader: input_nodes ids must lie in \[0, num_nodes=5\)"):
            neighbor_loader(_path_graph(), [-1], batch_size=2, input_nodes=seeds, force_torch=True)
    loader = neighbor_loader(_path_graph(), [-1], batch_size=2, input_nodes=range(3, 5), force_torch=True)
    assert [b.n_id[:b.batch_size].tolist() for b in loader] == [[3, 4]]


@pytest.mark.parametrize("batch_size", ["2", None, [2]])
def test_kills_neighbor_loader_batch_size_of_no_number_is_a_type_error(batch_size):
    """kills: data/neighbors.py ``_check_loader_seeds`` ``if not isinstance(batch_size, numbers.Real):`` (a
    TypeError) -> ``if batch_size is None:`` (a string or a list was reported as a ValueError, a wrong value of
    the right type, unlike every other argument check of the library)."""
    from diffusionformer.data.neighbors import neighbor_loader

    with pytest.raises(TypeError, match=r"neighbor_loader: expected batch_size a positive int"):
        neighbor_loader(_path_graph(), [-1], batch_size=batch_size, force_torch=True)


def test_kills_check_experiment_minibatch_warning_names_the_users_line():
    """kills: experiments/validate.py ``_check_minibatch`` ``stacklevel=user_stacklevel()`` -> ``stacklevel=3``
    (the warning for fewer sampled hops than the model propagates named a line of the package for one of
    ``validate_experiment`` / ``check_experiment``, not the user's call)."""
    import warnings

    from diffusionformer.experiments.config import load_experiment_config
    from diffusionformer.experiments.validate import check_experiment, validate_experiment

    cfg = load_experiment_config({"name": "x", "seeds": [0], "operators": [{"name": "attention"}],
                                  "tasks": [{"name": "k", "dataset": "karate", "model": "graph-node-small",
                                             "model_overrides": {"depth": 2},
                                             "minibatch": {"batch_size": 4, "num_neighbors": [3]}}]})
    for call in (lambda: validate_experiment(cfg), lambda: check_experiment(cfg)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call()
        hops = [w for w in caught if "minibatch." in str(w.message)]
        assert [(w.category, w.filename) for w in hops] == [(UserWarning, __file__)], [str(w.message) for w in caught]
