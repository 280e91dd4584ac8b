"""Edge-case probes of diffusionformer.data, second pass: augmentations, splits, the neighbour
sampler, the synthetic tasks, text, and hostile Planetoid / TU files."""

from __future__ import annotations

import pickle
import zipfile

import numpy as np
import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.sampler import NodeSamplerInput

from diffusionformer.data import CorruptDataError
from diffusionformer.data.augment import MultiCropAugment, gaussian_blur, random_crop_flip, resample_crops
from diffusionformer.data.csbm import csbm_graph
from diffusionformer.data.neighbors import TorchNeighborSampler
from diffusionformer.data.planetoid import read_planetoid
from diffusionformer.data.recall import load_assoc_recall, make_assoc_recall
from diffusionformer.data.sequences import load_mnist1d
from diffusionformer.data.splits import (
    normalize_channels,
    per_class_split,
    split_sizes,
    stratified_kfold_split,
    stratified_split,
)
from diffusionformer.data.text import char_text_data, load_tinyshakespeare


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ----------------------------------------------------------------------------- augmentation


@pytest.mark.parametrize("field,value", [("ratio", (1.0, float("inf"))), ("blur_sigma", (0.1, float("inf")))])
def test_multicrop_refuses_an_infinite_range_end(field, value):
    """Bug: ``MultiCropAugment(ratio=(1, inf))`` was accepted and gave NaN views (``inf * 0`` in the
    log-ratio), and ``blur_sigma=(0.1, inf)`` failed only at the first batch with ``OverflowError:
    cannot convert float infinity to integer``."""
    with pytest.raises(ValueError, match=rf"MultiCropAugment\.{field} must be a pair of finite numbers"):
        MultiCropAugment(**{field: value})


def test_multicrop_apply_names_parameters_drawn_for_another_image_size():
    """Bug: noise drawn by ``sample(B, (1, 4, 16), g)`` was silently reshaped onto ``(B, 1, 8, 8)``
    images (same element count), and for other sizes failed with "shape '[4, 1, 8, 8]' is invalid";
    a missing key was a bare ``KeyError: 'gain'``."""
    aug = MultiCropAugment(noise_std=0.1)
    x = torch.rand(2, 1, 8, 8)
    with pytest.raises(ValueError, match=r"'noise' must have shape \(2, 2, 1, 8, 8\).*got \(2, 2, 1, 4, 16\)"):
        aug.apply(x, aug.sample(2, (1, 4, 16), _gen()))
    params = aug.sample(2, (1, 8, 8), _gen())
    del params["gain"]
    with pytest.raises(ValueError, match=r"'gain' must have shape \(2, 2\).*got missing"):
        aug.apply(x, params)


def test_blur_and_resample_take_an_empty_batch_and_name_integer_images():
    """Bug: ``gaussian_blur`` and ``resample_crops`` of a batch of 0 images failed inside
    ``conv2d``/``affine_grid`` ("Expected non-zero, positive output size"); uint8 images failed as
    "expected scalar type Byte but found Float" and "Expected theta to have floating point type"
    (theta was float: the images were not)."""
    empty = torch.rand(0, 3, 5, 5)
    assert gaussian_blur(empty, torch.zeros(0), 3).shape == (0, 3, 5, 5)
    assert resample_crops(empty, torch.zeros(0, 2, 3)).shape == (0, 3, 5, 5)
    views = MultiCropAugment()(torch.rand(2, 0, 4, 4), _gen())  # no channels: empty views, no crash
    assert views.shape == (2, 2, 0, 4, 4)
    img = torch.zeros(1, 1, 5, 5, dtype=torch.uint8)
    with pytest.raises(TypeError, match="gaussian_blur expects floating-point images, got torch.uint8"):
        gaussian_blur(img, torch.ones(1), 3)
    with pytest.raises(TypeError, match="resample_crops expects floating-point images, got torch.uint8"):
        resample_crops(img, torch.zeros(1, 2, 3))


