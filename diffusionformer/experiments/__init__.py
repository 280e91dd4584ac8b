"""The operator-comparison experiment runner (configs, task adapters, runs, tables, plots).

A study is a TOML config (:func:`load_experiment_config`); :func:`run_experiment` trains
every (task, operator setting, seed) run with checkpoint and resume,
:func:`analyze_experiment` measures token geometry of the trained models,
:func:`validate_experiment` resolves every run before anything trains,
:func:`publish_experiment` writes a results page, and :func:`summary_table` compares several
studies at once. The command line (``python -m diffusionformer.experiments``) wraps them.
"""

from diffusionformer.experiments.analyze import analyze_experiment, analyze_run
from diffusionformer.experiments.config import (
    ExperimentConfig,
    OperatorSetting,
    TaskConfig,
    apply_overrides,
    load_experiment_config,
    parse_override,
)
from diffusionformer.experiments.publish import publish_experiment, summary_table
from diffusionformer.experiments.runner import (
    RunResult,
    aggregate,
    difference_t,
    finished_runs,
    format_table,
    paired_t,
    run_experiment,
    run_status,
    welch_t,
)
from diffusionformer.experiments.validate import check_experiment, validate_experiment

__all__ = [
    "ExperimentConfig",
    "OperatorSetting",
    "RunResult",
    "TaskConfig",
    "aggregate",
    "analyze_experiment",
    "analyze_run",
    "apply_overrides",
    "check_experiment",
    "difference_t",
    "finished_runs",
    "format_table",
    "load_experiment_config",
    "paired_t",
    "parse_override",
    "publish_experiment",
    "run_experiment",
    "run_status",
    "summary_table",
    "validate_experiment",
    "welch_t",
]
