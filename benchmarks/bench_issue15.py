"""Issue 15: every head type against the reference attention layer, a profile, and GPT vs nanoGPT.

Part 1 (layers). Reference layer: ``qkv Linear -> F.scaled_dot_product_attention -> out Linear``
(nanoGPT's ``CausalSelfAttention`` without dropout, ``bias=False``). Candidates, all with the
reference's weights: ``DiffusionAttention`` with all heads attention, half the heads Laplacian,
2 of H heads ``heat(t=1.0, steps=8)``, 2 of H heads ``ppr(steps=10)``, half the heads
``heat(t=0.5, learnable=True)``, with ``backend=--library-backend`` (default ``"auto"``: on CUDA
it materialises ``P`` for K-step heads in ``ops.dense.CUDA_MATERIALISE_ELEMENTS`` and takes the
Triton back-end only once ``ops.dense.TRITON_IN_AUTO`` is set; ``sdpa``, as the GPU suite passes,
measures the PyTorch path); and the same layers with ``backend="triton"`` (the
engine's Triton back-end through the real layer) when triton imports. Sizes ``(B, N, D, H)``: (8, 1024, 768, 12),
(2, 4096, 768, 12), (64, 256, 384, 6); causal and not; forward (eval, ``no_grad``) and
forward+backward; bf16 autocast. Medians of paired ratios over interleaved rounds with the IQR.
Targets (issue 15): the all-attention ``DiffusionAttention`` ``<= 1.00`` x the reference layer; relative to
the all-attention ``DiffusionAttention``: affine layers ``<= 1.03``; ``G`` of ``H`` heads with ``K`` steps
``<= 1.05 (1 + (K - 1) G / H)``.

Part 2 (profile). One forward+backward of every candidate at the first size, causal, under
``torch.profiler``: which SDPA operator runs (flash / cuDNN / efficient / math, from the aten
operator names) with the dtype, contiguity, mask and ``is_causal`` of its inputs (recorded by a
``TorchFunctionMode``), device kernel launches per call (CUDA; on CPU the number of aten
operators), copies (``aten::copy_``), casts (``aten::_to_copy``) and host syncs (CUDA:
``cudaStreamSynchronize``, which every ``.item()`` and blocking device-to-host copy ends in; CPU: the
``aten::_local_scalar_dense`` calls that would wait on a GPU; not ``cudaDeviceSynchronize``, which only the
script's own synchronisation and the profiler's exit call inside the profiled window).

Part 3 (GPT). One training step (bf16 autocast forward + loss, backward, AdamW fused on CUDA,
``zero_grad``), eager, of nanoGPT's GPT (``benchmarks/nanogpt_model.py``) and ``DiffusionGPT`` at
equal size (``bias=False``) with attention only, half the heads Laplacian and 2 heat heads of
``K = 4`` per layer (targets >= 1.00, >= 0.97, >= 0.85 of nanoGPT's throughput, peak memory
<= nanoGPT's + 5%; the peak of a steady-state step, after a warm-up step made AdamW's state), the
last two also with ``recompute=True`` (``GPTConfig``: combined head outputs formed again in the
backward pass instead of kept), plus the Triton versions (``GPTConfig(backend="triton")``) when triton imports. Sizes: 6 layers, 6 heads,
width 384, T = 256, batch 64, vocabulary 65; 12 layers, 12 heads, width 768, T = 1024, batch 16,
vocabulary 50304.

Part 4 (dropout; with the Triton column only). The cost of dropout on ``P`` in the Triton kernels
(a Philox mask per power, drawn again by the backward pass): forward+backward in training mode at
the first size, causal, of the reference layer with SDPA's dropout and of the Triton layers
(half Laplacian, 2 heat heads of ``K = 8``) with ``dropout=0.1`` and without, and the library's
PyTorch path (``--library-backend``) with dropout for comparison; ratios to the same layer
without dropout.

``--smoke`` (or ``DF_BENCH_SMOKE=1``): tiny sizes, few rounds, CPU allowed, so the whole script
is testable without a GPU (the Triton column then runs only under ``TRITON_INTERPRET=1``). Without it a CPU
run refuses the full sizes (hours) unless ``--layer-sizes`` / ``--gpt-sizes`` choose some.

On CUDA the Triton layers first run once, untimed, in 8 processes side by side (``--warm-workers``;
``_common.warm_kernels``): that builds their kernels into triton's on-disk cache in parallel, so the
timed parts load them instead of compiling one after the other.

Run: ``python benchmarks/bench_issue15.py --device cuda --out benchmarks/results-cuda``.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

import _common as C
from diffusionformer import DiffusionAttention
from diffusionformer.models import DiffusionGPT, GPTConfig
from nanogpt_model import GPT, NanoGPTConfig

LAYER_SIZES = [(8, 1024, 768, 12), (2, 4096, 768, 12), (64, 256, 384, 6)]
SMOKE_LAYER_SIZES = [(2, 32, 64, 4)]
# (name, n_layer, n_head, n_embd, T, batch, vocab)
GPT_SIZES = [("6L-384", 6, 6, 384, 256, 64, 65), ("12L-768", 12, 12, 768, 1024, 16, 50304)]
SMOKE_GPT_SIZES = [("2L-64", 2, 4, 64, 32, 2, 65)]


def selected_layer_sizes(args: Any, smoke: bool) -> list[tuple[int, int, int, int]]:
    """The layer sizes ``(B, N, D, H)`` of the ``layers`` part (``--layer-sizes``; the smoke size with ``--smoke``)."""
    if smoke:
        return SMOKE_LAYER_SIZES
    return [s for i, s in enumerate(LAYER_SIZES) if args.layer_sizes is None or i in args.layer_sizes]


def first_layer_size(smoke: bool) -> tuple[int, int, int, int]:
    """The one size of the ``profile`` and ``dropout`` parts."""
    return (SMOKE_LAYER_SIZES if smoke else LAYER_SIZES)[0]


def selected_gpt_sizes(args: Any, smoke: bool) -> list[tuple[Any, ...]]:
    """The GPT sizes of the ``gpt`` part (``--gpt-sizes``; the smoke size with ``--smoke``)."""
    if smoke:
        return SMOKE_GPT_SIZES
    return [s for s in GPT_SIZES if args.gpt_sizes is None or s[0] in args.gpt_sizes]


def triton_ready(device: str) -> bool:
    """Whether the Triton column can run: triton imports, and CUDA or the interpreter."""
    try:
        from diffusionformer.ops.triton import is_available
    except Exception:  # pragma: no cover - broken install
        return False
    if not is_available():
        return False
    return device == "cuda" or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# ---------------------------------------------------------------------------- layers
class ReferenceLayer(nn.Module):
    """``qkv Linear -> F.scaled_dot_product_attention -> out Linear`` (nanoGPT's attention; SDPA's dropout on
    ``P`` while training when ``dropout > 0``, no dropout by default)."""

    def __init__(self, dim: int, num_heads: int, causal: bool, dropout: float = 0.0) -> None:
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out_proj = nn.Linear(dim, dim, bias=False)
        self.num_heads, self.causal, self.dropout = num_heads, causal, dropout

    def forward(self, x: Tensor) -> Tensor:
        B, N, D = x.shape
        q, k, v = self.qkv(x).split(D, dim=2)
        q, k, v = (t.view(B, N, self.num_heads, D // self.num_heads).transpose(1, 2) for t in (q, k, v))  # (B, H, N, C)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.out_proj(y.transpose(1, 2).contiguous().view(B, N, D))


def layer_specs(H: int) -> dict[str, str]:
    half = H // 2
    return {
        "all attention": f"attention:{H}",
        "half Laplacian": f"attention:{H - half},laplacian:{half}",
        "2 heat(t=1, K=8)": f"attention:{H - 2},heat(t=1.0, steps=8):2",
        "2 ppr(K=10)": f"attention:{H - 2},ppr(alpha=0.1, steps=10):2",
        "half learned heat(t=0.5)": f"attention:{H - half},heat(t=0.5, learnable=True):{half}",
    }


REFERENCE = "reference (SDPA)"


def budget(layer: DiffusionAttention) -> tuple[float, str]:
    """Issue 15's target and its formula: an all-attention layer ``<= 1.00`` x the reference layer; any other layer
    relative to the all-attention layer (affine heads ``1.03``, ``G`` of ``H`` heads with ``K`` steps
    ``1.05 (1 + (K - 1) G / H)``)."""
    if all(op.name == "attention" for op in layer.operators):
        return 1.00, "1.00 (/ reference)"
    H = layer.num_heads
    G, K = 0, 1
    for op, (_, count) in zip(layer.operators, layer._groups):
        if op.degree > 1:
            G += count
            K = max(K, op.degree)
    if G == 0:
        return 1.03, "1.03"
    return 1.05 * (1 + (K - 1) * G / H), f"1.05(1+{K - 1}*{G}/{H})"


def verdict(t: dict[str, C.Timing], name: str, target: float) -> tuple[tuple[float, float, float], str, bool]:
    """The ratio issue 15 judges the layer ``name`` by, its baseline, and whether it meets ``target``: the
    all-attention layers (library and Triton) against the reference layer, every other layer against the
    library's all-attention layer (judged against itself its ratio is 1 by construction and could not fail)."""
    base = REFERENCE if name.removeprefix("triton: ") == "all attention" else "all attention"
    r = C.ratio(t, name, base)
    return r, base, r[0] <= target


