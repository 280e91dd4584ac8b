"""Publish a finished comparison into the docs: tables, figures, command, machine, wall times.

``python -m diffusionformer.experiments publish CONFIG --out results --to docs/results`` writes
``docs/results/<name>.md`` and copies the small result files (``results.json``, ``results.md``,
PNG plots, the analysis ``metrics.json`` and figures when present) to ``docs/results/<name>/``.
Checkpoints are never copied, and the page is added to the toctree of ``docs/results/index.md``
(once) so that the docs keep building with ``sphinx -W``. Each run's metrics log is published as a small JSON file,
``docs/results/<name>/logs/<task>/<operator>/seed<k>.json`` (columns ``step``, ``loss``, ``lr``
and every metric, for the training and the evaluation records), so curves can be checked.
The page is regenerated from those files by running the command again. What follows
:data:`GAP_MARKER` (the over-fitting tables of :mod:`~diffusionformer.experiments.gaps`) or
:data:`READING_MARKER` (a reading written by hand) on an existing page is kept at its end.

**From the published files.** ``publish CONFIG --out docs/results --to docs/results`` (the
results root is the docs folder itself) rewrites the page from the files already published
there (``results.json``, ``manifest.json``, plots, ``analysis/``) without copying or deleting
anything: how the tables of studies whose raw results folders are gone are recomputed when
the statistics change.
"""

from __future__ import annotations

import json
import math
import numbers
import re
import shlex
import shutil
import warnings
from pathlib import Path
from typing import Any

from diffusionformer._files import file_kind
from diffusionformer._warnings import user_stacklevel
from diffusionformer.experiments.config import ExperimentConfig, _folded, _folder_twin
from diffusionformer.experiments.results import (RunResult, _Change, _completed, _row_problem, _runs_of_another_train,
                                                 _set_of, finished_runs, first_reach, read_curves, read_json_dict,
                                                 run_dir, select_evaluation)
from diffusionformer.experiments.outputs import _run_flags
from diffusionformer.experiments.stats import _require_scipy
from diffusionformer.experiments.tables import _cell, _elapsed_by_device, _text, aggregate, format_table
from diffusionformer.train.metrics import write_json_atomic, write_text_atomic

__all__ = ["GAP_MARKER", "READING_MARKER", "add_to_toctree", "publish_experiment", "read_run_log", "summary_table",
           "write_run_log"]

#: starts the over-fitting tables of :mod:`~diffusionformer.experiments.gaps` on a results page
GAP_MARKER = "<!-- gap tables: python -m diffusionformer.experiments.gaps -->"
#: starts a reading written by hand at the end of a results page: ``publish`` and ``gaps`` keep it
READING_MARKER = "<!-- reading: written by hand; publish and gaps keep it -->"


def _kept_tail(text: str) -> str:
    """The part of a results page that rebuilding it keeps: from the first :data:`GAP_MARKER` or
    :data:`READING_MARKER` on (``""`` when it has neither).

    Examples:
        >>> _kept_tail("tables " + READING_MARKER + " ours") == READING_MARKER + " ours"
        True
    """
    at = [i for i in (text.find(GAP_MARKER), text.find(READING_MARKER)) if i >= 0]
    return text[min(at):] if at else ""


def _read_page(path: Path) -> str:
    """The text of a docs page that ``publish`` or ``gaps`` edits (a results page, the index of its toctree); a
    ValueError naming it when it is not UTF-8 (a bare "'utf-8' codec can't decode byte 0xff" named no file)."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc}); save it as UTF-8 and run the command again") from None


#: a figure path that a markdown image keeps as it is: markdown-it percent-encodes other characters (a non-ASCII
#: letter, ``[``, ``|``, ``%``) and MyST then looks for a file of the encoded name; ``(`` and ``)`` end the link
_PLAIN_PATH = re.compile(r"[A-Za-z0-9._~/+=,;@!-]+")


def _image(alt: str, target: str) -> str:
    """A figure of a results page: ``![alt](target)``, or MyST's ``{image}`` directive, which takes the path as it
    is, where markdown would change it (a comparison or task named ``größe``, ``[x]`` or ``a(b``: the figure was left
    out of the page, or ``sphinx -W`` failed with "image file not readable"). A tilde fence, as a backtick fence
    cannot hold a name with a backtick.

    Examples:
        >>> _image("digits: curves", "default/plots/digits_curves.png")
        '![digits: curves](default/plots/digits_curves.png)'
        >>> print(_image("größe: curves", "s/plots/größe_curves.png"))
        ~~~{image} s/plots/größe_curves.png
        :alt: größe: curves
        ~~~
    """
    if _PLAIN_PATH.fullmatch(target):
        return f"![{alt}]({target})"
    return f"~~~{{image}} {target}\n:alt: {alt}\n~~~"


def _copy(src: Path, dst: Path) -> Path | None:
    if not src.is_file():
        return None
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    return dst


class _UnreadableFigure(ValueError, OSError):
    """A figure that does not load (truncated by an interrupted run, not a PNG): a ``ValueError`` naming the file,
    which the command line reports in one line, and an ``OSError`` as Pillow's own error was, so code that caught
    that keeps working."""


def _copy_png(src: Path, dst: Path, drawn_by: str = "run") -> Path | None:
    """Copy a figure, reduced to a 256-colour palette when Pillow is installed (about 4x smaller); ``dst`` is
    replaced once whole (it may be ``src``). A figure that does not load is an :class:`_UnreadableFigure` naming it
    and the command that draws it again (``drawn_by``: ``"run"``, ``"analyze"``)."""
    if not src.is_file():
        return None
    try:
        from PIL import Image
    except ImportError:
        return _copy(src, dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        with Image.open(src) as im:
            small = im.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    except (OSError, SyntaxError) as exc:  # truncated or not an image (PIL raises OSError, SyntaxError for bad chunks)
        raise _UnreadableFigure(f"{src}: not a readable PNG figure ({type(exc).__name__}: {exc}); `{drawn_by}` the "
                                "comparison again to redraw its figures") from None
    from diffusionformer.experiments.plots import _replace_when_written

    with _replace_when_written(dst) as tmp:
        small.save(tmp, format="PNG", optimize=True)
    return dst


def _read_manifest(path: Path) -> dict[str, Any]:
    """A comparison's ``manifest.json`` (``{}`` when it has none); a ``ValueError`` naming it when it is not one (a
    folder or a FIFO in its place too: else the page was published without its machine and versions, unsaid)."""
    if not path.is_file():
        if path.exists():
            raise ValueError(f"{path} is {file_kind(path.stat().st_mode)}, not the manifest of a comparison; restore "
                             "it, or delete it to publish the page without the machine and versions")
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as exc:  # truncated, edited, not UTF-8, nested thousands deep
        data = exc
    if not isinstance(data, dict):
        why = f"{type(data).__name__}: {data}" if isinstance(data, Exception) else f"a JSON {type(data).__name__}"
        raise ValueError(f"{path} is not the manifest of a comparison ({why}); restore it, or delete it to publish "
                         "the page without the machine and versions")
    return data


def _check_results_file(path: Path) -> None:
    """Refuse a ``results.json`` that is there but no regular file (a folder, a FIFO: reading one would wait for a
    writer for ever): else it read as missing, "run the comparison first", for a comparison that ran."""
    if path.exists() and not path.is_file():
        raise ValueError(f"{path} is {file_kind(path.stat().st_mode)}, not a results file; remove it and `run` the "
                         "comparison again to rewrite it from its finished runs")


def _listed(manifest: dict[str, Any], key: str, kind: type = str) -> list[Any]:
    """The values of type ``kind`` (strings; ``int``: ints, not bools) of the manifest's list ``key`` (every
    invocation's value, :func:`~diffusionformer.experiments.outputs.merged_manifest`); ``[]`` where the manifest
    predates it or ``key`` is not a list (an edited ``7`` or ``"AVX2"``: not its characters), as ``run`` reads it."""
    values = manifest.get(key)
    return [v for v in values if isinstance(v, kind) and not isinstance(v, bool)] if isinstance(values, list) else []


def _kernels_text(manifest: dict[str, Any]) -> str:
    """The Machine line's CPU kernel set (``cpu_kernels``, ``cpu_kernel_sets`` of the manifest), or ``""``."""
    sets = _listed(manifest, "cpu_kernel_sets")
    if len(sets) > 1:
        return (f"; CPU kernels: {', '.join(sets)} (runs of this comparison were trained under {len(sets)} kernel "
                "sets of torch's CPU operators: float rounding differs between them, so a run's numbers on CPU hold "
                "for its kernel set)")
    # the one set the CPU-trained runs saw (the last invocation's may be a GPU call's, which records none); a
    # manifest written before the list existed: its ``cpu_kernels``
    kernels = sets[0] if sets else manifest.get("cpu_kernels")
    return f"; CPU kernels: {kernels}" if isinstance(kernels, str) else ""


