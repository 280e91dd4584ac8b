"""Edge probes of the GPU study's machinery (issue 16), simulated on CPU: worker locks, threads, staging."""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from diffusionformer.experiments import store

_LINUX_PROC = Path("/proc/self/stat").exists()


def _state(pid: int) -> bytes:
    text = Path(f"/proc/{pid}/stat").read_bytes()
    return text[text.rindex(b")") + 1:].split()[0]


@pytest.mark.skipif(not _LINUX_PROC, reason="needs /proc (a zombie's state is read from it)")
def test_bug_a_killed_worker_not_yet_reaped_holds_no_run(tmp_path):
    """Bug: a worker killed while ``run --workers`` waited for an earlier worker stayed a zombie (exited, not
    reaped): it still answers signal 0 and keeps its start time, so its run's lock read as held, and every other
    worker skipped that run (``status`` showed it running) until all workers had ended."""
    child = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "up"
        rdir = tmp_path / "run"
        rdir.mkdir()
        start = store._start_time(child.pid)
        assert start is not None
        # the lock the worker wrote when it claimed the run (as acquire_lock writes it)
        (rdir / store.LOCK_NAME).write_text(json.dumps({"pid": child.pid, "host": platform.node(), "start": start}))
        assert store.live_holder(rdir) == (child.pid, platform.node())  # alive: held
        os.kill(child.pid, signal.SIGKILL)
        for _ in range(5000):  # until the kernel has made it a zombie (not reaped: no wait() yet)
            if _state(child.pid) == b"Z":
                break
            time.sleep(0.002)
        assert _state(child.pid) == b"Z"
        assert store.live_holder(rdir) is None
        assert store.acquire_lock(rdir) is None  # taken over by this process
        assert store.read_lock(rdir) == (os.getpid(), platform.node())
        store.release_lock(rdir)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
        child.stdout.close()


@pytest.mark.parametrize("kwargs, env, named", [
    ({}, {"OMP_NUM_THREADS": "3000000000"}, r"\$OMP_NUM_THREADS: expected a positive int of at most 2147483647"),
    ({}, {"OMP_NUM_THREADS": "99999999999999999999,2"}, r"\$OMP_NUM_THREADS='99999999999999999999,2' \(its first"),
    ({"threads": 2**31}, {}, r"--threads: expected a positive int of at most 2147483647 .*got 2147483648"),
])
def test_bug_a_thread_count_beyond_a_c_int_is_named(kwargs, env, named):
    """Bug: ``$OMP_NUM_THREADS`` (or ``--threads``) of 2**31 or more passed the plan and failed in
    ``torch.set_num_threads`` with ``Overflow when unpacking long``, which named neither the variable nor the value."""
    import torch

    from diffusionformer.experiments.threads import apply_threads, plan_threads

    before = torch.get_num_threads()
    try:
        with pytest.raises(ValueError, match=named):
            apply_threads(plan_threads(cores=2, environ=env, **kwargs))
    finally:
        torch.set_num_threads(before)


def test_thread_counts_from_bad_environment_values_are_named():
    """Not a bug: zero, negative, non-integer and empty-list counts are refused naming their variable; blank is
    unset; the largest C int still plans."""
    from diffusionformer.experiments.threads import WORKERS_ENV, plan_threads

    for env, named in [({"OMP_NUM_THREADS": "0"}, r"\$OMP_NUM_THREADS: .*got 0"),
                       ({"OMP_NUM_THREADS": "2.5"}, r"\$OMP_NUM_THREADS: .*got '2.5'"),
                       ({"OMP_NUM_THREADS": ","}, r"\$OMP_NUM_THREADS=','"),
                       ({WORKERS_ENV: "x"}, r"\$DIFFUSIONFORMER_WORKERS: .*got 'x'"),
                       ({"LOCAL_WORLD_SIZE": "-2"}, r"\$LOCAL_WORLD_SIZE: .*got -2")]:
        with pytest.raises(ValueError, match=named):
            plan_threads(cores=4, environ=env)
    assert plan_threads(cores=4, environ={"OMP_NUM_THREADS": " ", WORKERS_ENV: " "}).threads == 4
    assert plan_threads(cores=4, environ={"OMP_NUM_THREADS": str(2**31 - 1)}).threads == 2**31 - 1


