"""Worker run by ``test_train_ddp.py`` under ``python -m torch.distributed.run --nproc_per_node=2``.

Usage: ``train_ddp_worker.py OUT_DIR [GRAD_ACCUM_STEPS]``. Trains the tiny regression task on every rank; rank 1
also saves its replica's final weights to ``OUT_DIR/replica_rank1.pt`` so the test can check
that DDP kept the replicas equal.
"""

from __future__ import annotations

import os
import sys


def main(out_dir: str, accum: int = 1) -> None:
    import torch
    from train_tiny_tasks import RegressionTask, TinyMLP, ddp_config

    from diffusionformer.train import Trainer, seed_everything

    class ShapeRecorder(RegressionTask):
        def loss(self, model, batch):  # type: ignore[no-untyped-def]
            rows.append(batch["x"].shape[0])
            return super().loss(model, batch)

    rows: list[int] = []
    no_sync_calls: list[int] = []
    original_no_sync = torch.nn.parallel.DistributedDataParallel.no_sync

    def counting_no_sync(self):  # type: ignore[no-untyped-def]
        no_sync_calls.append(1)
        return original_no_sync(self)

    torch.nn.parallel.DistributedDataParallel.no_sync = counting_no_sync  # type: ignore[method-assign]
    torch.set_num_threads(1)
    seed_everything(0)
    model = TinyMLP(dropout=0.0)  # dropout masks of a shard differ from the whole batch's
    config = ddp_config(grad_accum_steps=accum)
    # the task's loss jitter from the global RNGs is drawn per loss call, and every rank draws from global
    # generators of its own (as dropout must): a rank's jitter is not the single process's, so leave it out
    summary = Trainer(model, ShapeRecorder(global_rng=False), config, out_dir).fit()
    assert summary["world_size"] == 2, summary
    # each rank saw its half of every global batch, in `accum` micro-batches
    assert rows == [config.batch_size // (2 * accum)] * (config.max_steps * accum), rows
    # gradients were all-reduced on the last micro-batch of each update only
    assert len(no_sync_calls) == (accum - 1) * config.max_steps, no_sync_calls
    if int(os.environ["RANK"]) == 1:
        torch.save(model.state_dict(), os.path.join(out_dir, "replica_rank1.pt"))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1)
    # no interpreter teardown: Gloo's may abort a process at exit ("terminate called without an active exception",
    # pytorch/pytorch#179291; rank 1 once in a CI run of sitting 48), after this rank's work is checked above and on
    # disk; an exception in main() still exits 1 with its traceback (as launch_gloo_ranks' ranks do)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