def _threads_text(manifest: dict[str, Any]) -> str:
    """The Machine line's torch thread counts (``torch_thread_counts`` of the manifest: every invocation that trained on
    the CPU) where there were several, else ``""`` (one count, or none recorded: nothing to warn of)."""
    counts = _listed(manifest, "torch_thread_counts", int)
    if len(counts) > 1:
        return (f"; torch threads: {', '.join(map(str, counts))} (runs of this comparison were trained on the CPU "
                f"under {len(counts)} thread counts: a reduction split over another number of threads rounds "
                "otherwise, so a seed's numbers need not match across them)")
    return ""


def _processes_text(manifest: dict[str, Any]) -> str:
    """The Machine line's processes per run (``world_sizes`` of the manifest: torchrun's world size of each
    invocation that trained), or ``""`` where every run was trained by one process (or none is recorded)."""
    sizes = _listed(manifest, "world_sizes", int)
    if len(sizes) > 1:
        return (f"; processes per run: {', '.join(map(str, sizes))} (runs of this comparison were trained by "
                f"{len(sizes)} numbers of processes, with torchrun and without: each rank draws dropout from a stream "
                "of its own and gradients are averaged over ranks, so a seed's numbers need not match across them)")
    return f"; processes per run: {sizes[0]} (torchrun, DDP)" if sizes and sizes[0] > 1 else ""


def _cuda_text(manifest: dict[str, Any]) -> str:
    """The Machine line's GPU: the last invocation's (``cuda``), and every GPU an earlier invocation trained on
    (``cuda_devices`` of the manifest) when it differs (a GPU call's runs, the rest trained on this CPU)."""
    last = manifest.get("cuda") if isinstance(manifest.get("cuda"), str) else None
    gpus = _listed(manifest, "cuda_devices")
    if gpus and gpus != [last]:
        return (f"{', '.join(gpus)} (GPUs of the invocations of `run` that trained this comparison; the last "
                f"ran {'on ' + last if last else 'without CUDA'})")
    return last or "none"


def _torch_text(manifest: dict[str, Any]) -> str:
    """The Versions line's torch: every version that trained the comparison (``torch_versions`` of the manifest)
    when several did (a GPU call's and this machine's), else the one recorded (``torch``)."""
    versions = _listed(manifest, "torch_versions")
    if len(versions) > 1:
        return (f"{', '.join(versions)} (runs of this comparison were trained under {len(versions)} torch versions: "
                "a seed's numbers need not match across them)")
    return str(manifest.get("torch", "?"))


def _commit_line(manifest: dict[str, Any]) -> str:
    """The page's git line: the commit of the last ``run`` invocation, and every earlier one when the
    comparison was trained over several commits (``git_commits`` of :func:`~diffusionformer.experiments.outputs.merged_manifest`)."""
    commit = manifest.get("git_commit")
    if not commit:
        if not manifest:
            return "- **Git commit:** not recorded (this study has no `manifest.json`)"
        if "git_commit" in manifest:  # written by `git_commit()`: None outside a git checkout or without git
            return ("- **Git commit:** not recorded (`run` ran outside a git checkout, or without git: the code "
                    "that trained this study is not identified by a commit)")
        return "- **Git commit:** not recorded (this study's manifest predates the `git_commit` field)"
    commits = _listed(manifest, "git_commits")
    if len(commits) > 1:
        listed = ", ".join(f"`{c}`" for c in commits)
        return (f"- **Git commits:** {listed} (the invocations of `run` that trained this comparison and recorded "
                f"their commit ran at these "
                f"{len(commits)} commits, in this order; the last at `{commit}`)")
    return f"- **Git commit:** `{commit}`"


