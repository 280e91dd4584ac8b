"""Static cost of dropout on ``P`` in the Triton kernels: PTX instructions per kernel, no GPU needed.

Each kernel that runs a power of ``P`` is compiled for sm_90 (bf16, causal, no padding, head size
64, the launch geometry of ``ops.triton._launch.BLOCKS``) with and without ``DROPOUT`` by triton's
bundled toolchain (``diffusionformer.ops.triton._aot``), and the table gives its PTX instruction count, the
``mul.hi`` instructions (the Philox rounds' 32-bit high multiplies: 10 rounds x 2 per draw of
4 x 32 bits) and its shared memory. The kernels' loop bodies are compiled once, so a count is per
block pair, not per launch; it is a static proxy, not a time (the GPU suite's ``dropout`` rows time
it). ``--kernels-file`` compiles another version of ``_kernels.py`` instead, e.g. an earlier commit's:

    git show REV:diffusionformer/ops/triton/_kernels.py > /tmp/kernels_rev.py
    python benchmarks/ptx_counts.py --kernels-file /tmp/kernels_rev.py --out /tmp/ptx-rev
"""

from __future__ import annotations

import importlib.util
import os

os.environ["TRITON_INTERPRET"] = "0"  # before triton is imported: compile, do not interpret

import _common as C  # noqa: E402
from diffusionformer.ops.triton._aot import compile_kernel, ptx_instructions  # noqa: E402
from diffusionformer.ops.triton._launch import cuda_geometry  # noqa: E402

BLOCK_C = 64  # head size 64
# the geometry the library launches with (ops.triton._launch.BLOCKS), block sizes as each kernel takes them
(FWD_M, FWD_N, BWD_M, BWD_N), LAUNCH = cuda_geometry(BLOCK_C)
BWD_LAUNCH = cuda_geometry(BLOCK_C, backward=True)[1]  # the backward kernels' warps and stages
# (kernel, constexprs beyond the common ones)
CASES = [("_first_step", dict(STORE_Y=True, BLOCK_M=FWD_M, BLOCK_N=FWD_N)),
         ("_next_step", dict(STORE_Y=True, BLOCK_M=FWD_M, BLOCK_N=FWD_N)),
         ("_transposed_step", dict(HAS_IN=True, BLOCK_M=BWD_M, BLOCK_N=BWD_N)),
         ("_bwd_dkdv", dict(BLOCK_M=BWD_M, BLOCK_N=BWD_N)),
         ("_bwd_dq", dict(BLOCK_M=BWD_N, BLOCK_N=BWD_M))]
COMMON = dict(CAUSAL=True, HAS_PAD=False, MASK_KIND=0, UPCAST=False, IEEE=False, BLOCK_C=BLOCK_C)


def load_kernels(path: str | None):  # noqa: ANN201
    if path is None:
        from diffusionformer.ops.triton import _kernels
        return _kernels
    spec = importlib.util.spec_from_file_location("kernels_under_test", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"ptx_counts: cannot load {path!r}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(argv: list[str] | None = None) -> C.Report:
    def extra(p):  # noqa: ANN001, ANN202
        p.add_argument("--kernels-file", default=None, help="another _kernels.py to compile (default: the library's)")

    args = C.parse_args(__doc__.splitlines()[0], argv, extra)
    K = load_kernels(args.kernels_file)
    rep = C.Report("ptx_counts", "Static cost of dropout on P in the Triton kernels (PTX, sm_90)", args)
    rep.note(f"kernels: {args.kernels_file or 'diffusionformer.ops.triton._kernels'}")
    rows = []
    for name, extra_consts in CASES:
        counts = {}
        for drop in (False, True):
            k = compile_kernel(getattr(K, name), dict(COMMON, DROPOUT=drop, **extra_consts),
                               **(LAUNCH if name in ("_first_step", "_next_step") else BWD_LAUNCH))
            ins = ptx_instructions(k)
            counts[drop] = (len(ins), sum(i.startswith("mul.hi") for i in ins), k.metadata.shared)
        (n0, _, s0), (n1, h1, s1) = counts[False], counts[True]
        rows.append([name, n0, n1, n1 - n0, h1, s0, s1])
        rep.rows.append({"kernel": name, "ptx": n0, "ptx_dropout": n1, "mul_hi_dropout": h1, "shared": s0,
                         "shared_dropout": s1})
        print(name, rows[-1][1:], flush=True)
    rep.table("PTX instructions per kernel, sm_90, bf16, causal, head size 64, default blocks; without and with DROPOUT",
              ["kernel", "PTX", "PTX with dropout", "added by dropout", "mul.hi with dropout", "shared bytes",
               "shared bytes with dropout"], rows)
    rep.write()
    return rep


if __name__ == "__main__":
    main()
