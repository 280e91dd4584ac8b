"""What a comparison writes besides its runs: the manifest, ``results.json``, ``results.md`` and the plots."""

from __future__ import annotations

import contextvars
import dataclasses
import json
import math
import os
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from diffusionformer._files import folder_lock
from diffusionformer.experiments.config import ExperimentConfig, TaskConfig, _check_path_name, train_config
from diffusionformer.experiments.results import (RunResult, _completed, _definition, _read_identity, _row_problem,
                                                 _same_definition, run_dir)
from diffusionformer.experiments.tables import aggregate, format_table
from diffusionformer.train.metrics import write_json_atomic, write_text_atomic

__all__ = ["git_commit", "manifest", "merged_manifest", "write_outputs"]

#: the ``argv`` given to :func:`~diffusionformer.experiments.cli.main` (``None``: the command line itself), which the
#: manifest records: else ``main(argv)`` called from Python recorded its caller's command line (pytest's)
_MAIN_ARGV: contextvars.ContextVar[tuple[str, ...] | None] = contextvars.ContextVar("_MAIN_ARGV", default=None)


def _row(data: Any) -> RunResult | None:
    """A ``results.json`` row as a :class:`RunResult` (keys it does not know, a newer version's, left out); ``None``
    for one that does not fit (not an object, a required key missing, a value of the wrong type): only that row is dropped, not its neighbours."""
    if _row_problem(data) is not None:  # "0.5", true or a 400-digit int as its value: the tables could not add it
        return None
    known = {f.name for f in dataclasses.fields(RunResult)}
    try:
        row = RunResult(**{k: v for k, v in data.items() if k in known})
    except TypeError:
        return None
    # a completed run's NaN or inf metric is written as null (strict JSON has no NaN), in `value` and in `final`:
    # read back as None it was no longer counted as non-finite, as if the run had no evaluation
    if (row.value is None and row.status == "completed" and isinstance(row.final, dict)
            and row.metric in row.final and row.final[row.metric] is None):
        row.value = math.nan
    return row


def _one_folder(name: str) -> bool:
    """Whether ``name`` is a task or setting name a config accepts (``config._check_path_name``: one folder below
    its parent, not ``""``, ``"."`` or ``".."``, no ``/`` or NUL, ...): "../.." would name a folder outside."""
    try:
        _check_path_name("name", name)
    except ValueError:
        return False
    return True


def _other_finished_rows(out: Path, results: list[RunResult]) -> list[RunResult]:
    """The runs of ``out/results.json`` not in ``results`` whose ``summary.json`` still says completed."""
    if not (out / "results.json").is_file():  # none yet, or a FIFO or device (reading it would block or fill memory)
        return []
    try:
        previous = json.loads((out / "results.json").read_text())["runs"]
    except (FileNotFoundError, ValueError, KeyError, TypeError, RecursionError):  # none yet, or unreadable (not JSON,
        # not UTF-8, nested thousands deep): rebuilt
        return []
    rows = [r for r in map(_row, previous if isinstance(previous, list) else []) if r is not None]
    have = {(r.task, r.operator, r.seed) for r in results}
    kept = []
    for r in rows:
        if (isinstance(r.task, str) and isinstance(r.operator, str)  # else no run folder: dropped
                and _one_folder(r.task) and _one_folder(r.operator)  # "../.." would read a summary outside `out`
                and isinstance(r.seed, int) and not isinstance(r.seed, bool)  # "0" would name seed 0's folder twice
                and (r.task, r.operator, r.seed) not in have and r.status == "completed"
                and _completed(run_dir(out, r.task, r.operator, r.seed))):
            have.add((r.task, r.operator, r.seed))  # a run listed twice (an edited file) is one run, not two seeds
            kept.append(r)
    # a row of a task and setting retrained with another definition (--restart with a changed config) is dropped:
    # averaging it with the new runs would mix two experiments under one name
    now: dict[tuple[str, str], dict[str, Any]] = {}
    for r in results:
        if (r.task, r.operator) in now:  # one readable identity per task and setting is enough
            continue
        ident = _read_identity(run_dir(out, r.task, r.operator, r.seed))
        if ident is not None:
            now[(r.task, r.operator)] = _definition(ident)

    def same(r: RunResult) -> bool:
        if (r.task, r.operator) not in now:  # no new run of this task and setting to differ from
            return True
        ident = _read_identity(run_dir(out, r.task, r.operator, r.seed))
        return ident is None or _same_definition(_definition(ident), now[(r.task, r.operator)])
    return [r for r in kept if same(r)]


