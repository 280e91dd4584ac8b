"""Reload a trained run of the experiment runner: ``load_run(path)``.

A run directory ``<out>/<name>/runs/<task>/<operator>/seed<k>/`` written by
:func:`~diffusionformer.experiments.run_experiment` holds everything needed to rebuild its
model without the config or the data it was trained on: ``run_config.json`` names the model
preset and its fully resolved config (data-derived sizes and the operator setting included),
``checkpoint.pt`` the weights of the last saved step, ``metrics.jsonl`` the training and
evaluation records, ``summary.json`` the final result and ``preprocessing.json`` how the run's inputs
were prepared (pixel scale and training statistics of images, the vocabulary of text; for text and graphs
also a fingerprint of the data, which a resume and ``analyze`` compare: ``_data_fingerprint``).

Examples:
    Rebuild a run's model and evaluate it (``results/default`` is the README's main job)::

        from diffusionformer import load_run

        run = load_run("results/default/runs/digits/laplacian-half/seed0")
        logits = run.model(images)                  # eval mode, on the CPU
        run.config                                  # the ViTConfig it was built with
        evals = [r for r in run.metrics if r["split"] == "eval"]
        prep = run.preprocessing                    # new raw images prepared as the run's were
        mean, std = (torch.tensor(prep[k]).view(-1, 1, 1) for k in ("mean", "std"))
        logits = run.model((pixels.float() / prep["scale"] - mean) / std)
"""

from __future__ import annotations

import contextlib
import math
import numbers
import os
import re
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from diffusionformer.data.checksums import sha256_bytes

__all__ = ["LoadedRun", "load_run"]

RUN_CONFIG_NAME = "run_config.json"
PREPROCESSING_NAME = "preprocessing.json"


def _data_preprocessing(data: Any) -> dict[str, Any]:
    """What the runner records in a run's ``preprocessing.json`` (:attr:`LoadedRun.preprocessing`): the data's
    ``kind``; for images the ``scale`` raw pixels were divided by and the per-channel ``mean``/``std`` of the
    training split they were then standardised with (``None`` where not known: a loader of one's own that did not
    record its scale, or ``normalize=False``); for text the vocabulary ``itos`` (token id -> character) and a
    fingerprint of the tokens (:func:`_data_fingerprint`), for graphs one of the graph."""
    kind = getattr(data, "kind", None)
    record: dict[str, Any] = {"kind": kind if isinstance(kind, str) else None}
    if kind == "image":
        meta = getattr(data, "meta", None)
        scale = meta.get("scale") if isinstance(meta, Mapping) else None
        # a NumPy number too (numbers.Real), as a user's meta may hold it: else recorded as not known
        record.update(scale=float(scale) if isinstance(scale, numbers.Real) and not isinstance(scale, bool) else None,
                      mean=_channel_floats(data, "mean"), std=_channel_floats(data, "std"))
    elif kind == "text":
        itos = getattr(data, "itos", None)
        record["itos"] = None if itos is None else [str(t) for t in itos]
    return {**record, **_data_fingerprint(data)}


