"""Shared helpers of the benchmark scripts: interleaved timing, peak memory, machine info, tables.

Timing method (every script): each candidate is a zero-argument callable. After warm-up, the
callables of one comparison are run in *interleaved rounds* (the order rotates every round),
each round timing a block of ``n`` calls with :func:`time.perf_counter` (CUDA: synchronised
before and after the block; ``--clock cpu`` uses :func:`time.process_time` instead, the CPU
time of the process, which other processes on a shared machine do not inflate when the
benchmark runs on one thread), ``n`` chosen so one block takes about ``block_s`` seconds. A
candidate's time is the median over rounds; a ratio is the median over rounds of the paired
ratios ``t_candidate / t_baseline`` (both measured in the same round, so slow drifts of a
shared machine cancel), reported with its inter-quartile range as the noise.

Peak memory: CUDA uses :func:`torch.cuda.max_memory_allocated` minus the memory allocated
before the call. CPU uses the PyTorch profiler's allocation events
(``profile_memory=True``): the peak of its running "Total Allocated" counter is the largest
amount of memory allocated through PyTorch's CPU allocator during the call and not yet freed
(memory held before the call is excluded). Allocations made inside third-party libraries
(e.g. MKL's sparse workspaces) are not seen by it; ``bench_sparse.py`` cross-checks with the
process' resident-set high-water mark.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

ROOT = Path(__file__).resolve().parent.parent
# before the first import of the package: a script run from a checkout benchmarks that checkout's package (not
# another copy installed in the environment, nor a ModuleNotFoundError without one)
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from diffusionformer.testing.memory import cpu_allocations  # noqa: E402
from diffusionformer.train.metrics import write_text_atomic  # noqa: E402

from _warm import add_warm_arguments, warm_kernels  # noqa: E402,F401 - the scripts call them as C.<name>

DEFAULT_OUT = ROOT / "benchmarks" / "results"


# ---------------------------------------------------------------------------- setup
def parse_args(description: str, argv: Sequence[str] | None = None, extra: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    """The command line shared by every script: ``--quick``, ``--device``, ``--out``, ``--threads``."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="fewer sizes and rounds (smoke run)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="device to benchmark on")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="folder for <name>.md and <name>.json")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: all cores)")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds per comparison")
    p.add_argument("--clock", default="wall", choices=["wall", "cpu"],
                   help="wall: time.perf_counter (default); cpu: time.process_time, the CPU time of this process "
                        "(robust to other processes on a shared machine when --threads 1; CPU only)")
    shared = len(p._actions)
    if extra is not None:
        extra(p)
    args = p.parse_args(argv)
    args._script_options = _given_options(p._actions[shared:], args)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda was requested but torch.cuda.is_available() is False")
    if args.device == "cuda" and args.clock == "cpu":
        p.error("--clock cpu measures host CPU time; use the wall clock with --device cuda")
    check_threads_and_out(p, args.threads, args.out, args.rounds)
    args.threads = setup_threads(args.threads)
    set_clock(args.clock)
    return args


_CLOCK: Callable[[], float] = time.perf_counter


def _given_options(actions: Sequence[argparse.Action], args: argparse.Namespace) -> list[str]:
    """A script's own options (``extra``'s) as given, the defaults left out, for the command written with the tables
    (``--smoke``, ``--library-backend sdpa``, ``--parts gpt`` change what a run measures). ``--compile-only``, the
    warm-up processes' option, is not a command of its own."""
    words: list[str] = []
    for a in actions:
        value = getattr(args, a.dest, None)
        if not a.option_strings or a.dest == "compile_only" or value == a.default:
            continue
        flag = max(a.option_strings, key=len)
        if a.nargs == 0:  # store_true
            words.append(flag)
        elif isinstance(value, (list, tuple)):
            words += [flag, *map(str, value)]
        else:
            words += [flag, str(value)]
    return words


def check_threads_and_out(p: argparse.ArgumentParser, threads: int | None, out: str, rounds: int | None = None) -> None:
    """Usage errors (``p.error``) before any work: ``--rounds`` or ``--threads`` below 1 (an IndexError of empty
    samples after minutes of warm-up, a bare RuntimeError of torch) and an ``--out`` that is not a folder that can
    be made (a FileExistsError when the first table is written, its measurements lost)."""
    for flag, value in (("--rounds", rounds), ("--threads", threads)):
        if value is not None and value < 1:
            p.error(f"{flag} must be >= 1, got {value}")
    try:
        Path(out).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        p.error(f"--out {out!r} is not a folder that can be written: {e.strerror or e}")