def test_a_seed_passed_as_the_generator_is_named():
    """Bug: passing a seed where a ``torch.Generator`` goes failed deep in torch with "rand()
    received an invalid combination of arguments - got (..., generator=int)"."""
    calls = [
        lambda: MultiCropAugment()(torch.rand(2, 1, 8, 8), 0),
        lambda: random_crop_flip(torch.rand(2, 1, 8, 8), 0),
        lambda: make_assoc_recall(2, 2, 8, 0),
        lambda: csbm_graph(8, 2, 2.0, 0.5, 2, 1.0, 0),
    ]
    for call in calls:
        with pytest.raises(TypeError, match=r"generator must be a torch.Generator, got int \(for a seed"):
            call()


def test_numpy_numbers_in_multicrop_ranges_counts_and_kernel_size():
    """Bug: ``MultiCropAugment(global_scale=(np.float32(0.3), 1.0))`` and ``local_crops=np.int64(2)``
    (a sweep grid's values) were refused as "must be a pair (a, b) with 1e-06 <= a <= b <= 1.0" and
    "must be an int >= 0", and ``gaussian_blur(..., kernel_size=np.int64(3))`` as "must be a positive
    odd int"; numpy floats were kept as numpy numbers in the frozen settings."""
    aug = MultiCropAugment(global_scale=(np.float32(0.5), np.float64(1.0)), local_crops=np.int64(1))
    ref = MultiCropAugment(global_scale=(float(np.float32(0.5)), 1.0), local_crops=1)
    assert aug == ref and type(aug.global_scale[0]) is float and type(aug.local_crops) is int
    x = torch.rand(2, 1, 8, 8)
    assert torch.equal(aug(x, _gen()), ref(x, _gen()))
    assert torch.equal(gaussian_blur(x, torch.ones(2), np.int64(3)), gaussian_blur(x, torch.ones(2), 3))


def test_random_crop_flip_matches_a_numpy_reference_on_odd_sizes():
    """Pins: odd sizes, padding larger than the image, uint8 and a batch of 0, against numpy slicing
    of the zero-padded images with the documented draws (offsets, then flips)."""
    x = torch.randint(0, 256, (5, 2, 3, 7), dtype=torch.uint8)
    for p in (0, 1, 9):
        g = _gen(3)
        offsets = torch.randint(0, 2 * p + 1, (5, 2), generator=g)
        flips = torch.rand(5, generator=g) < 0.5
        padded = np.pad(x.numpy(), ((0, 0), (0, 0), (p, p), (p, p)))
        ref = [padded[b, :, i:i + 3, j:j + 7] for b, (i, j) in enumerate(offsets.tolist())]
        ref = np.stack([r[..., ::-1] if f else r for r, f in zip(ref, flips.tolist())])
        got = random_crop_flip(x, _gen(3), padding=p)
        assert got.dtype == torch.uint8 and np.array_equal(got.numpy(), ref)
    assert random_crop_flip(torch.rand(0, 1, 3, 3), _gen()).shape == (0, 1, 3, 3)


# ----------------------------------------------------------------------------- splits


def test_stratified_split_refuses_float_labels_instead_of_losing_examples():
    """Bug: ``stratified_split(torch.tensor([nan] * 4), ...)`` returned three EMPTY parts (NaN equals
    no class, so every example vanished from the partition); list and numpy labels failed with
    "'list' object has no attribute 'dim'"."""
    with pytest.raises(TypeError, match="stratified_split: labels must be integer class labels, got dtype torch.float32"):
        stratified_split(torch.tensor([float("nan")] * 4), 0.25, 0.25, 0)
    with pytest.raises(TypeError, match="labels must be a 1-D integer tensor, got ndarray"):
        stratified_split(np.array([0, 1, 0, 1]), 0.25, 0.25, 0)
    with pytest.raises(TypeError, match="stratified_kfold_split: labels must be integer"):
        stratified_kfold_split(torch.tensor([0.0, 1.0, 0.0, 1.0]), 2, 0, 0.0, 0)


