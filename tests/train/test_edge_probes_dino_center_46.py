"""Edge probe of DINO's teacher centre under multi-process training with shards of unequal size.

Found and fixed (test marked "Bug:"): ``DINO.update_center`` summed the teacher outputs over the ranks but divided by
one rank's count times the world size (as DINO's reference does), so a task whose ``shard_batch`` splits a batch
unevenly got a centre weighted by rank, not by output; a rank without outputs pulled the centre towards zero.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
from train_tiny_tasks import launch_gloo_ranks

_WORKER = textwrap.dedent('''
    import datetime, json, os, sys
    import torch
    import torch.distributed as dist
    from diffusionformer.models import DINO, DINOConfig

    RANK = int(os.environ["RANK"])
    OUT = sys.argv[1]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    torch.manual_seed(0)  # the same model on both ranks
    dino = DINO(DINOConfig(out_dim=5, center_momentum=0.25))
    dino.center.copy_(torch.arange(5.0).view(1, 5))
    rows = json.loads(sys.argv[2])
    results = []
    for step, counts in enumerate(rows):
        g = torch.Generator().manual_seed(100 * step + RANK)
        dino.update_center(torch.randn(counts[RANK], 5, generator=g) * 3 + RANK)
        results.append(dino.center.double().flatten().tolist())
    with open(os.path.join(OUT, f"rank{RANK}.json"), "w") as f:
        json.dump(results, f)
    sys.stdout.flush()
    os._exit(0)
''')


def _reference(rows: list[list[int]]) -> list[torch.Tensor]:
    """The centre of one process holding every rank's outputs, in float64."""
    center = torch.arange(5.0, dtype=torch.float64).view(1, 5)
    out = []
    for step, counts in enumerate(rows):
        parts = [torch.randn(n, 5, generator=torch.Generator().manual_seed(100 * step + r)) * 3 + r
                 for r, n in enumerate(counts)]
        flat = torch.cat(parts).double()
        if flat.shape[0]:
            center = 0.25 * center + 0.75 * flat.mean(0, keepdim=True)
        out.append(center.flatten())
    return out


@pytest.mark.slow
def test_bug_update_center_weighs_every_output_over_uneven_ranks(tmp_path: Path):
    """Bug: with 1 output on rank 0 and 3 on rank 1 the centre took (sum of 4 outputs) / (1 * 2), not / 4; with none on
    one rank, (sum) / 0 was skipped there only (the ranks' centres drifted apart) or the centre was halved."""
    rows = [[1, 3], [2, 2], [0, 4], [0, 0], [3, 0]]
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    out = tmp_path / "out"
    out.mkdir()
    launch_gloo_ranks(script, [str(out), json.dumps(rows)], tmp_path)
    want = _reference(rows)
    for rank in range(2):
        got = json.loads((out / f"rank{rank}.json").read_text())
        for step, (g, w) in enumerate(zip(got, want)):
            torch.testing.assert_close(torch.tensor(g, dtype=torch.float64), w, rtol=1e-5, atol=1e-5,
                                       msg=lambda m, r=rank, s=step: f"rank {r}, step {s}: {m}")
