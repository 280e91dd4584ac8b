"""Mutation kills (sitting 52m) for the day's last changes: the first-values guard of
:meth:`~diffusionformer.nn.DiffusionAttention.forward` (``LayerState._first_owner``/``_first_grad``/``_first_read``),
the weights-only refusal advice (``train.checkpoint._refusal_advice``, ``runner._not_resumed_advice``),
``DiffusionGPT.crop_block_size``'s config copy and ``from_nanogpt``'s norm check, and ``ops.csr._edge_layout``.

Each "Pin:" test kills a mutant that the earlier tests let live; the guard's pins are also its no-false-alarm
cases in ordinary training (two calls per step, gradient accumulation, ``no_grad`` evaluation between steps, a
frozen stem, non-reentrant checkpointing).
"""

from __future__ import annotations

import os
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from diffusionformer.experiments.runner import _not_resumed_advice
from diffusionformer.models import DiffusionGPT, GPTConfig
from diffusionformer.nn import LayerState
from diffusionformer.train import CheckpointError
from diffusionformer.train.checkpoint import CHECKPOINT_FORMAT, load_checkpoint


def _gpt(**kw) -> DiffusionGPT:
    torch.manual_seed(0)
    return DiffusionGPT(GPTConfig(**{**dict(vocab_size=50, block_size=16, n_layer=3, n_head=4, n_embd=32,
                                            heads="neutreno:4"), **kw}))


_IDX = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(0))
_TGT = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(1))


