"""Mutation audit 60p of the library lines added or changed since 2aaa48f (``git diff 2aaa48f HEAD --
diffusionformer``): ``cli._imported``, the manifest's ``imports``, ``preprocessing.json``, ``_seeds_as_tensor``,
``full_graph_metrics``, ``LayerRecorder``'s call counting, ``_check_dense_attentions``, ``set_input_size``, the CSV
refill and ``_new_model_fields``. Each test kills mutants that survived the tests of those changes, checked against an
expectation worked out by hand, not against the code.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch
from experiments_tiny_configs import TINY_DIGITS_TOML

from diffusionformer.experiments.cli import main


# ------------------------------------------------------------------- cli._imported: the spelling of a recorded module
def _comparison_without_the_model(tmp_path, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out" / "tiny").mkdir(parents=True)
    (tmp_path / "out" / "tiny" / "manifest.json").write_text(json.dumps({"command": command}))
    (tmp_path / "c.toml").write_text(TINY_DIGITS_TOML.replace('model = "vit-digits"', 'model = "vit-60p"'))


def test_a_recorded_dotted_import_given_as_its_file_is_not_named(tmp_path, monkeypatch, capsys):
    """Recorded as the dotted ``ops60p``, given as ``./ops60p.py`` (the same module): only ``regs60p.py`` is missing.
    Kills ``_imported`` answering False for a dotted name already in ``sys.modules``."""
    _comparison_without_the_model(
        tmp_path, monkeypatch, "python -m diffusionformer.experiments run c.toml --import ops60p --import regs60p.py")
    (tmp_path / "ops60p.py").write_text("")
    try:
        assert main(["run", "c.toml", "--out", "out", "--import", "./ops60p.py", "--no-progress"]) == 2
    finally:
        sys.modules.pop("ops60p", None)
    err = capsys.readouterr().err
    assert "unknown model 'vit-60p'" in err
    assert "(the comparison out/tiny was made with --import regs60p.py (out/tiny/manifest.json): " in err


def test_a_recorded_file_import_is_named_when_another_file_of_its_name_was_imported(tmp_path, monkeypatch, capsys):
    """``--import sub/ops60q.py`` recorded, ``--import other/ops60q.py`` given: a module named ``ops60q`` is imported,
    but from another file, so the recorded one is still missing (kills ``_imported`` matching the name alone)."""
    _comparison_without_the_model(
        tmp_path, monkeypatch, "python -m diffusionformer.experiments run c.toml --import sub/ops60q.py")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "ops60q.py").write_text("")
    try:
        assert main(["run", "c.toml", "--out", "out", "--import", "other/ops60q.py", "--no-progress"]) == 2
    finally:
        sys.modules.pop("ops60q", None)
    err = capsys.readouterr().err
    assert "unknown model 'vit-60p'" in err
    assert "(the comparison out/tiny was made with --import sub/ops60q.py (out/tiny/manifest.json): " in err


# ------------------------------------------------------------------------------ preprocessing.json of an own loader
def test_the_preprocessing_of_images_whose_loader_recorded_no_scale_says_none_not_a_guess():
    """A loader of one's own that records no ``meta["scale"]`` (nor statistics): ``scale`` is None, as documented,
    not a guessed 255 (kills a default scale)."""
    from types import SimpleNamespace

    from diffusionformer.experiments.reload import _data_preprocessing

    own = SimpleNamespace(kind="image", meta={"source": "mine"}, mean=(0.5,), std=None)
    assert _data_preprocessing(own) == {"kind": "image", "scale": None, "mean": [0.5], "std": None}


def test_an_older_run_folder_without_preprocessing_loads_without_a_warning(tmp_path):
    """No ``preprocessing.json`` (a folder of an older version) is not a damaged record: ``preprocessing`` None and no
    warning (kills the warning for every absent file)."""
    import tomllib
    import warnings

    from diffusionformer import load_run
    from diffusionformer.experiments import load_experiment_config, run_experiment
    from diffusionformer.experiments.results import run_dir

    config = load_experiment_config(tomllib.loads(TINY_DIGITS_TOML))
    config = type(config)(**{**config.__dict__, "operators": config.operators[:1]})
    run_experiment(config, tmp_path, progress=False, log=lambda m: None)
    rdir = run_dir(tmp_path / config.name, "digits", config.operators[0].name, 0)
    assert json.loads((rdir / "preprocessing.json").read_text())["kind"] == "image"
    (rdir / "preprocessing.json").unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_run(rdir).preprocessing is None


# ----------------------------------------------------------------------------- neighbor_loader of a HeteroData pair
def test_a_node_type_pair_for_a_heterogeneous_graph_is_not_called_a_homogeneous_data():
    """``("paper", ids)`` is the right seeds of a HeteroData: the refusal meant for a homogeneous ``Data`` must not
    fire (it said "data is a homogeneous Data" of a HeteroData); what fails is the sampler, which says so."""
    from torch_geometric.data import HeteroData

    from diffusionformer.data.neighbors import neighbor_loader

    h = HeteroData()
    h["paper"].x, h["author"].x = torch.randn(4, 3), torch.randn(3, 3)
    h["author", "writes", "paper"].edge_index = torch.tensor([[0, 1, 2], [1, 2, 3]])
    with pytest.raises(TypeError, match="got HeteroData") as info:
        neighbor_loader(h, [2], batch_size=2, input_nodes=("paper", torch.tensor([1, 2, 3])), force_torch=True)
    assert "homogeneous" not in str(info.value)


# ----------------------------------------------------------------------------------- pad_by_batch without a batch
@pytest.mark.parametrize("num_graphs", [True, 1.0])
def test_pad_by_batch_without_batch_refuses_a_count_that_is_not_an_int_as_with_a_batch(num_graphs):
    """``num_graphs=True`` or ``1.0`` equals 1 but is no graph count: refused with ``batch=None`` as it is with a batch
    vector (kills a check by value alone), while an int 1 is one graph."""
    from diffusionformer.analysis.capture import pad_by_batch

    x = torch.randn(3, 2)
    with pytest.raises(ValueError, match="num_graphs"):
        pad_by_batch(x, torch.zeros(3, dtype=torch.long), num_graphs=num_graphs)
    with pytest.raises(ValueError, match="num_graphs"):
        pad_by_batch(x, None, num_graphs=num_graphs)
    padded, mask = pad_by_batch(x, None, num_graphs=1)
    assert torch.equal(padded, x.unsqueeze(0)) and mask.tolist() == [[True, True, True]]


# ------------------------------------------------------------------------- LayerRecorder(attentions=True) check
def test_attentions_of_blocks_without_an_attn_are_refused_before_the_pass():
    """Blocks with ``norm1`` but no ``attn`` at all: ``attentions=True`` is refused by the check, naming the block,
    and the states alone are captured (kills a check that lets a missing ``attn`` through to the hook)."""
    from diffusionformer.analysis import capture_dataset

    class NoAttnBlock(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1, self.mlp = torch.nn.LayerNorm(8), torch.nn.Linear(8, 8)

        def forward(self, x):
            return x + self.mlp(self.norm1(x))

    class Stack(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList([NoAttnBlock(), NoAttnBlock()])

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return x

    model, x = Stack(), torch.randn(2, 5, 8)
    with pytest.raises(TypeError, match=r"needs blocks with `attn` .*block 0 is a NoAttnBlock without attn$"):
        capture_dataset(model, [x], attentions=True)
    assert all(not b._forward_hooks and not b._forward_pre_hooks for b in model.blocks)
    with torch.no_grad():
        expected = model.blocks[0](x)
    torch.testing.assert_close(capture_dataset(model, [x]).states[1], expected)


def _shared_gpt(depth: int = 3):
    from diffusionformer.models import DiffusionGPT, GPTConfig

    torch.manual_seed(0)
    model = DiffusionGPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16))
    model.blocks = torch.nn.ModuleList([model.blocks[0]] * depth)  # one block applied at every depth
    return model.eval()


def _by_hand(model, ids, cache=None) -> list[torch.Tensor]:
    """X^(0..L) of ``model.blocks`` run on ``ids`` one call after another, outside any recorder."""
    with torch.no_grad():
        x = model._embed(ids, 0)
        states = [x]
        for i, block in enumerate(model.blocks):
            x = block(x) if cache is None else block(x, cache=cache[i])
            states.append(x)
    return states


def test_attentions_of_post_norm_blocks_are_refused_when_the_recorder_is_made():
    """A block with a DiffusionAttention ``attn`` but no pre-norm ``norm1``: refused by the check (the attentions are
    recomputed from ``norm1`` of the block's input), not later inside a hook (kills dropping the ``norm1`` check)."""
    from diffusionformer.analysis import LayerRecorder

    model = _shared_gpt(depth=1)

    class PostNorm(torch.nn.Module):
        def __init__(self, attn) -> None:
            super().__init__()
            self.attn, self.norm = attn, torch.nn.LayerNorm(16)

        def forward(self, x):
            return self.norm(x + self.attn(x))

    model.blocks = torch.nn.ModuleList([PostNorm(model.blocks[0].attn)])
    with pytest.raises(TypeError, match=r"`norm1` \(pre-norm\); block 0 is a PostNorm"):
        LayerRecorder(model, attentions=True)


def test_a_second_kv_cached_pass_of_other_tokens_is_recorded_at_every_position():
    """Outside a call of the model the calls of a shared block cycle through its positions: the second
    ``forward_cached`` pass (other tokens, a new cache) is the one recorded, at every layer (kills a count that stops
    recording after the first cycle and leaves the first pass's tokens)."""
    from diffusionformer.analysis import LayerRecorder

    model = _shared_gpt(depth=2)
    first, second = torch.randint(0, 11, (2, 8), generator=torch.Generator().manual_seed(1)).unbind(0)
    expected = _by_hand(model, second[None], model.new_cache())
    with LayerRecorder(model) as rec, torch.no_grad():
        model.forward_cached(first[None], model.new_cache())
        model.forward_cached(second[None], model.new_cache())
    assert sorted(rec.states) == [0, 1, 2]
    for layer, x in enumerate(expected):
        torch.testing.assert_close(rec.states[layer], x, msg=f"layer {layer}")


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpointing_only_the_later_positions_of_a_shared_block_keeps_every_recorded_position(reentrant):
    """A user checkpoints every block but the first (the first position is not recomputed): the backward pass
    recomputes positions 2 and 1 only, and neither may be recorded as position 0, nor counted: the cached passes after
    it, outside a call of the model, are recorded at every position (kills reading or counting the calls made inside a
    backward pass, and a pass that never ends)."""
    from torch.utils.checkpoint import checkpoint

    from diffusionformer.analysis import LayerRecorder
    from diffusionformer.models import DiffusionGPT

    class PartlyCheckpointed(DiffusionGPT):
        def forward(self, idx):  # type: ignore[override]
            x = self._embed(idx)
            for i, block in enumerate(self.blocks):
                x = block(x) if i == 0 else checkpoint(block, x, use_reentrant=reentrant)
            return x

    model = _shared_gpt(depth=3)
    model.__class__ = PartlyCheckpointed
    ids = torch.randint(0, 11, (2, 8), generator=torch.Generator().manual_seed(2))
    expected = _by_hand(model, ids)
    later = torch.randint(0, 11, (1, 8), generator=torch.Generator().manual_seed(3))
    expected_later = _by_hand(model, later, model.new_cache())
    with LayerRecorder(model) as rec:
        model(ids).sum().backward()
        for layer, x in enumerate(expected):
            torch.testing.assert_close(rec.states[layer], x, msg=f"layer {layer}")
        with torch.no_grad():  # and cached passes after it start at position 0 (the recomputations not counted)
            model.forward_cached(ids[:1], model.new_cache())
            model.forward_cached(later, model.new_cache())
    for layer, x in enumerate(expected_later):
        torch.testing.assert_close(rec.states[layer], x, msg=f"cached, layer {layer}")


def test_a_cached_pass_refused_at_a_later_position_does_not_shift_the_next_one():
    """Only the last layer's attention asked for: the refusal of a KV-cached step comes at the shared block's second
    call, after its first was counted; the next cached pass must still start at position 0 (kills keeping the count
    of a cached pass that raised)."""
    from diffusionformer.analysis import LayerRecorder

    model = _shared_gpt(depth=2)
    ids = torch.randint(0, 11, (1, 8), generator=torch.Generator().manual_seed(4))
    expected = _by_hand(model, ids, model.new_cache())
    with LayerRecorder(model, layers=[2], attentions=True) as rec:
        assert rec.attention_blocks == [1]
        with pytest.raises(ValueError, match="KV-cached"), torch.no_grad():
            model.forward_cached(ids, model.new_cache())
        rec.compute_attentions = False
        with torch.no_grad():
            model.forward_cached(ids, model.new_cache())
    torch.testing.assert_close(rec.states[2], expected[2])


def test_clear_starts_the_count_of_a_shared_block_again():
    """A block called by hand (one call: position 0 of a cycle) and then ``clear()``: the next cached pass is recorded
    at every position as run (kills ``clear`` keeping the count)."""
    from diffusionformer.analysis import LayerRecorder

    model = _shared_gpt(depth=2)
    ids = torch.randint(0, 11, (1, 8), generator=torch.Generator().manual_seed(5))
    expected = _by_hand(model, ids, model.new_cache())
    with LayerRecorder(model) as rec, torch.no_grad():
        model.blocks[0](model._embed(ids))
        rec.clear()
        model.forward_cached(ids, model.new_cache())
    for layer, x in enumerate(expected):
        torch.testing.assert_close(rec.states[layer], x, msg=f"layer {layer}")


def test_a_cached_pass_after_a_model_call_that_raised_midway_is_recorded_at_every_position():
    """A call of the model that raised after its first block (an error of the user's forward) still ends the pass:
    a later ``forward_cached`` pass starts at position 0 (kills a pass end that runs only when the call returned)."""
    from diffusionformer.analysis import LayerRecorder
    from diffusionformer.models import DiffusionGPT

    class FailsMidway(DiffusionGPT):
        def forward(self, idx):  # type: ignore[override]
            self.blocks[0](self._embed(idx))
            raise RuntimeError("midway")

    model = _shared_gpt(depth=2)
    ids = torch.randint(0, 11, (1, 8), generator=torch.Generator().manual_seed(6))
    expected = _by_hand(model, ids, model.new_cache())
    model.__class__ = FailsMidway
    with LayerRecorder(model) as rec, torch.no_grad():
        with pytest.raises(RuntimeError, match="midway"):
            model(ids)
        model.forward_cached(ids, model.new_cache())
    for layer, x in enumerate(expected):
        torch.testing.assert_close(rec.states[layer], x, msg=f"layer {layer}")


# --------------------------------------------------------------------------- layer_reports of a hand-made capture
@pytest.mark.parametrize("maps, num_examples, match", [
    ((5, 1, 4, 4), 5, r"at most B = 4\), shape \(5, H, 4, 4\), got \(5, 1, 4, 4\)"),  # more examples than sequences
    ((4, 1, 3, 3), 4, r"shape \(4, H, 4, 4\), got \(4, 1, 3, 3\)"),  # maps over 3 tokens of sequences of 4
])
def test_layer_reports_refuses_attention_maps_that_do_not_fit_the_sequences(maps, num_examples, match):
    """Four sequences of four tokens: attention maps of five sequences (``num_attention_examples`` 5 > B) or over
    three tokens are not the capture's maps; the ValueError names ``capture.attentions`` (kills dropping either
    bound of the check, which left an error about tensors the caller never passed)."""
    from diffusionformer.analysis import LayerCapture, layer_reports

    X = torch.randn(4, 4, 3, dtype=torch.float64)
    P = torch.softmax(torch.randn(*maps, dtype=torch.float64), dim=-1)
    with pytest.raises(ValueError, match=r"capture\.attentions\[0\] must hold one map per head .*" + match):
        layer_reports(LayerCapture({0: X, 1: X + 0.5}, attentions={0: P},
                                   extra={"num_attention_examples": num_examples}))


# ---------------------------------------------------------------------------------------- set_input_size
def _vit(**kw):
    from diffusionformer.models import DiffusionViT, ViTConfig

    torch.manual_seed(0)
    return DiffusionViT(ViTConfig(**{"input_size": (8, 8), "patch_size": 2, "dim": 8, "depth": 1, "num_heads": 2,
                                     **kw}))


def test_set_input_size_keeps_a_frozen_position_embedding_frozen_and_the_same_size_the_same_parameter():
    """A frozen ``pos_embed`` (fine-tuning with frozen positions) stays frozen after resampling (kills a new
    parameter that trains); the same grid keeps the very parameter (an optimiser built before still holds it)."""
    vit = _vit()
    vit.pos_embed.requires_grad_(False)
    vit.set_input_size((12, 8))
    assert isinstance(vit.pos_embed, torch.nn.Parameter) and not vit.pos_embed.requires_grad
    assert vit.pos_embed.shape == (1, 1 + 6 * 4, 8)
    same = _vit()
    param = same.pos_embed
    assert same.set_input_size((8, 8)).pos_embed is param and same.config.input_size == (8, 8)


def test_set_input_size_of_a_bfloat16_model_keeps_its_dtype_and_resamples_in_float32():
    """A bfloat16 model keeps a bfloat16 ``pos_embed`` (kills a float32 one that a bfloat16 forward then mixes in),
    equal to the float32 resampling of the same weights rounded once to bfloat16."""
    vit = _vit().to(torch.bfloat16)
    reference = _vit()
    reference.pos_embed.data.copy_(vit.pos_embed.float())
    vit.set_input_size((4, 12))
    reference.set_input_size((4, 12))
    assert vit.pos_embed.dtype == torch.bfloat16
    assert torch.equal(vit.pos_embed, reference.pos_embed.to(torch.bfloat16))


# ------------------------------------------------------------------------------- a CSV log switched on at a resume
def _record(step: int, metrics: dict) -> dict:
    return {"step": step, "split": "eval", "loss": 1.0 / step, "lr": 0.1, "metrics": metrics, "elapsed": 0.5 * step,
            "time": 1000.0 + step}


def test_a_csv_switched_on_at_a_resume_is_the_table_an_uninterrupted_run_writes(tmp_path):
    """Metrics first seen in the order ``zeta``, ``alpha`` (then ``mid``): the refilled table has the rows up to the
    checkpoint's step and the columns an uninterrupted run's appends give (kills metric columns in the order first
    seen); a resume before any record leaves no table (kills writing a header-only file)."""
    from diffusionformer.train.loggers import CSVLog, LogGroup
    from diffusionformer.train.metrics import MetricsLog

    records = [_record(1, {"zeta": 0.5, "alpha": 0.25}), _record(2, {"mid": 0.75, "zeta": 0.5}),
               _record(3, {"alpha": 0.125})]
    uninterrupted = CSVLog(tmp_path / "whole" / "metrics.csv")
    for r in records[:2]:
        uninterrupted.append(r)
    (tmp_path / "run").mkdir()
    jsonl = MetricsLog(tmp_path / "run" / "metrics.jsonl")
    for r in records:
        jsonl.append(r)
    LogGroup([jsonl, CSVLog(tmp_path / "run" / "metrics.csv")]).truncate(2)  # resumed at step 2, the CSV now on
    written = (tmp_path / "run" / "metrics.csv").read_text()
    assert written == (tmp_path / "whole" / "metrics.csv").read_text()
    assert written.splitlines()[0].endswith(",metrics.alpha,metrics.mid,metrics.zeta")
    (tmp_path / "fresh").mkdir()
    (tmp_path / "fresh" / "metrics.jsonl").write_text("")  # a run killed before its first record
    fresh = LogGroup([MetricsLog(tmp_path / "fresh" / "metrics.jsonl"), CSVLog(tmp_path / "fresh" / "metrics.csv")])
    fresh.truncate(0)
    assert not (tmp_path / "fresh" / "metrics.csv").exists()


# ------------------------------------------------------------------- rope_base in `status`'s change of a model config
@pytest.mark.parametrize("preset, other", [("gpt-char-tiny", 100.0), ("vit-digits", 10000.0)])
def test_status_names_a_rope_base_set_to_the_other_models_default_as_a_change(preset, other):
    """A stored run at the model's own RoPE base, the config now at the other model's default (GPT 10000 -> 100, ViT
    100 -> 10000): a change of the model config (kills dropping either default for every model there); the same
    config is none. A stored identity of a preset not registered now reads without an error, either default
    dropped (kills refusing an unknown preset)."""
    from diffusionformer.experiments.config import OperatorSetting, TaskConfig
    from diffusionformer.experiments.results import _model_changes, _normalized_identity
    from diffusionformer.experiments.runner import _run_identity
    from diffusionformer.models import create_model
    from diffusionformer.train import TrainConfig

    task = TaskConfig("t", "digits", preset, model_overrides={"rope": True})
    identity = _run_identity(task, create_model(preset, rope=True), TrainConfig(max_steps=2))
    stored = _normalized_identity(json.loads(json.dumps(identity, default=str)))["model_config"]
    assert "rope_base" not in stored
    assert _model_changes(task, OperatorSetting("attention"), stored) == []
    moved = TaskConfig("t", "digits", preset, model_overrides={"rope": True, "rope_base": other})
    (change,) = _model_changes(moved, OperatorSetting("attention"), stored)
    assert change.new["rope_base"] == other and "rope_base" not in change.old
    user = {"model": "user-preset-60p", "model_config": {"rope": False, "rope_base": 100.0, "dim": 8}}
    assert _normalized_identity(user)["model_config"] == {"dim": 8}
    user["model_config"]["rope_base"] = 10000.0
    assert _normalized_identity(user)["model_config"] == {"dim": 8}


@pytest.mark.parametrize(("has_attn", "has_norm1", "said"), [
    (True, False, "is a _Block without norm1$"),
    (False, True, "is a _Block without attn$"),
    (False, False, "is a _Block without attn and without norm1$"),
])
def test_layer_recorder_names_what_a_block_lacks_not_its_diffusion_attention(has_attn, has_norm1, said):
    """A post-norm block (a DiffusionAttention, no ``norm1``) was refused as one "whose attn is a
    DiffusionAttention": the message names what the block lacks."""
    from diffusionformer.analysis import LayerRecorder
    from diffusionformer.nn import DiffusionAttention

    class _Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            if has_attn:
                self.attn = DiffusionAttention(8, 2)
            if has_norm1:
                self.norm1 = torch.nn.LayerNorm(8)

        def forward(self, x):
            return x

    class _Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList([_Block()])

        def forward(self, x):
            return self.blocks[0](x)

    with pytest.raises(TypeError, match=said):
        LayerRecorder(_Model(), attentions=True)
