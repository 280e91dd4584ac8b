"""The docs of the day's changes (60o), held against the code: each test names the page or docstring and the claim.

- ``tutorials/experiments.rst``, ``runner``, ``reload`` and the README: a run folder holds ``preprocessing.json``,
  which ``load_run`` gives as ``run.preprocessing`` (``None`` for an older folder, and, with a warning, for an
  unreadable one); an entry the data did not record is ``None``.
- ``design.md``, ``tutorials/experiments.rst``, ``outputs.manifest`` and ``load_run``'s Raises: the manifest's
  ``imports`` (every invocation's, in the order first seen) and its ``command`` as a shell runs it.
- ``design.md``: ``rope_base`` stays out of a run's identity at the model's own default only.
- ``tutorials/experiments.rst`` and ``tutorials/modern_parts.rst``: the trainer lets ``loggers`` change on resume,
  and ``metrics.csv`` is then written again from ``metrics.jsonl``.
- ``LayerRecorder``: its hooks (every block, the module holding ``blocks``), a block shared across depth recorded
  at each position, and ``attentions=True`` on another attention a ``TypeError`` naming it.
- ``api/diffusionformer.rst`` and ``tutorials/modern_parts.rst``: ``DiffusionViT.set_input_size``.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from diffusionformer.experiments import LoadedRun, load_run, outputs, reload, runner
from diffusionformer.experiments.results import _new_model_fields, _normalized_identity, run_dir

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _words(text: str) -> str:
    return " ".join(text.split())


def _page(*parts: str) -> str:
    return _words((DOCS.joinpath(*parts)).read_text(encoding="utf-8"))


def _tiny_config():
    """The tiny digits comparison of ``tests/experiments/experiments_tiny_configs.py`` (by path), one setting."""
    import importlib.util
    import tomllib

    from diffusionformer.experiments import load_experiment_config

    path = ROOT / "tests" / "experiments" / "experiments_tiny_configs.py"
    spec = importlib.util.spec_from_file_location("_tiny_configs_60o", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = load_experiment_config(tomllib.loads(module.TINY_DIGITS_TOML))
    return dataclasses.replace(config, operators=config.operators[:1])


# ---------------------------------------------------------------------------- preprocessing.json, run.preprocessing
def test_a_run_folder_holds_the_files_the_docs_list_and_load_run_gives_its_preprocessing(tmp_path):
    page = _page("tutorials", "experiments.rst")
    listed = "runs/<task>/<operator>/seed<k>/{metrics.jsonl, summary.json, checkpoint.pt, run_config.json, " \
             "preprocessing.json}"
    assert listed in page and listed in _words(runner.__doc__)
    assert "images: the pixel ``scale`` and the training split's per-channel ``mean``/``std``" in page
    assert "``None`` for a run folder written before this file existed" in page
    assert "``preprocessing.json`` how the run's inputs were prepared" in _words(reload.__doc__)
    assert ("`preprocessing.json`, written beside it, records how the run's inputs were prepared (`run.preprocessing`: "
            "pixel scale and training statistics, or the vocabulary; `None` for a run folder written before it, "
            "nothing guessed). `load_run` refuses a checkpoint") in _page("design.md")
    readme = _words((ROOT / "README.md").read_text(encoding="utf-8"))
    assert "`run.preprocessing` says how its inputs were prepared" in readme
    config = _tiny_config()
    runner.run_experiment(config, tmp_path, progress=False, log=lambda m: None)
    rdir = run_dir(tmp_path / config.name, "digits", config.operators[0].name, 0)
    names = {"metrics.jsonl", "summary.json", "checkpoint.pt", "run_config.json", "preprocessing.json"}
    assert {p.name for p in rdir.iterdir()} == names
    recorded = json.loads((rdir / "preprocessing.json").read_text())
    assert recorded["kind"] == "image" and recorded["scale"] == 16.0  # digits: pixels 0..16
    assert len(recorded["mean"]) == len(recorded["std"]) == 1
    assert load_run(rdir).preprocessing == recorded

    doc = _words(LoadedRun.__doc__)
    assert "or whose ``preprocessing.json`` is unreadable (a warning names it)" in doc
    (rdir / "preprocessing.json").write_text('{"kind": "ima')  # truncated
    with pytest.warns(UserWarning, match=r"preprocessing\.json is unreadable"):
        assert load_run(rdir).preprocessing is None
    (rdir / "preprocessing.json").unlink()  # a folder of an older version: None, and no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_run(rdir).preprocessing is None


def test_an_entry_the_data_did_not_record_is_none_as_loaded_run_says():
    from diffusionformer.data import ClassificationData
    from diffusionformer.data.images import build_image_data

    doc = _words(LoadedRun.__doc__)
    assert ("an entry the data did not record is ``None``: ``mean``/``std`` with ``normalize=False``, or of a loader "
            "of one's own that left them unset, ``scale`` where the data's ``meta`` has no ``\"scale\"``") in doc
    x, y = torch.rand(12, 1, 4, 4), torch.arange(12) % 2
    own = ClassificationData("own", "image", x[:8], y[:8], x[8:10], y[8:10], x[10:], y[10:], num_classes=2,
                             input_shape=(1, 4, 4))
    assert reload._data_preprocessing(own) == {"kind": "image", "scale": None, "mean": None, "std": None}
    raw = (torch.rand(40, 1, 4, 4) * 255).round()
    idx = torch.arange(40)
    built = build_image_data("raw", raw, idx % 2, (idx[:20], idx[20:30], idx[30:]), num_classes=2, normalize=False,
                             meta={}, scale=255)
    assert reload._data_preprocessing(built) == {"kind": "image", "scale": 255.0, "mean": None, "std": None}


# ---------------------------------------------------------------------------- the manifest's imports and command
def test_the_manifest_records_every_invocations_imports_in_the_order_first_seen_as_the_docs_say():
    design = _page("design.md")
    assert ("`imports` every `--import` module of every invocation, in the order first seen (read from `command` in "
            "a manifest written before the field)") in design
    assert "(``imports``: those of every ``run``, kept when a later one is given none)" in _page(
        "tutorials", "experiments.rst")
    assert "its ``--import`` modules (``imports``, in its order)" in _words(outputs.manifest.__doc__)
    assert ("naming the ``--import`` modules the comparison's ``manifest.json`` records, ``imports``: those of every "
            "invocation") in _words(load_run.__doc__)
    token = outputs._MAIN_ARGV.set(("run", "c.toml", "--import", "b.py", "--import=a"))
    try:
        first = outputs.manifest(_tiny_config(), device="cpu")
    finally:
        outputs._MAIN_ARGV.reset(token)
    assert first["imports"] == ["b.py", "a"]
    assert first["command"] == "python -m diffusionformer.experiments run c.toml --import b.py --import=a"
    later = {"command": "python -m diffusionformer.experiments run c.toml", "imports": []}
    merged = outputs.merged_manifest(first, later)
    assert merged["imports"] == ["b.py", "a"] and merged["command"] == later["command"]  # the latest command
    older = {"command": "diffusionformer run c.toml --import=z --import y.py"}  # no field: read from command
    assert outputs.merged_manifest(older, first)["imports"] == ["z", "y.py", "b.py", "a"]


def test_the_manifest_command_of_python_m_is_the_one_a_shell_runs_as_design_says(monkeypatch):
    assert ("(`python -m diffusionformer.experiments run ...` for `main(argv)` and for that command itself, not its "
            "`__main__.py`; `diffusionformer run ...` from the console script)") in _page("design.md")
    main_py = str(Path(outputs.__file__).with_name("__main__.py"))
    monkeypatch.setattr(sys, "argv", [main_py, "run", "my config.toml"])
    assert outputs._command() == "python -m diffusionformer.experiments run 'my config.toml'"
    monkeypatch.setattr(sys, "argv", ["/venv/bin/diffusionformer", "run", "c.toml"])
    assert outputs._command() == "diffusionformer run c.toml"


# ---------------------------------------------------------------------------- rope_base in a run's identity
@pytest.mark.parametrize("preset, own, other", [("gpt-char-tiny", 10000.0, 100.0), ("vit-digits", 100.0, 10000.0)])
def test_rope_base_stays_out_of_the_identity_at_the_models_own_default_only(preset, own, other):
    from diffusionformer.models import get_preset

    assert "at its default (`rope_base`: the model's own, GPT's 10000 or the ViT's 100)" in _page("design.md")
    config_cls = get_preset(preset).config_cls
    assert config_cls().rope_base == own and _new_model_fields(preset)["rope_base"] == own
    at = _normalized_identity({"model": preset, "model_config": {"dim": 8, "rope_base": own}})
    off = _normalized_identity({"model": preset, "model_config": {"dim": 8, "rope_base": other}})
    assert at["model_config"] == {"dim": 8} and off["model_config"] == {"dim": 8, "rope_base": other}


# ---------------------------------------------------------------------------- loggers on resume, CSV refilled
class _Regression:
    """modern_parts.rst's task."""

    def train_batch(self, step, generator, batch_size):
        x = torch.randn(batch_size, 3, generator=generator)
        return {"x": x, "y": x.sum(-1, keepdim=True)}

    def loss(self, model, batch):
        return nn.functional.mse_loss(model(batch["x"]), batch["y"]), {}

    def evaluate(self, model, max_batches):
        return {"loss": 0.0}


