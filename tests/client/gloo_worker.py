"""One rank of a 2-process data-parallel CPU training loop (gloo), instrumented with the client.

Started by torchrun from test_gloo_training.py. Gradients are averaged with an
explicit all_reduce so the loop can time compute and communication apart.
Rank 1 is made a straggler (extra compute time), so rank 0 must show the wait
as exposed communication.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist

from fleetscope.client import StepTracker

STEPS = int(os.environ.get("GLOO_TEST_STEPS", "30"))
STRAGGLER_DELAY = 0.02  # seconds of extra "compute" on rank 1


def main() -> int:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # same initial weights on every rank
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    target = torch.randn(32, 1, generator=torch.Generator().manual_seed(1))
    data = torch.Generator().manual_seed(100 + rank)  # each rank its own shard
    tracker = StepTracker()  # job, rank, local_rank, world size and URL from the environment
    for _ in range(STEPS):
        with tracker.step(samples=16) as step:
            with tracker.phase("data"):
                x = torch.randn(16, 32, generator=data)
                y = x @ target
            with tracker.phase("compute"):
                optimizer.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                if rank == 1:
                    time.sleep(STRAGGLER_DELAY)
            with tracker.phase("comm"):
                for param in model.parameters():
                    dist.all_reduce(param.grad)
                    param.grad /= world
            with tracker.phase("compute"):
                optimizer.step()
            step.loss = loss.detach()
            step.tokens = 16 * 32
    tracker.close(timeout=10)
    stats = tracker.stats()
    dist.destroy_process_group()
    return 0 if stats.sent == STEPS else 1


if __name__ == "__main__":
    sys.exit(main())
