"""Command line of the experiment runner: ``python -m diffusionformer.experiments`` (or ``diffusionformer``).

Commands:
    run CONFIG [--set key=value ...]   train every run of a comparison (resumes), print the table;
                                       [--tasks T ...] trains only some tasks; a second ``run`` of
                                       the same config skips the runs the first one is training;
                                       [--device cuda] [--precision bf16|fp32|auto] [--workers N]
                                       (N processes share the runs, each with cores // N threads;
                                       --threads N sets the threads per process)
    show CONFIG [--set ...]            validate every run of a config (datasets, models and heads,
                                       metric keys) and print them; exit 2 listing every problem
    analyze CONFIG                     token-geometry metrics and figures of the trained models
    publish CONFIG --to docs/results   results page (tables, figures, command, machine) for the docs
    summary CONFIG [CONFIG ...]        one table of every setting's difference to the baseline, per task
                                       ([--set ...] applies to every config)
    status CONFIG                      which runs are completed, running, interrupted or missing; time left
    list                               registered datasets, model presets and operators

Every command takes ``--import MODULE`` (repeatable): a dotted module name found from the current folder, or a
``.py`` file, imported before the config is read, so that its ``register_model`` / ``register_dataset`` /
``register_operator`` ... calls make a config's own names known; ``run --workers N`` passes it on to every worker.

Ctrl-C (exit 130) or SIGTERM (exit 143) stops a command with one line saying how to go on; ``run`` then resumes.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import importlib.machinery
import importlib.util
import os
import re
import select
import shlex
import signal
import sys
import threading
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import torch

from diffusionformer.config import _closest_choice
from diffusionformer.train import CheckpointError
from diffusionformer.train.distributed import _rank_zero

__all__ = ["main"]


_ASCII_STAND_INS = str.maketrans({"\u00b1": "+/-", "\u0394": "delta", "\u00b2": "^2"})


def _print(text: str = "", end: str = "\n") -> None:
    """``print`` to stdout, also where it cannot encode every character (a Windows console's code page, a pipe
    under ``LC_ALL=C``): the tables' ``\u00b1`` and ``\u0394`` as ASCII, anything else escaped, not a
    ``UnicodeEncodeError`` after the runs are done."""
    try:
        print(text, end=end)
    except UnicodeEncodeError:  # nothing written: a text stream encodes the whole string first
        encoding = getattr(sys.stdout, "encoding", None) or "ascii"
        print((text + end).translate(_ASCII_STAND_INS).encode(encoding, "backslashreplace").decode(encoding), end="")


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors suggest the closest name: a misspelt option is reported with the usage of
    its command and ``did you mean '--device'?``, a misspelt command or choice with ``did you mean 'run'?``."""

    commands: dict[str, argparse.ArgumentParser] = {}  #: the parsers of the subcommands, by name

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        ns, extras = self.parse_known_args(args, namespace)
        if extras:  # reported by the command's parser (its usage, its options), not the top-level one
            parser = self.commands.get(getattr(ns, "command", None), self)
            options = [s for a in parser._actions for s in a.option_strings]
            words = [x.split("=")[0] for x in extras if x.startswith("-")]
            # an option of another command given exactly (`show c.toml --out r`): not misspelt, so no "did you mean"
            # a look-alike of this command's ('--set' for '--out'), but which commands take it
            elsewhere = {w: [n for n, c in self.commands.items() if c is not parser
                             and w in {s for a in c._actions for s in a.option_strings}]
                         for w in words if w not in options}
            close = [(w, None if elsewhere.get(w) else _closest_choice(w, options)) for w in words]
            hints = [f"{c!r}" + (f" for {w!r}" if len(words) > 1 else "") for w, c in close if c and c != w]
            # an option of the command given before it (`--no-progress run c.toml`): not misspelt, misplaced
            given = [x.split("=")[0] for x in (sys.argv[1:] if args is None else list(args))]
            command = getattr(ns, "command", None)
            placed = [w for w in words if parser is not self and w in options and command in given
                      and given.index(w) < given.index(command)]
            parser.error(f"unrecognized arguments: {' '.join(extras)}"
                         + (f" (did you mean {', '.join(hints)}?)" if hints else "")
                         + (f" ({', '.join(placed)}: option(s) of {command!r}, to be given after it)" if placed else "")
                         + "".join(f" ({w} is an option of {', '.join(map(repr, cs))}, not of {command!r})"
                                   for w, cs in elsewhere.items() if cs and parser is not self))
        return ns

    def error(self, message: str):  # type: ignore[override]
        bad = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
        # the choices are quoted ('run', 'show') up to Python 3.12.7 and 3.13.0, bare (run, show) from 3.12.8 on
        close = _closest_choice(bad.group(1), [c.strip().strip("'") for c in bad.group(2).split(", ")]) if bad else None
        if close and "did you mean" not in message:
            message += f"; did you mean {close!r}?"
        super().error(message)


