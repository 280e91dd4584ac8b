"""The operator-comparison experiment runner (configs, task adapters, runs, tables, plots)."""

from diffusionformer.experiments.config import (
    ExperimentConfig,
    OperatorSetting,
    TaskConfig,
    apply_overrides,
    load_experiment_config,
    parse_override,
)

__all__ = [
    "ExperimentConfig",
    "OperatorSetting",
    "TaskConfig",
    "apply_overrides",
    "load_experiment_config",
    "parse_override",
]
