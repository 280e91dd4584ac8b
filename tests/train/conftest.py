"""Make ``train_tiny_tasks`` (shared with the torchrun worker script) importable from the tests.

pytest runs with ``--import-mode=importlib``, which leaves ``sys.path`` alone, and the worker
script run by ``torch.distributed.run`` imports the same module from its own directory.
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