def _parser() -> argparse.ArgumentParser:
    # allow_abbrev=False: worker_argv removes --workers by its full name, and an abbreviation
    # (--work 2) left in a worker's command line would make every worker start workers of its own
    p = _Parser(prog="diffusionformer", description="Compare diffusion operators in transformers.", allow_abbrev=False)
    sub = p.add_subparsers(dest="command", required=True)
    p.commands = sub.choices
    for name, help_text in (("run", "train a comparison and write results/<name>/"),
                            ("show", "validate a config and list its runs")):
        c = sub.add_parser(name, help=help_text, allow_abbrev=False)
        c.add_argument("config", help="TOML config, e.g. experiments/configs/default.toml")
        c.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config value (TOML syntax), e.g. seeds=[0] or tasks.digits.train.max_steps=50; "
                            "tasks=NAME,... and operators=NAME,... keep only the named tasks / operator settings "
                            "(operators=attention,laplacian-half)")
        c.add_argument("--data-root", default=None,
                       help="data root for standard benchmarks (default: $DIFFUSIONFORMER_DATA)")
        if name == "run":
            c.add_argument("--out", default="results", help="results root (default: results)")
            c.add_argument("--device", default=None,
                           help="cpu, cuda, cuda:1 ... (default: the config's device, else each task's train.device)")
            c.add_argument("--precision", default=None, choices=["bf16", "fp32", "auto"],
                           help="bf16 autocast, fp32, or auto (bf16 on CUDA only); sets every task's train.amp")
            c.add_argument("--restart", action="store_true", help="discard earlier runs instead of resuming them")
            c.add_argument("--tasks", nargs="+", action="extend", default=None, metavar="TASK",
                           help="train only these tasks (finished runs of the others stay in the results)")
            c.add_argument("--no-progress", action="store_true", help="no progress bars (neither runs nor steps)")
            _thread_args(c, name)
    set_help = "the --set overrides the comparison was run with (TOML syntax, e.g. seeds=[0]): the same config as run's"
    st = sub.add_parser("status", allow_abbrev=False,
                        help="where every run of a comparison stands (completed, running, failed, interrupted, "
                             "missing)")
    st.add_argument("config")
    st.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help=set_help)
    st.add_argument("--out", default="results", help="results root the comparison is run into (default: results)")
    sub.add_parser("list", help="list datasets, model presets and operators", allow_abbrev=False)
    sm = sub.add_parser("summary", allow_abbrev=False,
                        help="one table of each setting's difference to the baseline over several comparisons")
    sm.add_argument("configs", nargs="+", metavar="config")
    sm.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a key of every config (the seeds or tasks the comparisons were run with)")
    sm.add_argument("--out", default="results", help="results root the comparisons were run into")
    sm.add_argument("--selected", action="store_true", help="compare the metric at the best select_by evaluation")
    pub = sub.add_parser("publish", help="write the docs results page of a finished comparison", allow_abbrev=False)
    pub.add_argument("config")
    pub.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help=set_help)
    pub.add_argument("--out", default="results", help="results root the comparison was run into (default: results)")
    pub.add_argument("--to", default="docs/results", help="docs folder of the results pages (default: docs/results)")
    a = sub.add_parser("analyze", help="token-geometry analysis of a finished comparison", allow_abbrev=False)
    a.add_argument("config")
    a.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help=set_help)
    a.add_argument("--out", default="results", help="results root the comparison was run into (default: results)")
    a.add_argument("--data-root", default=None,
                   help="data root for standard benchmarks (default: $DIFFUSIONFORMER_DATA)")
    a.add_argument("--max-examples", type=int, default=512, help="held-out examples to analyse per run (default: 512)")
    a.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda if available)")
    a.add_argument("--no-progress", action="store_true", help="no progress bars")
    a.add_argument("--partial", action="store_true", help="analyse the finished runs of a comparison still being run")
    _thread_args(a, "analyze")
    for c in sub.choices.values():
        c.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                       help="import MODULE first (a dotted name found from the current folder, or a .py file): its "
                            "register_model / register_dataset / register_operator ... calls make the config's own "
                            "names known; repeatable; run --workers passes it on to every worker")
    return p