def publish_experiment(config: ExperimentConfig, out_root: str | Path, docs_dir: str | Path,
                       *, config_path: str | None = None, overrides: list[str] | None = None,
                       imports: list[str] | None = None) -> Path:
    """Write the results page of ``config`` from ``<out_root>/<name>/`` into ``docs_dir``.

    ``overrides``: the ``--set`` values ``config`` was read with (``publish --set ...``): the page's command names
    them, since its description is the config file's (runs made with other train or model values are refused).
    ``imports``: the modules whose registrations the config needs (``publish --import ...``): the page's command
    names them, without which it could not read the config.

    The files of ``<docs_dir>/<name>/`` are copied into ``<docs_dir>/.<name>.publishing/``
    first, which replaces the earlier folder only once complete: a copy that fails half-way
    (a truncated figure, a full disk) leaves the earlier published files as they were. The page
    is made from that copy before it replaces anything, so a failure making it (or writing it)
    leaves the earlier page and files as they were, and an index whose toctree cannot take the
    page is refused before anything is copied. The earlier folder steps aside as
    ``.<name>.previous/`` until the copy has its name and the page is written; a publish killed
    between the two renames has its files put back by the next ``publish``.

    Raises:
        FileNotFoundError: the comparison has no ``results.json`` yet (run it first).
        ValueError: ``<docs_dir>/<name>/`` holds the results folder (``out_root="tiny"``, ``docs_dir="."``): replacing
            it would delete the runs; or finished runs were made with another train or model config than ``config``'s
            (or other data, task settings, model class or default dtype: ``run_status``'s ``changed``; a ``run --set
            ...`` published without the overrides: the page would call them runs of this config); the message names
            what differs and the remedy that fits it. Also a ``results.json`` that is no regular file (a folder, a
            FIFO), or whose rows do not fit (two of one run, another metric than the task's: the config changed); an
            earlier page or an ``index.md`` that is not UTF-8 (named, nothing published).
        ModuleNotFoundError: scipy missing where ``config`` has several seeds (the tables' t tests need it), before
            anything is copied.
    """
    for flag, values in (("overrides", overrides), ("imports", imports)):  # a str would be written a letter each
        if values is not None and (isinstance(values, str) or not all(isinstance(v, str) for v in values)):
            raise TypeError(f"publish_experiment: {flag} must be a list of str, got {values!r}")
    src = Path(out_root) / config.name
    results_path = src / "results.json"
    _check_results_file(results_path)
    if not results_path.is_file():
        # the command the runs are still to be made with: the --import / --set / --out given here, or the hint reruns
        # the config as its file has it (the README's main job: 18 runs, when `--set seeds=[0]` was meant)
        flags = _run_flags(imports, overrides, str(out_root))
        command = f"{shlex.quote(str(config_path)) if config_path else 'CONFIG'}{flags}"  # str: a Path too
        raise FileNotFoundError(
            f"{results_path} not found: run `python -m diffusionformer.experiments run {command}` first"
        )
    docs = Path(docs_dir)
    if _folded(config.name) == "index":  # its page would be docs/index.md (Index.md too, on macOS and Windows)
        raise ValueError(f"publish: a comparison named {config.name!r} would overwrite {docs / 'index.md'}, the index "
                         "of the results pages (file names ignore case on macOS and Windows); rename the comparison "
                         "(its `name`)")
    clash = _folder_twin(docs, config.name, ".md")
    if clash is not None:  # on macOS and Windows (and in a clone of the docs there) one page and folder: overwritten
        raise ValueError(f"publish: {str(docs / clash)!r} is published already, and differs from {config.name!r} only "
                         "in case or in Unicode normalization: on a case-insensitive file system (macOS, Windows) its "
                         "page and folder are this comparison's, which would overwrite them; rename the comparison "
                         "(its `name`)")
    if _toctree_target(config.name) != config.name:  # "x<y>": the page y titled x; "x.md": the page x
        raise ValueError(f"publish: a comparison named {config.name!r} cannot be listed in the toctree of "
                         f"{docs / 'index.md'}: Sphinx reads the entry as the page {_toctree_target(config.name)!r} "
                         "(`sphinx -W` fails, and each publish listed it again); rename the comparison (its `name`) "
                         "without a '<...>' or '.md' at its end")
    dst = docs / config.name
    if dst.resolve() in src.resolve().parents:  # `--out tiny --to .`: docs/tiny, replaced by the copy, holds the runs
        raise ValueError(f"publish: the published folder {str(dst)!r} (the comparison's name under --to) holds its "
                         f"results {str(src)!r} (--out); replacing it with the published files would delete every "
                         "run; publish --to another folder")
    # a finished run made with another train or model config than this one's (run with --set, published without): the
    # page would call it a run of this config, whose budget its description states; `status` counts it as not completed
    changed = _runs_of_another_train(config, out_root, verb="publish")
    if changed:
        raise ValueError(f"publish: {changed}")
    _require_scipy(len(config.seeds), "nothing was published")  # the tables' t tests: not once the files are copied
    runs = _load_runs(config, src)  # select_by evaluations of older results are picked from the run logs
    _warn_unfinished(config, runs)
    manifest = _read_manifest(src / "manifest.json")
    in_place = dst.resolve() == src.resolve()  # regenerate the page from the published files
    analysis = src / "analysis"
    _warn_unanalysed(runs, analysis / "metrics.json", src)
    page, index = docs / f"{config.name}.md", docs / "index.md"
    if index.is_file():  # a toctree it cannot be added to: refused before anything is copied
        _with_entry(_read_page(index), config.name, index)
    folder = dst  # where the page's files are found while it is made
    if not in_place:  # copied into a folder beside it that replaces it once whole: a failure keeps the earlier files
        stage, previous = docs / f".{config.name}.publishing", docs / f".{config.name}.previous"
        if previous.exists() and not dst.exists():  # a publish killed between its two renames: put the files back
            previous.rename(dst)
        for left in (stage, previous):  # left by a publish that failed
            _remove(left)
        folder = stage
    try:
        if not in_place:
            _copy_files(src, stage, runs)
        # the page is made from the copied files before they replace the published ones: a failure making it (a
        # table, a figure's name, a broken install) leaves the earlier page and files as they were
        text = _page_text(config, runs, manifest, folder, analysis, config_path, overrides, imports)
        tail = _kept_tail(_read_page(page)) if page.is_file() else ""
        text = text + ("\n" + tail if tail else "")
    except BaseException:
        if not in_place:
            shutil.rmtree(stage, ignore_errors=True)
        raise
    if in_place:
        write_text_atomic(page, text)  # the hand-written tail survives a failed write
    else:
        # two renames, never a moment without the published files: the earlier folder steps aside (kept under
        # a hidden name until the new one is in place), the complete copy takes its name, then the page is
        # replaced; a failure in between puts the earlier folder back (its page was not touched)
        had = dst.exists()
        if had:
            dst.rename(previous)
        moved = False
        try:
            stage.rename(dst)
            moved = True
            write_text_atomic(page, text)  # the hand-written tail survives a failed write
        except BaseException:
            if moved:
                dst.rename(stage)
            if had and previous.exists() and not dst.exists():
                previous.rename(dst)
            _remove(stage, ignore_errors=True)
            raise
        _remove(previous, ignore_errors=True)
    if index.is_file():
        add_to_toctree(index, config.name)
    else:
        warnings.warn(f"{index} not found: add {page.name} to a toctree, or `sphinx -W` fails "
                      "(\"document isn't included in any toctree\")", RuntimeWarning, stacklevel=2)
    return page


def _warn_unfinished(config: ExperimentConfig, runs: list[RunResult]) -> None:
    """Warn, naming them, of the runs of ``config`` that did not finish (a GPU call cut by its budget, a call left
    out, seeds the config lists that were not run): the page only counted them ("24 of 50 finished") and publish
    said nothing, though the paired tests then rest on fewer seeds than planned."""
    done = {(r.task, r.operator, r.seed) for r in runs if r.status == "completed"}
    left = [(t.name, o.name, s) for t in config.tasks for o in config.operators for s in config.seeds
            if (t.name, o.name, s) not in done]
    if left:
        expected = len(config.tasks) * len(config.operators) * len(config.seeds)
        warnings.warn(f"publish: {len(left)} of {expected} runs of {config.name!r} not finished ({_named(left)}): the "
                      "page compares the seeds both settings finished; `status` lists every run (run the missing ones, "
                      "or publish with --set seeds=[...] for the seeds that ran)", RuntimeWarning,
                      stacklevel=user_stacklevel())


