"""Tests written in a mutation-testing audit of the TU and CSBM loaders, the image builder, the
dataset and model registries and the experiment tables.

Each test kills a mutant of the library code (``diffusionformer/data``: tu, csbm, images,
registry; ``diffusionformer/models/registry.py``; ``diffusionformer/experiments/tables.py``)
that the rest of the suite let through; the docstring of each test names it. The references are
independent of the code under test: hand-worked values, closed-form expectations, the
documented contract, files written here with the standard library. CPU only, deterministic
(seeded generators), files only under ``tmp_path``.

Two tests guard defects the audit found and fixed (their docstrings start with "Bug"): a TU zip
whose deflated entry was damaged gave a bare ``zlib.error``, and one with an empty ``_A.txt`` a
bare ``IndexError`` from PyG's parser, instead of a ``CorruptDataError`` naming the archive.
"""

from __future__ import annotations

import zipfile

import pytest
import torch

from diffusionformer.data import CACHE_ENV, CorruptDataError, load_dataset


# ---------------------------------------------------------------------------------------------- tu
def _deflated_copy(src, dst):
    """``src`` rewritten with every entry deflate-compressed."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(src) as zi, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zo:
        for info in zi.infolist():
            zo.writestr(info.filename, zi.read(info))


def test_a_damaged_deflate_stream_is_a_corrupt_archive_naming_it(tmp_path, writers, monkeypatch):
    """Bug (tu.py:81): a TU zip whose deflated ``_A.txt`` has damaged bytes (CRC and sizes intact in
    the headers) raised a bare ``zlib.error: Error -3 while decompressing data``, which named
    neither the file nor the dataset; it is now a ``CorruptDataError`` naming the zip."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    plain = writers.write_tu_zip(tmp_path / "plain.zip", "MUTAG")
    path = tmp_path / "tudataset" / "MUTAG.zip"
    _deflated_copy(plain, path)
    raw = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as zf:
        first = zf.infolist()[0]
        start = first.header_offset + 30 + len(first.filename.encode()) + len(first.extra)
        assert first.filename.endswith("MUTAG_A.txt") and first.compress_size > 8
    for k in range(start, start + 8):  # the first bytes of the compressed stream
        raw[k] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptDataError, match=r"corrupt zip archive '.*MUTAG\.zip'"):
        load_dataset("mutag", root=tmp_path, verify=False)


def test_an_empty_adjacency_file_is_a_corrupt_archive(tmp_path, monkeypatch):
    """Bug (tu.py:92): a TU zip whose ``_A.txt`` is empty (no edges in the whole dataset) passed
    the archive checks and PyG's parser failed with a bare ``IndexError: Dimension out of range``;
    it is now a ``CorruptDataError`` naming the zip and the file. (With it, tu.py:162
    ``max_degree = 0`` -> ``1`` is equivalent: every accepted dataset has a node of degree >= 1.)"""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    path = tmp_path / "tudataset" / "IMDB-BINARY.zip"
    path.parent.mkdir(parents=True)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("IMDB-BINARY/IMDB-BINARY_A.txt", "\n")
        zf.writestr("IMDB-BINARY/IMDB-BINARY_graph_indicator.txt", "".join(f"{1 + i // 2}\n" for i in range(8)))
        zf.writestr("IMDB-BINARY/IMDB-BINARY_graph_labels.txt", "0\n1\n0\n1\n")
    with pytest.raises(CorruptDataError, match=r"IMDB-BINARY\.zip': IMDB-BINARY_A\.txt is empty"):
        load_dataset("imdb-binary", root=tmp_path, verify=False)