def build_layers(D: int, H: int, causal: bool, device: str, with_triton: bool,
                 backend: str = "auto") -> tuple[dict[str, nn.Module], dict[str, float]]:
    torch.manual_seed(0)
    ref = ReferenceLayer(D, H, causal)
    layers: dict[str, nn.Module] = {REFERENCE: ref}
    budgets: dict[str, float] = {}
    lib: dict[str, DiffusionAttention] = {}
    for name, spec in layer_specs(H).items():
        m = DiffusionAttention(D, H, spec, causal=causal, bias=False, backend=backend)
        m.qkv.load_state_dict(ref.qkv.state_dict())
        m.out_proj.load_state_dict(ref.out_proj.state_dict())
        lib[name] = m
        layers[name] = m
        budgets[name] = budget(m)[0]
    if with_triton:
        for name, m in lib.items():
            t = DiffusionAttention(D, H, layer_specs(H)[name], causal=causal, bias=False, backend="triton")
            t.load_state_dict(m.state_dict())
            layers[f"triton: {name}"] = t
            budgets[f"triton: {name}"] = budgets[name]
    for m in layers.values():
        m.to(device)
    return layers, budgets


def autocast(device: str):  # noqa: ANN201
    return torch.autocast(device_type=device, dtype=torch.bfloat16)