def manifest(config: ExperimentConfig, device: str | None = None,
             tasks: Sequence[TaskConfig] | None = None, world_size: int = 1) -> dict[str, Any]:
    """What ``manifest.json`` records: the resolved config, the command (``main(argv)``'s ``argv`` where it was given
    one) and its ``--import`` modules (``imports``, in its order), the machine, versions and commit.

    ``cuda`` names the GPU the runs train on and ``cpu_kernels`` the CPU kernel set, each ``None`` where no run
    trains there: ``device`` is the device of every run (``run --device``; default ``config.device``, else each of
    ``tasks``' own ``train.device``, default every task of ``config``), ``"auto"`` CUDA where available.
    ``world_size``: the processes that train each run (torchrun's, as the runner reads it)."""
    from diffusionformer import __version__

    gpu, cpu = _where_trained(config, device, tasks)
    command = _command()
    return {
        "config": config.to_dict(),
        "command": command,
        # its --import modules (merged_manifest keeps every invocation's): a later run without them, which needs none
        # (--set operators=attention), left no record of the modules the comparison's other runs need
        "imports": _command_imports(command),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "diffusionformer": __version__,
        "machine": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        # the vector kernels torch's CPU operators run (AVX512, AVX2, ...; ATEN_CPU_CAPABILITY chooses them): the
        # same seed rounds differently under another set, so a CPU study's numbers hold for its kernel set
        # (None where no run trains on the CPU: a GPU call's runs do not run them)
        "cpu_kernels": torch.backends.cpu.get_cpu_capability() if cpu else None,
        # torch's intra-op threads: a CPU reduction split over another number of threads rounds otherwise, so a seed's
        # numbers on CPU hold for its thread count (merged over the invocations that train on the CPU)
        "torch_threads": torch.get_num_threads(),
        # the processes that train each run (torchrun's WORLD_SIZE; 1 without it): the same seed draws and rounds
        # otherwise under another number (each rank its own dropout stream, gradients averaged over ranks)
        "world_size": world_size,
        "cuda": torch.cuda.get_device_name(gpu) if gpu is not None else None,
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "git_commit": git_commit(),
    }


def _command() -> str:
    """The manifest's ``command``: ``python -m diffusionformer.experiments ARGV`` (quoted for a shell) for
    ``main(argv)`` called from Python and for ``python -m diffusionformer.experiments`` itself (its ``sys.argv[0]``
    is the path of this package's ``__main__.py``, recorded as ``__main__.py``, which no shell runs), else the command
    line as given (the script's file name, ``diffusionformer`` for the console script, and its arguments, quoted too:
    load_run reads its ``--import`` back, and a path with a space was two words). A process torchrun started is
    recorded with its launcher (:func:`_launcher`): ``torchrun --nproc_per_node 2 -m diffusionformer.experiments
    ARGV``, ``torchrun ... --no-python diffusionformer ARGV`` for the console script (a name without ``.py``, which
    torchrun would else open as a file of the working folder): else re-running it trained each run in one process."""
    argv = _MAIN_ARGV.get()
    if argv is None and os.path.realpath(sys.argv[0]) == os.path.realpath(Path(__file__).with_name("__main__.py")):
        argv = tuple(sys.argv[1:])
    launcher = _launcher()
    if argv is not None:
        return shlex.join([*(launcher or ["python"]), "-m", "diffusionformer.experiments", *argv])
    script = Path(sys.argv[0]).name
    direct = ["--no-python"] if launcher and not script.endswith(".py") else []
    return shlex.join([*launcher, *direct, script, *sys.argv[1:]])