def _thread_args(c: argparse.ArgumentParser, command: str) -> None:
    from diffusionformer.experiments.threads import WORKERS_ENV

    c.add_argument("--threads", type=int, default=None, metavar="N",
                   help="torch threads of this process (default: $OMP_NUM_THREADS if set, else cores // workers)")
    # run starts the workers; analyze only sizes its own threads for N processes sharing the machine
    what = ("start N worker processes that share the runs through the run locks (e.g. several small runs on one "
            "GPU), each with cores // N torch threads" if command == "run" else
            "the processes sharing this machine: size this process's torch threads to cores // N")
    c.add_argument("--workers", type=int, default=None, metavar="N",
                   help=f"{what} (default: ${WORKERS_ENV}, else torchrun's $LOCAL_WORLD_SIZE, else 1)")


def _size_threads(args: argparse.Namespace) -> None:
    """Set torch's thread count by :func:`~diffusionformer.experiments.threads.plan_threads` and say so."""
    from diffusionformer.experiments.threads import apply_threads, plan_threads

    plan = plan_threads(threads=args.threads, workers=args.workers)
    apply_threads(plan)
    if _rank_zero():
        print(plan.describe(), file=sys.stderr)


def _precision_sets(config: Any, precision: str | None) -> list[str]:
    """``run --precision``'s value as the ``--set`` overrides of every task's ``train.amp`` (part of a run's identity),
    with which ``status``, ``analyze``, ``publish`` and ``summary`` read the runs it made; ``[]`` without one. Also
    read by ``experiments/scripts/gpu_study.sh`` for the ``status`` and ``analyze`` it runs after ``run``."""
    from diffusionformer.experiments.gpu import precision_amp
    from diffusionformer.experiments.results import _toml_key, _toml_string

    if precision is None:
        return []
    amp = _toml_string(precision_amp(precision))
    return [f"tasks.{_toml_key(t.name)}.train.amp={amp}" for t in config.tasks if _toml_key(t.name) is not None]


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    """A warning as the command line shows it: ``warning: <message>``, not the file, line and source line of the
    library code that raised it (which names nothing the user can act on)."""
    return f"warning: {message}\n"


_SIGTERM_EXIT = 128 + int(signal.SIGTERM)  # as a shell reports a process SIGTERM ended


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the main thread is: a ``KeyboardInterrupt``, so that every clean-up of a Ctrl-C runs
    (the run's lock released, an atomic write's temporary removed, a half-appended log line cut back, the workers of
    ``run --workers`` stopped)."""


def _raise_terminated(signum, frame) -> None:
    # a second SIGTERM does not cut the clean-ups short (a lock left held): one sent to the whole process group
    # reaches `run --workers`'s workers, and the parent's stop of them is another; SIGKILL still ends it at once
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise _Terminated


def _catch_sigterm() -> bool:
    """Make SIGTERM stop the command as Ctrl-C does, where its action is still the default one (a handler of the
    caller's, or an ignored SIGTERM, is kept) and this is the main thread; whether the handler was installed."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        return False
    signal.signal(signal.SIGTERM, _raise_terminated)
    return True


def main(argv: list[str] | None = None) -> int:
    from diffusionformer.experiments.outputs import _MAIN_ARGV

    # the command a comparison's manifest records: argv, not the caller's command line (pytest's, a notebook's);
    # None for main() too, else one called inside a main(argv) recorded the outer call's argv
    given = _MAIN_ARGV.set(None if argv is None else tuple(argv))
    caught = _catch_sigterm()
    threads = torch.get_num_threads()  # run and analyze size them (--threads): a caller of main() gets its own back
    try:
        return _main_with_warnings(argv)
    except _Terminated:  # outside the command's own handling (while parsing, at the final flush)
        print("\nterminated", file=sys.stderr)
        return _SIGTERM_EXIT
    finally:
        _MAIN_ARGV.reset(given)
        if caught:  # a caller of main() (a test, a notebook) gets the default action back, SIGTERM received or not
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)


def _main_with_warnings(argv: list[str] | None) -> int:
    formatter = warnings.formatwarning  # catch_warnings restores the filters and showwarning, not this
    try:
        with warnings.catch_warnings():
            warnings.formatwarning = _one_line_warning
            try:
                code = _main(argv)
            finally:  # the caller's formatter back (a test, a notebook's later warnings)
                warnings.formatwarning = formatter
        if sys.stdout is not None:
            sys.stdout.flush()  # a reader gone early (`status c.toml | head -3`) is met here, not at the exit's flush
        return code
    except BrokenPipeError:  # stdout's reader has gone: stop quietly, as Unix tools do; 141 = 128 + SIGPIPE
        if not _stdout_gone():
            raise
        return 141


