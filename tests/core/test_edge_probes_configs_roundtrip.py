"""Edge probes of the config layer: JSON round trips of every config class with every field off its default,
document_fields against the dataclass fields, unshared mutable defaults, and --set overrides of every field kind."""

from __future__ import annotations

import dataclasses
import json

import pytest

from diffusionformer.config import config_from_dict, config_to_dict
from diffusionformer.data.ssl import SSLConfig
from diffusionformer.experiments.config import ExperimentConfig, OperatorSetting, TaskConfig, load_experiment_config
from diffusionformer.experiments.minibatch import MiniBatchConfig
from diffusionformer.models import DINOConfig, GCNConfig, GINConfig, GPTConfig, GraphTransformerConfig, ViTConfig
from diffusionformer.train import TrainConfig

MODEL_CONFIGS = [
    GPTConfig(vocab_size=2**60, block_size=16, n_layer=2, n_head=4, n_embd=32, dropout=1e-8, bias=False, mlp_ratio=2.5,
              norm="rmsnorm", qk_norm=True, tie_weights=False, heads=["attention:4", "attention:2,heat:2"],
              backend="auto", rope=True, rope_base=1e4, n_kv_head=2, zero_init_proj=True, recompute=True),
    GPTConfig(n_layer=2, laplacian_heads=[1, "half"]),
    ViTConfig(input_size=(16,), in_channels=3, patch_size=4, num_classes=0, dim=32, depth=2, num_heads=2, mlp_ratio=1.5,
              pool="mean", qk_norm=True, dropout=0.1, attn_dropout=0.2, drop_path=0.3, layer_scale=1e-8, norm="rmsnorm",
              laplacian_heads="half", rope=True, rope_base=50.0),
    GraphTransformerConfig(in_channels=3, num_classes=5, task="graph", dim=32, depth=1, num_heads=2, mlp_ratio=1.0,
                           dropout=0.1, attn_dropout=0.1, input_dropout=0.1, self_loops=False, global_attention=True,
                           pool="max", norm="rmsnorm", laplacian_heads=1, edge_dim=3, pe="laplacian", pe_dim=4,
                           pe_sign_flip=False),
    GCNConfig(in_channels=3, num_classes=4, task="graph", hidden=3, num_layers=3, dropout=0.0, pool="add"),
    GINConfig(in_channels=3, num_classes=4, task="node", hidden=3, num_layers=3, dropout=0.0, pool="mean", train_eps=True),
    DINOConfig(input_size=(8, 8), patch_size=4, dim=16, depth=1, num_heads=2, out_dim=10, head_hidden=8,
               head_bottleneck=4, head_layers=1, student_temp=0.2, teacher_temp=0.05, warmup_teacher_temp=0.01,
               warmup_teacher_temp_steps=3, center_momentum=0.5, momentum=0.9, schedule_steps=2**55),
]


@pytest.mark.parametrize("config", MODEL_CONFIGS, ids=lambda c: type(c).__name__)
def test_every_model_config_round_trips_through_json_with_every_field_set(config):
    """Pins: tuples come back as tuples, ints beyond 2**53 and floats such as 1e-8 exactly, Literal choices,
    None, and mixed int/str lists."""
    back = config_from_dict(type(config), json.loads(json.dumps(config_to_dict(config))))
    assert back == config
    assert {f.name: type(getattr(back, f.name)) for f in dataclasses.fields(back)} == \
        {f.name: type(getattr(config, f.name)) for f in dataclasses.fields(config)}


def test_train_and_experiment_configs_round_trip_through_json_with_every_field_set():
    """Pins: TrainConfig.to_dict/from_dict and ExperimentConfig.to_dict/config_from_dict, huge ints included."""
    train = TrainConfig(max_steps=2**60, batch_size=4, grad_accum_steps=2, lr=1e-8, min_lr=1e-9, weight_decay=0.0,
                        betas=(0.5, 0.999), warmup_steps=3, lr_decay_steps=2**59, grad_clip=0.0, eval_interval=0,
                        eval_steps=2, log_interval=7, checkpoint_interval=0, seed=2**32 - 1, device="cpu", amp="fp16",
                        compile=True, progress=False, weight_decay_rule="nanogpt", loggers=("jsonl", "csv"))
    assert TrainConfig.from_dict(json.loads(json.dumps(train.to_dict()))) == train
    task = TaskConfig(name="a.b", dataset="digits", model="vit-digits", metric="val_loss", dataset_options={"x": 1},
                      model_overrides={"dim": 32, "heads": {"0": "attention:4"}}, train={"max_steps": 3, "lr": 1e-8},
                      data_seed=2**64 - 1, eval_batch_size=3, select_by="val_acc", folds=3, reach={"val_acc": 1},
                      augment={"crop_padding": 2, "flip": True}, label_smoothing=0.1)
    exp = ExperimentConfig(name="x", tasks=[task], seeds=[0, 1, 2], description="d", primary=["a.b:lap"],
                           operators=[OperatorSetting("attention"), OperatorSetting("lap", laplacian_heads=[1, 2]),
                                      OperatorSetting("h", heads={"0": "attention:{H}"}, model_overrides={"rope": True})],
                           primary_quantities=["final"], device="cpu", precision="bf16")
    assert config_from_dict(ExperimentConfig, json.loads(json.dumps(exp.to_dict()))) == exp