def test_an_entry_name_the_file_system_refuses_is_a_corrupt_archive(tmp_path, writers, monkeypatch):
    """kills: tu.py:81 ``OSError`` dropped from the except clause of the extraction (a hostile
    entry ``MUTAG/MUTAG_xxx...x.txt`` longer than a file name may be raised a bare
    ``OSError: File name too long`` while writing it)"""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    path = writers.write_tu_zip(tmp_path / "tudataset" / "MUTAG.zip", "MUTAG")
    with zipfile.ZipFile(path, "a") as zf:
        zf.writestr("MUTAG/MUTAG_" + "x" * 300 + ".txt", "1\n")
    with pytest.raises(CorruptDataError, match=r"corrupt zip archive '.*MUTAG\.zip'"):
        load_dataset("mutag", root=tmp_path, verify=False)


def test_a_damaged_processed_file_is_rebuilt_from_the_raw_files(tmp_path, writers, monkeypatch):
    """kills: tu.py:153 the ``drop_unsafe_processed`` call dropped (PyG read the cached
    ``processed/data.pt`` as it was: a file cut short by a killed run made every later load
    fail, and a doctored one would be unpickled without ``weights_only``)"""
    cache = tmp_path / "cache"
    monkeypatch.setenv(CACHE_ENV, str(cache))
    writers.write_tu_zip(tmp_path / "tudataset" / "MUTAG.zip", "MUTAG")
    assert len(load_dataset("mutag", root=tmp_path, verify=False).dataset) == 20
    processed = sorted((cache / "tudataset" / "MUTAG" / "processed").glob("*.pt"))
    assert processed
    for f in processed:
        f.write_bytes(f.read_bytes()[:40])  # cut short
    with pytest.warns(UserWarning, match="cached file refused and rebuilt"):
        again = load_dataset("mutag", root=tmp_path, verify=False)
    assert len(again.dataset) == 20
    assert sorted(torch.cat([g.y for g in again.dataset]).tolist()) == [0] * 10 + [1] * 10


def test_k_fold_val_share_is_val_fraction_not_test_fraction(tmp_path, writers, monkeypatch):
    """kills: tu.py:179 ``stratified_kfold_split(..., val_fraction, seed)`` -> ``test_fraction``
    (with the defaults both are 0.1, so the K-fold inner val split silently took the unused
    ``test_fraction``)"""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    writers.write_tu_zip(tmp_path / "tudataset" / "MUTAG.zip", "MUTAG")  # 10 graphs per class
    d = load_dataset("mutag", root=tmp_path, verify=False, fold=0, num_folds=5, val_fraction=0.25,
                     test_fraction=0.1)
    labels = torch.cat([g.y for g in d.dataset])
    assert labels[d.test_idx].bincount(minlength=2).tolist() == [2, 2]  # 10 / 5 folds
    assert labels[d.val_idx].bincount(minlength=2).tolist() == [2, 2]  # 0.25 * 8 of each class
    assert len(d.train_idx) == 12


def test_use_node_attr_reaches_the_loader(tmp_path, writers, monkeypatch):
    """kills: tu.py:219 the registered loader passing ``use_node_attr=False`` instead of the
    option (continuous node attributes, PROTEINS' and ENZYMES', were silently left out)"""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    path = writers.write_tu_zip(tmp_path / "tudataset" / "MUTAG.zip", "MUTAG")
    with zipfile.ZipFile(path) as zf:
        num_nodes = len(zf.read("MUTAG//MUTAG_graph_indicator.txt").split())
    attrs = [0.5 * k for k in range(num_nodes)]  # one continuous attribute per node
    with zipfile.ZipFile(path, "a") as zf:
        zf.writestr("MUTAG//MUTAG_node_attributes.txt", "\n".join(f"{a}" for a in attrs) + "\n")
    plain = load_dataset("mutag", root=tmp_path, verify=False)
    data = load_dataset("mutag", root=tmp_path, verify=False, use_node_attr=True)
    assert plain.num_features == 3 and data.num_features == 1 + 3  # attribute, then 3 one-hot labels
    first = data.dataset[0]  # a triangle: nodes 1..3 of the file
    assert first.x[:, 0].tolist() == attrs[:3]
    assert torch.equal(first.x[:, 1:], plain.dataset[0].x)


