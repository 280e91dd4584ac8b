"""Host overhead per call: nanoGPT's GPT vs ``DiffusionGPT`` at sizes where the arithmetic is negligible.

Issue 15 measured ``DiffusionGPT`` with attention heads only at 0.947x nanoGPT's training
throughput on a GPU although its aten operator sequence equals nanoGPT's: at the issue's sizes
the GPU waits for the host, which must launch every kernel, so what differs is the Python and
dispatch time per call. This script measures that time directly: the models are tiny (6 layers,
6 heads, width 48, ``T = 4``, batch 1, vocabulary 65, ``bias=False``, no dropout), so a call is
almost all host work, and they run on CPU tensors (``--device cuda`` runs the same on the GPU,
where the sizes make every call launch-bound).

Models: nanoGPT's GPT (``benchmarks/nanogpt_model.py``) and ``DiffusionGPT`` of equal size with
attention heads only, half the heads Laplacian (``laplacian_heads=3``) and 2 heat heads of
``K = 4`` per layer (``heads="attention:4,heat(t=1.0, steps=4):2"``; on CPU ``"auto"`` materialises
``P`` for them at this length, so they are also run on the fused kernel, ``backend="sdpa"``, the
path a GPU takes), and the half-Laplacian and fused-kernel heat models with ``recompute=True``
(what forming the combined head output again in the backward pass costs the host). Calls: the forward pass
with targets (logits and loss) in eval mode under ``no_grad``, and forward + backward in train
mode (gradients set to ``None`` before each call, as in a training step). Timing: interleaved
rounds of ``benchmarks/_common.py`` (``measure``/``ratio``); ratios are the medians of the
per-round paired ratios ``t_model / t_nanoGPT`` with their IQR.

``DiffusionGPT`` checks on CPU tensors that the token ids lie in the vocabulary (a host
synchronisation it skips on accelerators); the script switches that check off (``--id-check``
keeps it) so that the CPU measurement models the accelerator path.

The tables also give the module calls and aten operators of one call (counted once, outside the
timing, with ``sys.setprofile`` and a ``TorchDispatchMode``).

Run: ``python benchmarks/bench_host.py --threads 1 --clock cpu`` (one thread and the process' CPU
time: robust on a shared machine).
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Callable, Iterator

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode

import _common as C
import diffusionformer.models.gpt as _gpt
import diffusionformer.ops.engine as _engine
from diffusionformer.models import DiffusionGPT, GPTConfig
from nanogpt_model import GPT, NanoGPTConfig

# (n_layer, n_head, n_embd, T, batch, vocab): the 6 x 6 layout at a width where arithmetic is negligible
SIZE = (6, 6, 48, 4, 1, 65)


def models(device: str) -> dict[str, nn.Module]:
    """nanoGPT's GPT and the three ``DiffusionGPT`` variants at :data:`SIZE`."""
    L, H, D, T, _, V = SIZE
    torch.manual_seed(0)
    common = dict(vocab_size=V, block_size=T, n_layer=L, n_head=H, n_embd=D, bias=False, dropout=0.0)
    out: dict[str, nn.Module] = {
        "nanoGPT": GPT(NanoGPTConfig(block_size=T, vocab_size=V, n_layer=L, n_head=H, n_embd=D, bias=False, dropout=0.0)),
        "DiffusionGPT attention": DiffusionGPT(GPTConfig(**common)),
        "DiffusionGPT half Laplacian": DiffusionGPT(GPTConfig(**common, laplacian_heads=H // 2)),
        "DiffusionGPT 2 heat(K=4)": DiffusionGPT(GPTConfig(**common, heads=f"attention:{H - 2},heat(t=1.0, steps=4):2")),
        # what recompute=True costs on the host (the fused-kernel path of the heat heads, as on a GPU at this length)
        "DiffusionGPT half Laplacian, recompute": DiffusionGPT(GPTConfig(**common, laplacian_heads=H // 2, recompute=True)),
        "DiffusionGPT 2 heat(K=4), fused kernel": DiffusionGPT(GPTConfig(**common, heads=f"attention:{H - 2},heat(t=1.0, steps=4):2",
                                                                         backend="sdpa")),
        "DiffusionGPT 2 heat(K=4), fused kernel, recompute": DiffusionGPT(GPTConfig(
            **common, heads=f"attention:{H - 2},heat(t=1.0, steps=4):2", backend="sdpa", recompute=True)),
    }
    return {k: m.to(device) for k, m in out.items()}


@contextlib.contextmanager
def no_id_check(active: bool) -> Iterator[None]:
    """Switch ``DiffusionGPT``'s CPU token-id range check off while ``active`` (it is skipped on accelerators)."""
    if not active:
        yield
        return
    saved = _gpt._check_token_ids
    _gpt._check_token_ids = lambda *a, **k: None
    try:
        yield
    finally:
        _gpt._check_token_ids = saved


def callables(ms: dict[str, nn.Module], idx: Tensor, targets: Tensor, backward: bool) -> dict[str, Callable[[], None]]:
    """One zero-argument call per model: ``no_grad`` forward (eval), or forward + backward (train)."""
    fns: dict[str, Callable[[], None]] = {}
    for name, m in ms.items():
        if backward:
            m.train()

            def fb(m: nn.Module = m) -> None:
                m.zero_grad(set_to_none=True)
                _, loss = m(idx, targets)
                loss.backward()
            fns[name] = fb
        else:
            m.eval()

            def fwd(m: nn.Module = m) -> None:
                with torch.no_grad():
                    m(idx, targets)
            fns[name] = fwd
    return fns


class _OpCount(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.count += 1
        return func(*args, **(kwargs or {}))


def count_calls(fn: Callable[[], None]) -> tuple[int, int]:
    """Module calls and aten operators of one call of ``fn``.

    Module calls are counted with a profile function (``sys.setprofile``), not with a module hook:
    a hook would make the library call the placeholders it skips when no hook is registered.
    """
    code = nn.Module._call_impl.__code__
    modules = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal modules
        if event == "call" and frame.f_code is code:
            modules += 1
    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    with _caches_on(), _OpCount() as ops:
        fn()
    return modules, ops.count


@contextlib.contextmanager
def _caches_on() -> Iterator[None]:
    """Keep the library's tensor caches on while :class:`_OpCount` counts.

    The library bypasses them under any torch dispatch mode (``ops.engine._tensors_traced``: a fake-tensor mode
    must not cache its fake tensors), so under the counting mode every call rebuilt its cached coefficient
    columns, and the count took those operations (5 per mixed layer) for what a call runs. The counting mode
    runs every operation on the real tensors, so what it caches is what a plain call would.
    """
    saved = _engine.is_in_torch_dispatch_mode
    _engine.is_in_torch_dispatch_mode = lambda *a, **k: False
    try:
        yield
    finally:
        _engine.is_in_torch_dispatch_mode = saved


def main(argv: list[str] | None = None) -> C.Report:
    def extra(p):  # noqa: ANN001, ANN202
        p.add_argument("--id-check", action="store_true",
                       help="keep DiffusionGPT's CPU token-id range check (off by default: accelerators skip it)")

    args = C.parse_args(__doc__.splitlines()[0], argv, extra)
    rep = C.Report("bench_host", "Host overhead per call: DiffusionGPT vs nanoGPT at tiny sizes", args)
    dev = args.device
    L, H, D, T, B, V = SIZE
    ms = models(dev)
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, V, (B, T), generator=g).to(dev)
    targets = torch.randint(0, V, (B, T), generator=g).to(dev)
    # many short rounds: on a shared machine a paired ratio is only as good as the two blocks being alike
    rounds = args.rounds or (5 if args.quick else 61)
    block_s = 0.01 if args.quick else 0.02
    with no_id_check(not args.id_check):
        for backward in (False, True):
            fns = callables(ms, idx, targets, backward)
            counts = {name: count_calls(fn) for name, fn in fns.items()}
            t = C.measure(fns, device=dev, rounds=rounds, block_s=block_s, warmup=5)
            rows = []
            for name in fns:
                r = C.ratio(t, name, "nanoGPT")
                lo, hi = t[name].quartiles()
                rows.append([name, f"{t[name].median * 1e6:.0f}", f"{lo * 1e6:.0f}-{hi * 1e6:.0f}",
                             "1 (baseline)" if name == "nanoGPT" else C.rfmt(r), counts[name][0], counts[name][1]])
                rep.rows.append({"call": "forward+backward" if backward else "forward", "model": name,
                                 "seconds": t[name].median, "samples": t[name].samples, "ratio_vs_nanogpt": r,
                                 "module_calls": counts[name][0], "aten_ops": counts[name][1]})
            what = ("forward + backward (train mode)" if backward else "forward with loss (eval, no_grad)")
            rep.table(f"{what}: {L} layers, {H} heads, width {D}, T = {T}, batch {B}, vocabulary {V}; "
                      f"median of {rounds} interleaved rounds; time / nanoGPT's [IQR]",
                      ["model", "us per call", "IQR us", "time / nanoGPT", "module calls", "aten ops"], rows)
    rep.note("Lower is better; 1.10 means 10% more host time per call than nanoGPT. Module calls and aten ops "
             "count one call (the aten ops of forward + backward include the backward pass)."
             + ("" if args.id_check else " DiffusionGPT's CPU token-id range check is off (--id-check keeps it)."))
    rep.write()
    return rep


if __name__ == "__main__":
    main()