def check_indices(script: str, flag: str, chosen: Sequence[int] | None, table: Sequence[Any], default: str) -> None:
    """Refuse an index-list flag (``nargs="*"``) given without values (an empty argument expansion in a GPU call
    would run nothing and exit 0) or with an index outside ``table`` (an IndexError after set-up, or a negative
    index silently taken from the end), or with an index twice: a SystemExit before any work. ``None`` (the flag left
    out) passes."""
    if chosen is None:
        return
    if not chosen:
        raise SystemExit(f"{script}: {flag} was given without values; leave it out for {default}")
    bad = [i for i in chosen if not 0 <= i < len(table)]
    if bad:
        raise SystemExit(f"{script}: {flag} {bad} out of range: 0 .. {len(table) - 1} index {table}")
    twice = sorted({i for i in chosen if list(chosen).count(i) > 1})
    if twice:  # a size run twice costs its GPU time again and counts twice in a summary over sizes
        raise SystemExit(f"{script}: {flag} names {twice} more than once")


def set_clock(name: str) -> None:
    """``"wall"`` (:func:`time.perf_counter`) or ``"cpu"`` (:func:`time.process_time`, all threads of the process)."""
    global _CLOCK
    _CLOCK = time.process_time if name == "cpu" else time.perf_counter


def setup_threads(threads: int | None) -> int:
    """Use every core of the machine (or ``threads``) for intra-op parallelism; return the count."""
    n = threads or os.cpu_count() or 1
    torch.set_num_threads(n)
    return n


def sync(device: str | torch.device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


# ---------------------------------------------------------------------------- timing
@dataclass
class Timing:
    """Per-call seconds of one candidate over the interleaved rounds."""

    samples: list[float]
    calls_per_block: int

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    def quartiles(self) -> tuple[float, float]:
        return _quartiles(self.samples)


def _quartiles(xs: Sequence[float]) -> tuple[float, float]:
    if len(xs) < 2:
        return xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]


def _time_block(fn: Callable[[], Any], n: int, device: str) -> float:
    sync(device)
    t0 = _CLOCK()
    for _ in range(n):
        fn()
    sync(device)
    return (_CLOCK() - t0) / n


def measure(
    fns: dict[str, Callable[[], Any]],
    *,
    device: str = "cpu",
    rounds: int = 7,
    block_s: float = 0.03,
    warmup: int = 2,
) -> dict[str, Timing]:
    """Time the callables of one comparison in interleaved rounds (see the module docstring)."""
    names = list(fns)
    calls: dict[str, int] = {}
    for name in names:
        for _ in range(warmup):
            fns[name]()
        one = _time_block(fns[name], 1, device)
        calls[name] = max(1, min(1000, round(block_s / max(one, 1e-7))))
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            samples[name].append(_time_block(fns[name], calls[name], device))
    return {n: Timing(samples[n], calls[n]) for n in names}


def step_callables(fns: dict[str, Callable[[torch.Tensor], torch.Tensor]], x: torch.Tensor, backward: bool,
                   grad: torch.Tensor | None = None) -> dict[str, Callable[[], None]]:
    """Zero-argument callables for :func:`measure`: ``f(x)`` under ``no_grad``, or forward + backward.

    With ``backward`` every call runs ``f`` on one leaf copy of ``x`` and backpropagates ``grad``
    (default: ``randn_like(x)``, drawn once, so all candidates see the same gradient).
    """
    if not backward:
        def fwd(f: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], None]:
            def call() -> None:
                with torch.no_grad():
                    f(x)
            return call
        return {k: fwd(f) for k, f in fns.items()}
    xg = x.detach().clone().requires_grad_()
    g = torch.randn_like(x) if grad is None else grad

    def fb(f: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], None]:
        def call() -> None:
            torch.autograd.backward(f(xg), g)
        return call
    return {k: fb(f) for k, f in fns.items()}


