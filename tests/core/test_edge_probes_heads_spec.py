"""Edge probes of per-layer head specifications (``nn.heads``, ``nn.block``) and of how presets and experiment
overrides feed them.

Probed: ``resolve_layer_heads`` (strings, templates, per-layer lists and dicts, ``laplacian_heads`` ints, ``"half"``
and lists; bool/float/negative/too-large counts, wrong lengths, both forms given), ``parse_heads`` (counts that do not
add up, duplicate operator names, aliases, unknown names with their "did you mean"), the head order of every layout
(the documented one: the spec's order, ``laplacian_heads`` last), state-dict keys of equivalent specs, GQA, and a
``Block`` forward (pre-norm residual) against a float64 per-head reference ``f_h(P_h) v_h`` written out here.

Found and fixed (tests named ``test_bug_...``):

- ``experiments.build.add_setting_overrides``: a task whose ``model_overrides`` set ``heads`` (or ``laplacian_heads``)
  run with an operator setting that sets its own layout: ``heads`` over ``heads`` dropped the task's layout without a
  word; ``laplacian_heads`` over ``heads`` failed in the model with "give either heads= or laplacian_heads=, not
  both", naming neither the task nor the setting.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from diffusionformer.data.base import ClassificationData
from diffusionformer.experiments.build import build_model
from diffusionformer.experiments.config import OperatorSetting, TaskConfig
from diffusionformer.models import create_model
from diffusionformer.nn import Block, DiffusionAttention
from diffusionformer.nn.heads import parse_heads, resolve_layer_heads


def _per_head(layer: DiffusionAttention) -> list[tuple[str, list[int]]]:
    """``(operator name, head indices)`` of each group of a built layer."""
    return [(g.operator.name, list(range(g.start, g.stop))) for g in layer.head_groups]


# ----------------------------------------------------------------------------- bug: a task's layout and a setting's
def _images() -> ClassificationData:
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(k, 1, 8, 8, generator=g) for k in (4, 2, 2)]
    ys = [torch.randint(0, 3, (k,), generator=g) for k in (4, 2, 2)]
    return ClassificationData("img", "image", xs[0], ys[0], xs[1], ys[1], xs[2], ys[2], 3, (1, 8, 8))


@pytest.mark.parametrize("task_layout, setting, task_alone, setting_alone", [
    ({"heads": "laplacian:2"}, OperatorSetting("mine", heads="attention:1,heat:1"),
     ["laplacian", "laplacian"], ["attention", "heat"]),
    ({"heads": "laplacian:2"}, OperatorSetting("mine", laplacian_heads=1),
     ["laplacian", "laplacian"], ["attention", "laplacian"]),
    ({"laplacian_heads": 1}, OperatorSetting("mine", heads="attention:{H}"),
     ["attention", "laplacian"], ["attention", "attention"]),
], ids=["heads-heads", "heads-laplacian", "laplacian-heads"])
def test_bug_a_tasks_head_layout_and_a_settings_are_refused(task_layout, setting, task_alone, setting_alone) -> None:
    """Bug: a task's model_overrides heads was silently replaced by an operator setting's heads (or the model refused
    "both" without naming the task or setting)."""
    task = TaskConfig("d", "digits", "vit-digits", train={"max_steps": 1},
                      model_overrides={"dim": 8, "depth": 1, "num_heads": 2, **task_layout})
    with pytest.raises(ValueError, match=r"task 'd': model_overrides sets (heads|laplacian_heads) and operator "
                                         r"setting 'mine' sets (heads|laplacian_heads)"):
        build_model(task, setting, _images())
    # the task's layout alone (a setting without one) and the setting's alone still build
    assert build_model(task, OperatorSetting("base"), _images()).blocks[0].attn.head_operator_names == task_alone
    plain = TaskConfig("d", "digits", "vit-digits", train={"max_steps": 1},
                       model_overrides={"dim": 8, "depth": 1, "num_heads": 2})
    assert build_model(plain, setting, _images()).blocks[0].attn.head_operator_names == setting_alone


# ----------------------------------------------------------------------------- pins: layouts written out by hand
@pytest.mark.parametrize("kwargs, expected", [
    # laplacian_heads: the last k heads of a layer (the seed paper's code); "half" = H // 2; 0 = attention only
    (dict(laplacian_heads=1), [[("attention", [0, 1, 2]), ("laplacian", [3])]] * 3),
    (dict(laplacian_heads="half"), [[("attention", [0, 1]), ("laplacian", [2, 3])]] * 3),
    (dict(laplacian_heads=[0, "half", 4]),
     [[("attention", [0, 1, 2, 3])], [("attention", [0, 1]), ("laplacian", [2, 3])], [("laplacian", [0, 1, 2, 3])]]),
    # heads: the spec's order, whatever the operators; a dict changes some layers (negative = from the end)
    (dict(heads="lap:{half},attention:{half}"), [[("laplacian", [0, 1]), ("attention", [2, 3])]] * 3),
    (dict(heads={"-1": "I-P:1,attn:3", 0: "attention:2,attention:2"}),
     [[("attention", [0, 1]), ("attention", [2, 3])], [("attention", [0, 1, 2, 3])],
      [("laplacian", [0]), ("attention", [1, 2, 3])]]),
    (dict(heads=[None, ["attention", "laplacian", "attention", "laplacian"], "laplacian"]),
     [[("attention", [0, 1, 2, 3])], [("attention", [0]), ("laplacian", [1]), ("attention", [2]), ("laplacian", [3])],
      [("laplacian", [0, 1, 2, 3])]]),
])
def test_pins_layer_layouts_by_hand(kwargs, expected) -> None:
    layers = [Block(8, 4, spec, num_kv_heads=2).attn for spec in resolve_layer_heads(3, 4, **kwargs)]
    assert [_per_head(layer) for layer in layers] == expected


@pytest.mark.parametrize("kwargs, message", [
    (dict(heads="attention:2,laplacian:1"), "assigns 3 heads but the layer has num_heads=4"),
    (dict(heads="attention:3,laplacian:3"), "assigns 6 heads but the layer has num_heads=4"),
    (dict(heads="atention:2,laplacian:2"), r"unknown operator 'atention' \(did you mean 'attention'"),
    (dict(heads={1: "laplacain:4"}), r"unknown operator 'laplacain' \(did you mean 'laplacian'\?\)"),
    (dict(heads="attention:-1,laplacian:5"), "head count must be non-negative"),
    (dict(heads="attention:2.0,laplacian:2"), "head count after ':' must be an integer"),
    (dict(heads=["attention:4"] * 2), "a per-layer heads list must have 3 entries"),
    (dict(heads={3: "laplacian:4"}), "layer index 3 out of range for 3 layers"),
    (dict(heads={2: "laplacian:4", -1: "attention:4"}), "names layer 2 of 3 twice"),
    (dict(laplacian_heads=True), r"laplacian_heads\[0\] must be an int in \[0, 4\], got True"),
    (dict(laplacian_heads=[1, 2.0, 1]), r"laplacian_heads\[1\] must be an int in \[0, 4\], got 2.0"),
    (dict(laplacian_heads=-1), r"laplacian_heads\[0\] must be an int in \[0, 4\], got -1"),
    (dict(laplacian_heads=5), r"laplacian_heads\[0\] must be an int in \[0, 4\], got 5"),
    (dict(laplacian_heads=[1, 1]), "laplacian_heads lists 2 layers, the model has 3"),
    (dict(laplacian_heads="most"), "laplacian_heads must be an int, 'half' or a list"),
    (dict(heads="attention:4", laplacian_heads=0), "give either heads= or laplacian_heads=, not both"),
])
def test_pins_bad_layouts_are_refused_by_name(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        for spec in resolve_layer_heads(3, 4, **kwargs):
            parse_heads(spec, 4)


def test_pins_equivalent_specs_share_state_dict_keys_and_initial_values() -> None:
    def built(spec):
        torch.manual_seed(0)
        return create_model("gpt-char-tiny", n_embd=16, **spec).state_dict()

    base = built(dict(laplacian_heads=2))
    for spec in (dict(heads="attention:2,laplacian:2"), dict(heads="attn:{half},lap:1,I-P:1"),
                 dict(heads=["attention:1,attention:1,laplacian:2", "softmax:2,laplacian:{half}"]),
                 dict(heads="heat(learnable=True):0,attention:2,laplacian:2")):
        other = built(spec)
        assert list(other) == list(base)
        assert all(torch.equal(other[k], base[k]) for k in base), spec  # a zero-count group draws no numbers


# ----------------------------------------------------------------------------- pins: Block vs a float64 reference
def _block_reference(block: Block, x: torch.Tensor, laplacian: list[bool], causal: bool) -> torch.Tensor:
    """x + Attn(LN1 x), then + MLP(LN2 x); head h: f_h(P_h) v_h, P_h = softmax(q_h k_g^T / sqrt(C)), g = h // (H/G)."""
    sd = {k: v.double() for k, v in block.state_dict().items()}
    x = x.double()
    B, N, D = x.shape
    H, G = block.attn.num_heads, block.attn.num_kv_heads
    C = D // H
    qkv = F.layer_norm(x, (D,), sd["norm1.weight"], sd["norm1.bias"]) @ sd["attn.qkv.weight"].T + sd["attn.qkv.bias"]
    heads = []
    for h in range(H):
        g = h // (H // G)
        q = qkv[..., h * C:(h + 1) * C]
        k = qkv[..., H * C + g * C:H * C + (g + 1) * C]
        v = qkv[..., H * C + G * C + g * C:H * C + G * C + (g + 1) * C]
        s = q @ k.transpose(-1, -2) / math.sqrt(C)
        if causal:
            s = s.masked_fill(torch.ones(N, N, dtype=torch.bool).triu(1), -math.inf)
        P = s.softmax(-1)
        heads.append(((torch.eye(N, dtype=torch.float64) - P) if laplacian[h] else P) @ v)
    x = x + torch.cat(heads, -1) @ sd["attn.out_proj.weight"].T + sd["attn.out_proj.bias"]
    y = F.layer_norm(x, (D,), sd["norm2.weight"], sd["norm2.bias"])
    return x + F.gelu(y @ sd["mlp.fc1.weight"].T + sd["mlp.fc1.bias"]) @ sd["mlp.fc2.weight"].T + sd["mlp.fc2.bias"]


@pytest.mark.parametrize("spec, laplacian, kv", [
    ("attention:2,laplacian:2", [False, False, True, True], None),
    ("lap:1,attention:2,I-P:1", [True, False, False, True], 2),
    (["attention", "laplacian", "laplacian", "attention"], [False, True, True, False], 1),
    ("laplacian", [True] * 4, 2),
])
@pytest.mark.parametrize("causal", [False, True])
def test_pins_block_matches_float64_per_head_reference(spec, laplacian, kv, causal) -> None:
    torch.manual_seed(0)
    block = Block(16, 4, spec, num_kv_heads=kv, causal=causal).eval()
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 0.5)
    x = torch.randn(2, 5, 16)
    ref = _block_reference(block, x, laplacian, causal)
    torch.testing.assert_close(block(x).double(), ref, rtol=0, atol=5e-5)
    torch.testing.assert_close(block.double()(x.double()), ref, rtol=0, atol=1e-12)