def test_only_the_named_dataset_files_are_extracted(tmp_path, writers, monkeypatch):
    """kills: tu.py:78 ``not base.startswith(f"{name}_")`` dropped from the entry filter (the
    archive's README.txt and entries of other names landed in ``raw/``)"""
    cache = tmp_path / "cache"
    monkeypatch.setenv(CACHE_ENV, str(cache))
    path = writers.write_tu_zip(tmp_path / "tudataset" / "MUTAG.zip", "MUTAG", node_labels=False)
    with zipfile.ZipFile(path, "a") as zf:
        zf.writestr("MUTAG/OTHER_A.txt", "1, 2\n")
    load_dataset("mutag", root=tmp_path, verify=False)
    raw = cache / "tudataset" / "MUTAG" / "raw"
    assert sorted(p.name for p in raw.iterdir()) == [
        ".source_sha256", "MUTAG_A.txt", "MUTAG_graph_indicator.txt", "MUTAG_graph_labels.txt",
    ]


def test_the_extraction_records_the_zip_digest_and_is_done_once(tmp_path, writers, monkeypatch):
    """kills: tu.py:101 ``marker.write_text(digest)`` dropped (no record of the extracted zip: every
    load unzipped it again and threw away PyG's ``processed/``, which was then rebuilt)"""
    import hashlib

    cache = tmp_path / "cache"
    monkeypatch.setenv(CACHE_ENV, str(cache))
    path = writers.write_tu_zip(tmp_path / "tudataset" / "MUTAG.zip", "MUTAG")
    load_dataset("mutag", root=tmp_path, verify=False)
    marker = cache / "tudataset" / "MUTAG" / "raw" / ".source_sha256"
    # first line: the zip's digest; then the extracted tables' (helper 54a: a table changed in the cache is re-extracted)
    assert marker.read_text().partition("\n")[0] == hashlib.sha256(path.read_bytes()).hexdigest()
    processed = sorted((cache / "tudataset" / "MUTAG" / "processed").glob("*.pt"))
    stamps = [f.stat().st_mtime_ns for f in processed]
    load_dataset("mutag", root=tmp_path, verify=False)
    assert [f.stat().st_mtime_ns for f in processed] == stamps  # not rebuilt


def test_constant_features_replace_the_node_labels(tmp_path, writers, monkeypatch):
    """kills: tu.py:159 ``T.Constant(1.0, cat=False)`` -> ``cat=True`` (the documented "replacing
    existing features" became appending: MUTAG's 3 one-hot labels plus the constant)"""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    writers.write_tu_zip(tmp_path / "tudataset" / "MUTAG.zip", "MUTAG", node_labels=True)
    data = load_dataset("mutag", root=tmp_path, verify=False, node_features="constant")
    assert data.num_features == 1 and data.meta["node_features"] == "constant 1.0"
    assert torch.equal(data.dataset[1].x, torch.ones(4, 1))  # the second graph is a 4-node path


# ------------------------------------------------------------------------------------------ images
def test_a_float32_official_test_set_is_not_modified_in_place():
    """kills: images.py:71 ``x.to(torch.float32, copy=True)`` -> ``x.to(torch.float32)`` (a float32
    ``test=`` tensor is returned as is by ``.to`` and ``div_`` then scaled the caller's tensor)"""
    from diffusionformer.data.images import build_image_data

    images = torch.arange(4 * 2 * 2, dtype=torch.float32).view(4, 1, 2, 2)
    labels = torch.tensor([0, 1, 0, 1])
    test_x = torch.full((2, 1, 2, 2), 8.0)
    data = build_image_data("toy", images, labels, (torch.tensor([0, 1]), torch.tensor([2]), torch.tensor([3])),
                            num_classes=2, normalize=False, meta={}, scale=16.0, test=(test_x, torch.tensor([1, 0])))
    assert torch.equal(test_x, torch.full((2, 1, 2, 2), 8.0))  # the caller's tensor is untouched
    assert torch.equal(data.x_test, torch.full((2, 1, 2, 2), 0.5))
    assert torch.equal(data.x_train, images[:2] / 16.0) and data.y_test.tolist() == [1, 0]


