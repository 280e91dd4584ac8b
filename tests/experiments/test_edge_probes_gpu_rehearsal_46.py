"""Probe 46: rehearsal on CPU of the GPU sitting's ``experiments/scripts/gpu_study.sh`` (issue 16) under the GPU
image's versions (torch 2.11, triton 3.6, PyG 2.8): ``stage text|vision``, then ``run`` with ``ALLOW_CPU=1``.
"""

from __future__ import annotations

import io
import os
import shutil
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "experiments" / "scripts" / "gpu_study.sh"

# a stand-in python: the CUDA check passes, the comparison's name comes from the real config loader, and ``run``
# records where it reads its data (``--data-root``) and what it finds there
_FAKE_PY = """#!/usr/bin/env bash
if [ "$1" = "-m" ] && [ "$3" = "run" ]; then
  while [ $# -gt 0 ]; do [ "$1" = "--data-root" ] && root="$2"; [ "$1" = "--out" ] && out="$2"; shift; done
  echo "data root $root"
  cat "$root/tiny/input.txt"
  mkdir -p "$out/probe"
  exit 0
fi
[ "$1" = "-m" ] && [ "$3" = "status" ] && { echo "${FAKE_STATUS:-status}"; exit 0; }
[ "$1" = "-" ] && { cat > /dev/null; sleep "${FAKE_SETUP_SLEEP:-0}"; exit 0; }
exec "%s" "$@"
"""


def _probe_files(tmp_path: Path) -> tuple[Path, Path]:
    """A one-run comparison's config and the stand-in python (``_FAKE_PY``), written into ``tmp_path``."""
    config = tmp_path / "c.toml"
    config.write_text('name = "probe"\nseeds = [0]\n[[tasks]]\nname = "t"\ndataset = "digits"\n'
                      'model = "vit-digits"\n[[operators]]\nname = "a"\nheads = "attention:4"\n')
    fake = tmp_path / "py"
    fake.write_text(_FAKE_PY % sys.executable)
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return config, fake


def _tar_xz(path: Path, folder: str, name: str, text: str) -> None:
    with tarfile.open(path, "w:xz") as tar:
        data = text.encode()
        info = tarfile.TarInfo(f"{folder}/{name}")
        info.size = len(data)
        info.mode = 0o444
        tar.addfile(info, io.BytesIO(data))


@pytest.mark.slow  # two calls of the script, each reading the config in a fresh python
@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("tar") is None or shutil.which("xz") is None,
                    reason="needs bash, tar and xz")
def test_bug_run_leaves_the_carried_data_folder_as_staged(tmp_path):
    """Bug: ``gpu_study.sh run`` unpacked ``.gpudata/*.tar.xz`` into ``.gpudata/`` itself, the folder the GPU call
    carries (at most 64 MiB in all): after the documented CPU dry run (``ALLOW_CPU=1``) of the vision config,
    ``.gpudata`` held the 19 MB archive and the 62 MB unpacked ``cifar10_jpg`` (80 MB), too big to carry to the GPU
    call. Every call also unpacked every archive again (9 s for CIFAR-10), into read-only folders left by the last
    unpacking. The archives are now unpacked outside the data folder (``UNPACKED``, default /tmp/df-data), once per
    archive version, and plain folders placed in the data folder are still read."""
    config, fake = _probe_files(tmp_path)
    data = tmp_path / "data"
    data.mkdir()
    _tar_xz(data / "tiny.tar.xz", "tiny", "input.txt", "staged text")
    unpacked = tmp_path / "unpacked"

    def call():
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("FAKE_")}, "PY": str(fake), "ALLOW_CPU": "1", "OUT": str(tmp_path / "out"),
               "RESULTS": str(tmp_path / "res"), "DATA": str(data), "UNPACKED": str(unpacked), "BUDGET": "60",
               "DIFFUSIONFORMER_CACHE": str(tmp_path / "cache")}
        return subprocess.run(["bash", str(SCRIPT), "run", str(config), "1"], env=env, capture_output=True,
                              text=True, timeout=300)

    first = call()
    assert first.returncode == 0, first.stdout + first.stderr
    assert sorted(p.name for p in data.iterdir()) == ["tiny.tar.xz"]  # what is carried is what was staged
    log = (tmp_path / "out" / "run.log").read_text()
    assert "staged text" in log, log
    assert f"unpacking {data}/tiny.tar.xz" in first.stdout

    second = call()  # the same data again: nothing to unpack
    assert second.returncode == 0, second.stdout + second.stderr
    assert "unpacking" not in second.stdout
    assert "staged text" in (tmp_path / "out" / "run.log").read_text()

    # a newer archive is unpacked again; a plain folder in the data folder is read where it is
    _tar_xz(data / "tiny.tar.xz", "tiny", "input.txt", "restaged text")
    os.utime(data / "tiny.tar.xz", (1e10, 1e10))
    (data / "other").mkdir()
    third = call()
    assert third.returncode == 0, third.stdout + third.stderr
    assert "restaged text" in (tmp_path / "out" / "run.log").read_text()
    assert (unpacked / "other").resolve() == (data / "other").resolve()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("steps, said", [("tests,issue15", ["tests"]), ("grid,host", ["grid"]),
                                         ("host,memory", [])])
