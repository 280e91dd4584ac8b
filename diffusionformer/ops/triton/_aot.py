"""Ahead-of-time builds of the Triton kernels for a GPU target, on a machine without a GPU.

triton's wheel bundles its toolchain (``ptxas``), so any kernel of
:mod:`~diffusionformer.ops.triton._kernels` can be compiled down to an sm_90 cubin here: the tests
use it to catch what the interpreter does not type-check, and ``benchmarks/ptx_counts.py`` to count
a kernel's instructions. ``TRITON_INTERPRET`` must be ``0`` (or unset) before triton is first
imported, since the interpreter replaces the kernels by Python functions.
"""

from __future__ import annotations

from typing import Any

#: pointer arguments that are not tensors in the inputs' dtype, by name
POINTERS = {"PAD": "*u8", "C0": "*fp32", "C1": "*fp32", "CK": "*fp32", "LSE": "*fp32", "DELTA": "*fp64",
            "DCROW": "*fp32", "ACC": "*fp32", "SEED": "*i64"}
#: the tensor arguments in the inputs' dtype (q, k, v, outputs, gradients, the powers y_t): bf16 unless told
TENSORS = ("Q", "K", "V", "X", "G", "A", "A_IN", "A_OUT", "Y", "YS", "OUT", "DQ", "DK", "DV")


def signature(fn: Any, consts: dict[str, Any], dtype: str = "bf16") -> dict[str, str]:
    """Triton's argument types of kernel ``fn`` with the constexprs ``consts``: tensors in ``dtype`` (triton's name:
    ``"bf16"``, ``"fp16"``, ``"fp32"`` with ``IEEE=True``, as the launches pair them), float32 statistics
    (``DELTA`` float64), a bool (MASK_KIND 1) or ``dtype`` (MASK_KIND 2) ``attn_mask``, int32 sizes and strides."""
    writes_scales = fn.arg_names[:2] == ["SEED", "OUT"]  # _dropout_scales writes float32
    sig = {}
    for name in fn.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        elif name == "MASK":
            sig[name] = f"*{dtype}" if consts.get("MASK_KIND") == 2 else "*u8"
        elif name in POINTERS or (name == "OUT" and writes_scales):
            sig[name] = POINTERS.get(name, "*fp32")
        elif name in TENSORS:
            sig[name] = f"*{dtype}"
        elif name.endswith("scale") or name in ("drop_p", "inv_keep"):
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    return sig


def compile_kernel(fn: Any, consts: dict[str, Any], arch: int = 90, num_warps: int = 4, num_stages: int = 2,
                   dtype: str = "bf16") -> Any:
    """Compile kernel ``fn`` (a ``triton.jit`` function) with the constexprs ``consts`` for CUDA ``sm_<arch>``, its
    tensors in ``dtype`` (:func:`signature`).

    ``consts`` may name constexprs the kernel does not take (they are dropped), so one dict of flags
    serves every kernel. Returns triton's compiled kernel (``.asm["ptx"]``, ``.asm["cubin"]``, ``.metadata``).
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    consts = {n: v for n, v in consts.items() if n in fn.arg_names}
    return triton.compile(ASTSource(fn=fn, signature=signature(fn, consts, dtype), constexprs=consts),
                          target=GPUTarget("cuda", arch, 32), options={"num_warps": num_warps, "num_stages": num_stages})


def ptx_instructions(kernel: Any) -> list[str]:
    """The instruction lines of a compiled kernel's PTX (no directives, labels, braces or comments)."""
    out = []
    for line in kernel.asm["ptx"].splitlines():
        s = line.strip()
        if not s or s.startswith(("//", ".", "{", "}", "$")) or s.endswith(":") or not s[0].isalpha() and s[0] != "@":
            continue
        out.append(s)
    return out
