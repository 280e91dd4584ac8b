"""Edge probes: module-level mutable state and re-entrancy (threads, nested contexts, registries).

Threads only (no forks): a user serves models from several Python threads in one process.
"""

from __future__ import annotations

import threading
import warnings

import pytest
import torch

from diffusionformer.functional import diffuse_sparse


def _sparse_call() -> torch.Tensor:
    q = torch.randn(5, 2, 4, dtype=torch.float64)
    edge_index = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])
    return diffuse_sparse(q, q, q, edge_index, [0.0, 1.0], backend="csr")


def _warn_here() -> None:
    warnings.warn("a warning shown once per location", UserWarning)


def test_bug_sparse_call_does_not_reset_the_once_per_location_warning_registries():
    """Bug: every CSR sparse call (``ops.csr._csr``) entered ``warnings.catch_warnings()``, which marks the
    process's warning filters as changed: each module's "already shown" registry was cleared, so a warning of the
    user's that Python shows once per location (the ``"default"`` action) came back after every sparse call, i.e.
    at every training step of a graph model."""
    _sparse_call()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("default")
        _warn_here()
        _sparse_call()
        _warn_here()
        _sparse_call()
        _warn_here()
    assert [str(w.message) for w in rec] == ["a warning shown once per location"]


def test_bug_sparse_call_in_a_thread_does_not_drop_another_threads_warning_filter(monkeypatch):
    """Bug: ``catch_warnings`` in the sparse hot path saves the process-wide filter list on entry and puts it back
    on exit; a filter another thread installed meanwhile (``warnings.simplefilter("error", ...)`` in the serving
    thread) was silently discarded when the sparse call of a worker thread returned."""
    _sparse_call()
    inside, release = threading.Event(), threading.Event()
    real = torch.sparse_csr_tensor

    def paused(*args, **kwargs):  # stands still while the worker thread builds its CSR matrix
        if threading.current_thread().name == "sparse-worker" and not inside.is_set():
            inside.set()
            release.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "sparse_csr_tensor", paused)

    class _Mine(UserWarning):
        pass

    errors: list[BaseException] = []

    def work() -> None:
        try:
            _sparse_call()
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    with warnings.catch_warnings():
        worker = threading.Thread(target=work, name="sparse-worker")
        worker.start()
        assert inside.wait(30)
        warnings.simplefilter("error", _Mine)  # the main thread's filter, set while the worker is inside its call
        release.set()
        worker.join(30)
        assert not errors
        with pytest.raises(_Mine):
            warnings.warn("mine", _Mine)


def test_bug_load_run_of_a_float64_run_leaves_other_threads_default_dtype_alone(tmp_path, run_folder, monkeypatch):
    """Bug: ``load_run`` of a float64 run built its model under ``torch.set_default_dtype(torch.float64)``. The default
    dtype is one for the whole process, not per thread: while a loader thread built the model, the serving thread's
    ``torch.zeros(...)`` (and models, and the graph transformer's edge weights) came out float64; two loads at once
    could restore each other's default and leave the process at float64. The model is now built once and cast."""
    import dataclasses
    import queue

    from diffusionformer.experiments import load_run
    from diffusionformer.models import registry

    torch.set_default_dtype(torch.float64)
    try:
        rdir, model64 = run_folder(tmp_path / "f64", dim=8, heads="attention:1,heat(t=0.5):1")
    finally:
        torch.set_default_dtype(torch.float32)
    preset = registry.get_preset("vit-digits")
    arrived: queue.Queue = queue.Queue()
    proceed: queue.Queue = queue.Queue()

    def pausing(config):  # the loader thread stands still in each model construction
        arrived.put(None)
        proceed.get(timeout=60)
        return preset.model_cls(config)

    monkeypatch.setitem(registry._PRESETS, "vit-digits", dataclasses.replace(preset, model_cls=pausing))
    loaded: list = []
    loader = threading.Thread(target=lambda: loaded.append(load_run(rdir)))
    loader.start()
    seen = []  # the default dtype this (serving) thread sees while the loader builds
    while loader.is_alive() or not arrived.empty():
        try:
            arrived.get(timeout=0.05)
        except queue.Empty:
            continue
        seen.append(torch.zeros(1).dtype)
        proceed.put(None)
    loader.join()
    assert seen and set(seen) == {torch.float32}
    assert torch.get_default_dtype() == torch.float32
    run = loaded[0]
    assert {p.dtype for p in run.model.parameters()} == {torch.float64}
    x = torch.rand(2, 1, 8, 8, dtype=torch.float64)
    with torch.no_grad():
        assert torch.equal(run.model.eval()(x), model64(x))
    assert dict(run.model.named_buffers()).keys() == dict(model64.named_buffers()).keys()
    for (name, a), b in zip(run.model.named_buffers(), model64.buffers()):
        assert a.dtype == b.dtype and torch.equal(a, b), name


