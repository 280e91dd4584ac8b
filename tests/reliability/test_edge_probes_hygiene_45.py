"""Edge probes: test-suite hygiene, i.e. process-wide state one test (or one folder's fixtures) leaves behind for the
tests run after it (``os.environ``, torch's global flags). tests/conftest.py also fails any test that leaves them
changed (``_leaves_process_state_as_found``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_bug_the_data_tests_give_the_callers_data_root_back_to_the_tests_after_them(tmp_path):
    """Bug: tests/data's autouse ``_isolated_env`` was session-scoped: the first test of tests/data deleted
    ``$DIFFUSIONFORMER_DATA`` (and pointed ``$DIFFUSIONFORMER_CACHE`` at its own folder) for the rest of the
    session, so the tests of the folders run after it found no data root: ``pytest tests/data
    tests/nn/test_edge_probes_edge_features_42.py`` with ``DIFFUSIONFORMER_DATA`` set failed the staged-MUTAG test
    (collected as runnable, then given ``root=None``), which passes alone. Now the variables are put back at the end
    of each tests/data module."""
    data_root = tmp_path / "my data root"
    after = tmp_path / "test_after_the_data_tests.py"
    after.write_text(textwrap.dedent(f"""
        import os

        def test_sees_the_callers_data_root():
            assert os.environ.get("DIFFUSIONFORMER_DATA") == {str(data_root)!r}
    """))
    env = {**os.environ, "DIFFUSIONFORMER_DATA": str(data_root), "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env.pop("PYTEST_ADDOPTS", None)
    env.pop("PYTEST_XDIST_WORKER_COUNT", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:randomly",
         "--rootdir", str(REPO), "-c", str(REPO / "pyproject.toml"),
         str(REPO / "tests" / "data" / "test_data_splits.py") + "::test_kfold_is_seeded", str(after)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "2 passed" in proc.stdout