_REPO = Path(__file__).resolve().parents[2]


def _stage(tmp_path: Path, src: Path, what: str = "text") -> subprocess.CompletedProcess:
    """``gpu_study.sh stage`` run from a copy of the script in a fresh git checkout (its git-ignore line goes there)."""
    repo = tmp_path / "repo"
    if not repo.exists():
        (repo / "experiments" / "scripts").mkdir(parents=True)
        (repo / "experiments" / "scripts" / "gpu_study.sh").write_bytes(
            (_REPO / "experiments" / "scripts" / "gpu_study.sh").read_bytes())
        subprocess.run(["git", "init", "-q", str(repo)], check=True, capture_output=True)
    env = {k: v for k, v in os.environ.items() if k not in ("DIFFUSIONFORMER_DATA", "DATA")}
    return subprocess.run(["bash", str(repo / "experiments" / "scripts" / "gpu_study.sh"), "stage", what],
                          env={**env, "SRC": str(src)}, capture_output=True, text=True, timeout=60)


_needs_tools = pytest.mark.skipif(any(__import__("shutil").which(t) is None for t in ("bash", "tar", "xz", "git")),
                                  reason="needs bash, tar, xz and git")


@_needs_tools
@pytest.mark.parametrize("linked", ["folder", "file"])
def test_bug_stage_packs_the_files_a_linked_data_root_points_to(tmp_path, linked):
    """Bug: ``gpu_study.sh stage text`` with a data root whose ``tinyshakespeare`` folder (or its ``input.txt``)
    is a symbolic link packed the link itself, a 200-byte archive, and reported success: on the GPU machine the
    link dangles and the call fails after its setup. The files the links point to are packed now."""
    import tarfile

    store_dir = tmp_path / "store" / "tinyshakespeare"
    store_dir.mkdir(parents=True)
    (store_dir / "input.txt").write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 50)
    root = tmp_path / "root"
    root.mkdir()
    if linked == "folder":
        (root / "tinyshakespeare").symlink_to(store_dir, target_is_directory=True)
    else:
        (root / "tinyshakespeare").mkdir()
        (root / "tinyshakespeare" / "input.txt").symlink_to(store_dir / "input.txt")
    done = _stage(tmp_path, root)
    assert done.returncode == 0, done.stderr
    archive = tmp_path / "repo" / ".gpudata" / "tinyshakespeare.tar.xz"
    with tarfile.open(archive) as tar:
        member = tar.getmember("tinyshakespeare/input.txt")
        assert member.isfile() and not member.issym()
        assert tar.extractfile(member).read() == (store_dir / "input.txt").read_bytes()


@_needs_tools
def test_stage_is_idempotent_and_refuses_a_wrong_data_root(tmp_path):
    """Not a bug: staging twice gives the same archive and one git-ignore line; a data root that is absent, or
    lacks the folder, is refused naming it, with nothing packed."""
    root = tmp_path / "root"
    (root / "tinyshakespeare").mkdir(parents=True)
    (root / "tinyshakespeare" / "input.txt").write_text("ab\n" * 100)
    for bad, named in [(tmp_path / "absent", "data root '%s' not found"), (tmp_path, "'%s/tinyshakespeare' not found")]:
        done = _stage(tmp_path, bad)
        assert done.returncode == 2 and named % bad in done.stderr
        assert not list((tmp_path / "repo").glob(".gpudata/*"))
    archive = tmp_path / "repo" / ".gpudata" / "tinyshakespeare.tar.xz"
    first = [_stage(tmp_path, root).returncode, archive.read_bytes()]
    second = [_stage(tmp_path, root).returncode, archive.read_bytes()]
    assert first == second and first[0] == 0
    exclude = (tmp_path / "repo" / ".git" / "info" / "exclude").read_text().splitlines()
    assert exclude.count("/.gpudata/") == 1
    assert sorted(p.name for p in archive.parent.iterdir()) == ["tinyshakespeare.tar.xz"]  # no .part left