def test_the_trainer_lets_loggers_change_on_resume_and_writes_the_csv_again_as_the_tutorials_say(tmp_path):
    from diffusionformer.train import TrainConfig, Trainer, read_metrics, read_metrics_csv
    from diffusionformer.train.trainer import RESUMABLE_FIELDS

    assert ("lets evaluation, log and checkpoint intervals, the device and the ``loggers`` change (a ``metrics.csv`` "
            "is then written again from ``metrics.jsonl``, so one switched on at a resume holds the whole run") in \
        _page("tutorials", "experiments.rst")
    assert ("``metrics.csv`` is written again from ``metrics.jsonl`` (so a CSV switched on at a resume, or off for a "
            "while, holds every record of the run") in _page("tutorials", "modern_parts.rst")
    assert {"eval_interval", "log_interval", "checkpoint_interval", "device", "loggers"} <= RESUMABLE_FIELDS
    base = dict(batch_size=4, lr_decay_steps=6, log_interval=1, eval_interval=2, device="cpu", progress=False)
    segments = [(2, ("jsonl",)), (4, ("jsonl", "csv")), (5, ("jsonl",)), (6, ("jsonl", "csv"))]
    model = nn.Linear(3, 1)
    for i, (steps, loggers) in enumerate(segments):  # the CSV switched on at a resume, then off for a while
        cfg = TrainConfig(max_steps=steps, loggers=list(loggers), **base)
        Trainer(model, _Regression(), cfg, tmp_path, resume=i > 0).fit()
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records if r["split"] == "train"] == [1, 2, 3, 4, 5, 6]
    assert read_metrics_csv(tmp_path) == records