def _warn_unanalysed(runs: list[RunResult], path: Path, src: Path) -> None:
    """Warn, naming them, of the finished runs that the token-geometry analysis ``path`` (its ``metrics.json``) did
    not measure (but in the tasks it could not analyse, ``skipped_tasks``): an ``analyze --partial`` made while the
    comparison was being run, whose tables the page would show, fewer settings or seeds than the page's own tables,
    with nothing saying so. The runs of ``src`` (the comparison's folder) that ``analyze`` cannot measure there
    (neither their checkpoint nor an analysis cache: an archive packed without checkpoints) are named as such."""
    data = read_json_dict(path)
    tasks = data.get("tasks") if data is not None else None
    if not isinstance(tasks, dict):
        return
    # an entry of another type (a hand edit) measured nothing: else an AttributeError of ``.items()`` on a list
    measured = {(t, o, str(s)) for t, entry in tasks.items() if isinstance(entry, dict)
                for o, setting in _dict(entry.get("operators")).items() if isinstance(setting, dict)
                for s in _dict(setting.get("seeds"))}
    unanalysable = _dict(data.get("skipped_tasks"))
    done = [r for r in runs if r.status == "completed" and r.task not in unanalysable]
    left = [r for r in done if (r.task, r.operator, str(r.seed)) not in measured]
    if left:
        from diffusionformer.experiments.analyze import _CACHE_NAME, _run_state

        lost = [r for r in left if _run_state(rdir := run_dir(src, r.task, r.operator, r.seed)) == "weightless"
                and not (rdir / _CACHE_NAME).is_file()]
        lost_text = ("" if not lost else f"; {_named(lost)} cannot be measured here: neither their checkpoint nor an "
                     "analysis cache is in their run folder (a results archive packed without checkpoints): `analyze` "
                     "them where their checkpoints are")
        warnings.warn(f"publish: the token-geometry analysis {str(path)!r} measured {len(done) - len(left)} of the "
                      f"{len(done)} finished runs (it was made before {_named(left)} finished, or with other --set "
                      "overrides); its tables on the page leave them out: `analyze` the comparison again first"
                      f"{lost_text}", RuntimeWarning, stacklevel=user_stacklevel())


def _dict(value: Any) -> dict[Any, Any]:
    """``value`` where it is a dict (a JSON object), else ``{}``."""
    return value if isinstance(value, dict) else {}


def _named(runs: list[Any]) -> str:
    """The first six of ``runs`` (``(task, setting, seed)`` or :class:`RunResult`), ``'task' / 'setting' seed N`` each,
    for a message."""
    keys = [(r.task, r.operator, r.seed) if isinstance(r, RunResult) else r for r in runs]
    return ", ".join(f"{t!r} / {o!r} seed {s}" for t, o, s in keys[:6]) + (", ..." if len(keys) > 6 else "")


def _wall_time_split(runs: list[RunResult]) -> str:
    """``""`` when the timed runs trained on one device kind (and GPU model); else the total per kind, per GPU model
    where the runs record it, e.g. ``", of which 10.0 min on cpu, 2.0 min on cuda"`` or ``", of which 3.0 min on
    NVIDIA H100 80GB HBM3, 2.0 min on NVIDIA H200"``: the sum in all adds the minutes of devices of different
    speeds."""
    totals = _elapsed_by_device(runs)
    if totals is None:
        return ""
    return ", of which " + ", ".join(f"{total / 60:.1f} min on {_text(k)}" for k, (total, _) in totals.items())


def _default_dtype_line() -> list[str]:
    """The page's line naming torch's default dtype where it is not float32, else none. Every run a page publishes
    was built at this process's default dtype (its identity records it, and ``run_status`` counts a run of another
    one as changed): the page's command alone, in a fresh float32 process, trains other runs."""
    import torch

    dtype = torch.get_default_dtype()
    if dtype == torch.float32:
        return []
    name = str(dtype).removeprefix("torch.")
    return [f"- **Default dtype:** {name}: the runs were built after `torch.set_default_dtype(torch.{name})` "
            f"(give the command a module that sets it with `--import`); the command alone trains float32 runs"]


def _page_text(config: ExperimentConfig, runs: list[RunResult], manifest: dict[str, Any], folder: Path,
               analysis: Path, config_path: str | None, overrides: list[str] | None = None,
               imports: list[str] | None = None) -> str:
    """The results page of ``config`` (without the kept tail), its figures and logs those in ``folder`` (the
    published files, or their copy that is about to replace them), the geometry tables those of ``analysis``."""
    logs = sorted((folder / "logs").rglob("*.json")) if (folder / "logs").is_dir() else []

    table = aggregate(runs)
    total = sum(r.elapsed or 0.0 for r in runs)
    done = sum(1 for r in runs if r.status == "completed")
    expected = len(config.tasks) * len(config.operators) * len(config.seeds)
    lines = [
        f"# {_text(config.name)}",
        "",
        config.description.strip(),
        "",
        # the --set overrides the runs were made with (publish refuses other train or model values): without them the
        # page called toy runs (`--set max_steps=6`) runs of the config its description states
        "- **Command:** " + _code(f"python -m diffusionformer.experiments run {config_path or '<config>'}"
                                  + _run_flags(imports, overrides))
        + " (add `--data-root <root>` for standard benchmarks), then `publish` with the same config"
        + (" and `--import` modules" if imports else "")
        + (" and overrides (the description above is the config file's, before them)" if overrides else ""),
        f"- **Config:** `{config_path}`" if config_path else "- **Config:** see `manifest.json`",
        f"- **Runs:** {done} of {expected} finished (tasks x operator settings x seeds {config.seeds})",
        *([f"- **Cross-validation:** {', '.join(t.name for t in config.tasks if t.folds)}: seed s tests on fold "
           f"s % folds of a stratified partition, trains and selects on the other folds; means and "
           f"spreads are over folds; comparisons are paired over folds with the Nadeau-Bengio correction"]
          if any(t.folds for t in config.tasks) else []),
        f"- **Machine:** {manifest.get('cpu_model') or manifest.get('processor', '?')}, "
        f"{manifest.get('cpu_count', '?')} CPUs, {manifest.get('machine', '?')}; CUDA: {_cuda_text(manifest)}"
        f"{_kernels_text(manifest)}{_threads_text(manifest)}{_processes_text(manifest)}",
        f"- **Versions:** torch {_torch_text(manifest)}, diffusionformer {manifest.get('diffusionformer', '?')}, "
        f"Python {manifest.get('python', '?')}",
        *_default_dtype_line(),
        _commit_line(manifest),
        f"- **Training wall time:** {total / 60:.1f} min in all{_wall_time_split(runs)} (per-run times in the tables)",
        f"- **Per-run metric logs:** {len(logs)} files, {_code(config.name + '/logs/<task>/<operator>/seed<k>.json')} "
        "(training and evaluation records by step)" if logs else
        # no run finished: no log to publish (not one published before `publish` copied logs)
        "- **Per-run metric logs:** none yet (no run of this study has finished)" if not done else
        "- **Per-run metric logs:** not published for this study (it was published before `publish` copied them, "
        "and its raw results folder is not kept); the curve figures show mean ± std over seeds",
        f"- **Primary contrasts:** {_primary_line(config)}",
        "",
        "Tables give the mean ± sample standard deviation over seeds of the final evaluation (after the last step; "
        "no early stopping) and each setting's difference to the first one, paired over seeds (a seed fixes the "
        "initial weights, the batches and the dropout of every setting; a model with differential heads draws their "
        "lambda vectors first, so its other weights start elsewhere); the legend under the tables says what "
        "each column is."
        " Where a task names `select_by`, a second table gives the metric at each run's evaluation with the best "
        "value of that key."
        + (" Where a task names `reach`, a table gives the first evaluated step at which each run met that "
           "threshold: mean ± std over the runs that did (k of n), compared only where every run of both settings "
           "did." if any(t.reach for t in config.tasks) else ""),
        "",
        format_table(table, config).replace("### ", "## "),
    ]
    for task in config.tasks:
        for kind, caption in (("curves", "training loss and headline metric (mean ± std over seeds)"),
                              ("final", "final metric per setting (dots: seeds)")):
            png = folder / "plots" / f"{task.name}_{kind}.png"
            if png.is_file():
                lines += [_image(f"{task.name}: {caption}", f"{config.name}/plots/{png.name}"), ""]
    analysis_pngs = sorted((folder / "analysis").glob("*.png")) if (folder / "analysis").is_dir() else []
    if analysis_pngs:
        linked = re.sub(r"([()])", r"\\\1", config.name)  # a ( or ) of the name would end the link
        lines += ["## Token geometry", "",
                  f"From `python -m diffusionformer.experiments analyze {config_path or '<config>'}`; "
                  f"numbers in [`metrics.json`]({linked}/analysis/metrics.json). The t in these tables is "
                  "Welch's, unpaired and not adjusted for the many metrics and layers: read them as exploratory.", ""]
        readme = analysis / "README.md"
        if readme.is_file():  # the geometry tables (mean ± std, Welch t), headings one level down
            try:
                body = readme.read_text(encoding="utf-8")
            except UnicodeDecodeError as exc:  # else a bare "'utf-8' codec can't decode", naming no file
                raise ValueError(f"{readme}: not UTF-8 text ({exc}); `analyze` the comparison again to rewrite "
                                 "it") from None
            body = body.split("\n", 1)[1] if body.startswith("# ") else body
            lines += [body.replace("\n## ", "\n### ").strip(), ""]
        lines += [_image(p.stem, f"{config.name}/analysis/{p.name}") + "\n" for p in analysis_pngs]
    return "\n".join(lines).rstrip() + "\n"


