"""Raw errors turned into named ValueErrors: token ids, unknown operators and datasets."""

from __future__ import annotations

import pytest
import torch

from diffusionformer.data import load_dataset
from diffusionformer.models import create_model
from diffusionformer.operators import build_operator


@pytest.fixture(scope="module")
def gpt():
    return create_model("gpt-char-tiny", n_layer=1, vocab_size=11)


@pytest.mark.parametrize("bad", [11, 12, -1, -100])
def test_gpt_token_ids_outside_the_vocabulary_are_named(gpt, bad):
    idx = torch.tensor([[1, 2, bad, 3]])
    with pytest.raises(ValueError, match=rf"idx holds token id {bad}, outside the vocabulary \[0, 11\)"):
        gpt(idx)


def test_gpt_targets_outside_the_vocabulary_are_named_and_ignore_index_is_allowed(gpt):
    idx = torch.tensor([[1, 2, 3, 4]])
    with pytest.raises(ValueError, match=r"targets holds token id 11, outside the vocabulary \[0, 11\) \(or -100"):
        gpt(idx, torch.tensor([[1, 11, 3, 4]]))
    with pytest.raises(ValueError, match=r"targets holds token id -3"):
        gpt(idx, torch.tensor([[1, -3, 3, 4]]))
    logits, loss = gpt(idx, torch.tensor([[-100, 2, -100, 10]]))
    ref = torch.nn.functional.cross_entropy(logits.view(-1, 11).double(), torch.tensor([-100, 2, -100, 10]))
    assert torch.isfinite(loss) and abs(loss.item() - ref.item()) < 1e-5
    _, loss = gpt(idx, torch.full((1, 4), -100))  # every position ignored: no id to check
    assert loss is not None


def test_gpt_float_targets_are_refused_not_read_as_probabilities(gpt):
    with pytest.raises(ValueError, match=r"targets must be token ids \(an integer tensor\), got dtype torch.float32"):
        gpt(torch.tensor([[1, 2, 3]]), torch.zeros(1, 3))


def test_gpt_in_range_ids_at_both_ends_are_fine(gpt):
    logits, _ = gpt(torch.tensor([[0, 10, 0, 10]]))
    assert logits.shape == (1, 4, 11) and torch.isfinite(logits).all()


@pytest.mark.parametrize("typo,meant", [("laplacain", "laplacian"), ("atention", "attention"), ("hat", "heat"),
                                        ("polynomal", "polynomial")])
def test_unknown_operator_suggests_the_closest_name(typo, meant):
    with pytest.raises(ValueError, match=rf"unknown operator '{typo}' \(did you mean '{meant}'"):
        build_operator(typo)


def test_unknown_operator_far_from_every_name_gets_no_suggestion():
    with pytest.raises(ValueError, match=r"unknown operator 'qqqq'; valid names") as info:
        build_operator("qqqq")
    assert "did you mean" not in str(info.value)


@pytest.mark.parametrize("typo,meant", [("digit", "digits"), ("core", "cora"), ("CIFAR", "cifar10"),
                                        ("tiny_shakespear", "tinyshakespeare")])
def test_unknown_dataset_suggests_the_closest_name(typo, meant):
    with pytest.raises(ValueError, match=rf"unknown dataset '{typo}' \(did you mean '{meant}'"):
        load_dataset(typo)