def test_log_group_truncate_writes_the_csv_again_from_the_cut_back_log_as_its_docstring_says(tmp_path):
    from diffusionformer.train import read_metrics, read_metrics_csv
    from diffusionformer.train.loggers import LogGroup, open_loggers

    assert ("then write every CSV table again from the JSON-lines log, cut back (a table switched on at a resume, or "
            "off for a while, holds every record of the run)") in _words(LogGroup.truncate.__doc__)
    log = open_loggers(["jsonl"], tmp_path)
    for step in (1, 2, 3):
        log.append({"step": step, "split": "train", "loss": 1.0 / step, "lr": 0.1, "metrics": {"acc": step / 4},
                    "elapsed": float(step), "time": 10.0 + step})
    log.close()
    group = open_loggers(["csv", "jsonl"], tmp_path)  # the CSV switched on at a resume from step 2
    assert group.truncate(2) == 1  # the JSON-lines log's count, whatever the order
    group.close()
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]
    assert read_metrics_csv(tmp_path) == read_metrics(tmp_path)


# ---------------------------------------------------------------------------- LayerRecorder
def _tiny_gpt():
    from diffusionformer.models import DiffusionGPT, GPTConfig

    torch.manual_seed(0)
    return DiffusionGPT(GPTConfig(vocab_size=11, block_size=8, n_layer=3, n_head=2, n_embd=16))