def _stdout_gone() -> bool:
    """Whether stdout's reader has gone; if so stdout's descriptor is pointed to ``os.devnull``, so that the
    interpreter's flush at exit does not report the broken pipe again (with a traceback and exit code 120)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (a test's capture): nothing to point elsewhere
        fd = None
    try:
        sys.stdout.flush()  # buffered: what the failed write left is still there and fails again
        # unbuffered ($PYTHONUNBUFFERED): nothing is left to flush; ask the pipe whether its reader is gone
        gone = fd is not None and hasattr(select, "poll") and _reader_closed(fd)
    except BrokenPipeError:
        gone = True
    if gone and fd is not None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, fd)
        finally:
            os.close(devnull)
    return gone  # False: the broken pipe was another one (a subprocess's), not this function's to hide


def _reader_closed(fd: int) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def _check_out(out: str, name: str) -> None:
    """Refuse ``--out`` where it, a folder above it or the comparison ``name``'s folder in it is a file."""
    if Path(out).exists() and not Path(out).is_dir():
        # else `status` reads every run as missing, and `run` fails on its first write
        raise NotADirectoryError(f"--out: expected the results folder, got the file {out!r}")
    root = Path(out)  # a file above it, or in the comparison folder's place: the same
    file = next((p for p in (root / name, *root.parents) if p.exists() and not p.is_dir()), None)
    if file is not None:
        raise NotADirectoryError(f"--out {out!r}: {str(file)!r} is a file, where the results "
                                 f"{'of ' + repr(name) if file == root / name else 'folder'} should be a folder")
    from diffusionformer.experiments.config import _refuse_results_twin

    _refuse_results_twin(out, name)


def _naming_missing_imports(folder: Path, given: list[str]) -> contextlib.AbstractContextManager[None]:
    """A ValueError raised inside that names an unknown operator, model or dataset gets the ``--import`` modules the
    manifest of the comparison ``folder`` records and this command did not import (in that spelling or another:
    :func:`_imported`; nothing for another problem, a folder or manifest not there or damaged, a message that names
    ``--import`` already, as ``load_run``'s): a comparison made with ``--import`` and run again without it got a
    bare "unknown operator"."""
    from diffusionformer.experiments.outputs import _run_flags
    from diffusionformer.experiments.reload import _adding_hint, _recorded_imports

    def hint(err: ValueError) -> str:
        text = str(err)
        if "--import" in text or not re.search(r"\bunknown (operator|model|dataset) '", text):
            return ""
        manifest_path = folder / "manifest.json"
        missing = [m for m in _recorded_imports(manifest_path) if m not in given and not _imported(m)]
        if not missing:
            return ""
        words = (f"the comparison {folder} was made with{_run_flags(missing, None)} ({manifest_path}): give this "
                 "command the same --import")
        return f"\n({words})" if "\n" in text else f"; {words}"

    return _adding_hint(hint)


def _imported(spec: str) -> bool:
    """Whether the module ``--import spec`` names is imported in this process: from the file it names (``./ops.py``
    given for ``ops.py``), or by its dotted name (``ops`` given for ``ops.py`` of the current folder, or the
    reverse)."""
    if spec.endswith(".py") or "/" in spec or os.sep in spec:
        where = getattr(sys.modules.get(Path(spec).stem), "__file__", None)
        with contextlib.suppress(OSError, ValueError, RuntimeError):  # a NUL in the name, a symbolic link's loop
            return where is not None and Path(where).resolve() == Path(spec).resolve()
        return False
    return spec in sys.modules


