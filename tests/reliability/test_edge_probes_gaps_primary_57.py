"""The gap study's primary quantities follow the config's ``primary_quantities`` unless ``--primary`` names them."""

from __future__ import annotations

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.gaps import main, primary_table
from diffusionformer.experiments.runner import run_dir
from experiments_tiny_configs import GAP_CURVES, write_gap_run

CURVES = GAP_CURVES


def _study(root, task_lines="", top_lines="", seeds=(0, 1, 2)):
    """A finished two-setting text study under ``root/g`` and its config file; ``*_lines``: extra TOML."""
    cfg = root / "g.toml"
    cfg.write_text(f'name = "g"\nseeds = {list(seeds)}\nprimary = ["lap"]\n{top_lines}[[tasks]]\nname = "t"\n'
                   f'dataset = "pydoc-chars"\nmodel = "gpt-char-tiny"\nmetric = "val_loss"\n{task_lines}'
                   '[[operators]]\nname = "attention"\n[[operators]]\nname = "lap"\nlaplacian_heads = 1\n')
    for (op, seed), curve in CURVES.items():
        if seed not in seeds:
            continue
        write_gap_run(run_dir(root / "g", "t", op, seed), [(100 * (i + 1), t, v) for i, (t, v) in enumerate(curve)])
    return cfg


def _primary_header(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("### Primary contrasts"))


def test_gaps_default_primary_is_the_configs_selected_quantity(tmp_path, capsys):
    # gpu_text.toml: primary_quantities = ["selected"] with select_by = "val_loss": the best val loss, not the final
    cfg = _study(tmp_path, 'select_by = "val_loss"\n', 'primary_quantities = ["selected"]\n')
    assert main([str(cfg), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr()
    assert _primary_header(out.out) == "### Primary contrasts: best val loss"
    assert "final val loss" not in out.out.split("### Primary contrasts")[1]
    assert "adjusted over the 1 primary cells" in out.out
    assert out.err == ""  # val_loss selected by val_loss is the best val loss itself: nothing to note


def test_primary_table_default_follows_the_config(tmp_path):
    cfg = _study(tmp_path, 'select_by = "val_loss"\n', 'primary_quantities = ["final", "selected"]\n')
    config = load_experiment_config(str(cfg))
    assert _primary_header(primary_table(config, tmp_path)) == "### Primary contrasts: final val loss, best val loss"
    # the config's default (every quantity) on a task without select_by: the final value only, as compare tests it
    (tmp_path / "plain").mkdir()
    plain = load_experiment_config(str(_study(tmp_path / "plain")))
    assert _primary_header(primary_table(plain, tmp_path / "plain")) == "### Primary contrasts: final val loss"
    # passing the quantities still works, positionally too
    assert _primary_header(primary_table(config, tmp_path, ("final_gap",))) == "### Primary contrasts: final gap"


def test_explicit_primary_wins_over_the_config(tmp_path, capsys):
    cfg = _study(tmp_path, 'select_by = "val_loss"\n', 'primary_quantities = ["selected"]\n')
    assert main([str(cfg), "--out", str(tmp_path), "--primary", "final_val,final_gap"]) == 0
    out = capsys.readouterr()
    assert _primary_header(out.out) == "### Primary contrasts: final val loss, final gap"
    assert out.err == ""


def test_reach_only_config_falls_back_to_the_final_val_loss_with_a_note(tmp_path, capsys):
    cfg = _study(tmp_path, "reach = { val_loss = 2.45 }\n", 'primary_quantities = ["reach"]\n')
    assert main([str(cfg), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr()
    assert _primary_header(out.out) == "### Primary contrasts: final val loss"
    assert "note:" in out.err and "reach" in out.err and "final_val" in out.err and "--primary" in out.err


def test_a_selected_metric_other_than_the_val_loss_is_noted_not_passed_off(tmp_path, capsys):
    # the config's selected quantity is the gap loss at the best val loss: the table's best val loss is another one
    cfg = _study(tmp_path, 'select_by = "val_loss"\n', 'primary_quantities = ["selected"]\n')
    cfg.write_text(cfg.read_text().replace('metric = "val_loss"', 'metric = "gap_loss"'))
    assert main([str(cfg), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr()
    assert _primary_header(out.out) == "### Primary contrasts: best val loss"
    assert "gap_loss" in out.err and "not the same quantity" in out.err


def test_no_note_without_primary_contrasts(tmp_path, capsys):
    # a reach-only config without primary contrasts has no primary table: nothing falls back, nothing to note
    cfg = _study(tmp_path, "reach = { val_loss = 2.45 }\n", 'primary_quantities = ["reach"]\n')
    cfg.write_text(cfg.read_text().replace('primary = ["lap"]\n', ""))
    assert main([str(cfg), "--out", str(tmp_path), "--page", str(tmp_path / "p.md")]) == 0
    out = capsys.readouterr()
    assert out.err == "" and "Primary contrasts" not in (tmp_path / "p.md").read_text()


def test_the_fallback_note_gives_the_reason_of_a_selected_quantity_without_select_by():
    """Bug (sitting 57): primary_quantities = ["selected", "reach"] on a primary task with reach and no select_by fell
    back to final_val with a note naming reach alone as having no gap quantity; selected had none either."""
    from diffusionformer.experiments.config import ExperimentConfig, OperatorSetting, TaskConfig
    from diffusionformer.experiments.gaps import _config_quantities

    ops = [OperatorSetting("attention"), OperatorSetting("lap", laplacian_heads=1)]
    cfg = ExperimentConfig("x", [TaskConfig("t", "digits", "vit-digits", reach={"val_loss": 0.5})], ops,
                           seeds=[0, 1], primary=["lap"], primary_quantities=["selected", "reach"])
    quantities, notes = _config_quantities(cfg)
    assert quantities == () and len(notes) == 1
    assert "(reach is steps to a threshold; selected needs a primary task with select_by)" in notes[0]
