"""Edge probe: ``torch.compile`` of a graph model in a fresh interpreter, PyG not yet imported.

Found and fixed (test marked "Bug:"): ``DiffusionGraphTransformer`` imported PyG (self loops, graph pool, the global
attention's ``to_dense_batch``) on its first forward, so a first compiled call traced PyG's whole import under dynamo:
a graph break and dynamo's warnings ("a call to a `functools.lru_cache`-wrapped function at 'typing.py:362'", "does
not know how to trace the builtin `sys._getframe`"). ``tests/reliability/test_edge_probes_warnings_44.py`` saw it only
when run alone (earlier tests had imported PyG). The model now imports what its forward needs when it is built.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_CODE = """
import sys, warnings, torch
from diffusionformer.models import DiffusionGraphTransformer, GraphTransformerConfig
assert 'torch_geometric' not in sys.modules
torch.manual_seed(0)
x, ei = torch.randn(6, 4), torch.tensor([[0, 1, 2, 3, 4, 5, 1], [1, 2, 0, 4, 5, 3, 0]])
b = torch.tensor([0, 0, 0, 1, 1, 1])
model = DiffusionGraphTransformer(GraphTransformerConfig(in_channels=4, num_classes=2, dim=16, depth=1, num_heads=2,
                                                         laplacian_heads=1, task="graph", global_attention=True)).eval()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    out = torch.compile(model)(x, ei, b)
    out.sum().backward()
dynamo = [str(w.message).splitlines()[0] for w in caught if "Dynamo" in str(w.message) or "dynamo" in w.filename]
assert dynamo == [], dynamo
torch.testing.assert_close(out, model(x, ei, b), atol=1e-5, rtol=1e-5)
print("ok")
"""


def test_bug_first_compiled_call_of_a_graph_transformer_traces_no_import():
    """Bug: the first compiled call imported PyG under dynamo's tracing (a graph break and two dynamo warnings)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", _CODE], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"