def _import_module(spec: str) -> None:
    """Import ``--import``'s ``spec``: a ``.py`` file (or a path) as the module its file name names, else a dotted
    module name, looked for in the current folder first (as ``python -m`` does; the ``diffusionformer`` script's
    ``sys.path`` lacks it). A module missing is one error line; an error inside the module is its traceback, then
    one error line naming the module; a module that fails (or calls ``sys.exit``) leaves the registries and torch's
    default dtype as they were, so that main() called again meets none of what it registered."""
    if not spec.strip():
        raise ValueError(f"--import: expected a module name or a .py file, got "
                         f"{'an empty string' if not spec else 'only spaces ' + repr(spec)}")
    is_path = spec.endswith(".py") or "/" in spec or os.sep in spec
    if not is_path and not all(part.isidentifier() for part in spec.split(".")):
        raise ValueError(f"--import {spec!r}: expected a dotted module name (mypackage.registrations) or a .py "
                         f"file's path")
    if is_path:
        path = Path(spec)
        if path.suffix != ".py":
            raise ValueError(f"--import {spec!r}: expected a .py file or a dotted module name")
        if not path.is_file():
            raise FileNotFoundError(f"--import {spec!r}: no such file (from {os.getcwd()})")
        name = path.stem
        if not name.isidentifier():
            raise ValueError(f"--import {spec!r}: the file's name is the module's name, which must be a Python "
                             f"identifier (e.g. {re.sub(r'[^0-9A-Za-z_]', '_', name).lstrip('0123456789') or 'mod'}"
                             f".py)")
        loaded = sys.modules.get(name)
        if loaded is not None:
            where = getattr(loaded, "__file__", None)
            if where is not None and Path(where).resolve() == path.resolve():
                return  # imported already (main() called again in one process): its registrations stand
            raise ValueError(f"--import {spec!r}: a module named {name!r} is imported already "
                             f"({'from ' + repr(where) if where else 'built in'}); rename the file")
        folder = str(path.resolve().parent)  # the file's neighbours import as a script's do
    else:
        folder = os.getcwd()
        top = spec.partition(".")[0]
        loaded = sys.modules.get(top)
        here = next((p for p in (Path(folder) / f"{top}.py", Path(folder) / top / "__init__.py") if p.is_file()), None)
        where = getattr(loaded, "__file__", None)
        if loaded is not None and here is not None and (where is None or Path(where).resolve() != here.resolve()):
            # else the module imported already is taken, silently, and the file's registrations never run
            raise ValueError(f"--import {spec!r}: a module named {top!r} is imported already "
                             f"({'from ' + repr(where) if where else 'built in'}), not {str(here)!r}; rename the "
                             f"{'file' if here.name != '__init__.py' else 'folder'}")
    added = folder not in sys.path and not (not is_path and "" in sys.path)
    if added:
        sys.path.insert(0, folder)
    state, imported, before = _registrations(), False, set(sys.modules)
    try:
        if is_path:
            loader_spec = importlib.util.spec_from_file_location(name, path.resolve())
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[name] = module  # before it runs: its classes and dataclasses look their module up
            try:
                loader_spec.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(name, None)
                raise
        else:
            importlib.import_module(spec)
        imported = True
    except SystemExit as exc:  # a script's own code run on import: else the command ended silently, with its code
        code = "" if exc.code is None else repr(exc.code)
        raise ValueError(f"--import {spec!r} failed: it called sys.exit({code}) while being imported (put a "
                         f"script's own code under `if __name__ == \"__main__\":`)") from None
    except ModuleNotFoundError as exc:
        if not is_path and exc.name is not None and (spec == exc.name or spec.startswith(exc.name + ".")):
            raise ModuleNotFoundError(f"--import {spec!r}: no module named {exc.name!r} in the current folder "
                                      f"({os.getcwd()}) or on sys.path; give a .py file's path, or install the "
                                      f"package", name=exc.name) from None
        traceback.print_exc()
        raise ValueError(f"--import {spec!r} failed: {type(exc).__name__}: {exc} (traceback above)") from exc
    except Exception as exc:  # the user's code: its traceback is what they need
        traceback.print_exc()
        raise ValueError(f"--import {spec!r} failed: {type(exc).__name__}: {exc} (traceback above)") from exc
    finally:
        if not imported:  # a module stopped halfway: a second main() (a notebook) does not meet what it registered
            _restore_registrations(state)
            _forget_own_modules(set(sys.modules) - before, folder)
        if added and folder in sys.path:
            sys.path.remove(folder)


def _forget_own_modules(names: set[str], folder: str) -> None:
    """Drop from ``sys.modules`` the modules of ``names`` (imported by an ``--import`` that failed) whose files lie
    under ``folder`` (the user's own helpers beside it): their registrations were undone, and a second ``main()``
    (the module fixed, in a notebook) must run them again, not find them imported with nothing registered. Installed
    packages imported on the way stay, a virtual environment inside ``folder`` included (a C extension is not
    imported twice), and so do C extensions built in place beside the user's files (an editable project's: Cython's
    refuse a second initialisation) and our own modules (an editable checkout as the current folder)."""
    root = Path(folder).resolve()
    installed = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    for name in names:
        where = getattr(sys.modules.get(name), "__file__", None)
        if where is None or name.partition(".")[0] == "diffusionformer":
            continue
        with contextlib.suppress(OSError, ValueError):
            file = Path(where).resolve()
            if (file.is_relative_to(root) and not any(file.is_relative_to(p) for p in installed)
                    and not {"site-packages", "dist-packages"} & set(file.parts)
                    and not file.name.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))):
                sys.modules.pop(name, None)