def _launcher() -> list[str]:
    """``torchrun`` and the options that started this process (``--nproc_per_node`` its processes on this node,
    ``--nnodes`` where more than one node), read from the variables torchrun's agent sets in every process it
    starts (``TORCHELASTIC_RUN_ID``, ``LOCAL_WORLD_SIZE``, ``GROUP_WORLD_SIZE``); ``[]`` for a process torchrun did
    not start (no run id, or a count that is no integer): ``WORLD_SIZE`` alone, set by hand or another launcher,
    names none.

    Examples:
        >>> from unittest import mock
        >>> with mock.patch.dict(os.environ, {"TORCHELASTIC_RUN_ID": "none", "LOCAL_WORLD_SIZE": "2",
        ...                                   "GROUP_WORLD_SIZE": "1"}):
        ...     _launcher()
        ['torchrun', '--nproc_per_node', '2']
    """
    if not os.environ.get("TORCHELASTIC_RUN_ID"):
        return []
    try:
        local, nodes = int(os.environ["LOCAL_WORLD_SIZE"]), int(os.environ.get("GROUP_WORLD_SIZE") or 1)
    except (KeyError, ValueError):
        return []
    return ["torchrun", "--nproc_per_node", str(local), *(["--nnodes", str(nodes)] if nodes > 1 else [])]


def _command_imports(command: Any) -> list[str]:
    """The ``--import`` modules of a manifest's ``command``, in both spellings (``--import m``, ``--import=m``) and in
    its order (a module may look up what an earlier one registered); ``[]`` for no command (not a string)."""
    try:
        words = shlex.split(command) if isinstance(command, str) else []
    except ValueError:  # unbalanced quotes: a manifest written before its command was quoted (`--out "Bob's runs"`)
        words = command.split()
    return [b if a == "--import" else a.partition("=")[2] for a, b in zip(words, [*words[1:], None])
            if (a == "--import" and b is not None) or a.startswith("--import=")]


def _manifest_imports(record: Any) -> list[str]:
    """The ``--import`` modules a manifest ``record`` keeps: its ``imports`` (every invocation's, merged by
    :func:`merged_manifest`), else, in a manifest written before that field, those of its ``command``."""
    if not isinstance(record, dict):
        return []
    imports = record.get("imports")
    if isinstance(imports, list):
        return [m for m in imports if isinstance(m, str)]
    return _command_imports(record.get("command"))


def _where_trained(config: ExperimentConfig, device: str | None,
                   tasks: Sequence[TaskConfig] | None) -> tuple[int | None, bool]:
    """(the index of the GPU a run trains on, or None; whether any run trains on the CPU) of :func:`manifest`."""
    spec = device if device is not None else config.device
    specs = [spec] if spec is not None else [train_config(t, seed=0).device
                                             for t in (config.tasks if tasks is None else tasks)]
    gpu, cpu = None, False
    for s in specs:
        d = torch.device("cuda" if torch.cuda.is_available() else "cpu") if s == "auto" else torch.device(s)
        if d.type == "cuda":
            if gpu is None:
                gpu = d.index or 0
        else:
            cpu = True
    return gpu, cpu


