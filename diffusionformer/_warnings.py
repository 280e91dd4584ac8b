"""The ``stacklevel`` of a warning that names the user's line: :func:`user_stacklevel`.

Private; used by the warnings that public functions reach some calls deep (data caches, experiment configs and
results, validation, the metrics log), where a fixed ``stacklevel`` named a library line for all but one entry point.
"""

from __future__ import annotations

import sys


def user_stacklevel() -> int:
    """The ``stacklevel`` for a warning issued by this function's caller that names the first frame outside the
    package: the user's line (``load_dataset(...)``, ``check_experiment(...)``) that reached it some calls deep, a
    number that differs between entry points (a fixed ``stacklevel`` named a library line for all but one). A frame
    is the package's when its module is (also the ``__init__`` that :mod:`dataclasses` generates for a config, run
    in its module's globals); 2 (the caller's caller) when every frame is the package's."""
    frame, level = sys._getframe(1), 1
    while frame is not None and str(frame.f_globals.get("__name__")).partition(".")[0] == "diffusionformer":
        frame, level = frame.f_back, level + 1
    return 2 if frame is None else level
