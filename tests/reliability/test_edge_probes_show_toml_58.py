"""Sitting 58: ``show`` prints a task's dataset_options and model_overrides as TOML, pasteable into ``--set``."""
from __future__ import annotations

import re


def test_show_prints_tables_a_set_takes_back(tmp_path, capsys):
    """``show`` printed ``{'val_fraction': 0.2, 'name': 'x y'}`` (a Python dict): pasted into ``--set
    tasks.mutag.dataset_options=...`` it is a TOML error. The printed table is now TOML, and a --set of it gives the
    same ``show``."""
    from diffusionformer.experiments.cli import main

    path = tmp_path / "cv.toml"
    path.write_text('name = "cvshow"\nseeds = [0, 1]\n[[tasks]]\nname = "mutag"\ndataset = "mutag"\n'
                    'model = "graph-graph-small"\nfolds = 2\ndataset_options = { val_fraction = 0.2 }\n'
                    'model_overrides = { dim = 16 }\n'
                    '[tasks.train]\nmax_steps = 2\n[[operators]]\nname = "attention"\n'
                    'model_overrides = { dim = 8 }\n', encoding="utf-8")
    assert main(["show", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    line = next(x for x in out if x.startswith("  task mutag:"))
    data = re.search(r"mutag (\{.*?\}) \(2-fold CV\)", line).group(1)
    model = re.search(r"model_overrides (\{.*\})$", line).group(1)
    train = re.search(r"train (\{.*?\}), model_overrides", line).group(1)
    assert train == "{max_steps = 2}", line
    op = re.search(r"model_overrides=(\{.*\})$", out[-1]).group(1)
    assert (data, model, op) == ("{val_fraction = 0.2}", "{dim = 16}", "{dim = 8}"), (line, out[-1])
    plain = tmp_path / "plain.toml"
    plain.write_text(path.read_text(encoding="utf-8").replace("dataset_options = { val_fraction = 0.2 }\n", "")
                     .replace("model_overrides = { dim = 16 }\n", ""), encoding="utf-8")
    assert main(["show", str(plain), "--set", f"tasks.mutag.dataset_options={data}",
                 "--set", f"tasks.mutag.model_overrides={model}"]) == 0
    assert capsys.readouterr().out.splitlines() == out
