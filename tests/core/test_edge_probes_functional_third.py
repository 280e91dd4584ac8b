"""Edge probes of the functional API (third pass): float masks on half-precision inputs."""

import pytest
import torch

import diffusionformer.functional as DF


@pytest.mark.parametrize("backend", ["sdpa", "matrix"])
def test_bug_float_mask_beyond_half_range_is_not_a_fully_masked_row(backend):
    """Bug: a float attn_mask was cast to the dtype of float16 inputs, so a finite bias beyond float16's range
    (-1e9, a common "do not attend" value, or finfo(float32).min) overflowed to -inf; a row whose entries were all
    such biases then became a fully masked zero row (output 0), where softmax(s + c) = softmax(s) (and
    F.scaled_dot_product_attention with the same float32 mask) attends."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 3, 4, dtype=torch.float16) for _ in range(3))
    mask = torch.tensor([[-1e9, -1e9, -1e9], [0.0, -1e9, 0.0], [0.0, 0.0, 0.0]])
    P_ref = torch.softmax(q.double() @ k.double().transpose(-2, -1) / 2.0 + mask.double(), dim=-1)  # explicit, float64
    ref = (P_ref @ v.double()).float()
    out = DF.diffuse(q, k, v, [0.0, 1.0], attn_mask=mask, backend=backend)
    torch.testing.assert_close(out.float(), ref, atol=1e-2, rtol=1e-2)
    P = DF.attention_matrix(q, k, attn_mask=mask)
    torch.testing.assert_close(P.float(), P_ref.float(), atol=2e-3, rtol=0)
    # -inf stays a masked entry
    inf_mask = mask.masked_fill(mask < 0, float("-inf"))
    assert DF.attention_matrix(q, k, attn_mask=inf_mask)[..., 0, :].abs().sum() == 0
