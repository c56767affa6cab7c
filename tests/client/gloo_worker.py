"""One rank of a 2-process data-parallel CPU training loop (gloo), instrumented as the README shows.

Started by torchrun from test_gloo_training.py: ``StepTracker()``,
``tracker.watch(DDP(model))`` and ``for batch in tracker.steps(loader)``.
Rank 1's accelerator share takes 60 ms longer per step (a wait inside forward
and backward), so rank 0 must show the difference as exposed
communication, measured by watch(), and rank 1 as compute.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

from fleetscope.client import SenderStats, StepTracker
from tests.e2e.gloo_rank import Accelerator, end_process_group

STEPS = int(os.environ.get("GLOO_TEST_STEPS", "30"))
SLOW_SECONDS = 0.06  # extra accelerator time per step on rank 1 (half in forward, half in backward)


def train(rank: int) -> SenderStats:
    """The loop; the model (DDP's reducer with it) is freed when it returns (see end_process_group)."""
    torch.manual_seed(0)  # same initial weights on every rank
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), Accelerator(SLOW_SECONDS / 2 if rank == 1 else 0.0), torch.nn.ReLU(),
        torch.nn.Linear(64, 1),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    target = torch.randn(32, 1, generator=torch.Generator().manual_seed(1))
    data = torch.Generator().manual_seed(100 + rank)  # each rank its own shard
    inputs = [torch.randn(16, 32, generator=data) for _ in range(STEPS)]

    tracker = StepTracker()  # job, rank, local_rank, world size and URL from the environment
    model = tracker.watch(torch.nn.parallel.DistributedDataParallel(model))
    for x in tracker.steps(inputs):
        loss = torch.nn.functional.mse_loss(model(x), x @ target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    tracker.close(timeout=10)
    return tracker.stats()


def main() -> int:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    stats = train(rank)
    end_process_group()
    if stats.sent != STEPS:
        print(f"rank {rank}: {stats.sent} of {STEPS} steps delivered: {stats}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