def test_images_without_a_channel_axis_are_refused_by_name():
    """kills: images.py:67 the ``images.dim() != 4`` check dropped (``(N, H, W)`` images were
    accepted and recorded an ``input_shape`` of two numbers)"""
    from diffusionformer.data.images import build_image_data

    images = torch.zeros(4, 2, 2)
    splits = (torch.tensor([0, 1]), torch.tensor([2]), torch.tensor([3]))
    with pytest.raises(ValueError, match=r"images must be \(N, C, H, W\), got shape \(4, 2, 2\)"):
        build_image_data("toy", images, torch.tensor([0, 1, 0, 1]), splits, num_classes=2, normalize=False, meta={})



def test_build_image_data_leaves_the_callers_meta_alone():
    """kills: images.py:84 ``meta = dict(meta)`` dropped (the caller's dict got this dataset's
    ``sizes`` and ``pixel_scale``, and a dict shared by two loads carried the first one's)"""
    from diffusionformer.data.images import build_image_data

    meta = {"source": "toy"}
    images = torch.zeros(5, 1, 2, 2, dtype=torch.uint8)
    splits = (torch.tensor([0, 1, 2]), torch.tensor([3]), torch.tensor([4]))
    data = build_image_data("toy", images, torch.tensor([0, 1, 0, 1, 0]), splits, num_classes=2,
                            normalize=False, meta=meta)
    assert meta == {"source": "toy"}
    assert data.meta["sizes"] == {"train": 3, "val": 1, "test": 1} and data.meta["source"] == "toy"


# ------------------------------------------------------------------------------- dataset registry
def test_a_loader_registered_as_needing_a_root_must_take_root(monkeypatch):
    """kills: registry.py:80 ``required = {"seed", "root"} if needs_root else {"seed"}`` ->
    ``{"seed"}`` (a ``needs_root`` loader without ``root`` registered fine and failed with a bare
    ``TypeError: unexpected keyword argument 'root'`` at its first load)"""
    from diffusionformer.data import registry

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    with pytest.raises(TypeError, match=r"loader for 'rootless' must accept \['root', 'seed'\]"):
        registry.register_dataset("rootless", kind="graph", needs_root=True)(lambda *, seed=0: None)
    assert "rootless" not in registry.list_datasets()


def test_an_unknown_dataset_name_suggests_up_to_three_close_names():
    """kills: registry.py:115 ``get_close_matches(..., n=3, ...)`` -> ``n=1`` (only the closest of
    several near names was suggested)"""
    with pytest.raises(ValueError, match=r"unknown dataset 'mnist-min' \(did you mean 'mnist-mini' or 'mnist' or "
                                         r"'mnist1d'\?\); valid names: assoc-recall, "):
        load_dataset("mnist-min")
    with pytest.raises(ValueError, match=r"unknown dataset 'PTC' \(did you mean 'ptc_mr'\?\)"):
        load_dataset("PTC")  # suggestions use the canonical names


def test_the_spec_summary_is_the_first_line_of_the_loader_docstring(monkeypatch):
    """kills: registry.py:93 ``doc.splitlines()[0]`` -> ``[-1]`` (the summary shown by the CLI was
    the docstring's last line)"""
    from diffusionformer.data import dataset_spec, registry

    assert dataset_spec("csbm").summary == (
        "A seeded CSBM node-classification graph with a seeded random 60/20/20 node split."
    )
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))

    def loader(*, seed=0, size=3):
        """First line.

        Args:
            size: last line.
        """

    registry.register_dataset("two-lines", kind="node")(loader)
    spec = dataset_spec("TWO_LINES")
    assert spec.summary == "First line." and spec.options == {"size": 3} and spec.name == "two-lines"


