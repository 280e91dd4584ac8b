"""Edge probes (44): user-facing errors across the public API.

House rule (STYLE.md): a user input error is a ValueError/TypeError that names the argument and says what was
expected and what came, never a bare torch/Python error from three layers down, and never a silent result.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from diffusionformer.functional import dense_attention_reference
from diffusionformer.models import init_transformer_weights
from diffusionformer.nn import Block, make_norm
from diffusionformer.train import open_loggers, resolve_amp, resolve_device


@pytest.mark.parametrize("num_layers, err", [
    (0, ValueError),       # was a bare ZeroDivisionError of std / sqrt(2 * 0)
    (-1, ValueError),      # was "math domain error"
    (True, TypeError),     # was read as one layer, silently
    (1.5, TypeError),      # was a silent sqrt(3) scaling
])
def test_bug_init_transformer_weights_num_layers(num_layers, err):
    """Bug: ``init_transformer_weights(model, 0)`` raised a bare ``ZeroDivisionError: float division by zero``,
    ``-1`` a ``ValueError: math domain error`` naming nothing, and ``True``/``1.5`` were accepted silently as a
    number of layers (the residual projections rescaled by 1/sqrt(2) or 1/sqrt(3))."""
    with pytest.raises(err, match=r"init_transformer_weights\.num_layers must be a positive int, got .*"
                                  + (r"bool True" if num_layers is True else repr(num_layers).replace(".", r"\."))):
        init_transformer_weights(Block(8, 2), num_layers)


@pytest.mark.parametrize("std", [-1.0, math.nan, math.inf, True])
def test_bug_init_transformer_weights_std(std):
    """Bug: a negative or NaN ``std`` surfaced as torch's ``RuntimeError: normal expects std >= 0.0`` (naming
    neither the function nor the argument); ``inf`` filled every weight with inf/NaN silently and ``True`` was
    read as std 1.0."""
    block = Block(8, 2)
    before = {k: v.clone() for k, v in block.state_dict().items()}
    with pytest.raises(ValueError, match=r"init_transformer_weights\.std must be (positive|a finite float), got "
                                         + re.escape(repr(std))):
        init_transformer_weights(block, 2, std=std)
    after = block.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # refused before touching a weight


def test_pins_init_transformer_weights_scaling():
    """Pins the valid path: out_proj and fc2 at std / sqrt(2 L), the other linears at std (large sample)."""
    torch.manual_seed(0)
    block = Block(256, 4)
    init_transformer_weights(block, 8, std=0.5)
    assert block.attn.out_proj.weight.std().item() == pytest.approx(0.5 / 4.0, rel=0.03)
    assert block.mlp.fc2.weight.std().item() == pytest.approx(0.5 / 4.0, rel=0.03)
    assert block.mlp.fc1.weight.std().item() == pytest.approx(0.5, rel=0.03)


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm", torch.nn.LayerNorm])
@pytest.mark.parametrize("dim", [0, -1, 1.5, True, None, "8"])
def test_bug_make_norm_dim(norm, dim):
    """Bug: ``make_norm("layernorm", 0)`` built a ``LayerNorm((0,))`` silently (every input of width > 0 then fails
    in forward with a shape error), ``-1`` raised torch's "Trying to create tensor with negative dimension", ``1.5``
    "'float' object is not iterable" and ``"8"`` "empty(): argument 'size' ...", none naming ``dim``."""
    with pytest.raises(ValueError, match=r"make_norm: dim must be a positive int, got " + re.escape(repr(dim))):
        make_norm(norm, dim)


def test_pins_make_norm_numpy_width():
    """A numpy int width still works (configs read from .npz/yaml): the check returns a Python int."""
    np = pytest.importorskip("numpy")
    norm = make_norm("rmsnorm", np.int64(6))
    assert isinstance(norm, torch.nn.RMSNorm) and norm.normalized_shape == (6,)


@pytest.mark.parametrize("device", ["cuda", "cpu", None, 0])
def test_bug_resolve_amp_device_type(device):
    """Bug: ``resolve_amp("auto", "cuda")`` (a device string, as ``TrainConfig.device`` holds one) raised a bare
    ``AttributeError: 'str' object has no attribute 'type'``, while its siblings ``build_optimizer`` and
    ``capture_rng_state`` answer the same mistake with a TypeError pointing at resolve_device."""
    with pytest.raises(TypeError, match=r"resolve_amp: expected device to be a torch\.device \(resolve_device "
                                        r"turns a string into one\), got " + type(device).__name__):
        resolve_amp("auto", device)
    assert resolve_amp("auto", torch.device("cpu")) is None  # the valid call is unchanged


@pytest.mark.parametrize("spec", [None, 1.5, [0]])
def test_bug_resolve_device_wrong_type(spec):
    """Bug: ``resolve_device(None)`` / ``resolve_device(1.5)`` surfaced torch's multi-line "device() received an
    invalid combination of arguments - got (NoneType), but expected one of: ..." naming no argument, while a bad
    string gives a ValueError naming ``TrainConfig.device``."""
    with pytest.raises(TypeError, match=r"TrainConfig\.device: expected 'auto' or a torch device string such as "
                                        r"'cpu', 'cuda' or 'cuda:1', got " + type(spec).__name__):
        resolve_device(spec)
    with pytest.raises(ValueError, match=r"TrainConfig\.device: .*got 'cdua' \(did you mean 'cuda'\?\)"):
        resolve_device("cdua")  # the string path keeps its ValueError and hint


@pytest.mark.parametrize("scale, err", [(math.nan, ValueError), (math.inf, ValueError), (True, TypeError),
                                        ("x", TypeError)])
def test_bug_dense_attention_reference_scale(scale, err):
    """Bug: ``dense_attention_reference(q, k, scale=nan)`` returned an all-NaN "reference" matrix silently (and
    ``inf`` NaN rows), ``scale=True`` was read as 1.0 and ``scale="x"`` raised torch's "only integer tensors of a
    single element can be converted to an index"; ``attention_matrix`` rejects all four naming ``scale``."""
    q = torch.randn(2, 3, 4)
    with pytest.raises(err, match=r"scale must be (finite|a float or None), got"):
        dense_attention_reference(q, q, scale=scale)


