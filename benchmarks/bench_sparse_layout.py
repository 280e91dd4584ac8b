"""Shared sparse layout: one CSR ``EdgeLayout`` per unmodified ``edge_index`` against one per call (the old path).

The sparse entry points (``diffuse_sparse``, ``edge_attention``, ``propagate_sparse``) sort the edges into CSR
order (``ops.csr.EdgeLayout``) and, in the backward pass, into the transposed order. Since commit ``2204d01``
consecutive calls with the same unmodified ``edge_index`` tensor share that layout and its transpose
(``ops.csr._edge_layout``): the layers of a graph model, which all take the model's one ``edge_index``, and the
steps of full-batch training. The old path is the same library with ``ops.sparse._edge_layout`` replaced by
``lambda e, n: csr.EdgeLayout(e, n)`` (a fresh layout, sorted again, at every call), so both paths run in one
process, interleaved in the same rounds (``benchmarks/_common.py``: ``measure``/``ratio``).

Cases, on a random graph of ``N = 2000`` nodes and ``E = 20000`` edges (``--quick``: 200 and 1600), width 64,
4 heads, float32:

* one ``DiffusionAttention(64, 4, "attention:2,heat(t=1.0, steps=3):2")`` layer, forward + backward;
* ``DiffusionGraphTransformer`` of depth 4 (``GraphTransformerConfig(in_channels=16, num_classes=5, dim=64,
  depth=4, num_heads=4)``), forward + backward in train mode (gradients set to ``None`` before each call);
* the same model in eval mode, forward under ``no_grad``;
* the model with edge features (``edge_dim=4``) and the layer's heads above, forward + backward;
* a full-batch training step of that depth-4 model over the fixed ``edge_index``: cross-entropy on the node
  labels, backward, ``AdamW`` step, gradients set to ``None``.

Before timing, every case is run on each path (outside the timing) and the outputs and every gradient (the
training step: the loss and every parameter after 3 steps from the same start) must be equal bit for bit; the
script stops with an ``AssertionError`` naming the case and the tensor otherwise. On a device where the old path
does not reproduce its own bits (kernels with atomics), the table gives the largest differences instead. The tables also give the
layouts (``EdgeLayout``) and transposed layouts built per call on each path, counted once outside the timing.

The models add self loops to ``edge_index`` in every forward pass (``self_loops=True``, a new tensor), so
their calls share one layout between their layers, not between calls; the single layer takes the caller's
``edge_index`` and, on the new path, sorts it once for all calls (the timed calls are steady state).

Run: ``python benchmarks/bench_sparse_layout.py --threads 1 --clock cpu`` (one thread and the process' CPU time:
robust on a shared machine).
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

import _common as C
from diffusionformer.models import DiffusionGraphTransformer, GraphTransformerConfig
from diffusionformer.nn import DiffusionAttention
from diffusionformer.ops import csr, sparse

HEADS = "attention:2,heat(t=1.0, steps=3):2"
DIM, NUM_HEADS, DEPTH, IN_CHANNELS, NUM_CLASSES, EDGE_DIM = 64, 4, 4, 16, 5, 4
SIZES = {"full": (2000, 20000), "quick": (200, 1600)}  # (N, E)
CHECK_STEPS = 3  # training steps compared bit for bit
PATHS = ("old", "new")

_NEW = sparse._edge_layout


def _old(edge_index: Tensor, num_nodes: int) -> csr.EdgeLayout:
    """The path before ``2204d01``: a fresh layout (edges sorted again) at every call."""
    return csr.EdgeLayout(edge_index, num_nodes)


_IMPL = {"old": _old, "new": _NEW}


@contextlib.contextmanager
def layout_path(name: str) -> Iterator[None]:
    """Run the sparse entry points with the ``"old"`` (a layout per call) or ``"new"`` (shared) layout; the
    library's own ``_edge_layout`` is put back on exit."""
    saved = sparse._edge_layout
    sparse._edge_layout = _IMPL[name]
    try:
        yield
    finally:
        sparse._edge_layout = saved