def test_a_dataset_name_that_is_not_a_string_is_a_type_error():
    """kills: registry.py:110 the ``isinstance(name, str)`` check dropped (``load_dataset(3)`` raised
    a bare ``AttributeError: 'int' object has no attribute 'strip'``)"""
    from diffusionformer.data import dataset_spec

    with pytest.raises(TypeError, match="dataset name must be a str, got int"):
        dataset_spec(3)
    with pytest.raises(TypeError, match="dataset name must be a str, got NoneType"):
        load_dataset(None)


def test_registering_an_unknown_kind_is_refused(monkeypatch):
    """kills: registry.py:67 the ``kind not in KINDS`` check of ``register_dataset`` dropped (a
    loader of kind ``"video"`` registered, and ``list_datasets(kind)`` could never list it)"""
    from diffusionformer.data import registry

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    with pytest.raises(ValueError, match=r"kind must be one of \['image', .*'graph'\], got 'video'"):
        registry.register_dataset("clips", kind="video")(lambda *, seed=0: None)
    assert "clips" not in registry.list_datasets()


# -------------------------------------------------------------------------------------------- csbm
def _csbm(seed=0, **kw):
    from diffusionformer.data import csbm_graph

    opts = dict(num_nodes=40, num_classes=2, avg_degree=4.0, homophily=0.5, feature_dim=4, mu=1.0)
    opts.update(kw)
    return csbm_graph(**opts, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(
    "kw, counts",
    [
        # 4 nodes, classes of 2: 2 intra-class pairs, 4 inter-class pairs
        (dict(homophily=0.0, avg_degree=2.5), "needs 0 intra-class and 5 inter-class edges, but only 2 and 4"),
        (dict(homophily=1.0, avg_degree=1.5), "needs 3 intra-class and 0 inter-class edges, but only 2 and 4"),
    ],
)
def test_more_edges_than_distinct_pairs_is_refused_before_sampling(monkeypatch, kw, counts):
    """kills: csbm.py:107 ``or m_out > inter_pool`` dropped, and csbm.py:103 the intra-class pool
    ``sum c (c - 1) / 2`` -> ``sum c^2 / 2`` (either way the impossible request reached the
    sampler, which redraws forever; here the sampler is replaced by a tripwire)"""
    from diffusionformer.data import csbm

    def tripwire(*args, **kwargs):
        raise AssertionError("the sampler was reached")

    monkeypatch.setattr(csbm, "_sample_unique_pairs", tripwire)
    with pytest.raises(ValueError, match=counts):
        _csbm(num_nodes=4, **kw)


def test_labels_are_balanced_and_shuffled_by_the_seed():
    """kills: csbm.py:95 the ``randperm`` shuffle of ``y = arange(N) % C`` dropped (labels
    alternated with the node id: node parity told the class)"""
    ys = [_csbm(seed=s, num_classes=2)[2] for s in range(3)]
    for y in ys:
        assert y.bincount().tolist() == [20, 20]
        assert not torch.equal(y, torch.arange(40) % 2)
    assert not torch.equal(ys[0], ys[1]) and not torch.equal(ys[1], ys[2])


def test_edge_homophily_of_a_graph_without_edges_is_an_error():
    """kills: csbm.py:150 the empty-graph check of ``edge_homophily`` dropped (the mean over no
    edges came back as ``nan``)"""
    from diffusionformer.data import edge_homophily

    with pytest.raises(ValueError, match="edge_homophily is undefined for a graph without edges"):
        edge_homophily(torch.empty(2, 0, dtype=torch.long), torch.tensor([0, 1]))
    # hand-counted: edges 0->1 (same), 1->2 (different), 2->3 (same), 3->0 (different)
    assert edge_homophily(torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]]), torch.tensor([0, 0, 1, 1])) == 0.5