def test_per_class_split_checks_its_labels_and_count():
    """Bug: 2-D labels ``[[0, 1]]`` were split as if the coordinates of ``nonzero()`` were node ids
    (train ``[0, 1]`` for a graph of 2 nodes laid out as one row); empty labels failed with
    "torch.cat(): expected a non-empty list"; ``num_train_per_class=1.5`` with "slice indices must
    be integers" and ``True`` was read as 1."""
    with pytest.raises(ValueError, match=r"labels must be 1-D, got shape \(1, 2\)"):
        per_class_split(torch.tensor([[0, 1]]), 1, 0.5, 0)
    with pytest.raises(ValueError, match="per_class_split: labels is empty"):
        per_class_split(torch.tensor([], dtype=torch.long), 1, 0.5, 0)
    for bad in (1.5, True):
        with pytest.raises(TypeError, match="num_train_per_class must be an int"):
            per_class_split(torch.tensor([0, 0, 1, 1]), bad, 0.5, 0)


def test_split_sizes_refuses_a_fractional_or_negative_count():
    """Bug: ``split_sizes(10.5, 0.1, 0.1)`` returned ``(8.5, 1, 1)`` and ``split_sizes(-5, ...)``
    ``(-5, 0, 0)``; ``load_assoc_recall(num_examples=10.5)`` then failed with "'float' object has no
    attribute 'numel'"."""
    with pytest.raises(TypeError, match="n must be an int, got 10.5"):
        split_sizes(10.5, 0.1, 0.1)
    with pytest.raises(ValueError, match="n must be >= 0, got -5"):
        split_sizes(-5, 0.1, 0.1)
    with pytest.raises(TypeError, match="num_examples must be an int, got 10.5"):
        load_assoc_recall(num_examples=10.5)
    with pytest.raises(TypeError, match="num_examples must be an int, got 2.5"):
        make_assoc_recall(2.5, 2, 8, _gen())
    with pytest.raises(TypeError, match="num_samples must be an int, got 20.5"):  # was read as 20
        load_mnist1d(num_samples=20.5)
    assert split_sizes(np.int64(10), 0.25, 0.25) == (4, 3, 3)  # halves round up; numpy n read as int


def test_kfold_reads_numpy_fold_numbers():
    """Bug: ``stratified_kfold_split(y, np.int64(2), np.int64(0), ...)`` was refused as "num_folds
    must be an int >= 2, got np.int64(2)"."""
    y = torch.tensor([0, 1, 0, 1, 0, 1])
    got = stratified_kfold_split(y, np.int64(3), np.int64(1), 0.0, 0)
    ref = stratified_kfold_split(y, 3, 1, 0.0, 0)
    assert all(torch.equal(a, b) for a, b in zip(got, ref))


def test_normalize_channels_checks_before_modifying_in_place():
    """Bug: a val tensor with the wrong channel count failed with a broadcast error AFTER x_train had
    been normalised in place (the caller's training images silently changed); a NaN pixel gave
    ``mean = nan`` and turned every image into NaN; ``chunk_size=0`` failed inside ``split``."""
    x = torch.rand(4, 3, 2, 2)
    before = x.clone()
    with pytest.raises(ValueError, match=r"others\[0\] must be float images \(N, 3, H, W\)"):
        normalize_channels(x, torch.rand(2, 1, 2, 2))
    assert torch.equal(x, before)
    bad = x.clone()
    bad[0, 1, 0, 0] = float("nan")
    kept = bad.clone()
    with pytest.raises(ValueError, match="non-finite statistics.*nothing was modified"):
        normalize_channels(bad)
    assert torch.equal(bad.isnan(), kept.isnan()) and torch.equal(bad.nan_to_num(), kept.nan_to_num())
    with pytest.raises(ValueError, match="chunk_size must be >= 1, got 0"):
        normalize_channels(x, chunk_size=0)
    mean, std, _ = normalize_channels(torch.tensor([1e4, 1e4 + 1.0]).repeat(500).view(1000, 1, 1, 1))
    assert mean == (10000.5,) and std == (0.5,)  # large offsets: float64 accumulation


