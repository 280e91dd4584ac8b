"""Review 59l of the day's commits (the vision walk's ``show`` and data-sized config check, the compile walk, hostile
data 2), as a reviewer who assumes each has a bug.

Findings pinned here: ``run``'s config check loaded a task's data to judge a model that does not build from its
preset's sizes, but a dataset that did not load (files missing or damaged) was dropped in silence, and ``run`` refused
the model with the preset's stand-in size again (the refusal the commit removed), naming neither the files nor the
data; ``zip_damage``, which reads every entry of a ``torch.save`` file before ``torch.load`` (``from_nanogpt``'s
downloaded checkpoint included), inflated a bzip2 or LZMA entry whole, the memory bomb the commit refused in data zips;
``load_planetoid`` hashed a sparse file of a terabyte before its size was refused (design.md: refused before).
"""

from __future__ import annotations

import os
import tracemalloc
import zipfile

import pytest

from diffusionformer.data import CACHE_ENV


def _cifar_from_mnist_preset() -> dict:
    """CIFAR-10 (32x32) with ``vit-mnist``'s 28x28 preset and 8x8 patches: they divide the data's images only."""
    return {"name": "review59l", "seeds": [0],
            "tasks": [{"name": "cifar", "dataset": "cifar10", "model": "vit-mnist",
                       "model_overrides": {"patch_size": 8, "dim": 8, "depth": 1, "num_heads": 2},
                       "train": {"max_steps": 1, "batch_size": 4}}],
            "operators": [{"name": "attention"}]}


def test_bug_run_refused_a_data_sized_model_by_the_presets_size_when_its_files_were_missing(tmp_path, monkeypatch):
    """Bug: ``run`` (its check on the config alone) loaded CIFAR-10 to judge ``patch_size = 8`` of the 28x28 preset,
    and where the files were missing it refused the config with "ViTConfig.patch_size=8 must divide input_size=(28,
    28)" alone: a size the data replaces, while the files that were the problem went unnamed. Now the data's failure
    to load is a problem of the task (as ``show``'s check reports it)."""
    from diffusionformer.experiments import load_experiment_config, run_experiment
    from diffusionformer.experiments.validate import validate_experiment

    root = tmp_path / "root"
    root.mkdir()  # a data root without CIFAR-10's files
    config = load_experiment_config(_cifar_from_mnist_preset())
    problems = validate_experiment(config, data_root=str(root), load_data=False)
    assert any("missing file(s)" in p and "cifar10_jpg/train.zip" in p for p in problems), problems
    assert validate_experiment(config, data_root=str(root), load_data=False, missing_data_ok=True) == [
        "task 'cifar' / setting 'attention': ViTConfig.patch_size=8 must divide input_size=(28, 28)"]
    with pytest.raises(ValueError, match=r"missing file\(s\) under the data root") as caught:
        run_experiment(config, tmp_path / "out", data_root=str(root), progress=False)
    assert "nothing was trained" in str(caught.value)
    assert not (tmp_path / "out").exists()
    # a root that is not there is one problem, not again as the load's
    nowhere = validate_experiment(config, data_root=str(tmp_path / "nowhere"), load_data=False)
    assert len(nowhere) == 2 and "is not a directory" in nowhere[0], nowhere
    # damaged files: the load's failure named
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    (root / "cifar10_jpg").mkdir()
    for split in ("train", "test"):
        (root / "cifar10_jpg" / f"{split}.zip").write_bytes(b"not a zip")
    problems = validate_experiment(config, data_root=str(root), load_data=False)
    assert any("dataset 'cifar10' does not load" in p and "train.zip" in p for p in problems), problems


@pytest.mark.parametrize("method, name", [(zipfile.ZIP_BZIP2, "bzip2"), (zipfile.ZIP_LZMA, "LZMA")])
def test_bug_a_checkpoint_entry_compressed_with_bzip2_was_inflated_whole(tmp_path, method, name):
    """Bug: ``zip_damage`` (the CRC check before ``torch.load`` of checkpoints, data caches and ``from_nanogpt``'s
    ``ckpt.pt``) read each entry through zipfile, which inflates a bzip2 or LZMA entry whole whatever is asked: a
    file of a few hundred bytes filled memory (32 MiB here, from 0.3 KB). ``torch.save`` writes neither method: the
    entry is now refused uninflated, named, as the data zips' are."""
    from diffusionformer.models.gpt import DiffusionGPT

    path = tmp_path / "ckpt.pt"
    with zipfile.ZipFile(path, "w", compression=method) as zf:
        zf.writestr("ckpt/data.pkl", bytes(32 << 20))
    tracemalloc.start()
    try:
        with pytest.raises(ValueError) as caught:
            DiffusionGPT.from_nanogpt(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak  # was 32 MiB and more: the entry inflated whole
    assert f"is corrupt: its entry 'ckpt/data.pkl' is compressed with {name}" in str(caught.value)


@pytest.mark.skipif(os.name != "posix", reason="sparse files as on POSIX")
def test_bug_a_sparse_planetoid_file_of_a_terabyte_was_hashed_before_it_was_refused(tmp_path, monkeypatch):
    """Bug: ``load_planetoid`` hashed its eight files whole (``verify=True``, the default; the commit hashes them once
    more after the read) before the reader refused a file over 1 GiB: a sparse ``ind.cora.x`` of 1 TiB (no disk
    space) was hashed for many minutes, against design.md ("a data file larger than any of its kind ... is refused
    before it is hashed or read"). Now it is refused first, naming it; here hashing it fails the test at once."""
    import diffusionformer.data.planetoid as planetoid
    from diffusionformer.data import CorruptDataError, load_dataset

    raw = tmp_path / "planetoid" / "Cora" / "raw"
    raw.mkdir(parents=True)
    for part in planetoid.PLANETOID_FILES:
        (raw / f"ind.cora.{part}").write_bytes(b"")
    with open(raw / "ind.cora.x", "wb") as f:
        f.truncate(1 << 40)

    def hashed(*args, **kwargs):
        raise AssertionError("the file was hashed")

    monkeypatch.setattr(planetoid, "sha256_file", hashed)
    monkeypatch.setattr(planetoid, "verify_file", hashed)
    with pytest.raises(CorruptDataError, match=r"ind\.cora\.x': 1099511627776 B, more than any Planetoid file"):
        load_dataset("cora", root=tmp_path)
