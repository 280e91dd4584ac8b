"""Hot-path audit for GPU training (issue 15): a training step reads no tensor value on the host off the CPU.

On CUDA a host read (``.item()``, ``bool(t)``, ``torch.nonzero``, a boolean-mask index: a data-dependent shape)
waits for the device's queue to drain. The library runs its value checks through one gate,
:func:`~diffusionformer.ops._checks.checks_values` (eager mode on CPU only). These tests turn that gate off in every
module that imported it, as a GPU turns it off, and count the host reads of a training step's forward and backward
passes with a ``TorchDispatchMode``: a read that remains is one the gate does not cover, i.e. one a GPU pays too.

Audited (sitting 56, probe, CPU): forward + backward of ``DiffusionGPT`` with every registered operator alone and
mixed per layer (dropout on and off, RoPE, recompute, GQA, bf16 autocast), ``DiffusionViT`` (with and without key
padding, dropout and drop-path), the graph transformer (local and global attention given ``max_num_nodes`` and
``num_graphs``, edge features, positional encodings) and single layers on every dense graph kind and back-end and on
sparse graphs; and the ``Trainer``'s update (host reads constant in the number of steps). Found: the sparse causal
filter and the CSR layout's sortedness test were gated on the device (``is_cuda``, ``device.type``) instead of
``checks_values``, so the causal filter's boolean index synchronised every non-CUDA accelerator, and neither could be
checked on the CPU. Remaining by design (documented): the graph transformer's self-loop normalisation
(``self_loops=True``) and its sizes read from ``batch`` when ``max_num_nodes``/``num_graphs`` are not given.
"""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from diffusionformer.models import DiffusionGPT, GPTConfig
from diffusionformer.models.graph_transformer import DiffusionGraphTransformer, GraphTransformerConfig
from diffusionformer.models.vit import DiffusionViT, ViTConfig
from diffusionformer.operators import build_operator, list_operators, operator_class
from diffusionformer.ops import _checks

#: aten operators that read a tensor's value on the host or give a shape that depends on values
_READS = ("_local_scalar_dense", "nonzero", "is_nonzero", "aten.equal", "masked_select", "aten.item")


class _HostReads(TorchDispatchMode):
    """The host reads and boolean-mask indexes (a ``nonzero``) of the operations run under it."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        indices = args[1] if func.__name__.startswith("index") and len(args) > 1 else ()
        masks = isinstance(indices, (list, tuple)) and any(
            isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8) for t in indices)
        if masks or any(r in name for r in _READS):
            self.reads.append(name + (" (boolean mask)" if masks else ""))
        return func(*args, **(kwargs or {}))


def _gate_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """``checks_values`` off in every library module that imported it, as on an accelerator."""
    gate = _checks.checks_values
    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("diffusionformer") and \
                getattr(module, "checks_values", None) is gate:
            monkeypatch.setattr(module, "checks_values", lambda t: False)


def _step(model: torch.nn.Module, loss_of) -> tuple[list[str], torch.Tensor, list[torch.Tensor]]:
    """Host reads of one forward and backward pass, the loss and the gradients; then an AdamW step (not counted:
    its step counters are CPU tensors on every device)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with _HostReads() as mode:
        loss = loss_of(model)
        loss.backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    optimizer.step()
    return mode.reads, loss.detach(), grads


def _off_and_on(monkeypatch: pytest.MonkeyPatch, build, loss_of) -> list[str]:
    """The host reads of a step with the gate off; its loss and gradients equal those of the step with the gate on
    (the CPU's checked path), from the same initial weights."""
    torch.manual_seed(0)
    _, want_loss, want_grads = _step(build(), loss_of)
    _gate_off(monkeypatch)
    torch.manual_seed(0)
    reads, loss, grads = _step(build(), loss_of)
    torch.testing.assert_close(loss, want_loss)
    for got, want in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(got, want)
    return reads


class _Sparse(torch.nn.Module):
    """``diffuse_sparse`` on projections of ``x`` with one fixed and one learned head, on a chosen back-end."""

    def __init__(self, backend: str, causal: bool) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(8, 24)
        self.c = torch.nn.Parameter(torch.tensor([0.5, 0.3, 0.2]))
        self.backend, self.causal = backend, causal

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        from diffusionformer.functional import diffuse_sparse

        q, k, v = self.qkv(x).view(-1, 3, 2, 4).unbind(1)  # (N, H, C) each
        coeffs = torch.stack([torch.tensor([0.0, 1.0, 0.0]), self.c])
        return diffuse_sparse(q, k, v, edge_index, coeffs, backend=self.backend, is_causal=self.causal)


_X = torch.randn(7, 8, generator=torch.Generator().manual_seed(0))
_EDGES = torch.tensor([[0, 1, 2, 3, 4, 5, 1, 0, 6, 2], [1, 2, 3, 0, 5, 6, 4, 2, 6, 5]])  # unsorted, causal and not


@pytest.mark.parametrize("backend", ["native", "csr"])
def test_bug_sparse_causal_filter_reads_the_host_where_values_are_not_checked(monkeypatch, backend):
    """Bug: ``diffuse_sparse(is_causal=True)`` filtered the edges with a boolean index (a ``nonzero``: a host
    synchronisation) unless they were on CUDA, so each causal sparse call synchronised any other accelerator (MPS,
    XPU), where performance.md says the filter runs on the CPU only; and the masked path a GPU takes could not be
    reached on the CPU. Now the edges are filtered where ``checks_values`` allows and masked elsewhere: no host
    read, and the masked path gives the filtered path's loss and gradients."""
    reads = _off_and_on(monkeypatch, lambda: _Sparse(backend, causal=True), lambda m: m(_X, _EDGES).square().mean())
    assert reads == [], reads


