"""Tests written in a second mutation-testing audit of ``diffusionformer/train``'s optimiser and
checkpoint layer, after ``test_mutation_kills_optim_checkpoint.py`` and
``test_mutation_kills_small_modules.py``: the weight-decay split of ``build_optimizer`` and
``param_groups`` (``optim.py``), the checkpoint files (``checkpoint.py``: an interrupted write, the
messages of an unreadable file and their cause), the process-group start (``distributed.py``) and
moving batches (``batch.py``). The learning-rate schedule (``schedule.py``), the random generators
(``rng.py``) and ``errors.py`` were mutated too: the existing suite killed every such mutant.

Each test kills a mutant of the library code that the rest of the suite let through (its docstring
names it: file and mutation) and checks the code against an independent reference:
``torch.optim.AdamW`` built over parameter groups listed by hand and stepped alongside, messages
written out by hand, a checkpoint damaged by hand, and stand-ins for ``torch.distributed`` and
``Tensor.to`` that record what they are given (so no GPU and no process group are needed). Mutants
judged equivalent are listed, with the reason, at the end of the file.
CPU only, deterministic, no network; files only under ``tmp_path``.
"""

from __future__ import annotations

import zipfile

import pytest
import torch
import torch.distributed as dist
from torch import nn

from diffusionformer.train import (
    CheckpointError,
    TrainConfig,
    build_optimizer,
    init_distributed,
    load_checkpoint,
    param_groups,
    save_checkpoint,
)
from diffusionformer.train.batch import to_device

CPU = torch.device("cpu")


# ----------------------------------------------------------------------------- optim.py
class _Nested(nn.Module):
    """An embedding one level down (inside a block), a matrix, a bias and a norm."""

    def __init__(self) -> None:
        super().__init__()
        self.block = nn.ModuleDict({"emb": nn.Embedding(5, 3), "lin": nn.Linear(3, 3)})
        self.norm = nn.LayerNorm(3)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.norm(self.block["lin"](self.block["emb"](idx)))


def _steps(model: nn.Module, opt: torch.optim.Optimizer, n: int = 3) -> None:
    idx = torch.tensor([0, 3, 4, 1])
    for _ in range(n):
        opt.zero_grad()
        model(idx).pow(2).sum().backward()
        opt.step()


def _hand_groups(model: _Nested, decayed: list[nn.Parameter], wd: float) -> list[dict]:
    rest = [p for p in model.parameters() if all(p is not q for q in decayed)]
    return [{"params": decayed, "weight_decay": wd}, {"params": rest, "weight_decay": 0.0}]


@pytest.mark.parametrize("rule", ["default", "nanogpt"])
def test_build_optimizer_trains_like_adamw_over_hand_made_groups(rule):
    """Kills optim.py ``model.modules()`` -> ``model.children()`` in the embedding scan (an embedding
    inside a block was decayed under the default rule) and ``build_optimizer`` calling
    ``param_groups(model, config.weight_decay)`` without ``config.weight_decay_rule`` (a config asking
    for ``"nanogpt"`` silently got the default split). Reference: ``torch.optim.AdamW`` over groups
    listed by hand (default: only the Linear weight is decayed; nanoGPT: the embedding table too),
    three identical steps, then every parameter compared exactly."""
    torch.manual_seed(0)
    ours, ref = _Nested(), _Nested()
    ref.load_state_dict(ours.state_dict())
    cfg = TrainConfig(lr=0.05, weight_decay=0.5, betas=(0.9, 0.95), weight_decay_rule=rule, device="cpu")
    opt = build_optimizer(ours, cfg, CPU)
    decayed = [ref.block["lin"].weight] + ([ref.block["emb"].weight] if rule == "nanogpt" else [])
    ref_opt = torch.optim.AdamW(_hand_groups(ref, decayed, 0.5), lr=0.05, betas=(0.9, 0.95))
    _steps(ours, opt)
    _steps(ref, ref_opt)
    for (name, p), q in zip(ours.named_parameters(), ref.parameters()):
        assert torch.equal(p, q), name
    want = ["block.lin.weight"] if rule == "default" else ["block.emb.weight", "block.lin.weight"]
    assert opt.param_groups[0]["names"] == want and opt.param_groups[0]["weight_decay"] == 0.5


def test_param_groups_refuses_an_unknown_rule_by_name():
    """Kills optim.py the ``rule not in ("default", "nanogpt")`` check dropped (a misspelt rule such as
    ``"nanoGPT"`` silently used the default split, leaving the embeddings undecayed)."""
    with pytest.raises(ValueError, match=r"^param_groups: expected rule 'default' or 'nanogpt', got 'nanoGPT' \(did you mean 'nanogpt'\?\)$"):
        param_groups(nn.Linear(2, 2), 0.1, rule="nanoGPT")


def test_unknown_no_weight_decay_names_are_listed_sorted():
    """Kills optim.py ``sorted(exempt_names - known)`` -> ``list(...)`` (the names of a set in hash
    order: the message changed from run to run, with ``PYTHONHASHSEED``). Eight unknown names, so the
    mutant passes by chance once in 8! runs; written out by hand, in sorted order."""

    class Hooked(nn.Linear):
        def no_weight_decay(self):
            return ["zeta", "weight", "alpha", "mid", "bias_x", "kappa", "b2", "omega", "eta"]

    with pytest.raises(ValueError) as info:
        param_groups(Hooked(2, 2), 0.1)
    assert str(info.value) == ("Hooked.no_weight_decay(): expected names of parameters, got unknown "
                               "['alpha', 'b2', 'bias_x', 'eta', 'kappa', 'mid', 'omega', 'zeta']")