def _remove(path: Path, *, ignore_errors: bool = False) -> None:
    """Remove a folder left by :func:`publish_experiment`; a symlink (the published folder was a link to a folder
    elsewhere, which then stepped aside as ``.<name>.previous``) is unlinked, never followed nor refused as
    ``shutil.rmtree`` refuses it."""
    if path.is_symlink():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path, ignore_errors=ignore_errors)


def _copy_files(src: Path, dst: Path, runs: list[RunResult]) -> None:
    """Copy the small files of the comparison in ``src`` into ``dst`` (made): results, manifest, figures, analysis
    and one log per run of ``runs``."""
    results_path, analysis = src / "results.json", src / "analysis"
    dst.mkdir(parents=True)
    stored = {(r.get("task"), r.get("operator"), r.get("seed")) for r in json.loads(results_path.read_text())["runs"]}
    if stored == {(r.task, r.operator, r.seed) for r in runs}:
        _copy(results_path, dst / "results.json")
    else:  # results.json holds runs outside the config (parts run with --set) or misses some: the page's runs
        write_json_atomic(dst / "results.json", {"runs": [r.__dict__ for r in runs], "summary": aggregate(runs)})
    _copy(src / "manifest.json", dst / "manifest.json")
    for png in sorted((src / "plots").glob("*.png")):
        _copy_png(png, dst / "plots" / png.name)
    _copy(analysis / "metrics.json", dst / "analysis" / "metrics.json")
    _copy(analysis / "README.md", dst / "analysis" / "README.md")
    for png in sorted((analysis / "plots").glob("*.png")):
        _copy_png(png, dst / "analysis" / png.name, drawn_by="analyze")
    for r in runs:
        log = run_dir(src, r.task, r.operator, r.seed) / "metrics.jsonl"
        if log.is_file():
            write_run_log(read_curves(log.parent), _run_log_path(dst, r.task, r.operator, r.seed))


def add_to_toctree(index: str | Path, entry: str) -> bool:
    r"""Add ``entry`` to the first ``{toctree}`` of the MyST page ``index``, once.

    ``publish`` calls it for ``<docs_dir>/index.md`` so that a new results page is part of the
    docs tree and ``sphinx -W`` keeps passing. An entry already listed (``name`` or
    ``name.md``) is left alone; a page without a toctree gets a hidden one at its end.

    Args:
        index: the MyST markdown page holding the toctree.
        entry: the document name relative to ``index``'s folder, without suffix.

    Returns:
        Whether the file was changed.

    Examples:
        >>> import tempfile
        >>> page = Path(tempfile.mkdtemp()) / "index.md"
        >>> _ = page.write_text("# Results\n\n```{toctree}\n:maxdepth: 1\n\nbaselines\n```\n")
        >>> add_to_toctree(page, "default"), add_to_toctree(page, "default")
        (True, False)
        >>> print(page.read_text())
        # Results
        <BLANKLINE>
        ```{toctree}
        :maxdepth: 1
        <BLANKLINE>
        baselines
        default
        ```
        <BLANKLINE>
    """
    path = Path(index)
    text = _with_entry(_read_page(path), entry, path)
    if text is None:
        return False
    write_text_atomic(path, text)
    return True


def _with_entry(text: str, entry: str, path: Path) -> str | None:
    """The index page ``text`` (of ``path``) with ``entry`` added to its first toctree, ``None`` when listed already;
    a ``ValueError`` when its toctree is not closed."""
    lines = text.split("\n")
    start = next((i for i, line in enumerate(lines) if re.match(r"^(`{3,}|:{3,})\{toctree\}", line.strip())), None)
    if start is None:
        return text.rstrip("\n") + f"\n\n```{{toctree}}\n:hidden:\n\n{entry}\n```\n"
    fence = re.match(r"^(`{3,}|:{3,})", lines[start].strip()).group(1)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].strip() == fence), None)
    if end is None:
        raise ValueError(f"{path}: expected a closing {fence} for the toctree opened on line {start + 1}, got none")
    listed = {_toctree_target(line) for line in lines[start + 1:end] if line.strip() and not line.strip().startswith(":")}
    if entry in listed:
        return None
    lines.insert(end, entry)
    return "\n".join(lines)


