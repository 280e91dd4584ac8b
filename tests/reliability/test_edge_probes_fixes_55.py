"""Edge probes, fixes of sitting 55: the command ``manifest.json`` records for ``main(argv)`` called from Python."""

from __future__ import annotations

import json
import sys

import pytest

from diffusionformer.operators import list_operators

_OP_MODULE = '''
from diffusionformer.operators import register_operator
from diffusionformer.operators.basic import AttentionOperator


@register_operator(name="probe55p-op")
class Probe55pOp(AttentionOperator):
    pass
'''

_CONFIG = '''
name = "imp"
seeds = [0]
[[operators]]
name = "mine"
heads = "probe55p-op"
[[tasks]]
name = "t"
dataset = "digits"
model = "vit-digits"
train = {max_steps = 1, batch_size = 8, eval_interval = 0}
'''


@pytest.fixture
def probe55p_op():
    yield
    sys.modules.pop("probe55p_ops", None)
    if "probe55p-op" in list_operators():
        from diffusionformer.operators import unregister_operator

        unregister_operator("probe55p-op")


def test_bug_main_argv_is_the_command_the_manifest_records(tmp_path, monkeypatch, probe55p_op):
    """Bug: ``manifest.json`` recorded the command from ``sys.argv``, so ``main(argv)`` called from Python (a test, a
    notebook) recorded the caller's command line (pytest's), not ``argv``; ``load_run``'s "--import" hint, which reads
    the recorded command, then named nothing. ``main(argv)`` records ``python -m diffusionformer.experiments <argv>``
    (quoted for a shell: a folder with a space stays one word), and the hint names its --import."""
    from diffusionformer.experiments.cli import main
    from diffusionformer.experiments.reload import load_run
    from diffusionformer.operators import unregister_operator

    (tmp_path / "my ops").mkdir()
    (tmp_path / "my ops" / "probe55p_ops.py").write_text(_OP_MODULE)
    (tmp_path / "c.toml").write_text(_CONFIG)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["pytest", "-q", "tests"])  # the caller's own command line
    argv = ["run", "c.toml", "--out", "res", "--import", "my ops/probe55p_ops.py", "--no-progress"]
    assert main(argv) == 0
    manifest = json.loads((tmp_path / "res" / "imp" / "manifest.json").read_text())
    assert manifest["command"] == ("python -m diffusionformer.experiments run c.toml --out res "
                                   "--import 'my ops/probe55p_ops.py' --no-progress")
    rdir = tmp_path / "res" / "imp" / "runs" / "t" / "mine" / "seed0"
    unregister_operator("probe55p-op")
    with pytest.raises(ValueError, match="unknown operator 'probe55p-op'") as info:
        load_run(rdir)
    assert str(info.value).endswith(f"; the run was made with --import 'my ops/probe55p_ops.py' "
                                    f"({tmp_path / 'res' / 'imp' / 'manifest.json'}): import what registers its "
                                    "names before load_run")