def _cpu_model() -> str | None:
    """The processor's name (``model name`` of ``/proc/cpuinfo``), None where it cannot be read."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    return value.strip() or None
    except OSError:
        pass
    return None


def _merged(previous: dict[str, Any] | None, current: dict[str, Any], key: str, many: str,
            kind: type = str) -> list[Any]:
    """The distinct values of type ``kind`` (strings; ``int``: ints, not bools) of ``previous[many]`` (or, from a
    manifest without it, ``previous[key]``) and ``current[key]``, oldest first."""
    seen: list[Any] = []
    earlier = previous.get(many) if isinstance(previous, dict) else None
    if isinstance(previous, dict) and not isinstance(earlier, list):
        earlier = [previous.get(key)]
    for c in [*(earlier or []), current.get(key)]:
        if isinstance(c, kind) and not isinstance(c, bool) and c not in seen:
            seen.append(c)
    return seen


def merged_manifest(previous: dict[str, Any] | None, current: dict[str, Any]) -> dict[str, Any]:
    """``current`` plus ``git_commits``: every commit an invocation of ``run`` recorded for this
    comparison, oldest first (a study resumed across commits lists each; ``git_commit`` is the
    latest), and ``cpu_kernel_sets``: likewise every CPU kernel set (``cpu_kernels``) its runs
    were trained under (left out while none is recorded), and ``torch_versions``: likewise every torch version
    (``torch``) that trained its runs (a GPU call's and this machine's), and ``cuda_devices`` every GPU (``cuda``;
    left out while none is recorded), and ``world_sizes`` every number of processes (``world_size``; likewise), and
    ``torch_thread_counts`` every torch thread count (``torch_threads``) of an invocation that trained on the CPU (one
    whose ``cpu_kernels`` is recorded; likewise), and ``imports`` every ``--import`` module of every invocation, in
    the order first seen (read from ``command`` in a manifest written before the field; ``[]`` for none).
    ``previous`` is the manifest already on disk, or ``None``.

    Examples:
        >>> merged_manifest({"git_commit": "a", "git_commits": ["a"]}, {"git_commit": "b"})["git_commits"]
        ['a', 'b']
        >>> merged_manifest({"git_commit": "a"}, {"git_commit": "a"})["git_commits"]
        ['a']
        >>> merged_manifest({"cpu_kernels": "AVX2"}, {"cpu_kernels": "AVX512"})["cpu_kernel_sets"]
        ['AVX2', 'AVX512']
        >>> merged_manifest({"torch": "2.11.0+cu130"}, {"torch": "2.13.0+cpu"})["torch_versions"]
        ['2.11.0+cu130', '2.13.0+cpu']
        >>> merged_manifest({"world_size": 2}, {"world_size": 1})["world_sizes"]
        [2, 1]
        >>> merged_manifest({"cpu_kernels": "AVX2", "torch_threads": 2},
        ...                 {"cpu_kernels": "AVX2", "torch_threads": 1})["torch_thread_counts"]
        [2, 1]
        >>> merged_manifest({"command": "diffusionformer run c.toml --import a.py --import=b"},
        ...                 {"command": "diffusionformer run c.toml --import c.py", "imports": ["c.py"]})["imports"]
        ['a.py', 'b', 'c.py']
    """
    kernels = _merged(previous, current, "cpu_kernels", "cpu_kernel_sets")
    torches = _merged(previous, current, "torch", "torch_versions")
    gpus = _merged(previous, current, "cuda", "cuda_devices")
    sizes = _merged(previous, current, "world_size", "world_sizes", int)  # every number of processes that trained
    # every thread count the CPU-trained runs saw: it decides a CPU run's rounding as the kernel set does (the last
    # invocation's torch_threads alone hid that earlier runs were trained under another count); a GPU call's is none
    threads = _merged(_cpu_threads(previous), _cpu_threads(current), "torch_threads", "torch_thread_counts", int)
    imports = list(dict.fromkeys([*_manifest_imports(previous), *_manifest_imports(current)]))
    return {**current, "git_commits": _merged(previous, current, "git_commit", "git_commits"),
            **({"imports": imports} if imports else {}),
            **({"cpu_kernel_sets": kernels} if kernels else {}),
            **({"torch_versions": torches} if torches else {}),
            **({"cuda_devices": gpus} if gpus else {}),
            **({"world_sizes": sizes} if sizes else {}),
            **({"torch_thread_counts": threads} if threads else {})}


def _cpu_threads(record: dict[str, Any] | None) -> dict[str, Any] | None:
    """``record`` (a manifest) as :func:`merged_manifest` reads its thread count: its ``torch_threads`` only where its
    invocation trained on the CPU (``cpu_kernels`` recorded); a list ``torch_thread_counts`` it holds is read as is."""
    if not isinstance(record, dict) or isinstance(record.get("cpu_kernels"), str):
        return record
    return {k: v for k, v in record.items() if k != "torch_threads"}


def git_commit(path: str | Path | None = None) -> str | None:
    """``git rev-parse HEAD`` of the checkout holding ``path`` (default: this package), with
    ``"+dirty"`` appended when tracked files differ from it; ``None`` outside a git checkout or
    without git."""
    import subprocess

    where = Path(path) if path is not None else Path(__file__).resolve().parent
    if where.is_file():  # a file of the checkout: git runs in its folder (a file as cwd gave None)
        where = where.parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        # without git's optional locks: a refresh of the index took the checkout's .git/index.lock (a `git commit`
        # meanwhile failed on it) and rewrote .git/index
        dirty = subprocess.run(["git", "--no-optional-locks", "status", "--porcelain", "--untracked-files=no"],
                               cwd=where, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")


def write_outputs(out: Path, config: ExperimentConfig, results: list[RunResult]) -> None:
    """Write ``results.json``, ``results.md`` and ``plots/`` of ``results`` into ``out`` (plots skipped without matplotlib).

    Rows of the previous ``results.json`` outside ``results`` are kept while their run is still
    finished on disk: an invocation on part of a comparison (``--set seeds=[1]``,
    ``--set tasks=...``, ``--set operators=...``, one GPU call per seed) adds its runs to the
    comparison's table instead of replacing the others'. Processes writing one comparison's outputs
    at once take turns (a lock of ``out``), so none drops the rows another has just written.
    """
    # the comparison's folder lock (processes writing its outputs at once: --workers, one invocation per seed)
    with folder_lock(out):  # another writer's read-merge-write in between would drop the rows of one of the two
        results = list(results) + _other_finished_rows(out, results)
        rows = [r.__dict__ for r in results]
        table = aggregate(results)
        write_json_atomic(out / "results.json", {"runs": rows, "summary": table})
        # the rows kept from earlier invocations (one GPU call per seed) may hold other seeds than this config's: the
        # header named only this invocation's ("Seeds: [1]." above rows of two seeds)
        shown = sorted({r.seed for r in results if isinstance(r.seed, int)} | set(config.seeds))
        seeds = f"{config.seeds}" if shown == sorted(config.seeds) else \
            f"{shown} (this invocation's: {config.seeds}; the finished runs of earlier ones are kept)"
        text = f"# {config.name}\n\n{config.description}\n\nSeeds: {seeds}. Mean ± sample std over seeds.\n\n"
        write_text_atomic(out / "results.md", text + format_table(table, config))  # a kill leaves the old table whole
        try:  # in the lock too: the figures of the last writer show the rows of the table it wrote
            from diffusionformer.experiments.plots import plot_experiment

            plot_experiment(out, config, results)
        except ImportError as exc:  # matplotlib missing: results are still written
            print(f"plots skipped: {exc}", file=sys.stderr)


def _run_flags(imports: list[str] | None, overrides: list[str] | None, out: str = "results") -> str:
    """The ``--import``, ``--set`` and (where not the default ``results``) ``--out`` flags of a command, each quoted
    for a shell (with a leading space): the results page's command, publish's "run ... first" and run's ``status``
    hint."""
    return ("".join(f" --import {shlex.quote(m)}" for m in imports or [])
            + "".join(f" --set {shlex.quote(o)}" for o in overrides or [])
            + ("" if out == "results" else f" --out {shlex.quote(out)}"))
