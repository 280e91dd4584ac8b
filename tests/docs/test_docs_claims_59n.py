"""The docs of the day's changes (59n), held against the code: each test names the page or docstring and the claim.

- ``tutorials/experiments.rst``: a lock this process left in place (its release failed) is taken back by a later
  call of ``run_experiment`` in the process; a bad ``WORLD_SIZE`` or ``RANK`` is refused before anything is written.
- ``operators.differential.lambda_init_schedule``: while compiling, the power form, equal up to rounding.
- ``experiments.compare._format_p``: a p next to 0.05 keeps its side of 0.05 and of ``alpha``.
- ``data.planetoid.load_planetoid``: a file over 1 GiB is refused before it is hashed; one rewritten between its
  hash and its read is a ``CorruptDataError``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from unittest import mock

import pytest

from diffusionformer.data import CorruptDataError
from diffusionformer.data import planetoid
from diffusionformer.experiments import compare, runner
from diffusionformer.experiments.results import run_dir
from diffusionformer.experiments.store import LOCK_NAME
from diffusionformer.operators.differential import lambda_init_schedule

DOCS = Path(__file__).resolve().parents[2] / "docs"
DATA = Path(os.environ.get("DIFFUSIONFORMER_DATA", "/nonexistent"))


def _tiny_configs():
    """``tests/experiments/experiments_tiny_configs.py`` (by path: not on ``sys.path`` here)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "experiments" / "experiments_tiny_configs.py"
    spec = importlib.util.spec_from_file_location("_tiny_configs_59n", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------------------- tutorials/experiments.rst: locks
def test_experiments_tutorial_a_later_call_takes_back_a_lock_its_process_left_in_place(tmp_path, monkeypatch):
    page = " ".join((DOCS / "tutorials" / "experiments.rst").read_text().split())
    assert "a later call in the process (a notebook) takes it back (with ``resume=False``, saying so)" in page
    doc = " ".join(runner.run_experiment.__doc__.split())
    assert "another live process, or another call of this one (a thread), is training" in doc
    tiny = _tiny_configs()
    config = tiny.tiny_digits_config()
    lock = tiny.leave_own_lock_in_place(monkeypatch, config, tmp_path, match="as a later call in this process does")
    assert lock == run_dir(tmp_path / "tiny", "digits", "attention", 0) / LOCK_NAME
    assert json.loads(lock.read_text())["pid"] == os.getpid()
    # resume=True (the default): taken back as this process's own, the run trained, not skipped as held
    results = runner.run_experiment(config, tmp_path, progress=False, log=lambda m: None)
    assert [r.status for r in results] == ["completed"] * len(results) and len(results) == len(config.operators)
    assert not lock.exists()


@pytest.mark.parametrize("env", [{"WORLD_SIZE": "1", "RANK": "1"}, {"WORLD_SIZE": "2", "RANK": "2"},
                                 {"WORLD_SIZE": "two", "RANK": "0"}, {"WORLD_SIZE": "0", "RANK": "0"}])
def test_experiments_tutorial_a_bad_world_size_or_rank_is_refused_before_anything_is_written(env, tmp_path):
    page = " ".join((DOCS / "tutorials" / "experiments.rst").read_text().split())
    assert "beside ``WORLD_SIZE=1`` too), is refused before anything is written" in page
    assert "below 1, or a ``RANK`` outside ``[0, WORLD_SIZE)``" in " ".join(runner.run_experiment.__doc__.split())
    with mock.patch.dict(os.environ, env):
        os.environ.pop("LOCAL_RANK", None)
        with pytest.raises(ValueError, match="WORLD_SIZE"):
            runner.run_experiment(_tiny_configs().tiny_digits_config(), tmp_path, progress=False, log=lambda m: None)
    assert not (tmp_path / "tiny").exists()


# ---------------------------------------------------------------------------- lambda_init_schedule under compile
def test_lambda_init_schedule_while_compiling_is_the_power_equal_up_to_rounding():
    assert "While :func:`torch.compile` traces" in lambda_init_schedule.__doc__
    eager = [lambda_init_schedule(depth) for depth in range(64)]
    with mock.patch("torch.compiler.is_compiling", return_value=True):
        traced = [lambda_init_schedule(depth) for depth in range(64)]
    assert all(abs(a - b) <= 4e-16 for a, b in zip(eager, traced))
    assert traced[0] == 0.8 - 0.6 and abs(traced[11] - 0.7779) < 1e-4


# ---------------------------------------------------------------------------- _format_p next to 0.05
@pytest.mark.parametrize("p, alpha", [(0.04969, 0.0497), (0.04971, 0.0497), (0.05031, 0.0503), (0.05029, 0.0503),
                                      (0.049996, 0.05), (0.0504999, 0.0505)])
def test_format_p_next_to_five_percent_keeps_its_side_of_both_bounds(p, alpha):
    assert "on its side of both 0.05 and ``alpha``" in " ".join(compare._format_p.__doc__.split())
    shown = float(compare._format_p(p, alpha))
    assert (shown < alpha) == (p < alpha) and (shown < 0.05) == (p < 0.05)
    assert len(compare._format_p(p, alpha).split(".")[1]) >= 4  # four decimals at least, as format_p says


# ---------------------------------------------------------------------------- load_planetoid's Raises
def _stage_cora(root: Path) -> Path:
    raw = root / "planetoid" / "Cora" / "raw"
    raw.mkdir(parents=True)
    for part in planetoid.PLANETOID_FILES:
        src = DATA / "planetoid" / "Cora" / "raw" / f"ind.cora.{part}"
        if not src.is_file():
            pytest.skip("the staged Cora files are not here ($DIFFUSIONFORMER_DATA)")
        shutil.copyfile(src, raw / src.name)
    return raw


def test_load_planetoid_refuses_a_file_over_one_gib_before_hashing_it(tmp_path):
    doc = " ".join(planetoid.load_planetoid.__doc__.split())
    assert "a file over 1 GiB (refused before it is hashed or read)" in doc
    assert planetoid._MAX_FILE_BYTES == 2**30
    raw = tmp_path / "planetoid" / "Cora" / "raw"
    raw.mkdir(parents=True)
    for part in planetoid.PLANETOID_FILES:
        (raw / f"ind.cora.{part}").write_bytes(b"x")
    with open(raw / "ind.cora.graph", "r+b") as f:
        f.truncate(2**30 + 1)  # sparse: no disk space
    with mock.patch.object(planetoid, "sha256_file", side_effect=AssertionError("hashed")), \
            mock.patch.object(planetoid, "verify_file", side_effect=AssertionError("verified")):
        for verify in (True, False):
            with pytest.raises(CorruptDataError, match=r"ind\.cora\.graph.*1073741825 B"):
                planetoid.load_planetoid("Cora", root=tmp_path, verify=verify)


def test_load_planetoid_refuses_a_file_rewritten_between_its_hash_and_its_read(tmp_path):
    raw = _stage_cora(tmp_path)
    read = planetoid.read_planetoid

    def read_then_rewrite(folder, prefix):
        data = read(folder, prefix)
        (raw / "ind.cora.y").write_bytes((raw / "ind.cora.y").read_bytes() + b"\0")  # after the read
        return data

    with mock.patch.object(planetoid, "read_planetoid", read_then_rewrite):
        with pytest.raises(CorruptDataError, match=r"ind\.cora\.y"):
            planetoid.load_planetoid("Cora", root=tmp_path, verify=True)
        page = " ".join((DOCS / "design.md").read_text().split())
        assert "(an IDX, text or Planetoid file is hashed with `verify` only, a zip always)" in page
        (raw / "ind.cora.y").write_bytes((raw / "ind.cora.y").read_bytes()[:-1])
        assert planetoid.load_planetoid("Cora", root=tmp_path, verify=False).name == "cora"  # not hashed: not checked
