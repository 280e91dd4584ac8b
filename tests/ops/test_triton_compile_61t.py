"""Task 61t. (1) The float32 backward of the Triton K-step kernels (``IEEE=True``: float64 ``DELTA``, Kahan-compensated
``dP``, :func:`~diffusionformer.ops.triton._kernels._acc_dp`, ``_split``) built to an sm_90 cubin, as the bf16 kernels
are in test_triton_attention.py (no GPU needed). (2) A recorder entered while another's block hook walks the active
recorders (another thread's ``with LayerRecorder``) made that hook raise "Set changed size during iteration"."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
import torch

requires_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")

# a subprocess: TRITON_INTERPRET (set to 1 by tests/ops/conftest.py without a GPU) must be 0 before triton is imported
COMPILE_FLOAT32 = r"""
import json, os
os.environ["TRITON_INTERPRET"] = "0"
from diffusionformer.ops.triton import _kernels as K
from diffusionformer.ops.triton._aot import compile_kernel, ptx_instructions

# float32 inputs, as ops.triton._launch sets the flags for them on a GPU
common = dict(CAUSAL=True, HAS_PAD=True, MASK_KIND=0, UPCAST=False, IEEE=True, DROPOUT=False, BLOCK_C=64)
cases = [(K._transposed_step, dict(HAS_IN=True, BLOCK_M=32, BLOCK_N=64)),
         (K._bwd_dkdv, dict(BLOCK_M=32, BLOCK_N=64)),
         (K._bwd_dq, dict(BLOCK_M=64, BLOCK_N=32))]
variants = {"plain": {}, "dropout": dict(DROPOUT=True), "float_mask": dict(MASK_KIND=2, HAS_PAD=False)}
for fn, extra in cases:
    for variant, flags in variants.items():
        k = compile_kernel(fn, dict(common, **extra, **flags), dtype="fp32")
        ops = [i.split()[1] if i.startswith("@") else i.split()[0] for i in ptx_instructions(k)]
        print(json.dumps({"kernel": fn.__name__, "variant": variant, "cubin": bool(k.asm.get("cubin")),
                          "signature": k.src.signature, "ieee": k.src.constants[(fn.arg_names.index("IEEE"),)],
                          "ld64": ops.count("ld.global.b64"), "st64": ops.count("st.global.b64")}))
"""


@requires_triton
@pytest.mark.slow
def test_float32_backward_kernels_compile_for_a_gpu_target_with_a_float64_delta():
    # the existing compile test builds bf16 alone (IEEE=False): the float32 branch of 0c14db3/9dd60cc (compensated dP,
    # float64 delta and its split) was never compiled by a test. Plain, with dropout on P and with a float attn_mask
    res = subprocess.run([sys.executable, "-c", COMPILE_FLOAT32], capture_output=True, text=True, timeout=600)
    if res.returncode != 0 and "ptxas" in res.stderr and "not found" in res.stderr.lower():
        pytest.skip("triton's ptxas is not available on this machine")
    assert res.returncode == 0, res.stderr[-3000:]
    built = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    assert [(b["kernel"], b["variant"]) for b in built] == [
        (k, v) for k in ("_transposed_step", "_bwd_dkdv", "_bwd_dq") for v in ("plain", "dropout", "float_mask")]
    for b in built:
        where = f"{b['kernel']} ({b['variant']})"
        assert b["cubin"] and b["ieee"] is True, where
        sig = b["signature"]
        # _launch allocates delta in float64: a '*fp32' DELTA compiles too (stores cast), and reads half of each value
        assert sig["DELTA"] == "*fp64", where
        assert sig["Q"] == "*fp32" and sig.get("A", sig.get("A_OUT")) == "*fp32", where
        if b["variant"] == "float_mask":
            assert sig["MASK"] == "*fp32", where  # check_attn_mask casts a float mask to the inputs' dtype
        if b["variant"] != "dropout":  # the 64-bit accesses are DELTA's (with dropout the seed is an int64 too)
            stores = 1 if b["kernel"] == "_transposed_step" else 0
            assert b["st64"] == stores and b["ld64"] >= 1, (where, b["ld64"], b["st64"])


# ---- (2) recorders entered or exited while a block hook walks the active ones ---------------------------------------

class _EntersWhileLooked(dict):
    """``LayerRecorder._positions`` of a recorder: its first lookup enters ``recorder`` (what another thread's
    ``with LayerRecorder(...)`` does between two steps of the walk, made deterministic here)."""

    def __init__(self, positions, recorder):
        super().__init__(positions)
        self.recorder = recorder

    def __contains__(self, key):
        if self.recorder is not None:
            self.recorder.__enter__()
            self.recorder = None
        return super().__contains__(key)


class _Outer(torch.nn.Module):
    """A model of its own (``blocks``) whose pass runs ``inner`` first (a teacher inside a distillation step)."""

    def __init__(self, inner, blocks):
        super().__init__()
        self.inner, self.blocks = inner, blocks

    def forward(self, idx, h):
        self.inner(idx)
        for block in self.blocks:
            h = block(h)
        return h


def test_a_recorder_entered_while_a_block_hook_walks_the_recorders_breaks_no_pass():
    from diffusionformer.analysis.capture import _RECORDING, LayerRecorder
    from diffusionformer.models import DiffusionGPT, GPTConfig

    torch.manual_seed(0)
    config = GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16)
    student, teacher, third, fourth = (DiffusionGPT(config) for _ in range(4))
    teacher.blocks[1] = student.blocks[1]  # one block shared: the student's recorder asks whose pass calls it
    outer = _Outer(teacher, third.blocks)
    idx, h = torch.randint(0, 11, (2, 8)), torch.randn(2, 8, 16)
    late = LayerRecorder(fourth)
    try:
        with LayerRecorder(student) as rs, LayerRecorder(outer) as ro:
            # the teacher's call of the shared block: the student's hooks ask each recorder in a pass (ro: no) whether
            # the block is its; `late` is entered meanwhile
            ro._positions = _EntersWhileLooked(ro._positions, late)
            outer(idx, h)
            # a pass of no recorded model sharing the block (the teacher's): the student's recorder keeps that call
            assert late in _RECORDING and sorted(ro.states) == [0, 1, 2] and sorted(rs.states) == [2]
            student(idx)
            assert sorted(rs.states) == [0, 1, 2]
    finally:
        late.remove()
    assert not _RECORDING