def test_pins_dense_attention_reference_scale_zero_width():
    """An explicit scale still allows C = 0 (every score 0: uniform rows), as before."""
    q = torch.zeros(2, 3, 0)
    torch.testing.assert_close(dense_attention_reference(q, q, scale=0.5),
                               torch.full((2, 3, 3), 1 / 3, dtype=torch.float64))


@pytest.mark.parametrize("names", [None, 3, 1.5])
def test_bug_open_loggers_non_iterable_names(names, tmp_path):
    """Bug: ``open_loggers(None, out_dir)`` raised a bare ``TypeError: 'NoneType' object is not iterable`` naming
    neither the argument nor the valid logger names (a str was already answered with both)."""
    with pytest.raises(TypeError, match=r"loggers: expected a list of names from \('jsonl', 'csv', 'tensorboard'\), "
                                        r"got " + type(names).__name__):
        open_loggers(names, tmp_path)
    assert list(tmp_path.iterdir()) == []



@pytest.mark.parametrize("shape", [(2, 5, 7), (2, 5, 16), (5, 7)])
def test_bug_block_names_a_wrong_width(shape):
    """Bug: ``Block(8, 2)(x)`` with ``x`` of width 7 failed in its first LayerNorm with torch's "Given
    normalized_shape=[8], expected input with shape [*, 8], but got input of size[2, 5, 7]", while
    ``DiffusionAttention`` itself answers the same input with "x must have last dimension dim=8"."""
    with pytest.raises(ValueError, match=r"Block: x must have last dimension dim=8, got shape "
                                         + re.escape(str(shape))):
        Block(8, 2).eval()(torch.randn(shape))


