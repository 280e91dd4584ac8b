"""Makes ``tests/experiments``' shared helpers (``experiments_tiny_configs``) importable here too: pytest runs with
``--import-mode=importlib``, which leaves ``sys.path`` alone."""

from __future__ import annotations

import sys
from pathlib import Path

_EXPERIMENTS = str(Path(__file__).resolve().parents[1] / "experiments")
if _EXPERIMENTS not in sys.path:
    sys.path.insert(0, _EXPERIMENTS)