# --------------------------------------------------------------------------------- model registry
@pytest.fixture()
def presets(monkeypatch):
    """The model registry module with its preset table copied, so registrations do not leak."""
    from diffusionformer.models import registry

    monkeypatch.setattr(registry, "_PRESETS", dict(registry._PRESETS))
    return registry


def test_registering_a_taken_preset_name_is_refused(presets):
    """kills: models/registry.py:61 the ``name in _PRESETS`` check dropped (a second
    ``register_model("vit-digits", ...)`` silently replaced the preset)"""
    from diffusionformer.models.vit import DiffusionViT, ViTConfig

    before = presets.get_preset("vit-digits")
    with pytest.raises(ValueError, match="model preset 'vit-digits' is already registered"):
        presets.register_model("vit-digits", DiffusionViT, ViTConfig, input_size=(4, 4), patch_size=2)
    assert presets.get_preset("vit-digits") is before


def test_preset_defaults_are_validated_when_registered(presets):
    """kills: models/registry.py:63 the ``config_from_dict`` check of the defaults dropped (a
    misspelt default registered and failed only when the preset was first built)"""
    from diffusionformer.models.vit import DiffusionViT, ViTConfig

    with pytest.raises(ValueError, match="unknown key 'detph'"):
        presets.register_model("vit-typo", DiffusionViT, ViTConfig, detph=2)
    assert "vit-typo" not in presets.list_models()


def test_task_defaults_without_a_task_config_class_are_refused(presets):
    """kills: models/registry.py:64 the ``task_defaults and task_config_cls is None`` check dropped
    (the task defaults were stored and never used or validated)"""
    from diffusionformer.models.vit import DiffusionViT, ViTConfig

    with pytest.raises(ValueError, match=r"preset 'vit-task': task_defaults \['knn_k'\] need a task_config_cls"):
        presets.register_model("vit-task", DiffusionViT, ViTConfig, task_defaults={"knn_k": 3})
    assert "vit-task" not in presets.list_models()


def test_an_empty_preset_name_is_refused(presets):
    """kills: models/registry.py:59 ``or not name`` dropped (a preset named ``""`` registered)"""
    from diffusionformer.models.vit import DiffusionViT, ViTConfig

    with pytest.raises(ValueError, match="preset name must be a non-empty string, got ''"):
        presets.register_model("", DiffusionViT, ViTConfig)
    assert "" not in presets.list_models()


def test_task_settings_override_the_preset_task_defaults():
    """kills: models/registry.py:115 ``{**task_defaults, **settings}`` -> ``{**settings,
    **task_defaults}`` (dino-digits' ``blur_sigma=(0.1, 0.6)`` won over the caller's value)"""
    from diffusionformer.models.registry import task_config

    assert task_config("dino-digits").blur_sigma == (0.1, 0.6)
    assert task_config("dino-digits", blur_sigma=(0.2, 0.3)).blur_sigma == (0.2, 0.3)


def test_task_settings_of_a_preset_without_any_are_refused():
    """kills: models/registry.py:112 the ``if settings`` check dropped (``task_config("vit-digits",
    knn_k=3)`` returned None and the setting vanished)"""
    from diffusionformer.models.registry import task_config

    assert task_config("vit-digits") is None
    with pytest.raises(ValueError, match=r"model 'vit-digits' has no task settings, got \['knn_k'\]"):
        task_config("vit-digits", knn_k=3)


def test_split_task_settings_warns_only_when_asked():
    """kills: models/registry.py:98 ``if moved and warn`` -> ``if moved`` (``warn=False``, used by
    callers that already warned, still warned)"""
    import warnings

    from diffusionformer.models.registry import split_task_settings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model, task = split_task_settings("dino-digits", {"knn_k": 3, "depth": 1}, warn=False)
    assert model == {"depth": 1} and task == {"knn_k": 3}
    with pytest.warns(DeprecationWarning, match=r"model 'dino-digits': \['knn_k'\] are settings of the task"):
        split_task_settings("dino-digits", {"knn_k": 3})