def test_layer_recorder_hooks_every_block_and_records_a_shared_block_at_each_position():
    from diffusionformer.analysis import LayerRecorder

    doc = _words(LayerRecorder.__doc__)
    assert ("a forward hook on every block (its calls) and hooks on the module that holds ``blocks`` (a pass); all "
            "hooks are removed on exit") in doc
    assert "A module at several positions of ``model.blocks`` (weights shared across depth) is recorded at each" in doc
    gpt = _tiny_gpt().eval()
    gpt.blocks[2] = gpt.blocks[0]  # one module at positions 0 and 2
    with LayerRecorder(gpt, layers=[1, 3]) as rec:
        assert all(len(block._forward_hooks) >= 1 for block in gpt.blocks)  # block 1's output is not recorded
        assert len(gpt._forward_pre_hooks) == 1 and len(gpt._forward_hooks) == 1
        with torch.no_grad():
            gpt(torch.randint(0, 11, (2, 8)))
    assert all(not b._forward_hooks and not b._forward_pre_hooks for b in gpt.blocks)
    assert not gpt._forward_hooks and not gpt._forward_pre_hooks
    with torch.no_grad():
        x2 = gpt.blocks[1](rec.states[1])
        assert torch.allclose(rec.states[3], gpt.blocks[2](x2))  # the shared block's second call, not its first
    assert not torch.allclose(rec.states[1], rec.states[3])


def test_layer_recorder_attentions_on_another_attention_is_a_type_error_naming_it():
    from diffusionformer.analysis import LayerRecorder

    doc = _words(LayerRecorder.__doc__)
    assert ("another block, or attention such as :class:`torch.nn.MultiheadAttention`, is a ``TypeError`` when the "
            "recorder is made, naming the block's class and its ``attn``'s") in doc
    gpt = _tiny_gpt()
    gpt.blocks[1].attn = nn.MultiheadAttention(16, 2, batch_first=True)
    with pytest.raises(TypeError, match=r"block 1 is a \w+ whose attn is a MultiheadAttention"):
        LayerRecorder(gpt, attentions=True)
    LayerRecorder(gpt, layers=[0, 1], attentions=True)  # block 1 not recomputed: no refusal


# ---------------------------------------------------------------------------- DiffusionViT.set_input_size
def test_set_input_size_is_in_the_api_reference_and_does_what_modern_parts_says():
    from diffusionformer.models import DiffusionViT, ViTConfig

    api = _page("api", "diffusionformer.rst")
    assert ":attr:`~diffusionformer.experiments.LoadedRun.preprocessing`" in api
    assert ":meth:`~diffusionformer.models.DiffusionViT.set_input_size`" in api
    assert "preprocessing" in {f.name for f in dataclasses.fields(LoadedRun)}
    page = _page("tutorials", "modern_parts.rst")
    assert ("(bicubic over the 2-D grid, antialiased as PIL's resize, the class token's row kept); a RoPE model only "
            "takes the new size") in page
    torch.manual_seed(0)
    vit = DiffusionViT(ViTConfig(input_size=(8, 8), patch_size=2, dim=16, depth=1, num_heads=2))
    old = vit.pos_embed.detach().clone()
    vit.set_input_size((12, 12))
    assert vit.pos_embed.shape == (1, 1 + 36, 16) and torch.equal(vit.pos_embed[:, :1], old[:, :1])
    grid = old[:, 1:].reshape(1, 4, 4, 16).permute(0, 3, 1, 2)
    expected = nn.functional.interpolate(grid, size=(6, 6), mode="bicubic", align_corners=False, antialias=True)
    assert torch.allclose(vit.pos_embed[:, 1:], expected.permute(0, 2, 3, 1).reshape(1, 36, 16))
    raises = _words(DiffusionViT.set_input_size.__doc__)
    assert "TypeError: ``input_size`` is not a tuple or list (a bare ``32``)." in raises
    assert "(another number of dimensions, not positive ints, not a multiple of ``patch_size``)" in raises
    before = vit.pos_embed.detach().clone()
    for bad, error in [(32, TypeError), ((12,), ValueError), ((12.0, 12), ValueError), ((0, 12), ValueError),
                       ((13, 12), ValueError)]:
        with pytest.raises(error):
            vit.set_input_size(bad)
        assert vit.config.input_size == (12, 12) and torch.equal(vit.pos_embed, before)  # left as it was
    rope = DiffusionViT(ViTConfig(input_size=(8, 8), patch_size=2, dim=16, depth=1, num_heads=2, rope=True))
    assert rope.set_input_size((12, 8)).pos_embed is None and rope.config.input_size == (12, 8)
    assert rope(torch.randn(2, 1, 12, 8)).shape == (2, 10)