def _toctree_target(line: str) -> str:
    """The document a toctree line names: ``name``, ``name.md`` or ``Title <name>`` (Sphinx's titled entry)."""
    line = line.strip()
    titled = re.fullmatch(r".*<([^<>]+)>", line)
    return (titled.group(1).strip() if titled else line).removesuffix(".md")


def _code(text: str) -> str:
    """``text`` as a markdown code span: fenced by one backtick more than its longest run of them (a name holding a
    backtick closed a one-backtick span early), padded where it starts or ends with one.

    Examples:
        >>> _code("lap"), _code("a`b")
        ('`lap`', '``a`b``')
    """
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _primary_line(config: ExperimentConfig) -> str:
    if len(config.operators) == 1:
        return "none (one setting: nothing is compared)"
    if config.primary:
        words = config._primary_quantities_text()
        on = f", on the {words}" if words else ""
        return (", ".join(_code(p) for p in config.primary) + f" against the first setting{on}, named in the config "
                "before it ran; every other comparison is exploratory")
    return ("none were named before this study ran, so every comparison on this page is exploratory: a p below 0.05 "
            "here suggests where to look, it does not establish an effect")


def _run_log_path(root: Path, task: str, setting: str, seed: int) -> Path:
    """Where ``publish`` writes the log of run ``(task, setting, seed)`` in a published folder ``root``."""
    return root / "logs" / task / setting / f"seed{seed}.json"