@pytest.mark.parametrize("shape", [(5, 7), (5, 16)])
def test_bug_graph_block_names_a_wrong_width(shape):
    """Bug: ``GraphBlock(8, 2)(x, edge_index)`` with node features of width 7 failed in its first LayerNorm with
    torch's "Given normalized_shape=[8], expected input with shape [*, 8], but got input of size[5, 7]"."""
    from diffusionformer.models import GraphBlock

    with pytest.raises(ValueError, match=r"GraphBlock: x must have last dimension dim=8, got shape "
                                         + re.escape(str(shape))):
        GraphBlock(8, 2).eval()(torch.randn(shape), torch.tensor([[0, 1], [1, 0]]))


def test_pins_blocks_still_run_at_their_width():
    """The width check passes the valid inputs through: dense (B, N, D) and sparse (N, D) for Block, (N, D) for
    GraphBlock, with outputs of the input's shape."""
    from diffusionformer.models import GraphBlock

    torch.manual_seed(0)
    ei = torch.tensor([[0, 1, 2], [1, 2, 0]])
    assert Block(8, 2).eval()(torch.randn(2, 5, 8)).shape == (2, 5, 8)
    assert Block(8, 2).eval()(torch.randn(3, 8), edge_index=ei).shape == (3, 8)
    assert GraphBlock(8, 2).eval()(torch.randn(3, 8), ei).shape == (3, 8)


@pytest.mark.parametrize("seed, err", [("x", TypeError), (None, TypeError), (1.5, TypeError), (True, TypeError),
                                       (-1, ValueError)])
def test_bug_load_dataset_checks_seed_of_fixed_split_datasets(seed, err):
    """Bug: ``load_dataset("pydoc-chars", seed="x")`` (and ``None``, ``-1``, ``True``; cora and citeseer alike)
    returned the data silently: a fixed-split loader never reads ``seed``, so only the seeded loaders refused a
    bad one. A sweep passing a bad seed learnt it only on the first seeded dataset."""
    from diffusionformer.data import load_dataset

    with pytest.raises(err, match=r"seed must be an int"):
        load_dataset("pydoc-chars", seed=seed)


def test_pins_load_dataset_numpy_seed_of_a_fixed_split_dataset():
    """A numpy int seed (a sweep grid's) still loads, and a fixed split is the same for every seed."""
    np = pytest.importorskip("numpy")
    from diffusionformer.data import load_dataset

    a, b = load_dataset("pydoc-chars", seed=np.int64(3)), load_dataset("pydoc-chars", seed=0)
    assert torch.equal(a.train, b.train) and torch.equal(a.val, b.val)


@pytest.mark.parametrize("P, v, what", [
    (torch.rand(3, 4), torch.rand(3, 2), r"expected P of shape \(\.\.\., N, N\) \(square matrices\), got \(3, 4\)"),
    (torch.rand(3, 3), torch.rand(4, 2), r"expected v of shape \(\.\.\., N, C\) with N=3 \(the size of P\), got \(4, 2\)"),
    (torch.rand(3, 3), torch.rand(3), r"expected v of shape \(\.\.\., N, C\) with N=3 \(the size of P\), got \(3,\)"),
])
@pytest.mark.parametrize("which", ["polynomial", "heat"])
def test_bug_references_name_mismatched_shapes(P, v, what, which):
    """Bug: ``polynomial_reference`` / ``heat_kernel_reference`` (public in ``diffusionformer.functional``) with a
    non-square ``P`` or signals ``v`` on another number of nodes failed with torch's "mat1 and mat2 shapes cannot
    be multiplied (3x3 and 4x2)" or "The size of tensor a (4) must match ..."; a 1-D ``v`` of N values even
    "worked" for the polynomial, returning a vector where (N, C) is documented."""
    from diffusionformer.functional import heat_kernel_reference, polynomial_reference

    with pytest.raises(ValueError, match=f"{which}_(kernel_)?reference: " + what):
        if which == "polynomial":
            polynomial_reference(P, v, torch.tensor([0.5, 0.5]))
        else:
            heat_kernel_reference(P, v, 0.5)


