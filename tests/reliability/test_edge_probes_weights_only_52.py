"""Sitting 52: one reading of ``torch.load(weights_only=True)``'s refusals (``_files.weights_only_refusal``) for
checkpoints, ``from_nanogpt``, the runner's resume advice and the data cache; each test failed before its fix."""

from __future__ import annotations

import os
import pickle

import pytest
import torch

from diffusionformer._files import load_error_text, weights_only_refusal
from diffusionformer.data.paths import drop_unsafe_processed, load_cached
from diffusionformer.experiments.runner import _not_resumed_advice
from diffusionformer.models import DiffusionGPT
from diffusionformer.train import CheckpointError
from diffusionformer.train.checkpoint import CHECKPOINT_FORMAT, load_checkpoint


class _Hostile:
    def __reduce__(self):
        return (os.system, ("true",))


def _payload() -> dict:
    return {"format": CHECKPOINT_FORMAT, "step": 1, "model": {"w": torch.ones(2)}, "optimizer": {}, "rng": {},
            "config": {}}


def _refusal(path) -> CheckpointError:
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    return info.value


@pytest.mark.filterwarnings("ignore:Detected pickle protocol 4:UserWarning")
def test_bug_a_whole_checkpoint_in_another_pickle_protocol_is_not_called_damaged(tmp_path):
    """Bug: a whole checkpoint re-saved with ``pickle_protocol=4`` (weights_only reads protocol 2) was called
    truncated or corrupt with the advice to delete it; it is now refused as whole, naming the opcode and protocol,
    and the runner's advice says to save it again, not to delete it first."""
    path = tmp_path / "checkpoint.pt"
    torch.save(_payload(), path, pickle_protocol=4)
    err = _refusal(path)
    assert "not damage: there is no need to delete it" in str(err)
    assert "(Unsupported operand 149 (FRAME, pickle protocol 4): a pickle protocol" in str(err)
    advice = _not_resumed_advice(err, str(path), "this")
    assert advice.startswith(f"{path} is whole: save it again with torch.save's default pickle protocol if you trust")
    torch.save(_payload(), path)  # the default protocol loads
    assert load_checkpoint(path)["step"] == 1


def test_bug_a_blocked_global_is_named_not_called_damage(tmp_path):
    """Bug: a checkpoint naming a global of a blocked module (``os.system``: a doctored file) was called truncated
    or corrupt, quoting torch's generic first line ("Weights only load failed. In PyTorch 2.6, ..."); the error now
    names the refused global."""
    path = tmp_path / "checkpoint.pt"
    torch.save({**_payload(), "extra": _Hostile()}, path)
    err = _refusal(path)
    assert f"GLOBAL {os.system.__module__}.system whose module {os.system.__module__} is blocked)" in str(err)
    assert "Trying to load unsupported GLOBAL" in str(err) and "In PyTorch 2.6" not in str(err)


def test_bug_damaged_pickle_bytes_quote_the_unpicklers_line(tmp_path):
    """Bug: a file that is not torch.save's (here one byte) was refused by ``load_checkpoint`` and ``from_nanogpt``
    quoting torch's generic first line about the weights_only default ("Weights only load failed. In PyTorch 2.6,
    ..."), and ``from_nanogpt`` said it "holds objects that torch.load(weights_only=True) refuses"; both now call
    it unreadable and quote the unpickler's own line (an operand outside a zip may be a damaged byte)."""
    path = tmp_path / "ckpt.pt"
    path.write_bytes(b"x")
    assert str(_refusal(path)).endswith("Cause: UnpicklingError: Unsupported operand 120")
    with pytest.raises(ValueError, match=r"is not a readable torch\.save file .*UnpicklingError: Unsupported operand 120$"):
        DiffusionGPT.from_nanogpt(path)


def test_bug_the_data_cache_warning_names_what_was_refused(tmp_path):
    """Bug: ``load_cached`` and ``drop_unsafe_processed`` warned with torch's generic first line ("Weights only
    load failed. In PyTorch 2.6, we changed the default ...") for every refused file; they now name the refused
    global (a doctored cache file naming ``os.system``)."""
    path = tmp_path / "cache.pt"
    torch.save({"x": _Hostile()}, path)
    with pytest.warns(UserWarning, match=r"refuses: Trying to load unsupported GLOBAL \S+\.system whose module"):
        assert load_cached(path) is None
    folder = tmp_path / "processed"
    folder.mkdir()
    torch.save({"x": _Hostile()}, folder / "data.pt")
    with pytest.warns(UserWarning):
        (why,) = drop_unsafe_processed(folder)
    assert why.endswith("is blocked") and "In PyTorch 2.6" not in why


@pytest.mark.parametrize("message, refused", [
    ("Weights only load failed. x\nWeightsUnpickler error: Unsupported global: GLOBAL a.B was not allowed.",
     "Unsupported global: GLOBAL a.B"),
    ("\x1b[1mWeights\x1b[0m\nUnsupported class a.B", "Unsupported class a.B"),
    ("Can only build Tensor, Parameter, OrderedDict or types allowlisted via `add_safe_globals`, but got <class 'x'>",
     "Can only build Tensor, Parameter, OrderedDict or types allowlisted via `add_safe_globals`, but got <class 'x'>"),
    ("``torch.nested`` and ``torch._dynamo`` must be imported to load nested jagged tensors (NJTs)",
     "``torch.nested`` and ``torch._dynamo`` must be imported to load nested jagged tensors (NJTs)"),
    ("Weights only load failed.\nWeightsUnpickler error: \n\nString is too long", None),
    ("Weights only load failed.\nWeightsUnpickler error: \n\nUnsupported operand 120", None),
])
def test_pin_the_refusal_shapes_of_torchs_unpickler(message, refused):
    """Pin: the lines of torch's weights-only unpickler read as a refusal of what a whole file holds, and the
    ones read as damage (an operand without a zip to vouch for the bytes); never a non-pickle error."""
    assert weights_only_refusal(pickle.UnpicklingError(message)) == refused
    assert weights_only_refusal(ValueError(message)) is None


def test_pin_load_error_text_takes_the_unpicklers_own_line():
    """Pin: the unpickler's line after torch's generic preamble (no escapes), else the first line, else empty."""
    err = pickle.UnpicklingError("Weights only load failed. \x1b[1mtrust\x1b[0m\nWeightsUnpickler error: \n\n"
                                 "String is too long\n\nCheck the documentation")
    assert load_error_text(err) == "UnpicklingError: String is too long"
    assert load_error_text(RuntimeError("first line\nsecond")) == "RuntimeError: first line"
    assert load_error_text(EOFError()) == "EOFError: "