def _paused_in_threads(model, names):
    """A forward pre-hook on ``model.blocks[0]`` that stops each thread of ``names`` at its first call until told;
    returns ``(arrived, release, handle)``: ``arrived[name]`` is set when it stops, ``release[name]`` lets it go."""
    arrived = {n: threading.Event() for n in names}
    release = {n: threading.Event() for n in names}

    def hook(module, args):
        name = threading.current_thread().name
        if name in arrived and not arrived[name].is_set():
            arrived[name].set()
            release[name].wait(60)

    return arrived, release, model.blocks[0].register_forward_pre_hook(hook)


@pytest.mark.parametrize("use_cache", [False, True])
def test_bug_two_generate_calls_at_once_keep_the_training_mode_and_the_greedy_tokens(use_cache):
    """Bug: ``DiffusionGPT.generate`` saved every module's mode, switched the model to eval and put the saved modes
    back at the end. Two threads generating with one model in training mode: the second saved the modes the first
    had set (eval); when the first finished, it switched the model back to training while the second was still
    decoding (dropout on its remaining tokens, or, with the KV cache, "call .eval() before decoding"), and the
    second then left the model in eval mode for good (the user's next training steps ran without dropout). The
    model stays in eval mode until the last concurrent call ends, which puts the modes of the first one back."""
    from diffusionformer.models import DiffusionGPT, GPTConfig

    torch.manual_seed(0)
    model = DiffusionGPT(GPTConfig(vocab_size=13, block_size=16, n_layer=2, n_head=2, n_embd=16, dropout=0.5,
                                   heads="attention:1,laplacian:1"))
    model.blocks[1].mlp.eval()  # a frozen submodule keeps its own mode
    modes = [m.training for m in model.modules()]
    prompts = {"A": torch.tensor([[1, 2, 3]]), "B": torch.tensor([[4, 5]])}
    want = {k: model.generate(p, 6, temperature=0.0, use_cache=use_cache) for k, p in prompts.items()}
    assert [m.training for m in model.modules()] == modes

    arrived, release, handle = _paused_in_threads(model, ["A", "B"])
    got: dict = {}
    errors: list = []

    def work(name):
        try:
            got[name] = model.generate(prompts[name], 6, temperature=0.0, use_cache=use_cache)
        except BaseException as err:
            errors.append(err)

    try:
        a = threading.Thread(target=work, args=("A",), name="A")
        b = threading.Thread(target=work, args=("B",), name="B")
        a.start()
        assert arrived["A"].wait(60)
        b.start()
        assert arrived["B"].wait(60)
        release["A"].set()  # A finishes first, while B is still decoding
        a.join(60)
        release["B"].set()
        b.join(60)
    finally:
        for event in release.values():
            event.set()
        handle.remove()
    assert not errors, errors
    assert torch.equal(got["A"], want["A"]) and torch.equal(got["B"], want["B"])
    assert [m.training for m in model.modules()] == modes


def test_bug_attention_maps_are_not_taken_from_another_threads_forward():
    """Bug: ``DiffusionViT.attention_maps`` recorded the maps with a :class:`LayerRecorder`, i.e. hooks on the
    model's blocks, which fire in every thread: a plain forward of the same (serving) model in another thread while
    the maps were being computed overwrote them with the maps of that thread's input; with both running in a loop,
    torch's hook registration raced too ("hook() missing 1 required positional argument: 'kwargs'" in the other
    thread's forward). The maps are now recomputed by the call itself, block by block, compared here with the
    float64 maps computed from each block's input by hand."""
    from diffusionformer.models import DiffusionViT, ViTConfig

    torch.manual_seed(0)
    model = DiffusionViT(ViTConfig(input_size=(8, 8), patch_size=2, num_classes=3, dim=16, depth=2, num_heads=2,
                                   heads="attention:1,heat(t=0.5):1")).double().eval()
    x, other = torch.rand(2, 1, 8, 8, dtype=torch.float64), torch.rand(2, 1, 8, 8, dtype=torch.float64)
    with torch.no_grad():  # the reference: softmax(q k^T / sqrt(C)) of each block's input, written out
        want, z = [], model._embed(x)
        for block in model.blocks:
            h = block.norm1(z)
            q, k, _ = block.attn.qkv(h).view(2, z.shape[1], 3, 2, 8).permute(2, 0, 3, 1, 4)
            want.append(torch.softmax(q @ k.transpose(-1, -2) / 8 ** 0.5, dim=-1))
            z = block(z)
    arrived, release = threading.Event(), threading.Event()

    def pause(module, args):  # thread "maps" stops at block 1, after block 0's map is recorded
        if threading.current_thread().name == "maps" and not arrived.is_set():
            arrived.set()
            release.wait(60)

    handle = model.blocks[1].register_forward_pre_hook(pause)
    got: list = []
    try:
        worker = threading.Thread(target=lambda: got.append(model.attention_maps(x)), name="maps")
        worker.start()
        assert arrived.wait(60)
        with torch.no_grad():
            model(other)  # the serving thread's call meanwhile
        release.set()
        worker.join(60)
    finally:
        release.set()
        handle.remove()
    assert len(got) == 1 and len(got[0]) == 2
    for P, ref in zip(got[0], want):
        torch.testing.assert_close(P, ref, rtol=1e-12, atol=1e-12)