@pytest.mark.parametrize("t, err", [(math.nan, ValueError), (math.inf, ValueError), (True, TypeError),
                                    (torch.tensor([0.5, math.nan]), ValueError)])
def test_bug_heat_kernel_reference_rejects_non_finite_times(t, err):
    """Bug: ``heat_kernel_reference(P, v, nan)`` returned an all-NaN "reference" silently (``inf`` NaN too, the
    matrix exponential of -inf (I - P)), and ``t=True`` was read as t = 1."""
    from diffusionformer.functional import heat_kernel_reference

    P = torch.full((2, 3, 3), 1 / 3)
    with pytest.raises(err, match=r"heat_kernel_reference: expected (finite diffusion times t|t to be a float)"):
        heat_kernel_reference(P, torch.rand(2, 3, 2), t)


def test_pins_heat_kernel_reference_negative_and_batched_times():
    """Negative times stay allowed (the backward heat equation of a learned t < 0), batched per matrix; against
    the closed form for P = J/N: exp(-t (I - J/N)) = e^{-t} I + (1 - e^{-t}) J/N."""
    from diffusionformer.functional import heat_kernel_reference

    N = 3
    P = torch.full((2, N, N), 1 / N, dtype=torch.float64)
    v = torch.arange(2 * N * 2, dtype=torch.float64).reshape(2, N, 2)
    t = torch.tensor([-0.5, 2.0], dtype=torch.float64)
    e = torch.exp(-t).reshape(2, 1, 1)
    want = e * v + (1 - e) * v.mean(dim=1, keepdim=True)
    torch.testing.assert_close(heat_kernel_reference(P, v, t), want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("build", ["causal", "complete", "sliding_window", "grid", "from_networkx"])
def test_bug_graph_builders_name_a_misspelt_device(build):
    """Bug: ``causal(4, device="cdua")`` (and complete, sliding_window, grid, from_networkx) raised torch's bare
    ``RuntimeError: Expected one of cpu, cuda, ipu, xpu, mkldnn, ... device type at start of device string: cdua``,
    naming neither the argument nor the likely fix; the package's own device argument helper gives both."""
    from diffusionformer import graph as G

    calls = {"causal": lambda d: G.causal(4, device=d), "complete": lambda d: G.complete(4, device=d),
             "sliding_window": lambda d: G.sliding_window(4, 2, device=d), "grid": lambda d: G.grid(2, 2, device=d),
             "from_networkx": lambda d: G.from_networkx(pytest.importorskip("networkx").path_graph(3), device=d)}
    with pytest.raises(ValueError, match=r"device: expected a torch device such as 'cpu', 'cuda' or 'cuda:1', got "
                                         r"'cdua' \(did you mean 'cuda'\?\)"):
        calls[build]("cdua")
    g = calls[build]("cpu")  # a valid string still builds on that device
    assert (g.edge_index if g.is_sparse else g.dense_allowed()).device.type == "cpu"


@pytest.mark.parametrize("out_dir", [None, 3, ["runs"]])
def test_bug_trainer_names_a_bad_out_dir(out_dir):
    """Bug: ``Trainer(model, task, config, None)`` raised pathlib's bare "TypeError: expected str, bytes or
    os.PathLike object, not NoneType", naming neither the Trainer nor ``out_dir``, while a bad ``model``,
    ``config`` or ``resume`` is answered with a TypeError naming it."""
    from diffusionformer.train import Trainer, TrainConfig

    class _Task:
        def train_batch(self, step, generator, batch_size):
            return torch.zeros(batch_size, 3)

        def loss(self, model, batch):
            return model(batch).mean(), {}

        def evaluate(self, model, max_batches):
            return {}

    with pytest.raises(TypeError, match=r"Trainer: expected out_dir to be a path \(str or os\.PathLike\), got "
                                        + type(out_dir).__name__):
        Trainer(torch.nn.Linear(3, 1), _Task(), TrainConfig(max_steps=1, batch_size=2, device="cpu"), out_dir)