def test_model_config_validates_task_settings_passed_as_overrides():
    """kills: models/registry.py:128 the ``task_config(name, **moved)`` check in ``model_config``
    dropped (an invalid ``knn_k=0`` among the overrides was silently discarded)"""
    from diffusionformer.models.registry import model_config

    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="knn_k must be an int >= 1, got 0"):
        model_config("dino-digits", knn_k=0)
    with pytest.warns(DeprecationWarning):
        assert model_config("dino-digits", knn_k=5, depth=1).depth == 1


# ---------------------------------------------------------------------------------- tables
def _result(op, seed, value, *, status="completed", elapsed=None, reach=None):
    from diffusionformer.experiments.results import RunResult

    return RunResult("t", op, seed, status, "test_acc", value, elapsed=elapsed, reach_step=reach)


def test_failed_runs_are_counted_whatever_their_reason():
    """kills: tables.py:30 ``r.status != "completed"`` -> ``r.status == "failed"`` (the runner's
    statuses are ``"failed: <reason>"``, so no failure was ever counted)"""
    from diffusionformer.experiments.tables import aggregate

    runs = [_result("a", 0, 0.5), _result("a", 1, None, status="failed: CUDA out of memory"),
            _result("a", 2, float("nan"), status="failed: loss is nan")]
    (row,) = aggregate(runs)
    assert row["failed"] == 2 and row["non_finite"] == 0  # a failed run's NaN is not a completed run's
    assert row["n"] == 1 and row["values"] == [0.5] and row["seeds"] == [0]


def test_format_status_estimates_the_time_left_from_the_time_per_step():
    """kills: tables.py:179 ``elapsed / max(step, 1)`` -> ``elapsed`` and tables.py:189 ``per_step *
    max(max_steps - step, 0)`` -> ``per_step * max_steps`` (the estimate used a whole run's time
    per step, or ignored the steps already done)"""
    from diffusionformer.experiments.tables import format_status

    def row(task, seed, state, step, elapsed=None, holder=None):
        return dict(task=task, operator="attention", seed=seed, state=state, step=step, max_steps=100,
                    elapsed=elapsed, holder=holder)

    rows = [row("a", 0, "completed", 100, elapsed=600.0), row("a", 1, "running", 50, holder="pid 7 on h"),
            row("a", 2, "missing", 0), row("b", 0, "interrupted", 10)]
    text = format_status(rows)
    # 6 s per step: 50 + 100 steps left = 900 s = 15 min; task b has no finished run to time
    assert text.startswith("1 of 4 runs completed; about 15 min of training left on one worker "
                           "(plus 1 run(s) of tasks with no finished run to time).\n")
    assert "| attention | 1 | running (pid 7 on h) | 50 / 100 | n/a |" in text
    assert "| attention | 0 | completed | 100 / 100 | 600 |" in text


def test_holm_p_is_bold_only_below_five_percent():
    """kills: tables.py:72 ``p_holm < 0.05`` -> ``<= 0.05`` (a Holm p of exactly 0.05, not below the
    level, was marked significant)"""
    from types import SimpleNamespace

    from diffusionformer.experiments.tables import _contrast_cells

    diff = SimpleNamespace(mean=0.01, low=-0.002, high=0.022, df=4.0, p=0.02, p_wilcoxon=0.0625)
    at = _contrast_cells(SimpleNamespace(diff=diff, p_holm=0.05), 3, False)
    assert at == ["+0.010", "[-0.002, +0.022]", "4", "0.020", "0.062", "0.0500"]
    below = _contrast_cells(SimpleNamespace(diff=diff, p_holm=0.0499), 3, True)
    assert below == ["+0.010", "[-0.002, +0.022]", "0.020", "**0.0499**"]