# ----------------------------------------------------------------------------- checkpoint.py
def test_an_interrupt_while_saving_leaves_the_old_checkpoint_and_no_temporary_file(tmp_path, monkeypatch):
    """Kills checkpoint.py ``except BaseException`` -> ``except Exception`` in ``save_checkpoint`` (a
    Ctrl-C, i.e. ``KeyboardInterrupt``, or a ``SystemExit`` while ``torch.save`` writes left a
    half-written ``.checkpoint.pt.*.tmp`` beside the checkpoint, one per interrupted run)."""
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, {"w": torch.ones(2)})
    good = path.read_bytes()
    for exc in (KeyboardInterrupt, SystemExit):
        def interrupted(obj, f, *args, exc=exc, **kwargs):
            f.write(b"part of a checkpoint")
            raise exc()

        monkeypatch.setattr(torch, "save", interrupted)
        with pytest.raises(exc):
            save_checkpoint(path, {"w": torch.zeros(2)})
        assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]
        assert path.read_bytes() == good


def test_an_empty_pickle_is_an_unreadable_checkpoint_caused_by_the_eof(tmp_path):
    """Kills checkpoint.py ``raise CheckpointError(...) from err`` -> without ``from err`` (the torch
    error was then only the implicit context, shown as "During handling of the above exception,
    another exception occurred", as if ``load_checkpoint`` itself had crashed). The file is a
    ``torch.save`` zip whose ``data.pkl`` was emptied by hand (a crash of an unsafe copy): torch raises
    an ``EOFError`` with an empty message."""
    good = tmp_path / "good.pt"
    torch.save({"step": 1}, good)
    path = tmp_path / "checkpoint.pt"
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(path, "w") as dst:
        for info in src.infolist():
            dst.writestr(info, b"" if info.filename.endswith("/data.pkl") else src.read(info))
    size = path.stat().st_size
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert str(info.value) == (
        f"checkpoint {path} ({size} bytes) is unreadable: truncated, corrupt, or holding objects that "
        "torch.load(weights_only=True) refuses; it was left untouched. Delete it (or resume from another "
        "copy) to continue. Cause: EOFError: ")
    assert isinstance(info.value.__cause__, EOFError) and info.value.__suppress_context__


def test_a_checkpoint_that_may_not_be_read_is_described_word_for_word(tmp_path, monkeypatch):
    """Kills checkpoint.py any rewording of the ``PermissionError`` advice (e.g. "delete it;" added:
    the file may be a good one that another user owns) and ``from err`` dropped there. The message is
    written out by hand."""
    path = save_checkpoint(tmp_path / "checkpoint.pt", {"w": torch.ones(1)})

    def denied(f, *args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(torch, "load", denied)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert str(info.value) == (
        f"checkpoint {path} cannot be read by this process ([Errno 13] Permission denied); the file itself may "
        "be intact and was left untouched: give this user read access to it to continue.")
    assert isinstance(info.value.__cause__, PermissionError)



# ----------------------------------------------------------------------------- distributed.py, batch.py
def test_init_distributed_under_torchrun_needs_a_torch_with_distributed(monkeypatch):
    """Kills distributed.py the ``dist.is_available()`` check dropped in ``init_distributed`` (under
    ``torchrun`` a torch build without ``torch.distributed`` failed inside ``init_process_group`` with
    an error that does not say why). ``init_process_group`` is a stand-in that records the call."""
    for var, value in {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}.items():
        monkeypatch.setenv(var, value)
    calls = []
    monkeypatch.setattr(dist, "is_available", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: calls.append(kw))
    with pytest.raises(RuntimeError, match=r"^WORLD_SIZE > 1 but this torch build has no torch\.distributed$"):
        init_distributed("cpu")
    assert calls == []


def test_to_device_copies_tensors_without_blocking(monkeypatch):
    """Kills batch.py ``batch.to(device, non_blocking=...)`` -> ``batch.to(device)`` (every host-to-GPU
    copy of a pinned batch then waited for the copy, serialising loading and compute). ``Tensor.to`` is
    a stand-in that records its arguments (and moves nothing), so no GPU is needed."""
    seen = []
    cuda = torch.device("cuda", 0)

    def to(self, *args, **kwargs):
        seen.append((args, kwargs))
        return self

    monkeypatch.setattr(torch.Tensor, "to", to)
    out = to_device({"x": torch.ones(2), "y": [torch.zeros(1)]}, cuda)
    assert out["x"].tolist() == [1.0, 1.0] and out["y"][0].tolist() == [0.0]
    assert seen == [((cuda,), {"non_blocking": True})] * 2


# ----------------------------------------------------------------------------- equivalent mutants
# rng.py ``npst["keys"].numpy().astype(np.uint32)`` -> ``npst["keys"].numpy()``: the keys were stored
#     as int64 copies of uint32 values (all in ``[0, 2**32)``), and ``np.random.set_state`` converts the
#     key array to uint32 itself, so the restored generator is the same.
# distributed.py ``pass`` put before ``raise TypeError(...)`` in ``shard_batch``'s int check: a
#     mis-written mutant (a no-op statement), listed for completeness; the check still raises.