def _registrations() -> tuple[list[tuple[dict, dict]], object, dict[type, dict[str, Any]]]:
    """The registries (datasets, model presets, operators, metrics, task adapters), torch's default dtype and the
    ``name`` and ``aliases`` the registered operator classes hold (``register_operator`` writes them) as they are
    now, for :func:`_restore_registrations`."""
    import torch

    from diffusionformer.analysis import report
    from diffusionformer.data import registry as data_registry
    from diffusionformer.experiments import tasks
    from diffusionformer.models import registry as model_registry
    from diffusionformer.operators import registry as operator_registry

    dicts = (data_registry._REGISTRY, model_registry._PRESETS, operator_registry._REGISTRY, operator_registry._ALIASES,
             operator_registry._DECLARED, report._METRICS, tasks._ADAPTERS)
    classes = {c: operator_registry._own_names(c)
               for c in (*operator_registry._DECLARED, *operator_registry._REGISTRY.values())}
    return [(d, dict(d)) for d in dicts], torch.get_default_dtype(), classes


def _restore_registrations(state: tuple[list[tuple[dict, dict]], object, dict[type, dict[str, Any]]]) -> None:
    import torch

    from diffusionformer.operators import registry as operator_registry

    dicts, dtype, classes = state
    # a class registered since gets the names it declared back (as unregister_operator gives them), one registered
    # before its names then (a library operator unregistered, then registered as "heat2", kept "heat2" as its name
    # while the registry held it as "heat" again: its specs named an unknown operator)
    named = {**{c: operator_registry._DECLARED[c] for c in operator_registry._DECLARED if c not in classes}, **classes}
    for d, before in dicts:
        d.clear()
        d.update(before)
    for cls, names in named.items():
        operator_registry._put_names(cls, names)
    torch.set_default_dtype(dtype)