def _head(m: DiffusionGPT, h: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(m.lm_head(m.norm(h)).flatten(0, 1), _TGT.flatten())


def _loss(m: DiffusionGPT, blocks: tuple[int, ...] = (), reentrant: bool = False) -> torch.Tensor:
    x, state = m._embed(_IDX), LayerState()
    for i, block in enumerate(m.blocks):
        x = (checkpoint(lambda x, b=block: b(x, state=state), x, use_reentrant=reentrant) if i in blocks
             else block(x, state=state))
    return _head(m, x)


# ------------------------------------------------------------------------------------------- first-values guard
def test_pin_a_frozen_stem_then_non_reentrant_checkpointed_readers_train():
    """Pin: the guard concerns the layer that recorded the first values only (``state._first_owner is self``):
    a frozen stem run under ``no_grad``, the later (reading) blocks checkpointed without reentrancy, trains, and
    their gradients equal those without checkpointing."""
    m = _gpt()

    def grads(ckpt: bool) -> list[torch.Tensor]:
        x, state = m._embed(_IDX), LayerState()
        with torch.no_grad():
            h = m.blocks[0](x, state=state)
        for b in m.blocks[1:]:
            h = checkpoint(lambda x, b=b: b(x, state=state), h, use_reentrant=False) if ckpt else b(h, state=state)
        params = [p for b in m.blocks[1:] for p in b.parameters()]
        return list(torch.autograd.grad(_head(m, h), params))

    for a, b in zip(grads(False), grads(True)):
        torch.testing.assert_close(b, a)


def test_pin_a_stem_under_no_grad_inside_a_reentrant_checkpoint_is_no_loss():
    """Pin: the first layer recomputed inside the backward pass under the user's own ``no_grad`` (a frozen stem
    within a reentrant checkpoint) loses nothing (its values had no gradient on the first call either): no error
    (``torch.is_grad_enabled()`` in the guard)."""
    m = _gpt()
    state = LayerState()

    def stem(x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            h = m.blocks[0](x, state=state)
        return h + x  # something differentiable, so that the checkpoint is recomputed

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        h = checkpoint(stem, m._embed(_IDX), use_reentrant=True)
    for b in m.blocks[1:]:
        h = b(h, state=state)
    _head(m, h).backward()
    assert m.tok_emb.weight.grad is not None


def test_pin_the_first_layer_called_again_outside_a_backward_pass_is_no_recomputation():
    """Pin: a first layer called again with autograd on outside a backward pass (a looped model over one state,
    after a frozen pass of it) is no recomputation: no error (``_current_graph_task_id() != -1`` in the guard)."""
    m = _gpt()
    state = LayerState()
    x = m._embed(_IDX)
    with torch.no_grad():
        h = m.blocks[0](x, state=state)
    h = m.blocks[1](h, state=state)  # reads the first values with autograd on
    h = m.blocks[0](h, state=state)
    _head(m, h).backward()


def test_pin_a_reader_under_no_grad_does_not_arm_the_guard():
    """Pin: only a read with autograd on arms the guard (``_first_read``): the first block checkpointed with
    reentrancy, the later blocks run under ``no_grad`` (a probe of the frozen rest, its result unused for the
    gradient), trains without error; the gradient through the first values was never asked for."""
    m = _gpt()
    state = LayerState()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        h0 = checkpoint(lambda x: m.blocks[0](x, state=state), m._embed(_IDX), use_reentrant=True)
    with torch.no_grad():
        h = h0
        for b in m.blocks[1:]:
            h = b(h, state=state)
    assert not state._first_read
    (_head(m, h0) + 0 * _head(m, h)).backward()
    assert m.blocks[0].attn.qkv.weight.grad is not None


def test_pin_a_compiled_call_records_nothing_for_the_guard(monkeypatch: pytest.MonkeyPatch):
    """Pin: while compiling (a compiled graph recomputes a checkpoint itself), a call leaves the guard's record
    alone (``if not eager: return out``). Simulated by ``torch.compiler.is_compiling`` answering True."""
    m = _gpt()
    state = LayerState()
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    h = m.blocks[0](m._embed(_IDX), state=state)
    m.blocks[1](h, state=state)
    assert state.first_values is not None and state.depth == 2
    assert state._first_owner is None and state._first_grad is None and not state._first_read


def test_pin_the_guards_record_is_out_of_the_states_equality_and_repr():
    """Pin: ``_first_owner``/``_first_grad``/``_first_read`` are bookkeeping (``compare=False, repr=False``): a
    state after a model's layers equals one built by hand with its depth and first values, and its repr names
    neither the record nor the layer (a whole module's repr)."""
    m = _gpt()
    state = LayerState()
    with torch.no_grad():
        h = m.blocks[0](m._embed(_IDX), state=state)
        m.blocks[1](h, state=state)
    assert state._first_owner is m.blocks[0].attn and state._first_grad is False
    twin = LayerState(first_values=state.first_values, depth=state.depth)
    assert state == twin
    text = repr(state)
    assert "_first" not in text and "DiffusionAttention" not in text


# ------------------------------------------------------------------------------------------- weights-only advice
class _Hostile:
    def __reduce__(self):
        return (os.system, ("true",))


class _Custom:
    """A type weights_only does not allow (an allow-list reaches it)."""


def _payload() -> dict:
    return {"format": CHECKPOINT_FORMAT, "step": 1, "model": {"w": torch.ones(2)}, "optimizer": {}, "rng": {},
            "config": {}}


def _refusal(path) -> CheckpointError:
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    return info.value


@pytest.mark.filterwarnings("ignore:Detected pickle protocol 4:UserWarning")
def test_pin_each_refusal_gets_its_own_advice_in_the_error_and_the_runner(tmp_path):
    """Pin: ``_refusal_advice`` and ``_not_resumed_advice`` word each refusal: a pickle protocol (save again), a
    global of a blocked module (no allow-list: delete to retrain), a type (allow it); the refusal is kept on the
    error (``_weights_only_refusal``) and is ``None`` on other checkpoint errors."""
    cases = {"protocol": dict(obj=_payload(), pickle_protocol=4), "blocked": dict(obj={**_payload(), "x": _Hostile()}),
             "type": dict(obj={**_payload(), "x": _Custom()})}
    errs = {}
    for name, kw in cases.items():
        path = tmp_path / f"{name}.pt"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.save(kw.pop("obj"), path, **kw)
        errs[name] = err = _refusal(path)
        assert isinstance(err._weights_only_refusal, str) and f"({err._weights_only_refusal})" in str(err)
    assert str(errs["protocol"]).endswith(
        "Load it only if you trust its source, and save it again with torch.save's default pickle protocol.")
    assert str(errs["blocked"]).endswith(
        "torch.load(weights_only=True) loads no global of a blocked module, whatever is allowed, and the trainer "
        "saves none: load it only if you trust its source.")
    assert str(errs["type"]).endswith(
        "Load it only if you trust its source (torch.serialization.add_safe_globals allows a type); a module's "
        "get_extra_state should return tensors and plain Python values.")
    assert _not_resumed_advice(errs["blocked"], "that checkpoint.pt", "its") == (
        "Delete that checkpoint.pt to train its run again from step 0: it names a global of a module that "
        "torch.load(weights_only=True) blocks, which no allow-list reaches (the trainer saves none).")
    assert "add_safe_globals" in _not_resumed_advice(errs["type"], "c.pt", "this")
    assert "save it again" in _not_resumed_advice(errs["protocol"], "c.pt", "this")
    damaged = tmp_path / "damaged.pt"
    damaged.write_bytes(b"not a checkpoint at all")
    err = _refusal(damaged)
    assert err._weights_only_refusal is None and CheckpointError("x")._weights_only_refusal is None
    assert _not_resumed_advice(err, "c.pt", "this") != _not_resumed_advice(errs["type"], "c.pt", "this")


# ------------------------------------------------------------------------------------------- GPT
def test_pin_crop_block_size_gives_the_model_a_config_of_its_own():
    """Pin: ``crop_block_size`` replaces the model's config (``dataclasses.replace``), so another model built from
    the same ``GPTConfig`` and the config itself keep their context."""
    config = GPTConfig(vocab_size=50, block_size=16, n_layer=1, n_head=4, n_embd=32)
    a, b = DiffusionGPT(config), DiffusionGPT(config)
    a.crop_block_size(8)
    assert a.config.block_size == 8 and b.config.block_size == 16 and config.block_size == 16
    assert a.config is not config and a.pos_emb.weight.shape[0] == 8
    DiffusionGPT(a.config).load_state_dict(a.state_dict())


class _SaysLayerNorm:
    def __str__(self) -> str:
        return "layernorm"

    __repr__ = __str__


@pytest.mark.parametrize("norm", [None, 1, _SaysLayerNorm()])
def test_pin_from_nanogpt_refuses_a_norm_that_is_no_string(nanogpt_reference, norm):
    """Pin: a ``norm`` override that is no string is refused by ``from_nanogpt``'s own check, naming it (not passed
    on to GPTConfig, nor read through ``str``)."""
    R = nanogpt_reference
    torch.manual_seed(0)
    ref = R.GPT(R.GPTConfig(block_size=8, vocab_size=13, n_layer=1, n_head=2, n_embd=16, dropout=0.0, bias=True))
    c = ref.config
    ckpt = {"model": ref.state_dict(), "model_args": dict(n_layer=c.n_layer, n_head=c.n_head, n_embd=c.n_embd,
                                                           block_size=c.block_size, bias=c.bias,
                                                           vocab_size=c.vocab_size, dropout=c.dropout)}
    with pytest.raises(ValueError, match=rf"from_nanogpt: norm={norm!r}: nanoGPT's blocks normalise with LayerNorm"):
        DiffusionGPT.from_nanogpt(ckpt, norm=norm)


# ------------------------------------------------------------------------------------------- shared CSR layout
def _edges() -> torch.Tensor:
    return torch.tensor([[0, 1, 2, 2], [1, 2, 0, 1]])


def test_pin_the_layout_entry_refers_to_the_storage_and_is_cleared_when_it_is_freed():
    """Pin: the shared entry holds a weak reference to the edges' storage (not the tensor) with a callback that
    clears it when the storage is freed (the layout does not outlive its edges)."""
    import gc

    from diffusionformer.ops import csr

    e = _edges()
    layout = csr._edge_layout(e, 3)
    entry = csr._LAST_LAYOUT[0]
    assert entry[0]() is e.untyped_storage() and entry[1] == id(e) and entry[4] is layout
    del e, entry, layout
    gc.collect()
    assert csr._LAST_LAYOUT[0] is None


def test_pin_a_write_that_bumps_no_version_is_seen_on_cpu():
    """Pin: on CPU the edges are compared with the copy kept in the entry: a write through ``.numpy()`` (no
    version bump, same key) gets a new layout."""
    from diffusionformer.ops import csr

    e = _edges()
    first = csr._edge_layout(e, 3)
    e.numpy()[1, 0] = 2
    assert csr._edge_layout(e, 3) is not first


def test_pin_only_cuda_edges_are_kept_out_during_a_graph_capture(monkeypatch: pytest.MonkeyPatch):
    """Pin: the capture condition asks about CUDA edges only (``edge_index.is_cuda and ...``): CPU edges keep
    their shared layout while a CUDA stream is being captured."""
    from diffusionformer.ops import csr

    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    e = _edges()
    assert csr._layout_key(e, 3) is not None
    assert csr._edge_layout(e, 3) is csr._edge_layout(e, 3)
