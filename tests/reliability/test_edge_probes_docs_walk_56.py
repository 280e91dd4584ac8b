"""Docs walk 56: the claims of docs/tutorials, docs/design.md and docs/performance.md held against the code.

* ``own_model_data.rst``: a loader's parameters are keyword-only, ``seed`` and its options, "each with a default";
  ``design.md``: a sweep grid's numpy numbers work "wherever a Python number does (... dataset seeds ...)" and are
  "stored as the Python int/float" they equal. ``load_dataset`` checked the seed and the options but handed the
  loader the values as given, so the page's own loader (``torch.Generator().manual_seed(seed)``) failed on an
  ``np.int64`` seed with torch's bare "an integer is required"; and a loader with an option without a default was
  registered, listed with the default ``inspect._empty`` and failed only when a config left the option out.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from diffusionformer.data import (ClassificationData, dataset_spec, list_datasets, load_dataset, register_dataset,
                                  unregister_dataset)


def _blobs(seed: int, size: int = 4) -> ClassificationData:
    g = torch.Generator().manual_seed(seed)  # as the tutorial's loader: torch refuses a numpy int here
    x = torch.randn(8, 1, size, size, generator=g, dtype=torch.float32)
    y = torch.randint(0, 2, (8,), generator=g)
    return ClassificationData("walk56", "image", x, y, x, y, x, y, num_classes=2, input_shape=(1, size, size))


@pytest.fixture
def walk56_loader():
    seen: dict[str, object] = {}

    @register_dataset("walk56", kind="image")
    def _load(*, seed, size=4, scale=1.0):
        seen.update(seed=seed, size=size, scale=scale)
        return _blobs(seed, size)

    yield seen
    unregister_dataset("walk56")


def test_bug_a_numpy_seed_and_numpy_options_reach_a_loader_as_python_numbers(walk56_loader):
    """Bug: ``load_dataset("blobs", seed=np.int64(3))`` with the tutorial's loader raised torch's bare
    ``TypeError: an integer is required``: the seed was checked (``_check_seed`` returns the int) but the numpy
    value was passed on; options likewise (``np.int64`` size, ``np.float32`` scale, an int for a float default)."""
    data = load_dataset("walk56", seed=np.int64(3), size=np.int64(4), scale=np.float32(2.0))
    assert torch.equal(data.x_train, _blobs(3).x_train)
    assert type(walk56_loader["seed"]) is int and type(walk56_loader["size"]) is int
    assert type(walk56_loader["scale"]) is float and walk56_loader["scale"] == 2.0
    load_dataset("walk56", scale=2)
    assert type(walk56_loader["scale"]) is float  # an int for a float default, as the config files read it


def test_bug_a_loader_option_without_a_default_is_refused_when_registered():
    """Bug: ``def load(*, seed, n)`` was registered with ``dataset_spec(...).options == {'n': inspect._empty}``
    and ``load_dataset`` (a config without ``dataset_options``) failed inside the call with "missing 1 required
    keyword-only argument"; the tutorial's contract is an option with a default, read from the signature."""
    def _load(*, seed, n):  # pragma: no cover - never called
        return _blobs(seed)

    try:
        with pytest.raises(TypeError, match=r"loader for 'walk56-nodefault' must give each option a default.*\['n'\]"):
            register_dataset("walk56-nodefault", kind="image")(_load)
    finally:
        if "walk56-nodefault" in list_datasets():  # registered by the code before the fix: leave no name behind
            unregister_dataset("walk56-nodefault")
    with pytest.raises(ValueError, match="unknown dataset"):
        dataset_spec("walk56-nodefault")  # nothing half-registered


@pytest.mark.parametrize("given, match", [
    ("laplacian", r"expected a GraphTransformerConfig with pe='laplacian', got str"),
    ("model", r"expected a GraphTransformerConfig \(the model's is model.config\), got DiffusionGraphTransformer"),
])
def test_bug_positional_encoding_transform_names_what_it_takes(given, match):
    """Bug: ``modern_parts.rst`` reads "positional_encoding_transform returns the PyG transform" for
    ``pe="laplacian" | "random_walk"``; given that string, or the model, it failed with
    ``AttributeError: 'str' object has no attribute 'pe'`` from inside the function."""
    from diffusionformer.models import DiffusionGraphTransformer, GraphTransformerConfig, positional_encoding_transform

    config = GraphTransformerConfig(in_channels=2, num_classes=2, dim=8, num_heads=2, pe="laplacian", pe_dim=2)
    with pytest.raises(TypeError, match=match):
        positional_encoding_transform(DiffusionGraphTransformer(config) if given == "model" else given)
    assert positional_encoding_transform(config) is not None  # the config itself still works