def _main(argv: list[str] | None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    if raw and raw[0].partition("=")[0] == "--import":  # else "invalid choice: 'MODULE'": the module read as a command
        _parser().error("--import goes after the command, e.g. diffusionformer run CONFIG --import MODULE")
    args = _parser().parse_args(argv)
    from diffusionformer.experiments.config import load_experiment_config

    try:
        for flag in ("out", "to"):  # Path("") is the current folder: `--out "$UNSET"` would write into it
            if getattr(args, flag, None) == "":
                raise ValueError(f"--{flag}: expected a folder, got an empty path")
        for spec in args.imports:  # before the config names what they register
            _import_module(spec)
        if args.command == "list":
            from diffusionformer.data import list_datasets
            from diffusionformer.models import get_preset, list_models
            from diffusionformer.operators import list_operators

            _print("datasets:  " + ", ".join(list_datasets()))
            _print("operators: " + ", ".join(list_operators()))
            _print("models:")
            for m in list_models():
                _print(f"  {m:20s} {get_preset(m).description}")
            return 0
        if args.command == "summary":
            from diffusionformer.experiments.publish import summary_table

            configs = [load_experiment_config(c, args.overrides) for c in args.configs]
            for c in configs:  # else a file as --out is "no results ...; run the comparisons first"
                _check_out(args.out, c.name)
            _print(summary_table(configs, args.out, selected=args.selected), end="")
            return 0
        config = load_experiment_config(args.config, args.overrides)
        if getattr(args, "out", None) is not None:
            _check_out(args.out, config.name)
        to = getattr(args, "to", None)
        if to is not None and any(p.exists() and not p.is_dir() for p in (Path(to), *Path(to).parents)):
            # else publish copies everything into a staging folder and fails with "[Errno 20] Not a directory"
            raise NotADirectoryError(f"--to: expected the docs folder of the results pages, got {to!r}, "
                                     f"which is or lies below a file")
        if args.command == "show":
            from diffusionformer.experiments.validate import check_experiment

            # every task x setting x seed resolves (datasets whose files are absent: from the preset's sizes);
            # a --data-root given is checked too (a misspelt one is not taken for data not yet downloaded)
            check_experiment(config, data_root=args.data_root, missing_data_ok=args.data_root is None)
            _print(f"{config.name}: {len(config.tasks)} tasks x {len(config.operators)} operator settings x "
                  f"{len(config.seeds)} seeds = {len(config.tasks) * len(config.operators) * len(config.seeds)} runs")
            # model_overrides too where set: else a setting defined by them alone (mlp = "swiglu", rope = true, or
            # their --set) printed as the baseline did, and a task's --set of its model did not show
            # the data too: dataset_options and folds (cross-validation) where set, else a k-fold study printed as the
            # single split does
            # the tables as TOML, pasteable into --set (a Python dict's quotes and colons were not)
            from diffusionformer.experiments.results import _toml_value

            def toml(table: dict) -> str:
                return _toml_value(table) or repr(table)

            # and the task's other settings where not at their defaults: else a task defined by its augment,
            # label_smoothing or select_by alone (or their --set) printed as the plain one did
            shown = {"name", "dataset", "model", "metric", "dataset_options", "model_overrides", "train", "folds"}
            for t in config.tasks:
                model = f", model_overrides {toml(t.model_overrides)}" if t.model_overrides else ""
                for f in dataclasses.fields(t):
                    value = getattr(t, f.name)
                    if f.name not in shown and value != (f.default if f.default_factory is dataclasses.MISSING
                                                         else f.default_factory()):
                        model += f", {f.name} {toml(value) if isinstance(value, dict) else value}"
                data = f" {toml(t.dataset_options)}" if t.dataset_options else ""
                data += f" ({t.folds}-fold CV)" if t.folds else ""
                _print(f"  task {t.name}: {t.dataset}{data} -> {t.model}, metric {t.metric}, "
                       f"train {toml(t.train)}{model}")
            for o in config.operators:
                model = f" model_overrides={toml(o.model_overrides)}" if o.model_overrides else ""
                _print(f"  operator {o.name}: heads={o.heads!r} laplacian_heads={o.laplacian_heads!r}{model}")
            return 0
        if args.command == "status":
            from diffusionformer.experiments.results import run_status
            from diffusionformer.experiments.tables import format_status

            _print(format_status(run_status(config, args.out)), end="")
            if not (Path(args.out) / config.name).is_dir():  # else a misspelt or forgotten --out reads as "0 of N"
                print(f"note: {Path(args.out) / config.name} does not exist: nothing was run into --out {args.out!r} "
                      "yet (a comparison run with another --out is read with that --out)", file=sys.stderr)
            return 0
        if args.command == "publish":
            from diffusionformer.experiments.publish import publish_experiment

            page = publish_experiment(config, args.out, args.to, config_path=args.config, overrides=args.overrides,
                                      imports=args.imports)
            _print(f"wrote {page}")
            return 0
        if args.command == "analyze":
            _size_threads(args)
            from diffusionformer.experiments.analyze import analyze_experiment

            # a dataset of an --import module not given (load_run names those of the runs' operators and models)
            with _naming_missing_imports(Path(args.out) / config.name, args.imports):
                analyze_experiment(config, args.out, data_root=args.data_root, max_examples=args.max_examples,
                                   device=args.device, progress=not args.no_progress, partial=args.partial)
            adir = Path(args.out) / config.name / "analysis"  # else the command ends without naming what it wrote
            plots = f", plots in {adir}/plots/" if any((adir / "plots").glob("*.png")) else ", no plots (see above)"
            _print(f"analysis: {adir}/README.md, {adir}/metrics.json{plots}")
            return 0
        from diffusionformer.experiments.gpu import WORKER_ENV, check_device, precision_amp, run_workers, worker_argv
        from diffusionformer.experiments.runner import _choose_tasks, run_experiment
        from diffusionformer.experiments.tables import aggregate, format_table

        workers = 1 if args.workers is None else args.workers
        if workers < 1:
            raise ValueError(f"--workers: expected an int >= 1, got {workers}")
        if workers > 1 and os.environ.get(WORKER_ENV):
            raise ValueError(f"--workers {workers} in a worker process (${WORKER_ENV}={os.environ[WORKER_ENV]}): "
                             "a worker does not start workers of its own")
        if workers > 1:  # under torchrun every rank started workers that joined its process group (a hang)
            from diffusionformer.experiments.runner import _distributed

            if _distributed():
                raise ValueError(f"--workers {workers} under torchrun (WORLD_SIZE={os.environ['WORLD_SIZE']}): each "
                                 "rank would start workers of its own, which join its process group; use one or the "
                                 "other (torchrun trains each run with DDP, --workers runs independent processes)")
        if workers > 1:  # a misspelt --tasks name, before any worker starts (each would refuse it, as run_experiment)
            _choose_tasks(config, args.tasks)
        _size_threads(args)
        # --precision as the --set of every task's train.amp (part of a run's identity): the status command below
        # without it read every run this command finishes as "made with another train", to be redone
        amp = None if args.precision is None else precision_amp(args.precision)
        precision_sets = _precision_sets(config, args.precision)
        if _rank_zero():
            from diffusionformer.experiments.outputs import _run_flags

            # with the --import modules: without them status cannot read a config naming what they register
            flags = _run_flags(args.imports, args.overrides + precision_sets, args.out)
            print(f"every run's step and time left, from another shell: python -m diffusionformer.experiments status "
                  f"{shlex.quote(args.config)}{flags}", file=sys.stderr)
        device = args.device if args.device is not None else config.device
        if device is not None:
            check_device(device)  # before any data is loaded: unknown, or CUDA where there is none
        if amp is not None:
            for task in config.tasks:
                task.train = {**task.train, "amp": amp}
        t0 = time.perf_counter()
        if workers > 1:
            if args.restart:
                raise ValueError("--restart with --workers: every worker would discard the others' runs; "
                                 "run once with --restart --workers 1, or delete the results folder")
            raw = list(sys.argv[1:] if argv is None else argv)
            codes = run_workers(worker_argv(raw), workers, Path(args.out) / config.name / "workers")
            if any(codes):
                print(f"worker exit codes {codes}; see {Path(args.out) / config.name / 'workers'}", file=sys.stderr)
        # one pass in this process: trains what no worker finished, then writes the tables
        # the runs' notes and failures on stderr, with the "see the messages above" they precede; stdout: the table
        # the config's names are checked before any run trains: one of an --import module not given is unknown
        with _naming_missing_imports(Path(args.out) / config.name, args.imports):
            results = run_experiment(config, args.out, data_root=args.data_root, resume=not args.restart,
                                     progress=not args.no_progress, device=device, tasks=args.tasks,
                                     log=lambda message: print(message, file=sys.stderr))
        if _rank_zero():
            _print()
            _print(format_table(aggregate(results), config, compact=True))
            out = Path(args.out) / config.name
            # plots/ is made before matplotlib is imported: without it the folder is there, and empty
            plots = f"plots in {out}/plots/" if any((out / "plots").glob("*.png")) else "no plots (see above)"
            _print(f"results: {out}/results.md, {out}/results.json, {plots} "
                  f"(wall time {time.perf_counter() - t0:.0f} s)")
        failed = [r for r in results if r.status != "completed"]
        if failed:
            print(f"{len(failed)} run(s) failed; see the messages above", file=sys.stderr)
            return 1
        return 0
    except BrokenPipeError:  # stdout's reader gone: main() decides (quiet exit 141), not an error line
        raise
    except (ValueError, TypeError, OSError, ImportError) as exc:
        # a bad --out (a file, a name too long for the file system), a package missing or installed but broken (an
        # ImportError of its own: a compiled extension built for another torch): no traceback; an import of this
        # package that fails is a bug of ours, whose traceback is kept
        if isinstance(exc, ImportError) and str(exc.name or "").partition(".")[0] == "diffusionformer":
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # Ctrl-C: one line, not a traceback; 130 = 128 + SIGINT, as a shell reports it
        # SIGTERM (kill, a scheduler's stop): the same, 143 = 128 + SIGTERM
        word, code = ("terminated", _SIGTERM_EXIT) if isinstance(exc, _Terminated) else ("interrupted", 130)
        if args.command == "run" and args.restart:  # the same command would discard the runs this one redid
            print(f"\n{word}: `run --restart` stopped; run again with --restart, every run is discarded again "
                  "(those it redid too); without --restart, the runs it redid are kept, an unfinished one resumes from "
                  "its last checkpoint and those it had not reached keep their earlier results", file=sys.stderr)
            return code
        again = (" again: finished runs are kept and an unfinished one resumes from its last checkpoint"
                 if args.command == "run" else " again")
        print(f"\n{word}: `{args.command}` stopped; run the same command{again}", file=sys.stderr)
        return code
    except CheckpointError as exc:
        from diffusionformer.experiments.runner import _not_resumed_advice

        print(f"error: {exc}\n{_not_resumed_advice(exc, 'that checkpoint.pt', 'its')}", file=sys.stderr)
        return 2