# ----------------------------------------------------------------------------- neighbour sampler


def _sample(sampler: TorchNeighborSampler, seeds: list[int]):
    return sampler.sample_from_nodes(NodeSamplerInput(input_id=None, node=torch.tensor(seeds)))


def test_sampler_refuses_repeated_and_out_of_range_seeds():
    """Bug: ``sample_from_nodes`` (what ``neighbor_loader`` calls) with seeds ``[0, 0]`` gave the
    first copy no edges and the second every edge twice; seed 7 of 6 nodes failed with "index 7 is
    out of bounds" and seed -1 with "repeats can not be negative"."""
    data = Data(edge_index=torch.tensor([[1, 2, 3, 0], [0, 0, 0, 1]]), num_nodes=6)
    sampler = TorchNeighborSampler(data, [-1])
    with pytest.raises(ValueError, match=r"expected distinct seeds in a batch, got repeated node ids \[0\]"):
        _sample(sampler, [0, 0])
    for seed in (7, -1):
        with pytest.raises(ValueError, match=r"seed node ids must lie in \[0, num_nodes=6\)"):
            _sample(sampler, [seed])


def test_sampler_checks_edge_index_and_reads_numpy_hop_sizes():
    """Bug: an edge to node 9 of 3 failed with "The expanded size of the tensor (3) must match the
    existing size (10)", a negative id with "bincount only supports 1-d non-negative integral
    inputs", a float edge_index was truncated to ids silently, and ``num_neighbors=[np.int64(2)]``
    was refused as "expected a non-empty list of positive ints"."""
    for ei, match in (([[0], [9]], r"node ids in \[0, 9\], outside \[0, num_nodes=3\)"),
                      ([[0], [-1]], r"node ids in \[-1, 0\]"),
                      ([[0.0], [1.0]], "integer edge_index of shape \\(2, E\\), got torch.float32")):
        with pytest.raises(ValueError, match=match):
            TorchNeighborSampler(Data(edge_index=torch.tensor(ei), num_nodes=3), [-1])
    data = Data(edge_index=torch.tensor([[1, 2], [0, 0]]), num_nodes=3)
    assert TorchNeighborSampler(data, [np.int64(1)]).num_neighbors == [1]


def test_sampler_all_neighbours_matches_a_brute_force_neighbourhood():
    """Pins: ``num_neighbors=[-1, -1]`` returns exactly the in-edges of the seeds and of the nodes
    they reach (a Python loop over the edge list), isolated seeds get no edges, and each sampled
    edge's local endpoints map back to its original edge."""
    g = _gen(1)
    N, E = 30, 90
    ei = torch.randint(0, N, (2, E), generator=g)
    seeds = [3, 7, 29]
    out = _sample(TorchNeighborSampler(Data(edge_index=ei, num_nodes=N), [-1, -1]), seeds)
    reached, frontier, edges = set(seeds), list(seeds), set()
    for _ in range(2):
        new = []
        for v in frontier:
            for e in range(E):
                if int(ei[1, e]) == v:
                    edges.add(e)
                    u = int(ei[0, e])
                    if u not in reached:
                        reached.add(u)
                        new.append(u)
        frontier = new
    assert set(out.node.tolist()) == reached and out.node[:3].tolist() == seeds
    assert sorted(out.edge.tolist()) == sorted(edges)
    n = out.node
    assert all(int(n[r]) == int(ei[0, e]) and int(n[c]) == int(ei[1, e]) for r, c, e in zip(out.row, out.col, out.edge))


# ----------------------------------------------------------------------------- text


def test_char_text_data_refuses_bytes_and_lists():
    """Bug: ``char_text_data("t", b"abcd")`` built a vocabulary of ints ``[97, 98, ...]`` (decode
    then failed on ``"".join``), and a list of words made each word one token."""
    with pytest.raises(TypeError, match=r"text must be a str, got bytes \(decode it first"):
        char_text_data("t", b"abcd")
    with pytest.raises(TypeError, match="text must be a str, got list"):
        char_text_data("t", ["ab", "cd", "ab"])


