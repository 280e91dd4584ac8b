"""Import cost, laziness and missing optional packages (sitting 45).

Every check that needs a clean ``sys.modules`` or a missing package runs in a fresh interpreter (``sys.executable``,
no fork); a package is made missing by a ``sys.meta_path`` finder installed before anything of the library is
imported, which raises ``ModuleNotFoundError`` for it as an absent install does.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# a finder that makes the packages named in BLOCKED unimportable, as if not installed
_BLOCK = (
    "import sys\n"
    "class _Blocked:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name.split('.')[0] in BLOCKED:\n"
    "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
    "sys.meta_path.insert(0, _Blocked())\n"
)


def _run(code: str, blocked: tuple[str, ...] = (), *flags: str) -> subprocess.CompletedProcess:
    prelude = f"BLOCKED = {set(blocked)!r}\n" + _BLOCK if blocked else ""
    return subprocess.run([sys.executable, *flags, "-c", prelude + code], cwd=REPO, capture_output=True, text=True,
                          env={"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PATH": ""}, timeout=120)


def test_bug_stats_without_scipy_name_the_extra():
    """Bug: without scipy (it comes only with the ``experiments`` extra) the p-values and intervals of
    :func:`welch_difference`, :func:`paired_difference` (so every results table with two seeds) raised a bare
    ``ModuleNotFoundError: No module named 'scipy'`` from inside ``stats``, naming neither what needs it nor the
    extra to install; the command line printed just ``error: No module named 'scipy'``."""
    code = (
        "from diffusionformer.experiments import paired_difference, welch_difference, wilcoxon_p\n"
        "assert wilcoxon_p([1.0, -2.0, 3.0]) == 0.75\n"  # exact for small n: no scipy needed
        "for f, args in ((welch_difference, ([1.0, 2.0, 3.0], [2.0, 3.0, 5.0])),\n"
        "                (paired_difference, ({0: 1.0, 1: 2.0, 2: 3.0}, {0: 2.0, 1: 3.0, 2: 5.0}))):\n"
        "    try:\n"
        "        f(*args)\n"
        "    except ImportError as exc:\n"
        "        msg = str(exc)\n"
        "        assert 'scipy' in msg and 'diffusionformer[experiments]' in msg, msg\n"
        "    else:\n"
        "        raise AssertionError(f'{f.__name__} computed a p-value without scipy')\n"
        "print('ok')\n"
    )
    done = _run(code, ("scipy",))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"


def test_bug_run_without_scipy_refused_before_training(tmp_path):
    """Bug: ``run`` of a comparison with several seeds, scipy missing, trained its runs and then failed writing the
    table (paired t test) with ``error: No module named 'scipy'``: hours of training could end in an error, the
    table and figures not written; ``publish`` copied the comparison's files into the docs and then failed, leaving
    them without their page. Now :func:`run_experiment` and :func:`publish_experiment` refuse before anything trains,
    is written or copied, naming scipy and the extra; one seed (no p-values) still runs without it."""
    args = (["run", "experiments/configs/study_text.toml", "--out", str(tmp_path), "--no-progress",
             "--set", "tasks=pydoc-chars", "--set", "operators=attention,laplacian-1"]
            + [x for kv in ("train.max_steps=1", "train.warmup_steps=0", "train.eval_interval=1",
                            "train.eval_steps=1", "train.checkpoint_interval=1",
                            "model_overrides={n_layer=1,n_head=2,n_embd=8,block_size=8}")
               for x in ("--set", f"tasks.pydoc-chars.{kv}")])
    code = (
        "import sys, io, contextlib\n"
        "from diffusionformer.experiments.cli import main\n"
        f"args = {args!r}\n"
        "def quiet(argv):\n"
        "    with contextlib.redirect_stdout(io.StringIO()):\n"
        "        return main(argv)\n"
        "print('rc', quiet(args + ['--set', 'seeds=[0,1]']))\n"
        f"import os; assert not os.path.exists({str(tmp_path / 'study-text')!r}), 'something was written'\n"
        "print('rc', quiet(args + ['--set', 'seeds=[0]']))\n"
        "assert 'scipy' not in sys.modules\n"
        # publish of a comparison with two seeds (these are finished): refused before its files are copied
        "publish = ['publish'] + [a for a in args[1:] if a != '--no-progress']\n"
        f"print('rc', quiet(publish + ['--to', {str(tmp_path / 'docs')!r}, '--set', 'seeds=[0,1]']))\n"
        f"assert not os.path.exists({str(tmp_path / 'docs')!r}), 'publish copied files'\n"
    )
    done = _run(code, ("scipy",))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["rc", "2", "rc", "0", "rc", "2"], (done.stdout, done.stderr[-3000:])
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 2, done.stderr[-3000:]
    for line, what in zip(errors, ("trained", "published")):
        assert "scipy" in line and "diffusionformer[experiments]" in line and f"nothing was {what}" in line, line
    assert (tmp_path / "study-text" / "results.md").is_file()


def test_bug_optional_dataset_error_names_the_missing_module():
    """Bug: when scikit-learn is installed but a package it needs is not (scipy), the digits dataset said
    ``needs the optional package 'scikit-learn' ... which is not installed``: false (it is installed), and the
    package actually missing was named nowhere in the message the command line prints."""
    code = (
        "from diffusionformer.data import load_dataset\n"
        "try:\n"
        "    load_dataset('digits')\n"
        "except ImportError as exc:\n"
        "    msg = str(exc)\n"
        "else:\n"
        "    raise AssertionError('digits loaded without scipy')\n"
        "assert \"'scipy'\" in msg and 'scikit-learn' in msg and 'diffusionformer[data]' in msg, msg\n"
        "assert 'is not installed' not in msg.split('scipy')[0], msg\n"
        "print('ok')\n"
    )
    done = _run(code, ("scipy",))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"


def test_pins_optional_dataset_error_when_the_package_itself_is_missing():
    """The message for the package itself missing is unchanged: it names the package, the module and the extra."""
    code = (
        "from diffusionformer.data import load_dataset\n"
        "try:\n"
        "    load_dataset('digits')\n"
        "except ImportError as exc:\n"
        "    msg = str(exc)\n"
        "assert msg == (\"dataset 'digits' needs the optional package 'scikit-learn' (module 'sklearn.datasets'), \"\n"
        "               'which is not installed: pip install \"diffusionformer[data]\"'), msg\n"
        "print('ok')\n"
    )
    done = _run(code, ("sklearn",))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"


def test_pins_public_packages_import_without_optional_packages():
    """Every public package (and the command line's ``--help``, ``run --help`` and ``list``) imports and works with
    matplotlib, scipy, triton, torch-scatter, scikit-learn, mnist1d, mlxtend and Pillow all missing, and pulls none
    of the heavy optional modules (nor PyG, nor torch._dynamo) when they are installed."""
    heavy = ["torch_geometric", "matplotlib", "scipy", "pandas", "sympy", "triton", "torch._dynamo", "PIL", "sklearn",
             "torch_scatter", "mnist1d", "mlxtend"]
    code = (
        "import sys, io, contextlib\n"
        "import diffusionformer, diffusionformer.nn, diffusionformer.ops, diffusionformer.graph\n"
        "import diffusionformer.operators, diffusionformer.models, diffusionformer.data, diffusionformer.train\n"
        "import diffusionformer.analysis, diffusionformer.experiments, diffusionformer.testing, diffusionformer.ops.triton\n"
        "from diffusionformer.experiments.cli import main\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        "    for argv in (['--help'], ['run', '--help'], ['list']):\n"
        "        try:\n"
        "            rc = main(argv)\n"
        "        except SystemExit as exc:\n"
        "            rc = exc.code\n"
        "        assert rc == 0, (argv, rc)\n"
        "assert 'operators:' in out.getvalue() and 'usage: diffusionformer run' in out.getvalue()\n"
        "assert not diffusionformer.ops.triton.is_available()\n"
        f"print(sorted(m for m in {heavy!r} if m in sys.modules))\n"
    )
    missing = ("matplotlib", "scipy", "triton", "torch_scatter", "sklearn", "mnist1d", "mlxtend", "PIL")
    done = _run(code, missing, "-W", "error")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]", done.stdout
    loaded = _run(code.replace("assert not diffusionformer.ops.triton.is_available()\n", ""), (), "-W", "error")
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    assert loaded.stdout.strip() == "[]", loaded.stdout


def test_pins_plots_without_matplotlib_name_the_extra():
    """Without matplotlib the figures of ``analysis`` and ``graph`` raise an ImportError naming the ``plot`` extra,
    and the metrics that need no figure still compute."""
    code = (
        "import torch\n"
        "from diffusionformer.analysis import plot_spectra, effective_rank\n"
        "from diffusionformer.graph.export import draw_attention_graph, to_networkx\n"
        "assert abs(float(effective_rank(torch.ones(3))) - 3.0) < 1e-5\n"
        "G = to_networkx(torch.tensor([[0, 1], [1, 0]]), torch.tensor([0.5, 1.0]))\n"
        "for f, args in ((plot_spectra, ({'a': torch.ones(3)},)), (draw_attention_graph, (G,))):\n"
        "    try:\n"
        "        f(*args)\n"
        "    except ImportError as exc:\n"
        "        assert 'matplotlib' in str(exc) and 'diffusionformer[plot]' in str(exc), str(exc)\n"
        "    else:\n"
        "        raise AssertionError(f.__name__)\n"
        "print('ok')\n"
    )
    done = _run(code, ("matplotlib",))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"


def test_bug_torch_scatter_imported_at_package_import(tmp_path):
    """Bug: ``import diffusionformer`` (through ``ops.scatter``) imported torch-scatter whenever it was installed, a
    compiled extension (its libraries loaded, its CUDA-version checks run) that the library uses only for CUDA
    tensors: a CPU user paid for it at every start, the command line's ``--help`` included. Now it is imported on
    first use for a CUDA tensor, for ``backend="torch_scatter"``, or when ``HAS_TORCH_SCATTER`` is read. A stand-in
    ``torch_scatter`` package on the path records its import."""
    (tmp_path / "torch_scatter").mkdir()
    (tmp_path / "torch_scatter" / "__init__.py").write_text(
        "import torch\n"
        "def scatter_add(src, index, dim=0, dim_size=None):\n"
        "    return torch.full((dim_size,) + tuple(src.shape[1:]), 7.0)\n"
        "def scatter_max(src, index, dim=0, dim_size=None):\n"
        "    return torch.full((dim_size,) + tuple(src.shape[1:]), 9.0), None\n"
    )
    code = (
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "import torch, diffusionformer, diffusionformer.functional as F, diffusionformer.experiments.cli\n"
        "from diffusionformer.ops import scatter as S\n"
        "src, index = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0, 2, 0])\n"
        "assert F.scatter_sum(src, index, 3).tolist() == [4.0, 0.0, 2.0]\n"
        "assert F.scatter_max(src, index, 3).tolist() == [3.0, 0.0, 2.0]\n"
        "assert F.segment_softmax(src, index, 3).shape == (3,)\n"
        "assert 'torch_scatter' not in sys.modules, 'imported for CPU tensors'\n"
        "assert S.scatter_sum(src, index, 3, backend='torch_scatter').tolist() == [7.0, 7.0, 7.0]\n"
        "assert S.scatter_max(src, index, 3, backend='torch_scatter').tolist() == [9.0, 9.0, 9.0]\n"
        "assert 'torch_scatter' in sys.modules and S.HAS_TORCH_SCATTER is True\n"
        "from diffusionformer.ops.scatter import *\n"
        "assert HAS_TORCH_SCATTER is True\n"
        "print('ok')\n"
    )
    done = _run("import sys\n" + code)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"
    # torch-scatter missing: HAS_TORCH_SCATTER is False, "auto" is native, asking for it is a ValueError naming the extra
    code = (
        "import torch\n"
        "from diffusionformer.ops import scatter as S\n"
        "src, index = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0, 2, 0])\n"
        "assert S.HAS_TORCH_SCATTER is False and S.scatter_sum(src, index, 3).tolist() == [4.0, 0.0, 2.0]\n"
        "try:\n"
        "    S.scatter_sum(src, index, 3, backend='torch_scatter')\n"
        "except ValueError as exc:\n"
        "    assert 'diffusionformer[scatter]' in str(exc), str(exc)\n"
        "else:\n"
        "    raise AssertionError('torch_scatter back-end without torch-scatter')\n"
        "print('ok')\n"
    )
    done = _run(code, ("torch_scatter",))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"


def test_bug_importing_experiments_main_ran_the_command_line():
    """Bug: ``experiments/__main__.py`` called ``sys.exit(main())`` at import, with no ``__name__`` guard: importing
    it (a tool that imports every module of the package, ``pkgutil.walk_packages`` + ``import_module``, pydoc)
    ran the command line on the importer's ``sys.argv`` and exited the interpreter. ``python -m`` still runs it."""
    code = (
        "import sys, importlib\n"
        "sys.argv = ['tool', 'show', 'no-such-config.toml']\n"
        "mod = importlib.import_module('diffusionformer.experiments.__main__')\n"
        "print('imported', callable(mod.main))\n"
    )
    done = _run(code)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "imported True" and done.stderr == "", done.stderr[-3000:]
    ran = subprocess.run([sys.executable, "-m", "diffusionformer.experiments", "show", "no-such-config.toml"], cwd=REPO,
                         capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PATH": ""})
    assert ran.returncode == 2 and ran.stderr.startswith("error: ") and "no-such-config.toml" in ran.stderr


def test_bug_planetoid_without_scipy_reported_as_corrupt_file(tmp_path):
    """Bug: scipy is a dependency neither of the package nor of PyG, but the Planetoid reader (Cora, CiteSeer) needs
    ``scipy.sparse`` for the pickled feature matrices; without it every file was reported as ``CorruptDataError:
    corrupt Planetoid file '.../ind.cora.x': ModuleNotFoundError: No module named 'scipy'``: a user told to replace
    intact data. Now an ImportError names scipy and the extra, and no file is called corrupt. The ``x`` file here is
    a pickle naming ``scipy.sparse.csr.csr_matrix``, as the real ones do."""
    from diffusionformer.data.planetoid import PLANETOID_FILES

    for part in PLANETOID_FILES:
        (tmp_path / f"ind.cora.{part}").write_bytes(b"\x80\x02cscipy.sparse.csr\ncsr_matrix\n)\x81}b.")
    code = (
        "from diffusionformer.data import CorruptDataError\n"
        "from diffusionformer.data.planetoid import read_planetoid\n"
        "try:\n"
        f"    read_planetoid({str(tmp_path)!r}, 'cora')\n"
        "except CorruptDataError as exc:\n"
        "    raise AssertionError(f'called corrupt: {exc}')\n"
        "except ImportError as exc:\n"
        "    msg = str(exc)\n"
        "assert \"'scipy'\" in msg and 'diffusionformer[data]' in msg and 'cora' in msg, msg\n"
        "print('ok')\n"
    )
    done = _run(code, ("scipy",))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"
