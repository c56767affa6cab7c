"""One rank of a 2-process Hugging Face Trainer run on CPU (gloo), reporting through FleetscopeCallback.

Started by torchrun from test_hf.py. Rank 1's forward takes 30 ms longer (a slower accelerator), so the
Trainer's DDP all-reduce makes rank 0 wait: the callback must book that wait as rank 0's comm.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import transformers

from fleetscope.client.hf import FleetscopeCallback

SLOW_SECONDS = 0.03


class TinyRegression(torch.nn.Module):
    def __init__(self, slow: bool) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)
        self.slow = slow

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.slow:
            time.sleep(SLOW_SECONDS)
        return {"loss": torch.nn.functional.mse_loss(self.linear(x).squeeze(-1), labels)}


class Points(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self, count: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(count, 4, generator=generator)
        self.y = self.x.sum(dim=1)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[index], "labels": self.y[index]}


def main() -> int:
    torch.set_num_threads(1)
    args = transformers.TrainingArguments(
        output_dir=sys.argv[1], max_steps=int(os.environ.get("HF_TEST_STEPS", "20")), per_device_train_batch_size=4,
        logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True, ddp_backend="gloo",
    )
    callback = FleetscopeCallback()
    trainer = transformers.Trainer(
        model=TinyRegression(slow=int(os.environ["RANK"]) == 1), args=args, train_dataset=Points(256),
        callbacks=[callback],
    )
    trainer.train()
    return 0


if __name__ == "__main__":
    sys.exit(main())
