"""The operator-comparison experiment runner (configs, task adapters, runs, tables, plots).

A study is a TOML config (:func:`load_experiment_config`); :func:`run_experiment` trains
every (task, operator setting, seed) run with checkpoint and resume,
:func:`analyze_experiment` measures token geometry of the trained models,
:func:`publish_experiment` writes a results page, :func:`load_run` rebuilds a trained run's
model with its weights, config and metrics, and :func:`summary_table` compares several
studies at once. Comparisons are paired over seeds (:func:`paired_difference`,
:func:`nadeau_bengio` for k-fold tasks, :func:`wilcoxon_p`) and adjusted over a page
(:func:`holm`, :func:`benjamini_hochberg`). The command line
(``python -m diffusionformer.experiments``) wraps them. :func:`validate_experiment`
resolves every run before anything trains. A node task's ``minibatch`` table
(:class:`MiniBatchConfig`) trains it on neighbour-sampled mini-batches
(:class:`NodeMiniBatchTask`, :func:`propagation_hops`).
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
from diffusionformer.experiments.minibatch import MiniBatchConfig, NodeMiniBatchTask, propagation_hops
from diffusionformer.experiments.publish import publish_experiment, summary_table
from diffusionformer.experiments.reload import LoadedRun, load_run
from diffusionformer.experiments.stats import (
    Difference,
    benjamini_hochberg,
    holm,
    nadeau_bengio,
    paired_difference,
    welch_difference,
    wilcoxon_p,
)
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
    "Difference",
    "ExperimentConfig",
    "LoadedRun",
    "MiniBatchConfig",
    "NodeMiniBatchTask",
    "OperatorSetting",
    "RunResult",
    "TaskConfig",
    "aggregate",
    "analyze_experiment",
    "analyze_run",
    "apply_overrides",
    "benjamini_hochberg",
    "check_experiment",
    "difference_t",
    "finished_runs",
    "format_table",
    "holm",
    "load_experiment_config",
    "load_run",
    "nadeau_bengio",
    "paired_difference",
    "paired_t",
    "parse_override",
    "propagation_hops",
    "publish_experiment",
    "run_experiment",
    "run_status",
    "summary_table",
    "validate_experiment",
    "welch_difference",
    "welch_t",
    "wilcoxon_p",
]
