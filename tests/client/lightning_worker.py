"""One rank of a 2-process Lightning DDP run on CPU (gloo), reporting through FleetscopeCallback.

Started by torchrun from test_lightning.py. Rank 1's training step takes 30 ms longer (a slower
accelerator), so DDP's all-reduce makes rank 0 wait: the callback must book that wait as rank 0's comm.
"""

from __future__ import annotations

import os
import sys
import time

import torch

try:
    import lightning.pytorch as pl
except ImportError:
    import pytorch_lightning as pl

from fleetscope.client.lightning import FleetscopeCallback

SLOW_SECONDS = 0.03


class TinyModule(pl.LightningModule):
    def __init__(self, slow: bool) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)
        self.slow = slow

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        if self.slow:
            time.sleep(SLOW_SECONDS)
        x, y = batch
        return torch.nn.functional.mse_loss(self.linear(x).squeeze(-1), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> int:
    torch.set_num_threads(1)
    x = torch.randn(256, 4, generator=torch.Generator().manual_seed(0))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(dim=1)), batch_size=4)
    trainer = pl.Trainer(
        max_steps=int(os.environ.get("PL_TEST_STEPS", "20")), accelerator="cpu", devices=2, num_nodes=1,
        strategy="ddp", logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[FleetscopeCallback()],
    )
    trainer.fit(TinyModule(slow=int(os.environ["RANK"]) == 1), loader)
    return 0


if __name__ == "__main__":
    sys.exit(main())