def test_tinyshakespeare_takes_a_str_root_and_a_numpy_train_chars(tmp_path):
    """Bug: ``load_tinyshakespeare(root="/path")`` (the loader called directly) failed with
    "unsupported operand type(s) for /: 'str' and 'str'", and ``train_chars=np.int64(3)`` was
    refused as "must be an int >= 2 or None"."""
    (tmp_path / "tinyshakespeare").mkdir()
    (tmp_path / "tinyshakespeare" / "input.txt").write_text("hello world, hello")
    data = load_tinyshakespeare(root=str(tmp_path), verify=False, train_chars=np.int64(3))
    assert data.decode(data.train) == "hel" and data.meta["sizes"]["train"] == 3


# ----------------------------------------------------------------------------- hostile files


def test_planetoid_sparse_header_declaring_gigabytes_is_refused(tmp_path, writers):
    """Bug: a 500-byte ``ind.cora.x`` holding a CSR matrix whose shape field says 10 x 10^9 made
    ``toarray()`` ask for 37 GiB: an uncaught ``MemoryError`` naming no file (a smaller lie, 40000 x
    40000, really allocated 6 GiB)."""
    import scipy.sparse as sp

    raw = writers.write_planetoid_layout(tmp_path)
    m = sp.csr_matrix(np.ones((1, 1), np.float32))
    m._shape = (10, 10**9)
    m.indptr = np.array([0] + [1] * 10, dtype=np.int32)
    (raw / "ind.cora.x").write_bytes(pickle.dumps(m, protocol=2))
    with pytest.raises(CorruptDataError, match=r"ind\.cora\.x'.*declares a 10 x 1000000000 matrix"):
        read_planetoid(raw, "cora")


def test_citeseer_test_index_far_out_of_range_allocates_nothing(tmp_path, writers):
    """Bug: one edited line of CiteSeer's text file ``test.index`` (a node id of 10^9) made the reader
    allocate a zero block of 10^9 x features rows for the isolated test nodes (tens of GiB; a
    ``RuntimeError`` from the allocator, or a graph of 10^9 nodes) before any range check."""
    raw = writers.write_planetoid_layout(tmp_path, "CiteSeer", gap=True)
    path = raw / "ind.citeseer.test.index"
    lines = path.read_text().split()
    lines[0] = str(10**9)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(CorruptDataError, match=r"ind\.citeseer\.test\.index'.*its index range declares"):
        read_planetoid(raw, "citeseer")


def test_tu_zip_declaring_more_than_the_cap_is_refused_before_writing(tmp_path, monkeypatch):
    """Bug: ``extract_tu_zip`` read each entry whole into memory (``zf.read``): a small zip of a
    deflated multi-GB ``_A.txt`` (deflate packs zeros ~1000:1) filled memory and disk. Entries are
    streamed now and an archive declaring more than the cap (1 GiB; 200x the largest TU zip here)
    is refused before anything is written; the cap is lowered here to keep the file small."""
    from diffusionformer.data import tu

    assert tu._MAX_UNZIPPED >= 100 * 4_800_000
    monkeypatch.setattr(tu, "_MAX_UNZIPPED", 10_000, raising=False)
    path = tmp_path / "MUTAG.zip"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("MUTAG/MUTAG_A.txt", "1, 2\n" * 4000)  # 20 kB, deflated to a few hundred bytes
        zf.writestr("MUTAG/MUTAG_graph_indicator.txt", "1\n1\n")
        zf.writestr("MUTAG/MUTAG_graph_labels.txt", "1\n")
    raw = tmp_path / "cache" / "MUTAG" / "raw"
    with pytest.raises(CorruptDataError, match=r"entries declare 20\d{3} B uncompressed, more than any TU"):
        tu.extract_tu_zip(path, "MUTAG", raw, "digest")
    assert not any(raw.iterdir())