def layer_callables(layers: dict[str, nn.Module], x: Tensor, backward: bool, device: str) -> dict[str, Callable[[], None]]:
    out: dict[str, Callable[[], None]] = {}
    if not backward:
        for name, m in layers.items():
            m.eval()

            def fwd(m: nn.Module = m) -> None:
                with torch.no_grad(), autocast(device):
                    m(x)
            out[name] = fwd
        return out
    xg = x.detach().clone().requires_grad_()
    g = torch.randn_like(x)
    for name, m in layers.items():
        m.train()

        def fb(m: nn.Module = m) -> None:
            with autocast(device):
                y = m(xg)
            torch.autograd.backward(y.float(), g)
        out[name] = fb
    return out


def part_layers(args: Any, rep: C.Report, smoke: bool, with_triton: bool) -> None:
    dev = args.device
    sizes = selected_layer_sizes(args, smoke)
    causals = [True] if smoke else [False, True]
    rounds = args.rounds or (2 if smoke else 7)
    for (B, N, D, H) in sizes:
        for causal in causals:
            for backward in (False, True):
                layers, budgets = build_layers(D, H, causal, dev, with_triton, args.library_backend)
                x = torch.randn(B, N, D, generator=torch.Generator().manual_seed(1)).to(dev)
                t = C.measure(layer_callables(layers, x, backward, dev), device=dev, rounds=rounds,
                              block_s=0.0 if smoke else 0.02, warmup=1 if smoke else 3)
                rows = []
                for name in layers:
                    r_ref = C.ratio(t, name, REFERENCE)
                    row: list[Any] = [name, C.ms(t[name].median), C.rfmt(r_ref)]
                    rec = {"size": (B, N, D, H), "causal": causal, "backward": backward, "layer": name,
                           "seconds": t[name].median, "vs_reference": r_ref}
                    if name in budgets:
                        r_att = C.ratio(t, name, "all attention")
                        _, base, ok = verdict(t, name, budgets[name])
                        target = f"{budgets[name]:.2f}" + (" (/ reference)" if base == REFERENCE else "")
                        row += [C.rfmt(r_att), target, C.check(ok)]
                        rec.update(vs_all_attention=r_att, target=budgets[name], target_baseline=base)
                    else:
                        row += ["", "", ""]
                    rows.append(row)
                    rep.rows.append(rec)
                mode = "forward+backward" if backward else "forward"
                rep.table(f"Layers, (B, N, D, H) = {(B, N, D, H)}, {'causal' if causal else 'not causal'}, {mode}, "
                          f"bf16 autocast; median of {rounds} interleaved rounds, ratios [IQR]",
                          ["layer", "ms", "/ reference", "/ all attention", "target", "met"], rows)
                del layers, x
                if dev == "cuda":
                    torch.cuda.empty_cache()