def _preprocessing_of(data: Any, prepared: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """``data``'s :func:`_data_preprocessing`, computed once per data object in ``prepared`` (keyed by ``id``: the
    caller keeps its data objects loaded while it uses it): its fingerprint hashes the data, and every setting and
    seed of a task (the runner's runs, ``analyze``'s) reads the same object."""
    if id(data) not in prepared:
        prepared[id(data)] = _data_preprocessing(data)
    return prepared[id(data)]


def _data_fingerprint(data: Any) -> dict[str, Any]:
    """A cheap fingerprint of what a model is trained on (2 ms on pydoc-chars, 8 ms on Cora), so that a resume is told
    a corpus changed within its vocabulary or an edited graph file: for text each split's token count and hash
    (``train_tokens``, ``train_sha256``, ``val_...``); for one graph (``kind="node"``) ``num_nodes``, ``num_edges``,
    ``x_shape`` and hashes of the features, the edges, the labels and each split's mask (``x_sha256``,
    ``edge_index_sha256``, ``y_sha256``, ``train_mask_sha256``, ...); for a set of graphs (``kind="graph"``)
    ``num_graphs``, each split's indices (``train_idx_sha256``, ...) and the graphs (``graphs_sha256``:
    :func:`_graph_set_sha256`, 16 ms on NCI1). A single graph's edges are hashed in sorted order (the same edges
    listed in another order are the same graph to the model).
    A hash is :func:`_tensor_sha256`'s; nothing for other kinds (images: their statistics are recorded)."""
    kind, record = getattr(data, "kind", None), {}
    if kind == "text":
        for split in ("train", "val"):
            tokens = getattr(data, split, None)
            if isinstance(tokens, torch.Tensor):
                record.update({f"{split}_tokens": tokens.numel(), f"{split}_sha256": _tensor_sha256(tokens)})
    elif kind == "node" and isinstance(getattr(getattr(data, "data", None), "edge_index", None), torch.Tensor):
        graph = data.data
        N, edges = int(graph.num_nodes), graph.edge_index.detach().cpu().long()  # int32: i N + j overflowed
        sorted_edges = (edges[0] * N + edges[1]).sort().values  # each edge (i, j) as the number i * N + j
        record.update(num_nodes=N, num_edges=int(edges.shape[1]), edge_index_sha256=_tensor_sha256(sorted_edges))
        x = getattr(graph, "x", None)
        if isinstance(x, torch.Tensor):  # a user's graph may have no features (or no labels, masks): None, not hashed
            record.update(x_shape=list(x.shape))
        for name in ("x", "y", "train_mask", "val_mask", "test_mask"):
            value = getattr(graph, name, None)
            if isinstance(value, torch.Tensor):
                record[f"{name}_sha256"] = _tensor_sha256(value)
    elif kind == "graph" and hasattr(data, "dataset"):
        record.update(num_graphs=len(data.dataset), graphs_sha256=_graph_set_sha256(data.dataset))
        for split in ("train", "val", "test"):
            idx = getattr(data, f"{split}_idx", None)
            if isinstance(idx, torch.Tensor):
                record[f"{split}_idx_sha256"] = _tensor_sha256(idx)
    return record


def _graph_set_sha256(dataset: Any) -> str:
    """The first 16 hex digits of a SHA256 of the graphs of a graph set (the split indices aside, which depend on the
    labels alone: a graph's features or edges edited in place resumed without a word): of the collated tensors and
    slices of a PyG in-memory dataset as stored (its transform is the loader's, of its options: 16 ms on NCI1), and
    a sliced or shuffled one's indices into them, else of each graph's ``x``, ``edge_index`` and ``y`` in turn (a
    user's list of ``Data``).

    Examples:
        >>> from torch_geometric.data import Data
        >>> graphs = [Data(x=torch.zeros(2, 1), edge_index=torch.tensor([[0], [1]]), y=torch.tensor([0]))]
        >>> before = _graph_set_sha256(graphs)
        >>> graphs[0].x[1, 0] = 1.0  # one feature edited: the labels, and so any split, unchanged
        >>> before == _graph_set_sha256(graphs)
        False
    """
    store, slices = getattr(dataset, "_data", None), getattr(dataset, "slices", None)
    if hasattr(store, "to_dict") and isinstance(slices, dict):
        parts = sorted(store.to_dict().items()) + [(f"slices.{k}", v) for k, v in sorted(slices.items())]
        if getattr(dataset, "_indices", None) is not None:  # sliced or shuffled: the places of its graphs in the store
            # (its graphs as the loader reads them, transform applied: an augmentation made every hash another)
            parts.append(("indices", torch.as_tensor(list(dataset.indices()), dtype=torch.long)))
    else:  # 1.6 s for 40,000 small graphs (PyG's edge_index property takes most)
        parts = [(f"{i}.{k}", getattr(g, k, None)) for i, g in enumerate(dataset) for k in ("x", "edge_index", "y")]
    text = "\n".join(f"{k} {_tensor_sha256(v)}" for k, v in parts if isinstance(v, torch.Tensor))
    return sha256_bytes(text.encode())[:16]


_BITS_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _tensor_sha256(tensor: torch.Tensor) -> str:
    """The first 16 hex digits of the SHA256 of ``tensor``'s elements: their bits in its dtype, little-endian, in
    row-major order, from a dense CPU copy (so one on another device, strided or sparse, hashes the same).

    Examples:
        >>> _tensor_sha256(torch.tensor([1, 2, 3])) == _tensor_sha256(torch.tensor([[1, 2, 3]]).t()[:, 0])
        True
    """
    t = tensor.detach().cpu()
    # a conjugate (or negative) view's bits are those of the values it shows: view(dtype) refuses it unresolved
    t = (t.to_dense() if t.layout != torch.strided else t).resolve_conj().resolve_neg().contiguous()
    # complex128 (16 bytes, no integer of its width: KeyError 16) as its two float64 halves in turn
    bits = t.reshape(-1).view(_BITS_OF_WIDTH[min(t.element_size(), 8)]).numpy()
    return sha256_bytes(bits.astype(bits.dtype.newbyteorder("<"), copy=False).data)[:16]  # (no copy of the bytes)


def _preprocessing_changes(recorded: Mapping[str, Any], now: Mapping[str, Any]) -> str:
    """The entries where a run's recorded ``preprocessing.json`` and its data's record now (:func:`_data_preprocessing`)
    differ, in words, ``""`` where none: ``"itos (id 93: '~' then '°')"`` (a vocabulary by its sizes and first
    differing ids), ``"mean ([0.1] then [0.2])"``. Floats (scale, mean, std) are one up to the rounding of their float64
    sums (data loaded under another thread count sums in another order), anything else exactly. An entry the record
    lacks is no change: a record of an older version holds no fingerprint (:func:`_data_fingerprint`)."""
    changes = []
    for key in sorted(recorded):
        old, new = recorded.get(key), now.get(key)
        if _same_record(old, new):
            continue
        if key == "itos" and isinstance(old, list) and isinstance(new, list):
            ids = [i for i, (a, b) in enumerate(zip(old, new)) if a != b]
            parts = [] if len(old) == len(new) else [f"{len(old)} characters then {len(new)}"]
            parts += [f"id {i}: {old[i]!r} then {new[i]!r}" for i in ids[:3]] + (["..."] if len(ids) > 3 else [])
            changes.append(f"itos ({', '.join(parts)})")
        else:
            changes.append(f"{key} ({old!r} then {new!r})")
    return ", ".join(changes)


def _same_record(a: Any, b: Any) -> bool:
    """Whether two values of a ``preprocessing.json`` entry are one, as :func:`_preprocessing_changes` compares them."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_record(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


def _channel_floats(data: Any, name: str) -> list[float] | None:
    """The data's per-channel ``mean`` or ``std`` as a flat list of floats, whatever a user's dataset holds: a tuple,
    a tensor or a NumPy array of shape ``(C,)``, ``(C, 1, 1)`` or ``(1, C, 1, 1)``, one number for every channel
    (iterated value by value, these failed every run at its start: "iteration over a 0-d tensor", "only one element
    tensors can be converted"). Finite real numbers only: a complex tensor lost its imaginary part, a bool one was
    recorded as 1.0/0.0 and NaN or inf as null (JSON), without a word."""
    values = getattr(data, name, None)
    if values is None:
        return None
    try:
        tensor = torch.as_tensor(values)
        real = not (tensor.dtype.is_complex or tensor.dtype == torch.bool)
        floats = tensor.double().reshape(-1).tolist() if real else []
    except (TypeError, ValueError, RuntimeError) as err:
        raise ValueError(f"{type(data).__name__}.{name}: expected the per-channel {name} of the images (numbers), "
                         f"got {values!r} ({err})") from None
    if not real or not all(math.isfinite(v) for v in floats):
        raise ValueError(f"{type(data).__name__}.{name}: expected the per-channel {name} of the images (finite real "
                         f"numbers), got {values!r}")
    return floats


@dataclass
class LoadedRun:
    """A trained run read back from its directory by :func:`load_run`.

    Attributes:
        model: the model rebuilt from ``config`` with the checkpoint's weights, in eval mode.
        config: the model's config dataclass (e.g. :class:`~diffusionformer.models.GPTConfig`), as the run built
            it: it stays so when the model changes later (``model.config`` after
            :meth:`~diffusionformer.models.DiffusionViT.set_input_size` holds the new size, this the trained one).
        metrics: the run's ``metrics.jsonl`` records (see :func:`~diffusionformer.train.read_metrics`).
        summary: ``summary.json`` (``status``, final ``eval``, ``elapsed`` ...), or ``None`` for
            a run that never finished (or whose ``summary.json`` is unreadable: a warning names it).
        train_config: the :class:`~diffusionformer.train.TrainConfig` stored in the checkpoint.
        step: the number of updates done when the checkpoint was saved.
        preset: the model preset the run was built from (``run_config.json``'s ``model``).
        path: the run directory.
        preprocessing: how the run's inputs were prepared, as recorded in ``preprocessing.json`` when it started:
            ``kind`` (the data's), for images ``scale``, ``mean`` and ``std`` (a new raw image ``p`` of shape
            ``(C, H, W)`` goes in as ``(p / scale - mean_c) / std_c``; an entry the data did not record is ``None``:
            ``mean``/``std`` with ``normalize=False``, or of a loader of one's own that left them unset, ``scale``
            where the data's ``meta`` has no ``"scale"``), for text ``itos`` (token id -> character); for text and
            graphs also a fingerprint of the data that a resume compares (``train_tokens``, ``train_sha256``, ...,
            ``num_nodes``, ``edge_index_sha256``, ...: ``reload._data_fingerprint``). ``None`` for a
            run folder written before it was recorded, or whose ``preprocessing.json`` is unreadable (a warning
            names it); nothing is guessed: load its data with
            ``load_dataset(dataset, seed=data_seed, **dataset_options)`` as its ``run_config.json`` names them and
            read the data's ``mean``/``std``/``itos``.
    """

    model: nn.Module
    config: Any
    metrics: list[dict[str, Any]]
    summary: dict[str, Any] | None
    train_config: Any
    step: int
    preset: str
    path: Path
    preprocessing: dict[str, Any] | None = None

    def __repr__(self) -> str:
        status = (self.summary or {}).get("status", "unfinished")
        return (f"LoadedRun(path={str(self.path)!r}, preset={self.preset!r}, model={type(self.model).__name__}, "
                f"step={self.step}, status={status!r}, records={len(self.metrics)})")


def _check_cuda_exists(device: torch.device) -> None:
    """A ValueError naming ``map_location`` when ``device`` is a CUDA device this machine does not have: else the
    whole model is built before ``model.to`` fails with torch's bare AssertionError ("Torch not compiled with CUDA
    enabled") or "invalid device ordinal". A device of another kind this torch cannot use (``mps`` off a Mac) is one
    too, not torch's bare RuntimeError once the model is built."""
    if device.type not in ("cuda", "cpu", "meta"):
        try:
            torch.empty(0, device=device)
        except (RuntimeError, AssertionError) as err:
            raise ValueError(f"load_run: map_location {str(device)!r} asked for, but this torch cannot use it "
                             f"({str(err).splitlines()[0] if str(err) else type(err).__name__}); use "
                             "map_location='cpu'") from err
        return
    if device.type != "cuda":
        return
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0 or (device.index is not None and device.index >= count):
        have = ("no CUDA device (torch.cuda.is_available() is False)" if count == 0
                else f"{count} CUDA device(s) (cuda:0 .. cuda:{count - 1})")
        raise ValueError(f"load_run: map_location {str(device)!r} asked for, but this machine has {have}; "
                         "use map_location='cpu'")


def _check_train_identity(recorded: Any, saved: dict[str, Any], ckpt: Path, ident_path: Path) -> None:
    """A CheckpointError when the checkpoint was trained under another train config than ``run_config.json``
    records (``train.seed`` above all: another seed's checkpoint copied into the folder has the same model record).
    Fields a resume may change (``max_steps``, intervals, device, ...) and ``amp`` (recorded as asked, saved as
    resolved) are not compared, nor fields one side lacks (an older run, an older library)."""
    import json

    from diffusionformer.train import CheckpointError
    from diffusionformer.train.trainer import RESUMABLE_FIELDS

    if not isinstance(recorded, Mapping):  # an older run_config.json without its train table
        return
    saved = json.loads(json.dumps(saved, default=str))  # as the runner records it (tuples as lists)
    diffs = [f"{name}: checkpoint {saved[name]!r}, run_config.json {value!r}" for name, value in recorded.items()
             if name in saved and name not in RESUMABLE_FIELDS and name != "amp" and saved[name] != value]
    if diffs:
        raise CheckpointError(f"checkpoint {ckpt}: expected the run that {ident_path} records, got a checkpoint "
                              f"trained under another train config ({'; '.join(diffs)}); was it copied from "
                              "another run's folder?")


def _check_model_record(saved: Any, model: nn.Module, ckpt: Path, ident_path: Path) -> None:
    """A CheckpointError when the checkpoint's model record (class, config, head layout of the model that wrote it)
    differs from ``model`` rebuilt from ``run_config.json``: weights of the same shapes load into another operator
    (a hand-edited ``heads``) without a word. Config fields the record lacks (added to the library after the run) and
    a checkpoint without a record (older versions) are not compared."""

    from diffusionformer.train import CheckpointError
    from diffusionformer.train.checkpoint import model_record, model_record_differences

    if saved is None:
        return
    if not (isinstance(saved, Mapping) and all(isinstance(saved.get(k) or {}, Mapping) for k in ("config", "heads"))):
        # as the trainer refuses to resume from it: a damaged record is not an older checkpoint's missing one
        raise CheckpointError(f"checkpoint {ckpt}: expected a model record as the trainer saves (a mapping with "
                              f"'class', 'config' and 'heads' mappings), got {type(saved).__name__} "
                              f"({repr(saved)[:200]})")
    now = model_record(model)
    if now["config"] is not None and saved.get("config"):
        now["config"] = {k: v for k, v in now["config"].items() if k in saved["config"]}
    diffs = model_record_differences(saved, now)
    if diffs:
        raise CheckpointError(f"checkpoint {ckpt}: expected the weights of the model that {ident_path} describes, got "
                              f"ones written by a different model ({'; '.join(diffs)}); was {ident_path.name} edited?")


def _rope_base_left_out(config: Any, recorded: Mapping[str, Any], saved: Any) -> Any:
    """``config`` at the checkpoint's ``rope_base`` where ``run_config.json`` (``recorded``) lacks it and the model
    record ``saved`` holds 100.0 or 10000.0: the runner left either out of every model's identity until 41b9968, so a
    ViT run at 10000 (a GPT at 100) came back at its class's default and was refused as an edited ``run_config.json``.
    Any other field or value is the record's to check, not to supply."""
    import dataclasses

    from diffusionformer.experiments.results import _left_out_rope_base  # status and run read the folder so too

    base = _left_out_rope_base(recorded, saved)
    if base is None or not dataclasses.is_dataclass(config) or not hasattr(config, "rope_base"):
        return config
    return dataclasses.replace(config, rope_base=base)


def _build_in_saved_dtype(model_cls: Any, config: Any, state: Any) -> nn.Module:
    """``model_cls(config)`` in the dtype of the checkpoint's parameters (float32 or float64, when they all have
    one), as if built under that default dtype: built under the caller's ``torch.set_default_dtype(torch.float64)``, a float32 run came
    back as a float64 model (its weights widened, its fixed operator coefficients recomputed in float64), whose
    outputs were not the trained model's; a float64 run loaded at the float32 default lost its precision.

    Built once and cast (a cast rebuilds the operators' fixed coefficients from their exact values, as building
    under that default does), never under ``torch.set_default_dtype``: the default dtype is one for the whole
    process, so another thread's tensors and models were made in the checkpoint's dtype meanwhile, and two loads
    at once could leave the process at the other's default for good."""
    model = model_cls(config)
    if not isinstance(state, Mapping):  # not a state dict: load_state_dict below says so
        return model
    saved = {state[n].dtype for n, _ in model.named_parameters() if isinstance(state.get(n), torch.Tensor)}
    if len(saved) != 1 or not saved <= {torch.float32, torch.float64} or saved == {p.dtype for p in model.parameters()}:
        return model
    return model.to(saved.pop())


def _runs_below(folder: Path, limit: int = 3) -> str:
    """`` (did you mean ...?)`` naming up to ``limit`` run directories below ``folder`` (an experiment's output
    folder, its ``runs`` folder or a task's), else ``""``: the bare "is it a run directory?" left the user to find
    the ``runs/<task>/<operator>/seed<k>`` layout on their own."""
    found: list[Path] = []
    try:  # the runner's layout only, shallowest first: not a walk of every folder below a home directory
        for pattern in ("seed*", "*/seed*", "*/*/seed*", "runs/*/*/seed*", "*/runs/*/*/seed*"):
            found += sorted(p.parent for p in folder.glob(f"{pattern}/{RUN_CONFIG_NAME}") if p.is_file())
            if found:
                break
    except OSError:
        return ""
    if not found:
        return ""
    more = " ..." if len(found) > limit else ""
    return f" (did you mean a run directory below it: {', '.join(str(p) for p in found[:limit])}{more}?)"


def _missing_folder_hint(rdir: Path, limit: int = 8) -> str:
    """For a path that does not exist: its first missing folder below a ``runs`` folder, named with the folders beside
    it (a seed not run, ``seed5`` of ``seed0 .. seed2``; a task or setting misspelt, with a "did you mean" among them),
    else ``""``: the bare "got missing .../seed5" left the user to list the folders to find which runs exist."""
    from diffusionformer.config import _choice_hint

    first = rdir
    while first.parent != first and not first.parent.is_dir():
        first = first.parent
    if "runs" not in first.parent.absolute().parts:  # not in a runner's layout: no listing of a home folder or /
        return ""
    try:
        beside = sorted(p.name for p in first.parent.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return ""
    if not beside:
        return ""
    if all(re.fullmatch(r"seed\d+", name) for name in beside):  # seed2 before seed10, not after it
        beside.sort(key=lambda name: int(name[4:]))
    listed = ", ".join(beside[:limit]) + (" ..." if len(beside) > limit else "")
    # a seed not run is no misspelling of another seed: the seeds there are named, no guess among them
    hint = "" if first.name.startswith("seed") else _choice_hint(first.name, beside)
    return f" (no {first.name!r} in {first.parent}{hint}; it holds {listed})"


def _check_summary_step(summary: dict[str, Any], step: int, summary_path: Path, ckpt: Path) -> None:
    """A warning when ``summary.json`` reports the results of another step than the checkpoint's: its ``eval``
    (and status) then describe other weights than ``run.model`` (a checkpoint copied in from another run, or an
    older one put back), which the runner itself refuses to pair (it rebuilds learned operators only from the
    checkpoint of the summary's step)."""
    said = summary.get("step") if summary.get("status") == "completed" else summary.get("last_checkpoint_step")
    if isinstance(said, int) and not isinstance(said, bool) and said != step:
        warnings.warn(f"load_run: {summary_path} reports step {said} ({summary.get('status')!r}), but the "
                      f"checkpoint {ckpt} holds step {step}: run.summary does not describe run.model's weights",
                      stacklevel=3)


def _recorded_imports(manifest_path: Path) -> list[str]:
    """The ``--import`` modules ``manifest_path`` (a comparison's ``manifest.json``) records: those of every
    invocation (its ``imports``), else, in a manifest written before that field, those of its ``command`` (in both
    spellings, ``--import m`` and ``--import=m``); ``[]`` where it records none, or is missing or damaged."""
    from diffusionformer.experiments.outputs import _manifest_imports
    from diffusionformer.experiments.results import read_json_dict

    return _manifest_imports(read_json_dict(manifest_path))


def _recorded_imports_hint(rdir: Path) -> str:
    """``; the run was made with --import ...`` naming the modules the comparison's ``manifest.json`` records
    (:func:`_recorded_imports`; ``<out>/<name>/manifest.json`` above ``runs/<task>/<operator>/seed<k>``), else
    ``""``: a run of a user's operator or preset, loaded without importing the module that registers it, failed with
    a bare "unknown operator" that did not say where its name came from."""
    from diffusionformer.experiments.outputs import _run_flags  # the flags as a results page's command quotes them

    rdir = rdir.absolute()  # load_run("seed0") from inside the operator's folder: its manifest is there too
    if len(rdir.parents) < 4 or rdir.parents[2].name != "runs":
        return ""
    manifest_path = rdir.parents[3] / "manifest.json"
    modules = _recorded_imports(manifest_path)
    if not modules:
        return ""
    return (f"; the run was made with{_run_flags(modules, None)} ({manifest_path}): "
            "import what registers its names before load_run")


@contextlib.contextmanager
def _adding_hint(hint: Callable[[ValueError], str]) -> Iterator[None]:
    """A ValueError raised inside gets the words ``hint(err)`` gives (none where ``""``), and keeps its type (a
    :class:`~diffusionformer.config.ConfigErrors` of several problems stays one); one whose message is not its
    ``args`` (a ``__str__`` of its own: a user's error, ``UnicodeError``) is a ValueError from it."""
    try:
        yield
    except ValueError as err:
        words = hint(err)
        if words and type(err).__str__ is not BaseException.__str__:
            raise ValueError(f"{err}{words}") from err
        if words:
            err.args = (f"{err}{words}",)
        raise


def _naming_recorded_imports(rdir: Path) -> contextlib.AbstractContextManager[None]:
    """A ValueError raised inside (an unknown operator or preset) gets :func:`_recorded_imports_hint`'s words, as
    :func:`_adding_hint` adds them."""
    return _adding_hint(lambda err: _recorded_imports_hint(rdir))


def load_run(path: str | os.PathLike[str], *, map_location: str | torch.device = "cpu") -> LoadedRun:
    """Rebuild the model of a run directory with its trained weights, its config and its metrics.

    The model is ``preset.model_cls(config)`` where ``config`` is the resolved model config
    recorded in ``run_config.json`` when the run started, so it is exactly the model the runner
    trained (no data or experiment config is needed; a DINO model also gets the run's
    :class:`~diffusionformer.data.ssl.SSLConfig` as ``model.task_config``); the weights are those of
    ``checkpoint.pt`` (the last saved step: the final one for a completed run), in their dtype whatever the
    caller's ``torch.get_default_dtype()``.

    Args:
        path: the run directory (``.../runs/<task>/<operator>/seed<k>``) or a file in it.
        map_location: where the weights (and so the model) go.

    Returns:
        A :class:`LoadedRun`; ``run.model`` is in eval mode.

    Raises:
        FileNotFoundError: ``path`` is not a run directory, or lacks ``run_config.json`` or
            ``checkpoint.pt`` (the run has not saved a step yet).
        ValueError: ``run_config.json`` is unreadable (truncated, not a JSON object), names an
            unknown preset or holds an invalid config (naming the ``--import`` modules the comparison's
            ``manifest.json`` records, ``imports``: those of every invocation, whose registrations it may need);
            ``map_location`` is not a device, or a CUDA device (or one of another kind, ``mps``) this machine does
            not have.
        CheckpointError: the checkpoint is unreadable, does not fit the model, was written by another model
            (class, config or head layout: an edited ``run_config.json``; a ``rope_base`` it lacks is the record's
            where that holds 100.0 or 10000.0, which runners before 41b9968 left out for every model) or under another
            train config (another seed's checkpoint copied into the folder), holds a damaged model record or NaN or
            inf weights.
    """
    from diffusionformer.config import _device_argument, config_from_dict
    from diffusionformer.models import get_preset
    from diffusionformer.models.registry import split_task_settings, task_config
    from diffusionformer.train import CheckpointError, TrainConfig, read_metrics
    from diffusionformer.train.checkpoint import CHECKPOINT_NAME, load_checkpoint
    from diffusionformer.train.rng import _device_in_use, preserve_rng_state

    if map_location is not None:  # checked before anything is read
        map_location = _device_argument("map_location", map_location)
        _check_cuda_exists(map_location)
    rdir = Path(path)
    if rdir.is_file():
        rdir = rdir.parent
    if not rdir.is_dir():
        raise FileNotFoundError(f"load_run: expected a run directory (.../runs/<task>/<operator>/seed<k>), got "
                                f"missing {rdir}{_missing_folder_hint(rdir)}")
    ident_path = rdir / RUN_CONFIG_NAME
    if not ident_path.is_file():
        if ident_path.exists() or ident_path.is_symlink():  # a FIFO or a folder there is not "none"
            from diffusionformer._files import file_kind

            what = ("a symbolic link to a missing file" if not ident_path.exists()
                    else file_kind(ident_path.stat().st_mode))
            raise FileNotFoundError(f"load_run: expected {ident_path} to be a file, got {what}")
        raise FileNotFoundError(
            f"load_run: expected {ident_path} (written by `python -m diffusionformer.experiments run` when a run "
            f"starts), got none; is {rdir} a run directory?{_runs_below(rdir)}"
        )
    from diffusionformer.experiments.results import read_json_dict

    identity = read_json_dict(ident_path)
    if identity is None:  # truncated, empty, not UTF-8 or not an object: name the file, not json's position
        raise ValueError(f"load_run: expected {ident_path} to hold a JSON object, got an unreadable file "
                         "(truncated, empty, not UTF-8 or not an object)")
    preset_name, cfg_dict = identity.get("model"), identity.get("model_config")
    if not isinstance(preset_name, str) or not isinstance(cfg_dict, dict):
        raise ValueError(f"load_run: expected 'model' (a preset name) and 'model_config' (a table) in {ident_path}, "
                         f"got {preset_name!r} and {type(cfg_dict).__name__}")
    with _naming_recorded_imports(rdir):  # a name a user's --import module registered is unknown without it
        preset = get_preset(preset_name)
        # the run's task settings (DINO's views and k-NN evaluation) sit beside the model's in the identity
        cfg_dict, settings = split_task_settings(preset_name, cfg_dict, warn=False)
        config = config_from_dict(preset.config_cls, cfg_dict, where=f"{ident_path} model_config")
    ckpt = rdir / CHECKPOINT_NAME
    if ckpt.exists() and not ckpt.is_file():  # a folder there is not "no step saved yet"
        raise FileNotFoundError(f"load_run: expected the checkpoint {ckpt} to be a file, got a directory or other "
                                "non-file; move it aside (the run's saved steps are not in it)")
    if not ckpt.is_file() and not ckpt.is_symlink():  # a link to a missing file: load_checkpoint names it
        raise FileNotFoundError(f"load_run: expected the checkpoint {ckpt}, got none (the run has not saved a step yet)")
    payload = load_checkpoint(ckpt)
    config = _rope_base_left_out(config, cfg_dict, payload.get("model_record"))  # a run folder from before 41b9968
    # the initial weights are overwritten: the caller's streams are not drawn from. Built on the CPU and moved to
    # map_location below, whatever the caller's default device: at a notebook's torch.set_default_device('meta') the
    # checkpoint's weights were copied into meta parameters (a no-op, one torch warning per tensor), then
    # "Tensor.item() cannot be called on meta tensors"
    # (its heads may name an operator a user's --import module registered: "unknown operator ...")
    with _naming_recorded_imports(rdir), preserve_rng_state(_device_in_use()), torch.device("cpu"):
        model = _build_in_saved_dtype(preset.model_cls, config, payload["model"])
    if preset.task_config_cls is not None:
        model.task_config = task_config(preset_name, **settings)
    try:
        model.load_state_dict(payload["model"])
    except RuntimeError as err:
        raise CheckpointError(f"checkpoint {ckpt}: expected the weights of the {preset_name!r} model of "
                              f"{ident_path}, got ones that do not fit: {err}") from err
    _check_model_record(payload.get("model_record"), model, ckpt, ident_path)
    bad = [name for name, p in model.named_parameters() if not bool(torch.isfinite(p).all())]
    if bad:  # the trainer saves no others (and refuses to resume from such a file)
        raise CheckpointError(f"checkpoint {ckpt}: expected finite parameters (the trainer saves no others), got "
                              f"NaN or inf in {bad[:3]}{' ...' if len(bad) > 3 else ''}")
    model.to(map_location).eval()
    summary_path = rdir / "summary.json"
    summary = None
    if summary_path.is_file():
        summary = read_json_dict(summary_path)
        if summary is None:  # truncated or not JSON: the weights are still good (the runner rebuilds it on resume)
            warnings.warn(f"load_run: {summary_path} is unreadable (truncated or not a JSON object); "
                          "run.summary is None", stacklevel=2)
    if summary is not None:
        _check_summary_step(summary, int(payload["step"]), summary_path, ckpt)
    metrics = read_metrics(rdir) if (rdir / "metrics.jsonl").is_file() else []
    preprocessing_path = rdir / PREPROCESSING_NAME
    preprocessing = read_json_dict(preprocessing_path)
    if preprocessing is None and preprocessing_path.exists():  # absent: a run folder of an older version
        warnings.warn(f"load_run: {preprocessing_path} is unreadable (truncated or not a JSON object); "
                      "run.preprocessing is None", stacklevel=2)
    try:
        train_config = TrainConfig.from_dict(payload["config"])
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"checkpoint {ckpt}: its config is invalid: {err}") from err
    _check_train_identity(identity.get("train"), train_config.to_dict(), ckpt, ident_path)
    return LoadedRun(model, config, metrics, summary, train_config, int(payload["step"]), preset_name, rdir,
                     preprocessing)
