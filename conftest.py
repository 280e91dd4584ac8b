"""Root conftest: import the package before pytest collects its doctests.

With ``--import-mode=importlib`` pytest imports a module whose doctests it collects by file; if
nothing has imported the package yet, that file becomes a second module object beside the one the
package imports: ``pytest diffusionformer/ops/dense.py tests/core`` then patched a copy of
``ops/dense.py`` that the layers do not call, and ``test_host_paths.py`` failed. Importing the package
here first makes pytest reuse ``sys.modules``.
"""

import diffusionformer  # noqa: F401
