from __future__ import annotations

from pathlib import Path

import pytest

from diffusionformer.data import (
    CACHE_ENV,
    DATA_ENV,
    DataRootError,
    cache_dir,
    dataset_spec,
    list_datasets,
    load_dataset,
    register_dataset,
    resolve_root,
)

EMBEDDED = ["digits", "mnist1d", "mnist-mini", "pydoc-chars", "karate", "csbm", "assoc-recall"]
FROM_ROOT = [
    "tinyshakespeare", "mnist", "cifar10", "cora", "citeseer", "mutag", "proteins", "enzymes",
    "nci1", "nci109", "imdb-binary", "imdb-multi", "ptc_mr",
]  # fmt: skip


def test_list_datasets_has_every_dataset_sorted():
    names = list_datasets()
    assert names == sorted(EMBEDDED + FROM_ROOT)
    assert list_datasets("graph") == sorted(FROM_ROOT[5:])
    assert set(list_datasets("node")) == {"karate", "csbm", "cora", "citeseer"}
    with pytest.raises(ValueError, match="kind must be one of"):
        list_datasets("video")


@pytest.mark.parametrize("name", EMBEDDED + FROM_ROOT)
def test_spec_records_root_need_and_options(name):
    spec = dataset_spec(name)
    assert spec.name == name
    assert spec.needs_root == (name in FROM_ROOT)
    assert "seed" not in spec.options and "root" not in spec.options
    assert spec.summary  # every loader documents itself


def test_lookup_is_forgiving_about_case_and_separators():
    assert dataset_spec("PTC-MR").name == "ptc_mr"
    assert dataset_spec("IMDB_BINARY").name == "imdb-binary"
    assert dataset_spec(" Cora ").name == "cora"


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError, match="unknown dataset 'imagenet'; valid names: .*cifar10"):
        load_dataset("imagenet")


def test_unknown_option_is_named():
    with pytest.raises(TypeError, match=r"option\(s\) 'num_nodez'.*valid options: .*num_nodes"):
        load_dataset("csbm", num_nodez=10)


def test_duplicate_registration_raises():
    with pytest.raises(ValueError, match="already registered"):
        register_dataset("digits", kind="image")(lambda *, seed=0: None)


def test_registration_rejects_positional_loaders():
    with pytest.raises(TypeError, match="keyword-only"):
        register_dataset("positional-demo", kind="image")(lambda seed=0: None)
    assert "positional-demo" not in list_datasets()


@pytest.mark.parametrize("name", FROM_ROOT)
def test_missing_root_raises_data_root_error_with_layout_and_hint(name):
    with pytest.raises(DataRootError) as info:
        load_dataset(name)
    msg = str(info.value)
    assert isinstance(info.value, FileNotFoundError)
    assert "<root>/" in msg and DATA_ENV in msg and "root=" in msg


def test_missing_files_under_root_are_listed(tmp_path):
    with pytest.raises(DataRootError, match=r"(?s)missing file.*planetoid/Cora/raw/ind\.cora\.x"):
        load_dataset("cora", root=tmp_path)


def test_root_resolution_order(monkeypatch, tmp_path):
    assert resolve_root(None) is None
    monkeypatch.setenv(DATA_ENV, str(tmp_path / "env"))
    assert resolve_root(None) == tmp_path / "env"
    assert resolve_root(tmp_path / "arg") == tmp_path / "arg"
    # the env root is what load_dataset uses when no root is passed
    with pytest.raises(DataRootError, match=str(tmp_path / "env")):
        load_dataset("tinyshakespeare")


def test_cache_dir_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "c"))
    path = cache_dir("x", "y")
    assert path == tmp_path / "c" / "x" / "y" and path.is_dir()
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == Path(tmp_path / "home" / ".cache" / "diffusionformer")


def test_seed_must_be_an_int():
    with pytest.raises(TypeError, match="seed must be an int"):
        load_dataset("assoc-recall", seed="1", num_examples=10)
