"""Worker run by ``test_train_ddp.py`` under ``python -m torch.distributed.run --nproc_per_node=2``.

Usage: ``train_ddp_worker.py OUT_DIR``. Trains the tiny regression task on every rank; rank 1
also saves its replica's final weights to ``OUT_DIR/replica_rank1.pt`` so the test can check
that DDP kept the replicas equal.
"""

from __future__ import annotations

import os
import sys


def main(out_dir: str) -> None:
    import torch
    from train_tiny_tasks import RegressionTask, TinyMLP, ddp_config

    from diffusionformer.train import Trainer, seed_everything

    class ShapeRecorder(RegressionTask):
        def loss(self, model, batch):  # type: ignore[no-untyped-def]
            rows.append(batch["x"].shape[0])
            return super().loss(model, batch)

    rows: list[int] = []
    torch.set_num_threads(1)
    seed_everything(0)
    model = TinyMLP(dropout=0.0)  # dropout masks of a shard differ from the whole batch's
    config = ddp_config()
    summary = Trainer(model, ShapeRecorder(), config, out_dir).fit()
    assert summary["world_size"] == 2, summary
    # each rank saw its half of every global batch
    assert rows == [config.batch_size // 2] * config.max_steps, rows
    if int(os.environ["RANK"]) == 1:
        torch.save(model.state_dict(), os.path.join(out_dir, "replica_rank1.pt"))


if __name__ == "__main__":
    main(sys.argv[1])
