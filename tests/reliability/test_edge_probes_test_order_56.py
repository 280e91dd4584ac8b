"""Test-suite hygiene of sitting 56's new test files (run alone, reversed, shuffled, twice): what they left outside
their ``tmp_path``.

- ``git_commit`` (the commit a comparison's manifest records, at every ``run`` and ``publish``) ran ``git status``,
  which refreshes the checkout's index: it took ``.git/index.lock`` and rewrote ``.git/index`` of the user's
  checkout (the library's own, in the tests), where a ``git commit`` run meanwhile fails on the lock. It now reads
  the state without git's optional locks.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from diffusionformer.experiments.outputs import git_commit


def test_bug_git_commit_does_not_rewrite_the_checkouts_index(tmp_path):
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    (tmp_path / "f.txt").write_text("a\n")
    try:
        subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True, env=env)
        subprocess.run([*git, "add", "f.txt"], cwd=tmp_path, check=True, env=env)
        subprocess.run([*git, "commit", "-qm", "c"], cwd=tmp_path, check=True, env=env)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("no usable git")
    os.utime(tmp_path / "f.txt", ns=(0, 0))  # stale stat data, same content: `git status` refreshed the index
    index = tmp_path / ".git" / "index"
    before = index.read_bytes()
    commit = git_commit(tmp_path)
    assert commit is not None and not commit.endswith("+dirty")
    assert index.read_bytes() == before
