"""A two-rank PyTorch Lightning job run with plain `python` (Lightning's own launcher re-runs
this script for rank 1). With --bug, rank 0 alone all-reduces at its third batch; with
--sync-log, rank 0 alone logs a metric with sync_dist=True at the end of each epoch (the line
marked 'the SYNC LOG'), which Lightning all-reduces from its own code; with --sync-log --all,
every rank logs it (healthy). With --stop, rank 1 alone sets trainer.should_stop = True in its
first epoch (the line marked 'the STOP'), which ends its epoch loop alone; with --stop --all,
every rank sets it at the same batch (healthy)."""

import sys

import lightning as L
import torch
import torch.distributed as dist


class Tiny(L.LightningModule):
    def __init__(self, bug: bool) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.bug = bug

    def training_step(self, batch, i):
        if self.bug and self.global_rank == 0 and i == 2:
            dist.barrier()  # the BUG: rank 0 only
        if "--stop" in sys.argv and self.current_epoch == 0 and i == 2:
            if "--all" in sys.argv:
                self.trainer.should_stop = True
            elif self.global_rank == 1:
                self.trainer.should_stop = True  # the STOP: rank 1 alone
        return self.layer(batch[0]).pow(2).mean()

    def on_train_epoch_end(self):
        if "--sync-log" not in sys.argv:
            return
        value = self.layer.weight.detach().abs().mean()
        if "--all" in sys.argv:
            self.log("w", value, sync_dist=True)
        elif self.trainer.is_global_zero:
            self.log("w", value, sync_dist=True)  # the SYNC LOG: rank 0 only

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    data = torch.utils.data.TensorDataset(torch.randn(32, 4))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2,
                        limit_train_batches=6, enable_progress_bar=False, logger=False,
                        enable_checkpointing=False, enable_model_summary=False)
    trainer.fit(Tiny("--bug" in sys.argv), loader)
    print(f"JOB DONE rank {trainer.global_rank}", flush=True)


if __name__ == "__main__":
    main()