def test_bug_register_metric_refuses_a_key_registered_between_the_call_and_the_decoration():
    """Bug: ``register_metric`` checked that ``key`` was free when the decorator was made, not when it was applied:
    two decorators made for one key (or one applied twice) registered both functions, the second silently replacing
    the first in every later analysis, although a taken key is documented to raise ``ValueError``."""
    from diffusionformer.analysis import list_metrics, register_metric, unregister_metric

    first = register_metric("probe_threads_42", group="smoothing")
    second = register_metric("probe_threads_42", group="smoothing")
    first(lambda view: 1.0)
    try:
        with pytest.raises(ValueError, match="already registered"):
            second(lambda view: 2.0)
        with pytest.raises(ValueError, match="already registered"):
            first(lambda view: 3.0)
        assert [m.fn(None) for m in list_metrics() if m.key == "probe_threads_42"] == [1.0]
    finally:
        unregister_metric("probe_threads_42")
    assert all(m.key != "probe_threads_42" for m in list_metrics())


def test_bug_an_operator_registered_again_under_a_new_name_does_not_keep_the_old_aliases():
    """Bug: registering wrote the resolved ``name`` and ``aliases`` into the class, and ``unregister_operator`` left
    them there; registering the class again under a new name (a rename) then took the aliases of the earlier
    registration as the class's own, so the old alias still built it, and registration state leaked from one
    test or session into the next. Unregistering now puts back what the class declared itself."""
    from diffusionformer.operators import DiffusionOperator, build_operator, operator_class, register_operator, unregister_operator
    from diffusionformer.operators.heat import HeatOperator

    class _Half(DiffusionOperator):
        degree = 1

        def coefficients(self):
            return torch.tensor([0.5, 0.5])

    register_operator(_Half, name="probe-threads-old", aliases=("probe threads alias",))
    assert operator_class("probe_threads_alias") is _Half
    unregister_operator("probe-threads-old")
    register_operator(_Half, name="probe-threads-new")
    try:
        assert _Half.aliases == ()
        for gone in ("probe-threads-old", "probe-threads-alias"):
            with pytest.raises(ValueError, match="unknown operator"):
                operator_class(gone)
        assert build_operator("probe threads new").spec() == "probe-threads-new"
    finally:
        unregister_operator("probe-threads-new")
    # a built-in unregistered and registered again keeps its declared names and aliases
    aliases = HeatOperator.aliases
    unregister_operator("heat")
    try:
        assert HeatOperator.name == "heat" and HeatOperator.aliases == aliases
    finally:
        register_operator(HeatOperator)
    assert operator_class("heat-kernel") is HeatOperator and HeatOperator.aliases == aliases


def test_bug_layer_recorder_entered_again_inside_its_own_block_keeps_recording():
    """Bug: a :class:`LayerRecorder` entered a second time inside its own ``with`` block (a helper that records
    with the recorder it is given) registered its hooks twice, and the inner exit removed all of them: the rest of
    the outer block recorded nothing, silently. The hooks now stay until the outermost block ends (also when the
    inner block raises), and are then all removed."""
    from diffusionformer.analysis import LayerRecorder
    from diffusionformer.models import DiffusionGPT, GPTConfig

    torch.manual_seed(0)
    gpt = DiffusionGPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16)).eval()
    x = torch.randint(0, 11, (2, 8))
    rec = LayerRecorder(gpt)
    with rec:
        with pytest.raises(RuntimeError, match="inner"):
            with rec:
                raise RuntimeError("inner")
        with rec:
            with torch.no_grad():
                gpt(x)
        assert len(gpt.blocks[0]._forward_pre_hooks) == 1  # registered once
        rec.clear()
        with torch.no_grad():
            gpt(x)
        assert sorted(rec.states) == [0, 1, 2]
        with torch.no_grad():
            assert torch.equal(rec.states[1], gpt.blocks[0](rec.states[0]))
    assert all(len(b._forward_hooks) == len(b._forward_pre_hooks) == 0 for b in gpt.blocks)