def ratio(timings: dict[str, Timing], cand: str, base: str) -> tuple[float, float, float]:
    """Median and quartiles of the paired per-round ratios ``cand / base``."""
    rs = [c / b for c, b in zip(timings[cand].samples, timings[base].samples)]
    lo, hi = _quartiles(rs)
    return statistics.median(rs), lo, hi


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, idx: torch.Tensor, targets: torch.Tensor,
               autocast: str | None = None) -> Callable[[], None]:
    """One training step of a GPT ``model(idx, targets) -> (logits, loss)``: forward and loss (under bf16
    autocast on the device type ``autocast``, if given), backward, ``opt.step()``, gradients set to ``None``."""
    def step() -> None:
        if autocast is None:
            _, loss = model(idx, targets)
        else:
            with torch.autocast(autocast, dtype=torch.bfloat16):
                _, loss = model(idx, targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


# ---------------------------------------------------------------------------- memory
def peak_memory(fn: Callable[[], Any], device: str = "cpu") -> int:
    """Peak bytes allocated by PyTorch during ``fn()`` beyond what was allocated before it."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    _, changes, totals = cpu_allocations(fn)
    # "Total Allocated" is a running counter that memory freed outside a profiled window leaves behind (it
    # drifts from one measurement to the next); what this call allocated is measured from the counter's value
    # just before its first event
    if not totals:
        return 0
    return max(0, max(totals) - (totals[0] - changes[0]))


# ---------------------------------------------------------------------------- machine
def machine_info(device: str = "cpu", threads: int | None = None) -> dict[str, Any]:
    """CPU model, cores, threads, torch version, load average (and the GPU when benchmarking CUDA)."""
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info: dict[str, Any] = {
        "clock": "cpu (time.process_time)" if _CLOCK is time.process_time else "wall (time.perf_counter)",
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": threads if threads is not None else torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": device,
        "loadavg_1min": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    if torch.device(device).type == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    try:
        import torch_geometric

        info["torch_geometric"] = torch_geometric.__version__
    except Exception:  # pragma: no cover - optional
        pass
    return info


def machine_line(info: dict[str, Any], load: bool = True) -> str:
    gpu = f", GPU {info['gpu']}" if "gpu" in info else ""
    line = (
        f"{info['cpu']}, {info['cores']} cores, torch.set_num_threads({info['torch_threads']}), "
        f"torch {info['torch']}{gpu}; device {info['device']}; clock {info['clock']}"
    )
    return line + (f"; 1-min load average at start {info['loadavg_1min']}" if load else "")


# ---------------------------------------------------------------------------- output
@dataclass
class Report:
    """One benchmark's tables, notes and raw rows, written as ``<name>.md`` and ``<name>.json``."""

    name: str
    title: str
    args: argparse.Namespace
    sections: list[tuple[str, list[str], list[list[Any]]]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        self.info = machine_info(self.args.device, self.args.threads)

    def table(self, caption: str, header: list[str], rows: list[list[Any]]) -> None:
        """Add a table, print it and write the report so far (a run cut short, e.g. by a GPU job's time limit,
        keeps every finished table)."""
        self.sections.append((caption, header, rows))
        print(f"\n{caption}\n" + markdown_table(header, rows), flush=True)
        self.write()

    def note(self, text: str) -> None:
        self.notes.append(text)

    def command(self) -> str:
        extra = " --quick" if self.args.quick else ""
        extra += f" --threads {self.args.threads}"
        if getattr(self.args, "rounds", None) is not None:  # the command written with the tables reruns them
            extra += f" --rounds {self.args.rounds}"
        if self.args.clock != "wall":
            extra += f" --clock {self.args.clock}"
        extra += "".join(f" {shlex.quote(w)}" for w in getattr(self.args, "_script_options", ()))
        return f"python benchmarks/{self.name}.py --device {self.args.device}{extra}"

    def markdown(self) -> str:
        lines = [f"## {self.title}", "", f"Machine: {machine_line(self.info)}.", "",
                 f"Command: `{self.command()}` ({time.perf_counter() - self.started:.0f} s).", ""]
        for caption, header, rows in self.sections:
            lines += [f"**{caption}**", "", markdown_table(header, rows), ""]
        for n in self.notes:
            lines += [n, ""]
        return "\n".join(lines)

    def write(self) -> Path:
        out = Path(self.args.out)
        out.mkdir(parents=True, exist_ok=True)
        # each file replaced whole (a temporary file moved over it): a run killed while writing (a GPU call's time
        # limit) keeps the report of its previous table instead of a truncated file
        write_text_atomic(out / f"{self.name}.md", self.markdown())
        payload = {"name": self.name, "title": self.title, "machine": self.info, "command": self.command(),
                   "quick": self.args.quick, "seconds": round(time.perf_counter() - self.started, 1),
                   "tables": [{"caption": c, "header": h, "rows": r} for c, h, r in self.sections],
                   "notes": self.notes, "rows": self.rows}
        write_text_atomic(out / f"{self.name}.json", json.dumps(payload, indent=1, default=_json_default))
        return out / f"{self.name}.md"


def _json_default(o: Any) -> Any:
    if isinstance(o, Timing):
        return asdict(o)
    if isinstance(o, Path):
        return str(o)
    return str(o)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(c) for c in header]] + [[fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(cells[0]), sep] + [line(r) for r in cells[1:]])


def fmt(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.3g}" if abs(x) < 1000 else f"{x:.0f}"
    return str(x)


def ms(t: float) -> str:
    return f"{t * 1e3:.2f}" if t < 0.1 else f"{t * 1e3:.1f}"


def rfmt(r: tuple[float, float, float]) -> str:
    """A paired ratio as ``median [q1-q3]``."""
    return f"{r[0]:.3f} [{r[1]:.2f}-{r[2]:.2f}]"


def mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.1f}"


def check(ok: bool) -> str:
    return "yes" if ok else "**no**"