def test_bug_smoke_run_names_the_steps_it_does_not_run(tmp_path, steps, said):
    """Bug: ``GPU_SUITE_STEPS=tests,issue15 bash benchmarks/gpu_suite.sh --smoke --issue15`` (the CPU try of the
    first GPU call, as the script's header asks) ran the issue-15 script and said nothing about the named ``tests``
    step (nor ``grid``), which a smoke run never runs: the output read as if every named step had been tried."""
    stub = tmp_path / "py"
    stub.write_text('#!/usr/bin/env bash\necho "ran $*"\n')
    stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPU_SUITE_", "BENCH_ISSUE15_ARGS"))}
    env.update(PYTHON=str(stub), GPU_SUITE_STEPS=steps)
    res = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_suite.sh"), "--smoke", "--issue15",
                          str(tmp_path / "out")], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    for step in ("tests", "grid"):
        assert (f"step {step} is not run in a smoke run" in res.stdout) == (step in said), res.stdout


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("tar") is None, reason="needs bash and tar")
def test_bug_budget_counts_the_setup_and_status_says_cut_runs_restart(tmp_path):
    """Bug: ``gpu_study.sh run`` gave the training the whole ``BUDGET`` after its setup (CUDA check, unpacking,
    the config read), so setup + 540 s + 30 s of grace + packing could pass the device call's 600 s limit; and its
    ``status.md`` said an interrupted run "resumes from step N" where the packed archive (no ``checkpoint.pt``)
    makes the next call start it again from step 0. The budget now counts from the script's start, and the status
    says so."""
    config, fake = _probe_files(tmp_path)
    data = tmp_path / "data"
    (data / "tiny").mkdir(parents=True)
    (data / "tiny" / "input.txt").write_text("text")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("FAKE_")}, "PY": str(fake), "ALLOW_CPU": "1",
           "OUT": str(tmp_path / "out"), "RESULTS": str(tmp_path / "res"), "DATA": str(data),
           "UNPACKED": str(tmp_path / "unpacked"), "BUDGET": "30", "DIFFUSIONFORMER_CACHE": str(tmp_path / "cache"),
           "FAKE_SETUP_SLEEP": "3", "FAKE_STATUS": "probe: 0/1 completed\n| t | a | 0 | interrupted (resumes from step 5) |"}
    res = subprocess.run(["bash", str(SCRIPT), "run", str(config), "1"], env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    line = next(x for x in res.stdout.splitlines() if x.startswith("setup: "))
    left = int(line.split("for at most ")[1].split()[0])
    assert left <= 27, line  # 30 s less the 3 s the setup took
    status = (tmp_path / "out" / "status.md").read_text()
    assert status.rstrip().endswith("start again from step 0 in the next call."), status
    env.update(FAKE_STATUS="probe: 1/1 completed", FAKE_SETUP_SLEEP="0")
    res = subprocess.run(["bash", str(SCRIPT), "run", str(config), "1"], env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "step 0" not in (tmp_path / "out" / "status.md").read_text()


@pytest.mark.skipif(shutil.which("git") is None or not (REPO / ".git").exists(), reason="needs a git checkout")
def test_bug_the_default_output_folder_of_a_dry_run_is_not_carried():
    """Bug: ``gpu_study.sh run`` writes to ``./gpu-out`` by default; after a CPU dry run that folder (results
    archives, logs) stayed in the working tree as untracked files, which the device tool carries to the next GPU
    call (untracked files git does not ignore travel with the checkout). It is git-ignored now."""
    done = subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q", "gpu-out/results-probe.tar.gz"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("tar") is None, reason="needs bash and tar")
def test_bug_a_dangling_link_of_another_checkout_is_replaced(tmp_path):
    """Bug: a data folder placed in ``DATA`` is linked into ``UNPACKED``; a link left there by another checkout's dry
    run whose folder was since deleted (dangling) read as missing to ``[ -e ]``, and ``ln`` then stopped the script
    ("File exists" under ``set -e``). The link is now replaced, pointing at this checkout's folder."""
    config, fake = _probe_files(tmp_path)
    data = tmp_path / "data"
    (data / "tiny").mkdir(parents=True)
    (data / "tiny" / "input.txt").write_text("this checkout's text")
    unpacked = tmp_path / "unpacked"
    unpacked.mkdir()
    (unpacked / "tiny").symlink_to(tmp_path / "gone" / "tiny")  # dangling
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("FAKE_")}, "PY": str(fake), "ALLOW_CPU": "1",
           "OUT": str(tmp_path / "out"), "RESULTS": str(tmp_path / "res"), "DATA": str(data),
           "UNPACKED": str(unpacked), "BUDGET": "60", "DIFFUSIONFORMER_CACHE": str(tmp_path / "cache")}
    res = subprocess.run(["bash", str(SCRIPT), "run", str(config), "1"], env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "this checkout's text" in (tmp_path / "out" / "run.log").read_text()
    assert (unpacked / "tiny").resolve() == (data / "tiny").resolve()