def read_run_log(path: str | Path) -> list[dict[str, Any]]:
    """The records of a log written by :func:`write_run_log` (its inverse, up to its rounding to 9 significant digits; a
    metric named like one of its columns, such as an evaluation's ``loss``, is that column).

    Args:
        path: a ``seed<k>.json`` log of ``publish``.

    Returns:
        The records in step order: ``{"split", "step", "loss", "lr", "elapsed", "metrics"}`` (absent keys left out).

    Raises:
        ValueError: the file is not JSON or not columns of equal length with integer steps (its path named).

    Examples:
        >>> import tempfile, pathlib
        >>> recs = [{"split": "eval", "step": 2, "loss": 1.4, "metrics": {"val_acc": 0.5}}]
        >>> read_run_log(write_run_log(recs, pathlib.Path(tempfile.mkdtemp()) / "seed0.json"))
        [{'split': 'eval', 'step': 2, 'loss': 1.4, 'metrics': {'val_acc': 0.5}}]
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:  # RecursionError: nested thousands deep
        raise ValueError(f"{path}: not a run log written by publish (not JSON: {exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a run log written by publish (expected an object of splits)")
    other = sorted(str(k) for k in data if k not in ("train", "eval"))
    if other:  # another JSON file ({"runs": ...}, a config) read as a log of no records
        raise ValueError(f"{path}: not a run log written by publish (expected the splits 'train' and 'eval', got "
                         f"{other[:5]})")
    records: list[dict[str, Any]] = []
    for split in ("train", "eval"):
        cols = data.get(split)
        if cols is None:
            continue
        lengths = {len(v) for v in cols.values() if isinstance(v, list)} if isinstance(cols, dict) else set()
        if (not isinstance(cols, dict) or len(lengths) != 1 or not all(isinstance(v, list) for v in cols.values())
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in cols.get("step", [None]))):
            raise ValueError(f"{path}: split {split!r} is not columns of equal length with integer steps")
        for i in range(len(cols["step"])):
            rec: dict[str, Any] = {"split": split}
            rec.update({k: cols[k][i] for k in ("step", "loss", "lr", "elapsed") if k in cols and cols[k][i] is not None})
            rec["metrics"] = {k: v[i] for k, v in cols.items() if k not in ("step", "loss", "lr", "elapsed")
                              and v[i] is not None}
            records.append(rec)
    return sorted(records, key=lambda r: r.get("step", 0))


def write_run_log(records: list[dict[str, Any]], path: str | Path) -> Path:
    """Write a run's metrics log as a small column-wise JSON file: ``{"train": {...}, "eval": {...}}``.

    Each split maps ``step``, ``loss``, ``lr``, ``elapsed`` and every metric name to a list
    with one entry per record of that split (``None`` where a record lacks the key). Floats keep 9
    significant digits (every float32 value exactly), so statistics recomputed from the
    published logs (``gaps``) agree with those of the run folders to about 9 digits (rounded to 6
    decimals, a p value of 0.02650 read 0.02649 and printed 0.026 against 0.027).

    Examples:
        >>> import json, tempfile, pathlib
        >>> recs = [{"split": "train", "step": 2, "loss": 1.5, "lr": 0.1, "metrics": {}},
        ...         {"split": "eval", "step": 2, "loss": 1.4, "metrics": {"val_acc": 0.5}}]
        >>> p = write_run_log(recs, pathlib.Path(tempfile.mkdtemp()) / "seed0.json")
        >>> json.loads(p.read_text())["eval"]
        {'step': [2], 'loss': [1.4], 'lr': [None], 'elapsed': [None], 'val_acc': [0.5]}
    """
    out: dict[str, dict[str, list[Any]]] = {}
    for split in ("train", "eval"):
        recs = [r for r in records if r.get("split") == split]
        if not recs:
            continue
        keys = ["step", "loss", "lr", "elapsed"] + sorted({k for r in recs for k in r.get("metrics", {})})
        cols: dict[str, list[Any]] = {}
        for k in keys:
            vals = [r.get(k) if k in ("step", "loss", "lr", "elapsed") else r.get("metrics", {}).get(k) for r in recs]
            # strict JSON (as every run file): a NaN or infinite value (a diverged loss) is null, as in metrics.jsonl
            cols[k] = [(float(f"{v:.9g}") if math.isfinite(v) else None) if isinstance(v, float) else v for v in vals]
        out[split] = cols
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(out, separators=(",", ":"), allow_nan=False))
    return path


def _stored_runs(results_path: Path) -> list[RunResult]:
    """The runs recorded in ``results.json``; a ValueError naming the file when it is not one (truncated, edited,
    foreign). A completed run whose metric was NaN or inf is written with ``null`` (JSON has no NaN): it is read
    back as NaN, so the tables still count it as non-finite instead of leaving the seed out unsaid."""
    try:
        rows = json.loads(results_path.read_text())["runs"]
        runs = [RunResult(**row) for row in rows]
        # a hand-edited "0.5", true or 400-digit value: named here, not a bare "must be real number, not str" (or a
        # traceback) from the tables, nor a true averaged as 1.0
        bad = next(((i, why) for i, why in enumerate(map(_row_problem, rows)) if why), None)
        if bad is not None:
            raise ValueError(f"run {bad[0]} of 'runs': {bad[1]}")
        first: dict[tuple[str, str, int], int] = {}  # a run's two rows (edited, merged by hand): else the last one won
        for i, r in enumerate(runs):
            j = first.setdefault((r.task, r.operator, r.seed), i)
            if j != i:
                raise ValueError(f"run {i} of 'runs' is a second row of {r.task!r} / {r.operator!r} seed {r.seed} "
                                 f"(run {j} is the first): which one holds its result cannot be told")
    except (ValueError, KeyError, TypeError, RecursionError) as exc:  # RecursionError: arrays nested thousands deep
        raise ValueError(f"{results_path} is not a results file of a comparison ({type(exc).__name__}: {exc}); "
                         "`run` the comparison again to rewrite it from its finished runs") from None
    for r in runs:
        if (r.status == "completed" and r.value is None and isinstance(r.final, dict) and r.metric in r.final
                and r.final[r.metric] is None):
            r.value = math.nan
    return runs


def _load_runs(config: ExperimentConfig, src: Path) -> list[RunResult]:
    """The runs of ``config`` in ``results.json`` (and finished on disk but not in it), with ``select_by``
    evaluations and ``reach`` steps recomputed from the run logs where missing. A completed row whose run was started
    again and has not finished (a run being retrained) is left out, as ``run`` leaves it out of the next
    ``results.json``.

    Rows of other tasks, settings or seeds are left out: the page shows what its config names. A run without its
    run folder (``src`` is a published folder: its raw results are not kept) is read from the log ``publish`` wrote.
    """
    stored = _stored_runs(src / "results.json")
    tasks = {t.name: t for t in config.tasks}
    settings, seeds = {o.name for o in config.operators}, set(config.seeds)
    # a row of another metric (the task's `metric` changed in the config since): else tabulated under the new name
    other = next((r for r in stored if r.task in tasks and r.operator in settings and r.seed in seeds
                  and r.metric != tasks[r.task].metric), None)
    if other is not None:  # run with a --set of the metric not given here, or the config changed since
        flag = _set_of(other.task, _Change("metric", other.metric)) or f"--set tasks.{other.task}.metric=..."
        raise ValueError(f"{src / 'results.json'}: the row of {other.task!r} / {other.operator!r} seed {other.seed} "
                         f"holds the metric {other.metric!r}, but task {other.task!r} of the config has the metric "
                         f"{tasks[other.task].metric!r}: runs made with `{flag}`, give it here too; else (the "
                         "config changed since the runs) `run` the comparison again to rewrite results.json with it "
                         "from the finished runs")
    # a completed row of a run started again (its run_config.json written) and not finished since (`run --restart`
    # stopped while retraining it): the discarded run's numbers beside the new run's partial log, where `status`
    # says interrupted; `run` leaves it out when it next writes results.json
    stored = [r for r in stored if not (r.status == "completed" and r.task in tasks and r.operator in settings
                                        and r.seed in seeds and _retraining(run_dir(src, r.task, r.operator, r.seed)))]
    runs = finished_runs(src, config, stored)
    for r in runs:
        task = tasks.get(r.task)
        if task is None or r.status != "completed":
            continue
        need_select = task.select_by is not None and r.selected_value is None
        need_reach = task.reach is not None and r.reach_step is None
        if not (need_select or need_reach):
            continue
        rdir = run_dir(src, r.task, r.operator, r.seed)
        published = _run_log_path(src, r.task, r.operator, r.seed)
        # one read of the run's log for both; publishing in place (the docs folder has no run folders) reads the log
        # publish wrote there, else the tables of a select_by or reach named after the runs vanished from the page
        curves = (read_run_log(published) if not (rdir / "metrics.jsonl").is_file() and published.is_file()
                  else read_curves(rdir))
        if need_select:
            r.selected_value, r.selected_step = select_evaluation(curves, task)
        if need_reach:
            r.reach_step = first_reach(curves, task)
    return runs


def _retraining(rdir: Path) -> bool:
    """Whether the run folder ``rdir`` holds a run started (its ``run_config.json`` is written first) but not finished
    (no completed ``summary.json``: a restart removes it first)."""
    return (rdir / "run_config.json").is_file() and not _completed(rdir)


def _setting_definition(config: ExperimentConfig, setting: Any) -> str:
    """``setting``'s definition in ``config`` as the model it builds (``summary``'s column key): ``norm``, ``mlp`` and
    the head specs as the configs read them (``"SwiGLU"`` is ``"swiglu"``, ``"Attention:2, I-P:2"`` is
    ``"attention:2,laplacian:2"``), and a later-added model field at its default
    (:data:`~diffusionformer.experiments.results._NEW_MODEL_FIELDS`: ``mlp = "gelu"``; ``rope_base`` at the tasks'
    models' own default) as absent, as a run's identity has them, unless a task of ``config`` sets that field otherwise
    (where ``mlp = "gelu"`` changes the model)."""
    from diffusionformer.experiments.results import _NEW_MODEL_FIELDS, _new_model_fields, _without_new_defaults
    from diffusionformer.nn.block import _names_as_read
    from diffusionformer.nn.heads import _layout_as_read

    overrides = setting.model_overrides
    if isinstance(overrides, dict):
        overrides = _names_as_read(overrides)
        # each task's model's defaults (rope_base: GPT's 10000, the ViT's 100; either for both put a GPT at 100 and
        # one at 10000 in one column)
        defaults = [_new_model_fields(task.model) for task in config.tasks] or [_NEW_MODEL_FIELDS]
        # the later-added fields a task sets to another value than their default
        set_by_tasks = {k for task, new in zip(config.tasks, defaults) if isinstance(task.model_overrides, dict)
                        for k in _without_new_defaults(_names_as_read(task.model_overrides), new) if k in new}
        # a field at the default of every task's model is absent; one whose default differs between them is kept
        new = {k: v for k, v in defaults[0].items() if k not in set_by_tasks and all(d[k] == v for d in defaults)}
        overrides = _without_new_defaults(overrides, new)
    return json.dumps([_layout_as_read(setting.heads), setting.laplacian_heads, overrides], sort_keys=True, default=str)


def summary_table(configs: list[ExperimentConfig], out_root: str | Path, *, selected: bool = False,
                  alpha: float = 0.05, strong: float | None = None) -> str:
    r"""One markdown table over several comparisons: each setting against the baseline, per task.

    A cell is ``Δ (p; Holm p)``: the mean over seeds of the paired difference to the config's
    first setting (:func:`~diffusionformer.experiments.paired_difference`; Nadeau-Bengio
    corrected for tasks with ``folds``), signed so that **positive is better** (loss
    differences are negated), its two-sided p and the p adjusted by Holm's method over every
    cell of the table. Cells whose Holm p is below ``alpha`` are bold; contrasts a config names
    in ``primary`` are marked ``[primary]`` on the quantities of its ``primary_quantities`` (exploratory
    otherwise, as on the comparison's page). A last line counts the cells below ``alpha``
    unadjusted, after Holm and after Benjamini-Hochberg. Tasks without finished runs are left
    out; a cell with fewer seeds than the config asks for says how many it has, and a setting whose runs all failed
    keeps its cell (``n/a``, counted as ``p = 1`` in the family, as on the comparison's page). A setting name that two
    comparisons define differently (another head layout or ``model_overrides``) gets a column per definition,
    headed with the comparisons that define it; ``norm``, ``mlp`` and head specs are compared as the configs read
    them (``"SwiGLU"`` is ``"swiglu"``, ``"Attention:2, I-P:2"`` is ``"attention:2,laplacian:2"``), and a
    later-added model field at its default as absent.

    Args:
        configs: the comparisons (their results under ``<out_root>/<name>/``).
        out_root: the results root given to ``run``.
        selected: compare the metric at each run's best ``select_by`` evaluation instead of
            the final one (tasks without ``select_by`` keep the final metric).
        alpha: level for the bold cells and the counts, in (0, 1]; each p is printed with the digits that keep it
            on its side of alpha.
        strong: no longer used (cells were bold from a fixed ``|t|``); passing it warns.

    Raises:
        ValueError: two configs of one name (one results folder: its contrasts would count twice); an
            ``alpha`` outside (0, 1]; a ``results.json`` that is no regular file (a folder, a FIFO).
        FileNotFoundError: none of the comparisons has a ``results.json`` under ``out_root``.
    """
    from diffusionformer.experiments.compare import _format_p, format_signed
    from diffusionformer.experiments.stats import benjamini_hochberg, compare_rows, holm

    if isinstance(alpha, bool) or not (isinstance(alpha, numbers.Real) and 0.0 < alpha <= 1.0):
        raise ValueError(f"alpha must be a probability in (0, 1], e.g. 0.05; got {alpha!r}")
    if strong is not None:
        warnings.warn("summary_table(strong=...) is ignored: cells are judged by their Holm-adjusted p (alpha)",
                      DeprecationWarning, stacklevel=2)
    names = [c.name for c in configs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:  # one folder read twice: its rows repeated, and Holm's family counting each contrast twice
        raise ValueError(f"summary: comparison(s) {twice} given more than once (configs of one name share the results "
                         f"folder <out>/<name>); give each comparison once")
    for c in configs:
        _check_results_file(Path(out_root) / c.name / "results.json")
    if configs and not any((Path(out_root) / c.name / "results.json").is_file() for c in configs):
        raise FileNotFoundError(f"summary: no results under {str(out_root)!r} for {names} (looked for "
                                f"{', '.join(str(Path(out_root) / n / 'results.json') for n in names)}); "
                                "run the comparisons first, or pass the --out they were run with")
    # a column per setting name and definition: one name defined differently by two comparisons (another head layout
    # or model_overrides) gets a column each, labelled with the comparisons that define it so
    settings: list[tuple[str, str]] = []
    defined_in: dict[tuple[str, str], list[str]] = {}
    rows: list[tuple[str, str, dict[tuple[str, str], Any]]] = []
    for config in configs:
        src = Path(out_root) / config.name
        if not (src / "results.json").is_file():
            continue
        # warned, not refused (publish refuses): the cells are those runs' numbers, under this config's name, with the
        # remedy publish names (summary takes --set too, applied to every config)
        changed = _runs_of_another_train(config, out_root, verb="run `summary`")
        if changed:
            warnings.warn(f"summary: {changed}; as it is, this table shows their numbers", UserWarning, stacklevel=2)
        table = {(row["task"], row["operator"]): row for row in aggregate(_load_runs(config, src))}
        baseline = config.operators[0].name
        primary = config.primary_contrasts()
        quantities = config.primary_quantities
        for task in config.tasks:
            use_selected = selected and task.select_by is not None
            key_values, key_mean = ("selected_values", "selected_mean") if use_selected else ("values", "mean")
            rows_of = {o.name: table.get((task.name, o.name), {}) for o in config.operators}
            base_row = rows_of[baseline]
            if not base_row.get(key_values):
                continue
            sign = -1.0 if task.minimize else 1.0
            cells: dict[tuple[str, str], Any] = {}
            for setting in config.operators[1:]:
                row = rows_of[setting.name]
                # a setting with no runs yet has no cell; one whose runs all failed keeps its cell (n/a, p = 1 in the
                # family), as on its page (compare.contrasts): dropping it shrank Holm's family and hid the failure
                if not row:
                    continue
                column = (setting.name, _setting_definition(config, setting))
                if column not in settings:
                    settings.append(column)
                if config.name not in defined_in.setdefault(column, []):
                    defined_in[column].append(config.name)
                diff = compare_rows(row, base_row, key_values, folds=task.folds)
                short = ""
                na, nb = len(row.get(key_values) or []), len(base_row[key_values])
                if na < len(config.seeds) or nb < len(config.seeds):
                    # seeds 0, 1, 2 against 1, 2, 3: "3 vs 3" hides that Δ and p rest on the 2 seeds both have
                    paired = f", {diff.n} paired" if diff.method != "Welch" and diff.n < min(na, nb) else ""
                    short = f" [{na} vs {nb} seeds{paired}]"
                # primary only on the quantities the config named (primary_quantities): the best-validation cell of
                # a study that named the final metric is exploratory, as on its page
                named = (task.name, setting.name) in primary and ("selected" if use_selected else "final") in quantities
                cells[column] = {"delta": None if diff.mean is None else sign * diff.mean, "p": diff.p,
                                       "primary": named, "short": short}
            metric = task.metric + (f" at best {task.select_by}" if selected and task.select_by else "")
            rows.append((f"{_text(config.name)} / {_text(task.name)}", f"{_text(metric)} ({base_row[key_mean]:.4f})", cells))
    family = [c for _, _, cells in rows for c in cells.values()]
    for c, ph, pb in zip(family, holm([c["p"] for c in family]), benjamini_hochberg([c["p"] for c in family])):
        c["holm"], c["bh"] = ph, pb

    def text(c: dict[str, Any]) -> str:
        out = f"{format_signed(c['delta'])} (p {_format_p(c['p'], alpha)}; Holm {_format_p(c['holm'], alpha)})"
        if c["holm"] is not None and c["holm"] < alpha:
            out = f"**{out}**"
        return out + (" [primary]" if c["primary"] else "") + c["short"]

    # one cell per setting (none for a comparison of one setting: the header keeps the separator's two columns)
    def label(column: tuple[str, str]) -> str:
        if sum(1 for other in settings if other[0] == column[0]) == 1:
            return column[0]
        return f"{column[0]} ({', '.join(defined_in[column])})"

    lines = ["| task | metric (baseline mean) |" + "".join(f" {_cell(_text(label(s)))} |" for s in settings),
             "|---|---|" + "---|" * len(settings)]
    lines += [f"| {_cell(name)} | {_cell(metric)} |" + "".join(f" {text(cells[s]) if s in cells else ''} |" for s in settings)
              for name, metric, cells in rows]
    below = sum(1 for c in family if c["p"] is not None and c["p"] < alpha)
    lines += ["", f"{len(family)} comparison{'' if len(family) == 1 else 's'}; p < {alpha:g} unadjusted: {below}; after Holm: "
              f"{sum(1 for c in family if c['holm'] is not None and c['holm'] < alpha)}; after Benjamini-Hochberg: "
              f"{sum(1 for c in family if c['bh'] is not None and c['bh'] < alpha)}."]
    return "\n".join(lines) + "\n"