def on_path(name: str, fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` as a zero-argument call on the path ``name`` (for :func:`_common.measure`)."""
    def call() -> Any:
        with layout_path(name):
            return fn()
    return call


@contextlib.contextmanager
def count_layouts() -> Iterator[dict[str, int]]:
    """Count the ``EdgeLayout`` objects made and the transposed layouts built while active."""
    counts = {"layouts": 0, "transposed": 0}
    init, transposed = csr.EdgeLayout.__init__, csr.EdgeLayout.transposed

    def counting_init(self: csr.EdgeLayout, *a: Any, **k: Any) -> None:
        counts["layouts"] += 1
        init(self, *a, **k)

    def counting_transposed(self: csr.EdgeLayout) -> Any:
        counts["transposed"] += self._transposed is None
        return transposed(self)
    csr.EdgeLayout.__init__ = counting_init  # type: ignore[method-assign]
    csr.EdgeLayout.transposed = counting_transposed  # type: ignore[method-assign]
    try:
        yield counts
    finally:
        csr.EdgeLayout.__init__ = init  # type: ignore[method-assign]
        csr.EdgeLayout.transposed = transposed  # type: ignore[method-assign]


def layouts_per_call(fn: Callable[[], Any], name: str) -> tuple[int, int]:
    """Layouts and transposed layouts that one call of ``fn`` builds on path ``name`` (after one call, as when
    timed)."""
    call = on_path(name, fn)
    call()
    with count_layouts() as counts:
        call()
    return counts["layouts"], counts["transposed"]


def _max_diff(a: list[tuple[str, Tensor]], b: list[tuple[str, Tensor]]) -> float:
    return max(float((x.double() - y.double()).abs().max()) if x.numel() else 0.0 for (_, x), (_, y) in zip(a, b))


def check_identical(case: str, run: Callable[[], list[tuple[str, Tensor]]]) -> str:
    """``run`` twice on the old path, then twice on the new one (a fresh and a shared layout): every tensor equal bit
    for bit to the old path's, else an ``AssertionError`` naming the case and the tensor. Returns ``"yes"``.

    Where the old path does not reproduce itself bit for bit (kernels with atomics on an accelerator), bits cannot
    tell the paths apart: nothing is asserted, and the largest differences old vs old and new vs old are returned
    for the table instead."""
    with layout_path("old"):
        ref, again = run(), run()
    reproducible = all(a.shape == b.shape and torch.equal(a, b) for (_, a), (_, b) in zip(ref, again))
    news = []
    for attempt in ("first", "second"):
        with layout_path("new"):
            got = run()
        news.append(got)
        for (name, a), (_, b) in zip(ref, got):
            if a.shape != b.shape:
                raise AssertionError(f"bench_sparse_layout: {case}: {name} has shape {tuple(b.shape)} on the new path, "
                                     f"{tuple(a.shape)} on the old one")
            if reproducible and not torch.equal(a, b):
                raise AssertionError(f"bench_sparse_layout: {case}: {name} differs between the old and the new path "
                                     f"({attempt} call on the new path)")
    if reproducible:
        return "yes"
    return ("n/a: the old path differs from itself (max |old - old| %.1e, |new - old| %.1e)"
            % (_max_diff(ref, again), max(_max_diff(ref, g) for g in news)))


def _grads(module: torch.nn.Module) -> list[tuple[str, Tensor]]:
    return [(f"grad of {n}", p.grad.clone()) for n, p in module.named_parameters() if p.grad is not None]


def cases(N: int, E: int, device: str) -> list[tuple[str, Callable[[], Any], Callable[[], list[tuple[str, Tensor]]]]]:
    """``(case, timed call, check run)`` for every case: the check run returns the named tensors compared bit for
    bit between the paths."""
    g = torch.Generator().manual_seed(0)
    edge_index = torch.randint(0, N, (2, E), generator=g).to(device)
    edge_attr = torch.randn(E, EDGE_DIM, generator=g).to(device)
    feats = torch.randn(N, IN_CHANNELS, generator=g).to(device)
    labels = torch.randint(0, NUM_CLASSES, (N,), generator=g).to(device)
    x = torch.randn(N, DIM, generator=g).to(device).requires_grad_()
    gx = torch.randn(N, DIM, generator=g).to(device)
    gy = torch.randn(N, NUM_CLASSES, generator=g).to(device)
    out: list[tuple[str, Callable[[], Any], Callable[[], list[tuple[str, Tensor]]]]] = []

    torch.manual_seed(0)
    layer = DiffusionAttention(DIM, NUM_HEADS, HEADS).to(device)

    def layer_fb() -> Tensor:
        x.grad = None
        layer.zero_grad(set_to_none=True)
        y = layer(x, edge_index=edge_index)
        y.backward(gx)
        return y

    def layer_check() -> list[tuple[str, Tensor]]:
        y = layer_fb()
        return [("output", y.detach().clone()), ("grad of x", x.grad.clone())] + _grads(layer)
    out.append(("one layer, forward + backward", layer_fb, layer_check))

    config = dict(in_channels=IN_CHANNELS, num_classes=NUM_CLASSES, dim=DIM, depth=DEPTH, num_heads=NUM_HEADS)
    torch.manual_seed(0)
    model = DiffusionGraphTransformer(GraphTransformerConfig(**config)).to(device)

    def model_fb() -> Tensor:
        model.train()
        model.zero_grad(set_to_none=True)
        y = model(feats, edge_index)
        y.backward(gy)
        return y

    def model_fb_check() -> list[tuple[str, Tensor]]:
        y = model_fb()
        return [("output", y.detach().clone())] + _grads(model)
    out.append((f"depth {DEPTH}, forward + backward (train)", model_fb, model_fb_check))

    def model_eval() -> Tensor:
        model.eval()
        with torch.no_grad():
            return model(feats, edge_index)
    out.append((f"depth {DEPTH}, forward (eval, no_grad)", model_eval,
                lambda: [("output", model_eval().clone())]))

    torch.manual_seed(0)
    edge_model = DiffusionGraphTransformer(GraphTransformerConfig(**config, edge_dim=EDGE_DIM, heads=HEADS)).to(device)

    def edge_fb() -> Tensor:
        edge_model.train()
        edge_model.zero_grad(set_to_none=True)
        y = edge_model(feats, edge_index, edge_attr=edge_attr)
        y.backward(gy)
        return y

    def edge_check() -> list[tuple[str, Tensor]]:
        y = edge_fb()
        return [("output", y.detach().clone())] + _grads(edge_model)
    out.append((f"depth {DEPTH}, edge features, forward + backward",
                edge_fb, edge_check))

    torch.manual_seed(0)
    start = DiffusionGraphTransformer(GraphTransformerConfig(**config)).to(device)

    def trainer(m: torch.nn.Module) -> Callable[[], Tensor]:
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        m.train()

        def step() -> Tensor:
            loss = F.cross_entropy(m(feats, edge_index), labels)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss
        return step

    def train_check() -> list[tuple[str, Tensor]]:
        m = copy.deepcopy(start)
        step = trainer(m)
        losses = [step().detach() for _ in range(CHECK_STEPS)]
        return [("losses", torch.stack(losses))] + [(f"{n} after {CHECK_STEPS} steps", p.detach().clone())
                                                    for n, p in m.named_parameters()]
    out.append((f"depth {DEPTH}, full-batch training step (AdamW)", trainer(copy.deepcopy(start)),
                train_check))
    return out


def main(argv: list[str] | None = None) -> C.Report:
    args = C.parse_args(__doc__.splitlines()[0], argv)
    rep = C.Report("bench_sparse_layout", "Shared sparse layout: one CSR layout per edge_index vs one per call", args)
    dev = args.device
    N, E = SIZES["quick" if args.quick else "full"]
    rounds = args.rounds or (3 if args.quick else 21)
    block_s = 0.01 if args.quick else 0.2
    rows = []
    for case, fn, check in cases(N, E, dev):
        identical = check_identical(case, check)  # outside the timing, before it
        built = {p: layouts_per_call(fn, p) for p in PATHS}
        t = C.measure({p: on_path(p, fn) for p in PATHS}, device=dev, rounds=rounds, block_s=block_s)
        r = C.ratio(t, "old", "new")
        rows.append([case, C.ms(t["old"].median), C.ms(t["new"].median), C.rfmt(r),
                     "%d / %d" % built["old"], "%d / %d" % built["new"], identical])
        rep.rows.append({"case": case, "N": N, "E": E, "seconds": {p: t[p].median for p in PATHS},
                         "samples": {p: t[p].samples for p in PATHS}, "calls_per_block": {p: t[p].calls_per_block for p in PATHS},
                         "ratio_old_over_new": r, "layouts_per_call": built, "identical": identical})
        print(f"{case}: old {C.ms(t['old'].median)} ms, new {C.ms(t['new'].median)} ms, old / new {C.rfmt(r)}", flush=True)
    rep.table(f"Random graph, N = {N}, E = {E}; one layer `DiffusionAttention({DIM}, {NUM_HEADS}, \"{HEADS}\")`; "
              f"depth {DEPTH}: `DiffusionGraphTransformer` (dim {DIM}, {NUM_HEADS} attention heads; with edge features: "
              f"edge_dim={EDGE_DIM} and the layer's heads); float32; median of {rounds} interleaved rounds; "
              "old / new = median paired ratio [IQR] (higher: the shared layout saves more)",
              ["case", "old ms", "new ms", "old / new", "layouts / transposes per call, old",
               "layouts / transposes per call, new", "bit-identical"], rows)
    rep.note("Old path: `ops.sparse._edge_layout` replaced by `lambda e, n: csr.EdgeLayout(e, n)` (a layout per call, "
             "the library before `2204d01`); new path: the library as it is. Outputs and gradients (training step: "
             f"loss and parameters after {CHECK_STEPS} steps) were compared bit for bit before timing (last column). The models add "
             "self loops (a new `edge_index`) in every forward pass, so the new path makes one layout per model call "
             "(shared by its layers) and the single layer none once its `edge_index` has been seen.")
    rep.write()
    return rep


if __name__ == "__main__":
    main()