def test_elapsed_mean_is_over_the_runs_that_report_a_time():
    """kills: tables.py:38 the mean of ``r.elapsed`` over runs with a time -> over every run with
    None as 0 (a failed run without a time halved the time per run)"""
    from diffusionformer.experiments.tables import aggregate

    runs = [_result("a", 0, 0.5, elapsed=10.0), _result("a", 1, 0.7, elapsed=20.0),
            _result("a", 2, None, status="failed: killed")]
    (row,) = aggregate(runs)
    assert row["elapsed_mean"] == 15.0
    assert aggregate([_result("a", 0, 0.5)])[0]["elapsed_mean"] is None


def test_a_single_operator_table_has_no_comparison_columns():
    """kills: tables.py:110 ``stat_heads = []`` for a single operator dropped (a comparison with
    nothing to compare got empty Δ/CI/p columns and the legend explaining them)"""
    from diffusionformer.experiments.config import ExperimentConfig, OperatorSetting, TaskConfig
    from diffusionformer.experiments.tables import aggregate, format_table

    cfg = ExperimentConfig("one", [TaskConfig("t", "digits", "vit-digits")], [OperatorSetting("attention")],
                           seeds=[0, 1])
    runs = [_result("attention", 0, 0.5, elapsed=10.0), _result("attention", 1, 0.7, elapsed=20.0)]
    text = format_table(aggregate(runs), cfg)
    assert text.splitlines()[2:5] == [
        "| operator | test_acc mean ± std | seeds | params | time/run (s) |",
        "|---|---|---|---|---|",
        "| attention | 0.6000 ± 0.1414 | 2 | n/a | 15.0 |",  # sample std: sqrt(0.02)
    ]
    assert "Δ" not in text and "Holm" not in text



@pytest.mark.parametrize("key, sign", [("val_loss", "≤"), ("val_acc", "≥")])
def test_the_steps_to_threshold_heading_says_at_most_for_a_loss(key, sign):
    """kills: tables.py:151 the heading's ``'≤' if rkey.endswith('loss') else '≥'`` -> ``'≥'`` (a
    loss threshold, reached by going down, read "steps to val_loss ≥ 0.5")"""
    from diffusionformer.experiments.config import ExperimentConfig, OperatorSetting, TaskConfig
    from diffusionformer.experiments.tables import aggregate, format_table

    cfg = ExperimentConfig("r", [TaskConfig("t", "digits", "vit-digits", reach={key: 0.5})],
                           [OperatorSetting("attention")], seeds=[0, 1])
    runs = [_result("attention", 0, 0.5, reach=40), _result("attention", 1, 0.7, reach=None)]
    text = format_table(aggregate(runs), cfg)
    assert f"#### t: steps to {key} {sign} 0.5" in text
    assert "| attention | 40 (1 of 2) |" in text


def test_the_selected_table_appears_when_any_setting_has_a_selected_value():
    """kills: tables.py:142 ``any("selected_mean" in r ...)`` -> ``all(...)`` (one setting whose runs
    never reached a selection evaluation hid the early-stopping table of all the others)"""
    from diffusionformer.experiments.config import ExperimentConfig, OperatorSetting, TaskConfig
    from diffusionformer.experiments.results import RunResult
    from diffusionformer.experiments.tables import aggregate, format_table

    cfg = ExperimentConfig("s", [TaskConfig("t", "digits", "vit-digits", select_by="val_acc")],
                           [OperatorSetting("attention")], seeds=[0, 1])
    runs = [RunResult("t", "attention", 0, "completed", "test_acc", 0.5, selected_value=0.6, selected_step=10),
            RunResult("t", "attention", 1, "completed", "test_acc", 0.7, selected_value=0.8, selected_step=20),
            RunResult("t", "other", 0, "completed", "test_acc", 0.4)]
    text = format_table(aggregate(runs), cfg)
    assert "#### t: test_acc at best val_acc" in text
    assert "| attention | 0.7000 ± 0.1414 |" in text and "| other | n/a |" in text
