r"""Mini-batch node classification in the runner: seeds, their sampled neighbourhoods, the loss on the seeds.

A node task trains full-batch by default (:class:`~diffusionformer.experiments.tasks.NodeTask`).
With a ``minibatch`` table (:class:`MiniBatchConfig`), update ``s`` instead draws ``B =
batch_size`` distinct training nodes (the *seeds*), samples their neighbourhood hop by hop
with at most ``num_neighbors[l]`` incoming edges per node at hop ``l`` (GraphSAGE, Hamilton
et al., NeurIPS 2017; the batch layout of PyG's ``NeighborLoader``), runs the model on the
sampled subgraph and takes the cross-entropy on the seeds only:

.. math::
    \ell_s = \frac{1}{B} \sum_{i \in S_s} -\log \mathrm{softmax}\big(f_\theta(G[N_R(S_s)])_i\big)_{y_i}.

A seed's full-graph output depends on its ``R``-hop in-neighbourhood, where ``R`` is the
number of *propagation steps* of the model (:func:`propagation_hops`), not of its layers: a
layer whose heads reach ``P^K`` propagates ``K`` hops, so ``R = sum_l max_h K_{l,h}``. With
``num_neighbors = [-1] * R`` (all neighbours at every hop) and ``batch_size`` = every training
node, one mini-batch update is the full-batch update (same loss and gradients); fewer hops
or fewer neighbours per hop approximate it.

Every draw (the seeds and the neighbours) comes from the trainer's checkpointed generator,
so a killed run resumes bit-identically; the sampler is the pure-PyTorch
:class:`~diffusionformer.data.neighbors.TorchNeighborSampler` whether or not ``pyg-lib`` is
installed, so a run samples the same batches on every machine.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Literal, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from diffusionformer._warnings import user_stacklevel
from diffusionformer.config import (ConfigErrors, _choice_hint, _python_number, _python_numbers, config_from_dict,
                                    config_to_dict, document_fields)
from diffusionformer.data.base import NodeData
from diffusionformer.experiments._metrics import _num_correct, _wide, _zero_sum
from diffusionformer.experiments._metrics import accuracy as _accuracy
from diffusionformer.experiments._metrics import full_graph_metrics
from diffusionformer.operators.base import DiffusionOperator, _registered_class

__all__ = ["MiniBatchConfig", "NodeMiniBatchTask", "check_num_neighbors", "operator_hops", "propagation_hops",
           "resolve_num_neighbors"]

_EVAL_SEED = 1234  # the same sampled neighbourhoods at every evaluation of every run
EVAL_MODES = ("full", "sampled")
#: non-polynomial operators that read one map (or two maps, or the uniform map) of P once per layer
_ONE_HOP = frozenset({"attnscale", "differential", "neutreno", "value-residual"})


@document_fields
@dataclass
class MiniBatchConfig:
    """Neighbour-sampled mini-batch training of a node task (the ``[tasks.minibatch]`` table)."""

    #: seed (training) nodes per update, drawn without replacement within the update and
    #: independently across updates; at most the number of training nodes (larger: all of them)
    batch_size: int | None = None
    #: neighbours sampled per node at each hop, ``-1`` for all of them: a list (one entry per
    #: hop), or one int for the same number at each of the model's ``R`` propagation hops
    num_neighbors: int | list[int] | None = None
    #: evaluation: ``"full"`` (the whole graph at once: exact) or ``"sampled"`` (val and test nodes
    #: as seeds, the task's ``eval_batch_size`` per batch, neighbourhoods sampled from a fixed seed)
    eval: Literal["full", "sampled"] = "full"

    def __post_init__(self) -> None:
        _python_numbers(self)  # a sweep grid's np.int64 is the int it equals (a numpy bool stays one, refused below)
        if self.batch_size is None or self.num_neighbors is None:
            missing = [k for k in ("batch_size", "num_neighbors") if getattr(self, k) is None]
            raise ValueError(f"minibatch needs {' and '.join(missing)}, e.g. "
                             "minibatch = { batch_size = 512, num_neighbors = [10, 10] }")
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"minibatch.batch_size must be a positive int, got {self.batch_size!r}")
        hops = [self.num_neighbors] if isinstance(self.num_neighbors, int) else self.num_neighbors
        if not isinstance(hops, list) or not hops or any(
                isinstance(k, bool) or not isinstance(k, int) or (k < 1 and k != -1) for k in hops):
            raise ValueError(f"minibatch.num_neighbors must be a positive int or -1 (all), or a non-empty list of "
                             f"them (one per hop), got {self.num_neighbors!r}")
        if self.eval not in EVAL_MODES:
            raise ValueError(f"minibatch.eval must be one of {list(EVAL_MODES)}, got {self.eval!r}"
                             f"{_choice_hint(self.eval, EVAL_MODES)}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "minibatch") -> MiniBatchConfig:
        """Build from a TOML table, rejecting unknown keys (named) and mistyped values."""
        try:
            return config_from_dict(cls, data, where=where)
        except ConfigErrors:  # several problems, each already named with `where` (and not rebuilt from one message)
            raise
        except (TypeError, ValueError) as exc:
            text = str(exc)
            if not text.startswith(where):  # a range check of __post_init__: "minibatch.<field> ..."
                text = where + text[len("minibatch"):] if text.startswith("minibatch") else f"{where}: {text}"
            raise type(exc)(text) from None

    def to_dict(self) -> dict[str, Any]:
        return config_to_dict(self)


def operator_hops(operator: nn.Module) -> int | None:
    """Hops one layer's heads of ``operator`` propagate: ``K`` for a polynomial in ``P`` of degree ``K``.

    Non-polynomial operators: ``grand-nl`` re-attends once per solver stage
    (``calls_per_forward``; ``None`` when its solver chooses the steps); AttnScale, differential attention,
    NeuTRENO and value residuals read their map(s) once. ``None`` when unknown (e.g. ``ppr-exact``, a full
    resolvent, or an unregistered subclass of one of the one-hop operators above, which may propagate further
    under its parent's name).

    Examples:
        >>> from diffusionformer.operators import build_operator
        >>> operator_hops(build_operator("laplacian")), operator_hops(build_operator("heat", steps=3))
        (1, 3)
    """
    if getattr(operator, "is_polynomial", False):
        return int(operator.degree)
    calls = getattr(operator, "calls_per_forward", None)
    if callable(calls):  # None: the solver chooses its steps
        n = calls()
        return None if n is None else int(n)
    # the name of a registered class only (or of a subclass that adds no behaviour): a subclass that overrides
    # apply_context inherits its parent's name, and read as one hop while it may propagate further, the sampled
    # neighbourhoods left out nodes its outputs depend on
    if isinstance(operator, DiffusionOperator) and _registered_class(type(operator)) is None:
        return None
    return 1 if getattr(operator, "name", None) in _ONE_HOP else None


def propagation_hops(model: nn.Module) -> int | None:
    r"""``R``: the hops of in-neighbourhood that a node's output depends on (``None``: unbounded or unknown).

    :class:`~diffusionformer.models.DiffusionGraphTransformer`: :math:`R = \sum_l \max_h K_{l,h}`
    over its blocks (``None`` with ``global_attention``: every node sees its whole graph).
    :class:`~diffusionformer.models.GCN`: ``num_layers + 1``, since its symmetric normalisation
    :math:`\hat d_i^{-1/2} \hat d_j^{-1/2}` reads the in-degree of the sources ``j`` at the
    last hop, known only with their own incoming edges.
    :class:`~diffusionformer.models.GIN`: its ``num_layers - 1`` convolutions (batch
    normalisation in training still sees the batch's nodes only).

    Examples:
        >>> from diffusionformer.models import create_model
        >>> propagation_hops(create_model("graph-node-small", depth=2, heads="attention:2,heat(steps=3):2"))
        6
    """
    from diffusionformer.analysis.capture import _innermost
    from diffusionformer.models import GCN, GIN, DiffusionGraphTransformer

    inner = _innermost(model)  # DistributedDataParallel's .module, torch.compile's ._orig_mod, in either order
    if isinstance(inner, DiffusionGraphTransformer):
        if inner.config.global_attention:
            return None
        total = 0
        for block in inner.blocks:
            hops = [operator_hops(op) for op in block.attn.operators]
            if any(h is None for h in hops):
                return None
            total += max(hops)  # type: ignore[type-var]
        return total
    if isinstance(inner, GCN):
        return inner.config.num_layers + 1
    if isinstance(inner, GIN):
        return inner.config.num_layers - 1
    return None


def check_num_neighbors(config: MiniBatchConfig, hops: int | None) -> tuple[str | None, str | None]:
    """``(problem, warning)`` of ``config.num_neighbors`` for a model of ``hops`` = ``R`` propagation hops.

    A problem: an int without a known ``R``, or more hops than ``R`` (they sample nodes no
    seed's output depends on). A warning: fewer hops than ``R`` (each seed's output is an
    approximation on a truncated neighbourhood, as in GraphSAGE), or ``R`` unknown.

    Examples:
        >>> check_num_neighbors(MiniBatchConfig(8, [10, 5]), 3)[1]
        'num_neighbors samples 2 hop(s) but the model propagates R = 3: seed outputs are approximations on truncated neighbourhoods; give 3 entries (-1 = all neighbours) for exact receptive fields'
    """
    if hops == 0:  # else an int resolved to no hops, which the sampler refused only when the run started
        return ("the model propagates R = 0 hops (every head's operator has degree 0): no seed's output depends "
                f"on a neighbour, so num_neighbors = {config.num_neighbors!r} has nothing to sample; train it "
                "full-batch (leave out minibatch)", None)
    if isinstance(config.num_neighbors, int):
        if hops is None:
            return ("num_neighbors is one int, which needs the model's propagation hops R, and this model's R is "
                    "unknown or unbounded; give a list, one entry per hop", None)
        return None, None
    L = len(config.num_neighbors)
    if hops is None:
        return None, (f"num_neighbors samples {L} hop(s); this model's propagation hops R are unknown or unbounded "
                      "(e.g. global attention), so seed outputs are approximations")
    if L > hops:
        return (f"num_neighbors samples {L} hops but the model propagates R = {hops}: hops beyond R reach nodes no "
                f"seed's output depends on; give {hops} entries, or one int for every hop", None)
    if L < hops:
        return None, (f"num_neighbors samples {L} hop(s) but the model propagates R = {hops}: seed outputs are "
                      f"approximations on truncated neighbourhoods; give {hops} entries (-1 = all neighbours) "
                      "for exact receptive fields")
    return None, None


def resolve_num_neighbors(config: MiniBatchConfig, hops: int | None) -> list[int]:
    """The per-hop neighbour counts: the list as given, or the int repeated ``R = hops`` times.

    Raises:
        ValueError: the problem :func:`check_num_neighbors` reports.
    """
    problem, _ = check_num_neighbors(config, hops)
    if problem is not None:
        raise ValueError(problem)
    if isinstance(config.num_neighbors, int):
        return [config.num_neighbors] * int(hops)  # type: ignore[arg-type]
    return list(config.num_neighbors)  # type: ignore[arg-type]


class NodeMiniBatchTask:
    r"""Node classification on neighbour-sampled mini-batches of seed nodes (see the module docstring).

    :meth:`train_batch` draws ``min(batch_size, n_train)`` distinct training nodes from the
    trainer's generator (``randperm``), then their neighbourhood from the same generator
    (:func:`~diffusionformer.data.neighbors.neighbor_batch`); :meth:`loss` is the
    cross-entropy on the seeds (the batch's first ``batch_size`` nodes). :meth:`evaluate`
    returns ``val_loss``, ``val_acc``, ``test_loss``, ``test_acc`` and ``loss = val_loss``:
    on the whole graph (``eval="full"``, exactly :class:`~diffusionformer.experiments.tasks.NodeTask`'s),
    or (``"sampled"``) on batches of ``eval_batch_size`` seeds of each split, in order, with
    neighbourhoods drawn from a generator seeded afresh at every evaluation (``max_batches``
    caps the batches of each split).

    Args:
        data: the graph with ``train_mask``/``val_mask``/``test_mask``.
        num_neighbors: neighbours per node at each hop (``-1`` = all).
        batch_size: seed nodes per update.
        eval: ``"full"`` or ``"sampled"``.
        eval_batch_size: seed nodes per evaluation batch (``eval="sampled"``).
    """

    #: one sampled subgraph per update: every micro-batch would compute it again, the gradient unchanged at
    #: grad_accum_steps times the work (grad_accum_steps is refused by the Trainer; raise batch_size instead)
    splits_into_micro_batches = False

    def __init__(self, data: NodeData, num_neighbors: list[int], batch_size: int, *, eval: str = "full",
                 eval_batch_size: int = 512) -> None:
        from diffusionformer.data.neighbors import TorchNeighborSampler

        if not isinstance(data, NodeData):
            raise TypeError(f"NodeMiniBatchTask: expected NodeData, got {type(data).__name__}")
        batch_size, eval_batch_size = _python_number(batch_size), _python_number(eval_batch_size)  # numpy ints too
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"NodeMiniBatchTask: batch_size must be a positive int, got {batch_size!r}")
        if eval not in EVAL_MODES:
            raise ValueError(f"NodeMiniBatchTask: eval must be one of {list(EVAL_MODES)}, got {eval!r}"
                             f"{_choice_hint(eval, EVAL_MODES)}")
        if isinstance(eval_batch_size, bool) or not isinstance(eval_batch_size, int) or eval_batch_size < 1:
            raise ValueError(f"NodeMiniBatchTask: eval_batch_size must be a positive int, got {eval_batch_size!r}")
        self.data = data
        self.sampler = TorchNeighborSampler(data.data, num_neighbors)  # validates num_neighbors
        self.num_neighbors = [_python_number(k) for k in num_neighbors]
        self.batch_size = batch_size
        self.eval = eval
        self.eval_batch_size = eval_batch_size
        self.train_nodes = data.data.train_mask.nonzero().view(-1)
        if self.train_nodes.numel() == 0:
            raise ValueError(f"NodeMiniBatchTask: dataset {data.name!r} has no training nodes")

    @classmethod
    def for_model(cls, data: NodeData, model: nn.Module, config: MiniBatchConfig | Mapping[str, Any],
                  eval_batch_size: int = 512) -> NodeMiniBatchTask:
        """The task of ``config`` for ``model``: an int ``num_neighbors`` becomes one per propagation hop.

        Fewer hops than the model's ``R`` warn (``UserWarning``); more, or an int for a model
        of unknown ``R``, raise ``ValueError``.
        """
        if not isinstance(config, MiniBatchConfig):
            config = MiniBatchConfig.from_dict(config)
        hops = propagation_hops(model)
        _, warning = check_num_neighbors(config, hops)
        if warning is not None:
            # the user's line: build_task's caller, or this method's (a fixed 2 named build_task's line)
            warnings.warn(warning, UserWarning, stacklevel=user_stacklevel())
        return cls(data, resolve_num_neighbors(config, hops), config.batch_size, eval=config.eval,
                   eval_batch_size=eval_batch_size)

    def seeds(self, generator: torch.Generator) -> Tensor:
        """``min(batch_size, n_train)`` distinct training nodes, uniformly, from ``generator``."""
        n = self.train_nodes.numel()
        return self.train_nodes[torch.randperm(n, generator=generator)[: self.batch_size]]

    def train_batch(self, step: int, generator: torch.Generator, batch_size: int) -> Any:
        from diffusionformer.data.neighbors import neighbor_batch

        return neighbor_batch(self.data.data, self.sampler, self.seeds(generator), generator)

    def shard_batch(self, batch: Any, rank: int, world_size: int) -> Any:
        return batch  # one sampled subgraph: every rank (and micro-batch) computes the same loss

    def loss(self, model: nn.Module, batch: Any) -> tuple[Tensor, dict[str, Any]]:
        B = int(batch.batch_size)
        logits = model(batch.x, batch.edge_index)[:B]
        y = batch.y[:B]
        return F.cross_entropy(_wide(logits), y), {"acc": _accuracy(logits.detach(), y)}

    @torch.no_grad()
    def evaluate(self, model: nn.Module, max_batches: int | None) -> dict[str, float]:
        if self.eval == "full":
            return full_graph_metrics(model, self.data)
        from diffusionformer.data.neighbors import neighbor_batch

        device = next(model.parameters()).device
        out: dict[str, float] = {}
        g = torch.Generator().manual_seed(_EVAL_SEED)
        for split in ("val", "test"):
            nodes = getattr(self.data.data, f"{split}_mask").nonzero().view(-1)
            loss_sum, correct, count = _zero_sum(device), _zero_sum(device), 0  # read once per split
            for b, i in enumerate(range(0, nodes.numel(), self.eval_batch_size)):
                if max_batches is not None and b >= max_batches:
                    break
                batch = neighbor_batch(self.data.data, self.sampler, nodes[i : i + self.eval_batch_size], g)
                B = int(batch.batch_size)
                logits = _wide(model(batch.x.to(device), batch.edge_index.to(device))[:B])
                y = batch.y[:B].to(device)
                loss_sum += F.cross_entropy(logits, y, reduction="sum").to(torch.float64)
                correct += _num_correct(logits, y)  # NaN for NaN logits, as the loss
                count += B
            out[f"{split}_loss"] = loss_sum.item() / count if count else float("nan")
            out[f"{split}_acc"] = correct.item() / count if count else float("nan")
        out["loss"] = out["val_loss"]
        return out