# ---------------------------------------------------------------------------- dropout
def part_dropout(args: Any, rep: C.Report, smoke: bool, with_triton: bool) -> None:
    if not with_triton:
        rep.note("Dropout part skipped: no Triton column")
        return
    dev = args.device
    B, N, D, H = first_layer_size(smoke)
    rounds = args.rounds or (2 if smoke else 7)
    p = 0.1
    torch.manual_seed(0)
    layers: dict[str, nn.Module] = {REFERENCE: ReferenceLayer(D, H, True),
                                    f"{REFERENCE}, dropout {p}": ReferenceLayer(D, H, True, p)}
    pairs = [(REFERENCE, f"{REFERENCE}, dropout {p}")]
    specs = layer_specs(H)
    for name in ("half Laplacian", "2 heat(t=1, K=8)"):
        for backend in ("triton", args.library_backend):
            for drop in (0.0, p):
                label = f"{backend}: {name}" + (f", dropout {p}" if drop else "")
                layers[label] = DiffusionAttention(D, H, specs[name], causal=True, bias=False, backend=backend,
                                                   dropout=drop)
            pairs.append((f"{backend}: {name}", f"{backend}: {name}, dropout {p}"))
    for m in layers.values():
        m.to(dev)
    x = torch.randn(B, N, D, generator=torch.Generator().manual_seed(1)).to(dev)
    t = C.measure(layer_callables(layers, x, True, dev), device=dev, rounds=rounds,
                  block_s=0.0 if smoke else 0.02, warmup=1 if smoke else 3)
    rows = []
    for base, dropped in pairs:
        r = C.ratio(t, dropped, base)
        rows.append([dropped, C.ms(t[dropped].median), C.ms(t[base].median), C.rfmt(r)])
        rep.rows.append({"part": "dropout", "size": (B, N, D, H), "layer": dropped, "seconds": t[dropped].median,
                         "vs_no_dropout": r})
    rep.table(f"Dropout on P ({p}), (B, N, D, H) = {(B, N, D, H)}, causal, forward+backward in training mode, bf16 "
              f"autocast; median of {rounds} interleaved rounds, ratio [IQR] to the same layer without dropout",
              ["layer", "ms", "ms without dropout", "/ without dropout"], rows)
    del layers, x
    if dev == "cuda":
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------- profile
class SDPARecorder(TorchFunctionMode):
    """Records the inputs of every ``F.scaled_dot_product_attention`` call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            q = args[0]
            mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
            causal = kwargs.get("is_causal", args[5] if len(args) > 5 else False)
            contig = all(t.stride(-1) == 1 for t in args[:3])
            self.calls.append(f"{str(q.dtype).replace('torch.', '')}, last dim {'contiguous' if contig else 'STRIDED'}, "
                              f"mask {'none' if mask is None else 'EXPLICIT ' + str(mask.dtype).replace('torch.', '')}, "
                              f"is_causal={causal}")
        return func(*args, **kwargs)


SDPA_KINDS = {
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash (cpu)",
    "aten::_scaled_dot_product_cudnn_attention": "cudnn",
    "aten::_scaled_dot_product_efficient_attention": "efficient",
    "aten::_scaled_dot_product_attention_math": "math",
    "aten::_scaled_dot_product_fused_attention_overrideable": "overrideable",
}


# The events of one host synchronisation, per device type. On CUDA an ``.item()`` is an aten::_local_scalar_dense
# event with a cudaStreamSynchronize inside it (c10::cuda::memcpy_and_sync: cudaMemcpyAsync, then the stream sync),
# so counting both would count it twice; cudaStreamSynchronize alone also sees blocking device-to-host copies and
# nonzero. On CPU nothing waits: aten::_local_scalar_dense marks the calls that would on a GPU.
# cudaDeviceSynchronize is not counted: the library never calls it, while profile_call's own C.sync and the
# profiler's exit (torch.autograd.profiler.profile.__exit__ synchronises before it stops recording) both do inside
# the profiled window, so it would add 2 to every row on CUDA, the reference layer's included
HOST_SYNC_EVENTS = {"cuda": ("cudaStreamSynchronize",), "cpu": ("aten::_local_scalar_dense",)}


def host_syncs(names: Counter, device: str) -> int:
    """Host synchronisations among the profiled event names of a run on ``device`` (see :data:`HOST_SYNC_EVENTS`)."""
    return sum(names[k] for k in HOST_SYNC_EVENTS["cuda" if torch.device(device).type == "cuda" else "cpu"])


def profile_call(fn: Callable[[], None], device: str) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    for _ in range(2):
        fn()
    C.sync(device)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    rec = SDPARecorder()
    with profile(activities=acts) as prof, rec:
        fn()
        C.sync(device)
    names = Counter(e.name for e in prof.events())
    kernels = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA) if device == "cuda" \
        else sum(n for k, n in names.items() if k.startswith("aten::"))
    syncs = host_syncs(names, device)
    sdpa = sorted({SDPA_KINDS[k] for k in names if k in SDPA_KINDS})
    triton_kernels = sorted({k for k in names if k.startswith(("_first_step", "_next_step", "_transposed_step", "_bwd_"))})
    return {"sdpa": ", ".join(sdpa) or "-", "inputs": "; ".join(sorted(set(rec.calls))) or "-",
            "launches": kernels, "copies": names["aten::copy_"], "casts": names["aten::_to_copy"], "syncs": syncs,
            "triton": ", ".join(triton_kernels) or "-"}


def part_profile(args: Any, rep: C.Report, smoke: bool, with_triton: bool) -> None:
    dev = args.device
    B, N, D, H = first_layer_size(smoke)
    layers, _ = build_layers(D, H, True, dev, with_triton, args.library_backend)
    x = torch.randn(B, N, D, generator=torch.Generator().manual_seed(1)).to(dev)
    rows = []
    for name, fn in layer_callables(layers, x, True, dev).items():
        p = profile_call(fn, dev)
        rows.append([name, p["sdpa"], p["inputs"], p["launches"], p["copies"], p["casts"], p["syncs"]])
        rep.rows.append({"profile": name, **p})
    unit = "CUDA kernels" if dev == "cuda" else "aten ops (CPU)"
    rep.table(f"Profile of one forward+backward, (B, N, D, H) = {(B, N, D, H)}, causal, bf16 autocast",
              ["layer", "SDPA kernel", "SDPA inputs", unit, "copy_", "_to_copy", "host syncs"], rows)


# ---------------------------------------------------------------------------- GPT
def gpt_models(name: str, L: int, H: int, D: int, T: int, V: int, device: str, with_triton: bool,
               backend: str = "auto") -> dict[str, nn.Module]:
    torch.manual_seed(0)
    models: dict[str, nn.Module] = {"nanoGPT": GPT(NanoGPTConfig(block_size=T, vocab_size=V, n_layer=L, n_head=H, n_embd=D))}
    common = dict(vocab_size=V, block_size=T, n_layer=L, n_head=H, n_embd=D, bias=False, dropout=0.0)
    variants = {
        "attention": GPTConfig(**common),
        "half Laplacian": GPTConfig(**common, laplacian_heads=H // 2),
        "2 heat(K=4)": GPTConfig(**common, heads=f"attention:{H - 2},heat(t=1.0, steps=4):2"),
        # the same layouts with the layers' combined head output formed again in the backward pass (less memory,
        # more host and element-wise work: which wins on the GPU decides the default, off for now)
        "half Laplacian, recompute": GPTConfig(**common, laplacian_heads=H // 2, recompute=True),
        "2 heat(K=4), recompute": GPTConfig(**common, heads=f"attention:{H - 2},heat(t=1.0, steps=4):2", recompute=True),
    }
    for vname, cfg in variants.items():
        models[f"DiffusionGPT {vname}"] = DiffusionGPT(dataclasses.replace(cfg, backend=backend))
    if with_triton:  # (recompute has no effect on the Triton back-end, whose kernels keep what they need)
        for vname, cfg in variants.items():
            if cfg.recompute:
                continue
            models[f"triton: DiffusionGPT {vname}"] = DiffusionGPT(dataclasses.replace(cfg, backend="triton"))
    return {k: m.to(device) for k, m in models.items()}


GPT_TARGETS = {"attention": 1.00, "half Laplacian": 0.97, "2 heat(K=4)": 0.85}


def part_gpt(args: Any, rep: C.Report, smoke: bool, with_triton: bool) -> None:
    dev = args.device
    rounds = args.rounds or (2 if smoke else 7)
    for (sname, L, H, D, T, B, V) in selected_gpt_sizes(args, smoke):
        models = gpt_models(sname, L, H, D, T, V, dev, with_triton, args.library_backend)
        g = torch.Generator().manual_seed(1)
        idx = torch.randint(0, V, (B, T), generator=g).to(dev)
        targets = torch.randint(0, V, (B, T), generator=g).to(dev)
        steps: dict[str, Callable[[], None]] = {}
        for name, m in models.items():
            m.train()
            decay = [p for p in m.parameters() if p.dim() >= 2]
            other = [p for p in m.parameters() if p.dim() < 2]
            opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                                    lr=6e-4, betas=(0.9, 0.95), **({"fused": True} if dev == "cuda" else {}))
            steps[name] = C.train_step(m, opt, idx, targets, autocast=dev)
        mem = {}
        for name, fn in steps.items():  # steady state: AdamW's state is made by a warm-up step, outside the peak
            fn()
            mem[name] = C.peak_memory(fn, dev)
        t = C.measure(steps, device=dev, rounds=rounds, block_s=0.0, warmup=1 if smoke else 3)
        rows = []
        for name in models:
            r = C.ratio(t, "nanoGPT", name)  # throughput ratio = nanoGPT time / time
            variant = name.replace("triton: ", "").replace("DiffusionGPT ", "").replace(", recompute", "")
            target = GPT_TARGETS.get(variant)
            mem_ratio = mem[name] / max(mem["nanoGPT"], 1)
            met = "" if target is None else C.check(r[0] >= target and mem_ratio <= 1.05)
            rows.append([name, C.ms(t[name].median), f"{B * T / t[name].median:.0f}",
                         "1 (baseline)" if name == "nanoGPT" else C.rfmt(r), C.mib(mem[name]), f"{mem_ratio:.3f}",
                         "" if target is None else f"{target:.2f}", met])
            rep.rows.append({"gpt": sname, "model": name, "step_s": t[name].median, "throughput_vs_nanogpt": r,
                             "peak_bytes": mem[name], "target": target})
        rep.table(f"GPT training step {sname}: {L} layers, {H} heads, width {D}, T = {T}, batch {B}, vocabulary {V}; "
                  f"bf16 autocast, AdamW{' fused' if dev == 'cuda' else ''}, eager; median of {rounds} interleaved rounds; "
                  "throughput = nanoGPT step time / step time [IQR]",
                  ["model", "step ms", "tokens/s", "throughput / nanoGPT", "peak MiB", "memory / nanoGPT", "target", "met"],
                  rows)
        del models, steps
        if dev == "cuda":
            torch.cuda.empty_cache()


# ---------------------------------------------------------------------------- warm-up
def warm_jobs(args: Any, smoke: bool, with_triton: bool) -> list[list[tuple[Any, ...]]]:
    """The Triton layers the parts run, as (N, D, H, layer, causal, training, dropout), grouped by kernel variant.

    A group is one layer type, causal or not, training or not, and dropout, at every shape the parts use (the
    GPT's layers included): the shapes specialise alike, so a group's kernels are built once.
    """
    if not with_triton:
        return []
    shapes: list[tuple[int, int, int]] = []
    if "layers" in args.parts:
        shapes += [(N, D, H) for (_, N, D, H) in selected_layer_sizes(args, smoke)]
    if "profile" in args.parts:
        shapes.append(first_layer_size(smoke)[1:])
    if "gpt" in args.parts:
        shapes += [(T, D, H) for (_, _, H, D, T, _, _) in selected_gpt_sizes(args, smoke)]
    shapes = sorted(set(shapes))
    groups = [[(N, D, H, name, causal, train, 0.0) for (N, D, H) in shapes]
              for name in layer_specs(2) for causal in ([True] if smoke else [False, True]) for train in (False, True)]
    if "dropout" in args.parts:
        _, N, D, H = first_layer_size(smoke)
        groups += [[(N, D, H, name, True, True, 0.1)] for name in ("half Laplacian", "2 heat(t=1, K=8)")]
    return [g for g in groups if g]


def warm_run(device: str) -> Callable[[list[tuple[Any, ...]]], None]:
    """Run one group of :func:`warm_jobs` once, untimed (batch 2), as the parts run their layers."""
    def run(group: list[tuple[Any, ...]]) -> None:
        for N, D, H, name, causal, train, drop in group:
            m = DiffusionAttention(D, H, layer_specs(H)[name], causal=causal, bias=False, backend="triton",
                                   dropout=drop).to(device)
            x = torch.randn(2, N, D, device=device)
            layer_callables({name: m}, x, train, device)[name]()
    return run


def main(argv: list[str] | None = None) -> C.Report:
    def extra(p):  # noqa: ANN001, ANN202
        p.add_argument("--smoke", action="store_true", help="tiny sizes and rounds (CPU smoke test of the script)")
        p.add_argument("--library-backend", default="auto", choices=["auto", "sdpa", "matrix"],
                       help="dense back-end of the library columns (the Triton column always uses 'triton')")
        p.add_argument("--parts", nargs="*", default=["layers", "profile", "gpt", "dropout"],
                       choices=["layers", "profile", "gpt", "dropout"])
        p.add_argument("--layer-sizes", nargs="*", type=int, default=None, metavar="I",
                       help=f"indices into the layer sizes {LAYER_SIZES} (default: all; for a GPU call short of time)")
        p.add_argument("--gpt-sizes", nargs="*", default=None, choices=[s[0] for s in GPT_SIZES],
                       help="GPT sizes to run (default: all)")
        C.add_warm_arguments(p)

    args = C.parse_args(__doc__.splitlines()[0], argv, extra)
    smoke = args.smoke or os.environ.get("DF_BENCH_SMOKE", "0") not in ("", "0")
    for flag, chosen in (("--layer-sizes", args.layer_sizes), ("--gpt-sizes", args.gpt_sizes), ("--parts", args.parts)):
        if chosen is not None and not chosen:  # e.g. an empty $BENCH_ISSUE15_ARGS expansion: it would judge nothing
            raise SystemExit(f"bench_issue15: {flag} was given without values; leave it out for all")
    C.check_indices("bench_issue15", "--layer-sizes", args.layer_sizes, LAYER_SIZES, "all")
    full = [flag for part, flag, chosen in (("layers", "--layer-sizes", args.layer_sizes),
                                            ("gpt", "--gpt-sizes", args.gpt_sizes)) if part in args.parts and chosen is None]
    if args.device == "cpu" and not smoke and full:
        # the full grid (a 12-layer GPT at T=1024, 4096-token layers) takes hours on a CPU: refuse it up front (also
        # when only one of the two parts has its sizes chosen: the other would still run all of its own)
        raise SystemExit("bench_issue15: the full sizes are meant for a GPU (hours on a CPU); on CPU pass --smoke, "
                         f"or choose sizes with {' and '.join(full)} (or leave their parts out with --parts)")
    with_triton = triton_ready(args.device)
    argv_on = ["--device", args.device, "--threads", "1", "--parts", *args.parts] + (["--smoke"] if smoke else [])
    argv_on += [] if args.layer_sizes is None else ["--layer-sizes", *map(str, args.layer_sizes)]
    argv_on += [] if args.gpt_sizes is None else ["--gpt-sizes", *args.gpt_sizes]
    warm_note = C.warm_kernels(__file__, argv_on, args, warm_jobs(args, smoke, with_triton), warm_run(args.device))
    rep = C.Report("bench_issue15", "Issue 15: head types vs the reference attention layer, profile, GPT vs nanoGPT", args)
    rep.note(f"Triton column: {'yes' if with_triton else 'no (triton not importable, or CPU without TRITON_INTERPRET=1)'}"
             + f"; library columns: backend={args.library_backend!r}"
             + ("; smoke run: tiny sizes, the numbers mean nothing" if smoke else ""))
    if warm_note:
        rep.note(warm_note)
    if "layers" in args.parts:
        part_layers(args, rep, smoke, with_triton)
    if "profile" in args.parts:
        part_profile(args, rep, smoke, with_triton)
    if "gpt" in args.parts:
        part_gpt(args, rep, smoke, with_triton)
    if "dropout" in args.parts:
        part_dropout(args, rep, smoke, with_triton)
    rep.write()
    return rep


if __name__ == "__main__":
    main()
