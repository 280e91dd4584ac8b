"""Review probes of the afternoon's changes (51b): ``publish``'s "run ... first" hint given a ``pathlib.Path`` config
path, and ``format_status``'s line on locks of other hosts for a run held on this host."""

from __future__ import annotations

import pytest

from diffusionformer.experiments.config import load_experiment_config
from diffusionformer.experiments.publish import publish_experiment
from diffusionformer.experiments.tables import format_status


def test_publish_hint_takes_a_path_as_config_path(tmp_path):
    """Bug: the "run ... first" hint of ``publish_experiment`` quoted ``config_path`` with ``shlex.quote``, which takes
    a str only: a ``pathlib.Path`` (what a notebook holds for a file) raised ``TypeError: expected string or
    bytes-like object`` from inside shlex instead of the FileNotFoundError that says to run the comparison first
    (before the hint repeated the flags, the path was formatted into the message as it came)."""
    cfg_path = tmp_path / "my study.toml"
    cfg_path.write_text('name = "c"\n[[tasks]]\nname = "t"\ndataset = "digits"\nmodel = "vit-digits"\n'
                        '[[operators]]\nname = "attention"\n')
    config = load_experiment_config(cfg_path)
    with pytest.raises(FileNotFoundError) as err:
        publish_experiment(config, tmp_path / "results", tmp_path / "docs", config_path=cfg_path,
                           overrides=["seeds=[0]"])
    assert f"run '{cfg_path}' --set 'seeds=[0]' --out {tmp_path / 'results'}` first" in str(err.value)


def _row(holder: str, other_host: bool = False) -> dict:
    return {"task": "t", "operator": "attention", "seed": 0, "state": "running", "step": 3, "max_steps": 10,
            "elapsed": None, "holder": holder, "other_host": other_host, "resumes_from": None, "changed": None}


def test_status_names_foreign_locks_only_for_locks_of_other_hosts():
    """Bug: ``format_status`` told a lock of another host from the holder text by the substring ``" is another host"``
    anywhere in it: a run held by a live process of this host, whose host name holds those words (a name is any text
    to the kernel), was listed among the locks of other hosts "to remove once that node no longer trains it" (a
    removed live lock trains the run twice). The note :func:`run_status` appends is ``"; <host> is another host"``
    after ``"pid <pid> on <host>"``. Since sitting 52 the row says so itself (``other_host``, set by
    :func:`run_status`): the holder text is not read at all."""
    local = format_status([_row("pid 4242 on lab; lab is another host")])
    assert "held by locks of other hosts" not in local
    foreign = format_status([_row("pid 4242 on node a; node a is another host; the run last showed a sign of life "
                                  "3 min ago", True)])
    assert "1 run(s) are held by locks of other hosts" in foreign
    assert "runs/t/attention/seed0/.lock" in foreign
    same_name = format_status([_row("pid 7 on n1; n1 is another host (another machine of this host's name)", True)])
    assert "1 run(s) are held by locks of other hosts" in same_name
