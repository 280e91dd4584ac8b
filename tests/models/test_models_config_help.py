"""``help()`` of a config says what each field means (the ``#:`` comments, via ``document_fields``)."""

from __future__ import annotations

import dataclasses
import pydoc
import re

import pytest

from diffusionformer.config import FIELDS_HEADER, document_fields
from diffusionformer.data.ssl import SSLConfig
from diffusionformer.experiments import ExperimentConfig, OperatorSetting, TaskConfig
from diffusionformer.models import (DINOConfig, GCNConfig, GINConfig, GPTConfig, GraphTransformerConfig, ViTConfig)

CONFIGS = [GPTConfig, ViTConfig, GraphTransformerConfig, GCNConfig, GINConfig, DINOConfig, SSLConfig, TaskConfig,
           OperatorSetting, ExperimentConfig]


def test_help_of_gpt_config_gives_each_fields_meaning():
    text = pydoc.render_doc(GPTConfig, renderer=pydoc.plaintext)
    for line in ("n_layer (int, default 4): depth L", "n_embd (int, default 128): width D",
                 "laplacian_heads (int | str | list[int | str] | None, default None): trailing Laplacian heads per layer",
                 "norm (str, default 'layernorm'): \"layernorm\" or \"rmsnorm\""):
        assert line in text, line


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_every_commented_field_is_in_the_docstring_with_its_comment(cls):
    """Independent reference: the ``#:`` comment read straight from the source file, line by line."""
    import inspect

    sources = [inspect.getsource(k) for k in cls.__mro__ if dataclasses.is_dataclass(k)]  # own class first
    doc = cls.__doc__
    assert doc.count(FIELDS_HEADER) == 1
    for f in dataclasses.fields(cls):
        m = next(filter(None, (re.search(rf"^    {f.name}: [^\n]*?#: ([^\n]*)$", src, re.M) for src in sources)), None)
        if m:
            assert f"    {f.name} (" in doc and f"): {m.group(1).strip()}" in doc, f.name


def test_inherited_fields_keep_their_base_comment_and_the_original_text_stays_first():
    assert "    patch_size (" in DINOConfig.__doc__ and DINOConfig.__doc__.startswith("Configuration of :class:`DINO`")
    assert "out_dim (int, default 256): K, prototypes of the projection head" in DINOConfig.__doc__
    # the k-NN and view settings are the SSL task's (SSLConfig), documented there
    assert "knn_k" not in DINOConfig.__doc__
    assert "knn_k (int, default 20): neighbours of the k-NN evaluation" in SSLConfig.__doc__


def test_document_fields_needs_a_dataclass():
    with pytest.raises(TypeError, match="expected a dataclass"):
        document_fields(int)