def test_bug_csr_sortedness_test_reads_the_host_where_values_are_not_checked(monkeypatch):
    """Bug: the CSR layout (the sparse back-end under ``"auto"`` in eager mode) tested whether the edges were sorted
    on the host unless they were off the CPU, a gate of its own: with value checks off (as on an accelerator) it
    still read the edges, so the path a GPU takes (sort always) was never run by the CPU tests. Now the test runs
    where ``checks_values`` allows; sorting already sorted edges gives the same loss and gradients."""
    sorted_edges = _EDGES[:, torch.argsort(_EDGES[1] * 7 + _EDGES[0])]
    for edges in (_EDGES, sorted_edges):
        with monkeypatch.context() as mp:
            reads = _off_and_on(mp, lambda: _Sparse("csr", causal=False), lambda m: m(_X, edges).square().mean())
        assert reads == [], reads


def _graph_model(self_loops: bool) -> DiffusionGraphTransformer:
    return DiffusionGraphTransformer(GraphTransformerConfig(
        in_channels=6, dim=16, num_heads=4, depth=2, task="graph", global_attention=True, edge_dim=3, pe="laplacian",
        pe_dim=4, self_loops=self_loops, dropout=0.1, attn_dropout=0.1,
        heads="attention:1,laplacian:1,heat(t=0.5, steps=2, learnable=True):1,ppr(alpha=0.2, steps=2):1"))


_NODES = torch.randn(9, 6, generator=torch.Generator().manual_seed(1))
_GRAPH_EDGES = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 8, 1, 6], [1, 2, 3, 0, 5, 6, 7, 8, 4, 0, 6]])  # a self loop
_BATCH = torch.tensor([0] * 4 + [1] * 5)
_EDGE_ATTR = torch.randn(11, 3, generator=torch.Generator().manual_seed(2))
_PE = torch.randn(9, 4, generator=torch.Generator().manual_seed(3))


def _graph_loss(model: torch.nn.Module) -> torch.Tensor:
    logits = model(_NODES, _GRAPH_EDGES, _BATCH, edge_attr=_EDGE_ATTR, pe=_PE, max_num_nodes=5, num_graphs=2)
    return F.cross_entropy(logits, torch.tensor([0, 1]))


def test_bug_graph_transformer_forward_doc_claims_no_host_read_with_default_self_loops(monkeypatch):
    """Bug (docs): ``DiffusionGraphTransformer.forward`` said that given ``max_num_nodes`` and ``num_graphs`` it
    reads no tensor value on the host, but with ``self_loops=True`` (the default; the class docstring and
    performance.md say so) PyG's ``remove_self_loops`` indexes the edges by a boolean mask, a ``nonzero`` on a GPU at
    every step. The claim now names ``self_loops=False``, for which it holds (and held only after the CSR
    sortedness fix above)."""
    doc = " ".join(DiffusionGraphTransformer.forward.__doc__.split())
    assert "with ``self_loops=False``, reads no tensor value on the host" in doc, doc
    assert _off_and_on(monkeypatch, lambda: _graph_model(False), _graph_loss) == []
    reads = _step(_graph_model(True), _graph_loss)[0]
    assert reads and all("boolean mask" in r for r in reads), reads  # the documented normalisation only


def _registry_gpt() -> DiffusionGPT:
    """A GPT with one layer per registered operator (built with its ``example_kwargs``) beside an attention head."""
    names = list_operators()
    heads = [["attention", build_operator(n, **operator_class(n).example_kwargs)] for n in names]
    return DiffusionGPT(GPTConfig(vocab_size=11, block_size=8, n_layer=len(names), n_head=2, n_embd=16, dropout=0.1,
                                  rope=True, heads=heads))


_IDS = torch.arange(16).view(2, 8) % 11


@pytest.mark.parametrize("make, loss_of", [
    (_registry_gpt, lambda m: m(_IDS, (_IDS + 1) % 11)[1]),
    (lambda: DiffusionViT(ViTConfig(
        input_size=(8, 8), patch_size=4, num_classes=2, dim=16, depth=2, num_heads=4, dropout=0.1, attn_dropout=0.1,
        drop_path=0.1, pool="mean", heads="attention:1,laplacian:1,heat(t=0.5, steps=2):1,polynomial(steps=2):1")),
     lambda m: F.cross_entropy(m(torch.linspace(-1, 1, 128).view(2, 1, 8, 8), key_padding_mask=torch.tensor(
         [[False] * 4, [False, False, False, True]])), torch.tensor([0, 1]))),
    (lambda: _graph_model(False), _graph_loss),
], ids=["gpt-every-operator", "vit-padded", "graph-global-sized"])
def test_pins_a_training_step_reads_nothing_on_the_host_with_value_checks_off(monkeypatch, make, loss_of):
    """Pin (issue 15): forward and backward of each model (every registered operator in the GPT, dropout on, key
    padding in the ViT, global attention given its sizes and edge features in the graph transformer) make no host
    read once ``checks_values`` is off, and give the loss and gradients of the checked CPU path."""
    assert _off_and_on(monkeypatch, make, loss_of) == []