@pytest.mark.parametrize("cls", [GPTConfig, ViTConfig, GraphTransformerConfig, GCNConfig, GINConfig, DINOConfig,
                                 ExperimentConfig, TaskConfig, OperatorSetting, MiniBatchConfig, SSLConfig])
def test_document_fields_lists_every_field_in_order(cls):
    """Pins: the Fields: section names every dataclass field (a subclass's inherited ones too), in field order."""
    section = cls.__doc__.split("Fields:\n", 1)[1]
    rows = [line.split()[0] for line in section.splitlines() if line.startswith("    ") and not line.startswith("     ")]
    assert rows == [f.name for f in dataclasses.fields(cls)]


def test_mutable_defaults_are_not_shared_between_instances():
    """Pins: every dict/list default is a default_factory (one object per instance)."""
    a, b = TaskConfig("a", "digits", "vit-digits"), TaskConfig("b", "digits", "vit-digits")
    for name in ("dataset_options", "model_overrides", "train", "augment", "ssl", "minibatch"):
        assert getattr(a, name) is not getattr(b, name)
    assert OperatorSetting("x").model_overrides is not OperatorSetting("y").model_overrides
    e1 = ExperimentConfig("x", [a], [OperatorSetting("attention")])
    e2 = ExperimentConfig("y", [b], [OperatorSetting("attention")])
    for name in ("seeds", "primary", "primary_quantities"):
        assert getattr(e1, name) is not getattr(e2, name)
    for cls in (GPTConfig, ViTConfig, GraphTransformerConfig, GCNConfig, GINConfig, DINOConfig, TaskConfig,
                OperatorSetting, ExperimentConfig):
        for f in dataclasses.fields(cls):
            assert not isinstance(f.default, (list, dict, set)), (cls.__name__, f.name)


def _experiment(*names: str) -> dict:
    return {"name": "x", "tasks": [{"name": n, "dataset": "digits", "model": "vit-digits"} for n in names],
            "operators": [{"name": "attention"}, {"name": "lap", "laplacian_heads": 1}]}


def test_bug_set_into_a_dotted_task_name_whose_prefix_is_another_task():
    """Bug: with tasks 'csbm-h0' and 'csbm-h0.1' (a sweep of h), the documented unquoted address
    tasks.csbm-h0.1.train.max_steps=5 went to 'csbm-h0' (the shortest name that fit) and failed as its
    unknown key '1'; the name followed by a task field now wins."""
    cfg = load_experiment_config(_experiment("csbm-h0", "csbm-h0.1"), ["tasks.csbm-h0.1.train.max_steps=5",
                                                                        "tasks.csbm-h0.train.max_steps=7"])
    assert [t.train for t in cfg.tasks] == [{"max_steps": 7}, {"max_steps": 5}]
    cfg = load_experiment_config(
        {**_experiment("a"), "operators": [{"name": "attention"}, {"name": "l"}, {"name": "l.1"}]},
        ["operators.l.1.laplacian_heads=1"])
    assert [o.laplacian_heads for o in cfg.operators] == [None, None, 1]


def test_set_overrides_of_every_field_kind():
    """Pins: lists, inline tables (replacing the table), bare words, 'half', huge ints and the quoted form."""
    cfg = load_experiment_config(_experiment("a", "a.b"), [
        "seeds=[3, 4]", "tasks.a.train.betas=[0.5, 0.6]", "tasks.a.model_overrides={dim=32}",
        "tasks.a.model_overrides.heads={0=\"attention:4\"}", "operators.lap.laplacian_heads=half",
        'tasks."a.b".train={max_steps=7}', "tasks.a.data_seed=18446744073709551615", "device=cuda:1",
        "tasks.a.reach={val_acc=0.9}", "primary=[\"lap\"]"])
    a, ab = cfg.tasks
    assert (cfg.seeds, cfg.device, cfg.primary) == ([3, 4], "cuda:1", ["lap"])
    assert a.train == {"betas": [0.5, 0.6]} and a.model_overrides == {"dim": 32, "heads": {"0": "attention:4"}}
    assert (a.data_seed, a.reach, ab.train) == (2**64 - 1, {"val_acc": 0.9}, {"max_steps": 7})
    assert cfg.operators[1].laplacian_heads == "half"
    with pytest.raises(ValueError, match="cannot set a key inside a list"):
        load_experiment_config({**_experiment("a"), "seeds": [0, 1]}, ["seeds.0=5"])
    with pytest.raises(ValueError, match="expected a finite float, got nan"):
        load_experiment_config(_experiment("a"), ["tasks.a.train.lr=nan"])
