"""A real ``torch.distributed`` (gloo, CPU) data-parallel job instrumented with :mod:`fleetscope.client`.

Run one process per rank with the usual torchrun environment (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) plus
``FLEETSCOPE_PUSH_URL`` pointing at the node's daemon::

    python -m fleetscope_sim.gloo_job --seconds 120 [--slow-rank 2 --slowdown 0.2]

Each step times its phases with the client: ``data`` (build a batch),
``compute`` (forward, backward and optimizer step of a small MLP, plus
``--device-ms`` of waiting that stands for the accelerator's kernel time) and
``comm`` (all-reduce of the gradients, which includes waiting for slower
ranks). The slow rank stretches its compute by ``--slowdown`` of what it
measured, the way a GPU at a lower clock would.
"""

from __future__ import annotations

import argparse
import os
import time


def train(seconds: float, slow_rank: int, slowdown: float, width: int, batch: int, device_seconds: float) -> int:
    import torch
    import torch.distributed as dist

    from fleetscope.client import StepTracker

    torch.set_num_threads(1)  # several ranks share a few cores: no oversubscription
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    model = torch.nn.Sequential(
        torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width), torch.nn.ReLU(),
        torch.nn.Linear(width, 1),
    )
    for param in model.parameters():  # every rank starts from rank 0's weights
        dist.broadcast(param.data, src=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    tracker = StepTracker(pp_stage=0, dp_rank=rank)
    deadline = time.monotonic() + seconds
    steps = 0
    while True:
        with tracker.step(samples=batch, tokens=batch * width) as step:
            with tracker.phase("data"):
                inputs = torch.randn(batch, width)
                target = inputs.sum(dim=1, keepdim=True) * 0.01
            with tracker.phase("compute"):
                started = time.perf_counter()
                optimizer.zero_grad()
                loss = torch.nn.functional.mse_loss(model(inputs), target)
                loss.backward()
                # The kernel time of the accelerator this CPU job stands in for: the host waits, as it
                # would on a CUDA synchronize, so ranks sharing a few cores do not steal it from each other.
                time.sleep(device_seconds)
                if rank == slow_rank:
                    time.sleep(slowdown * (time.perf_counter() - started))
            with tracker.phase("comm"):
                # One all-reduce per step, like DDP's gradient buckets; the last slot carries "stop": any rank
                # past its deadline ends the run, so every rank stops on the same step.
                grads = [p.grad for p in model.parameters() if p.grad is not None]
                stop_flag = torch.tensor([1.0 if time.monotonic() >= deadline else 0.0])
                flat = torch.cat([g.reshape(-1) for g in grads] + [stop_flag])
                dist.all_reduce(flat, op=dist.ReduceOp.SUM)
                offset = 0
                for grad in grads:
                    grad.copy_(flat[offset:offset + grad.numel()].view_as(grad) / world)
                    offset += grad.numel()
                stop = flat[-1:]
            with tracker.phase("compute"):  # phases add up: the optimizer is the rank's own work too
                optimizer.step()
            step.loss = float(loss)
        steps += 1
        if stop.item() > 0:
            break
    tracker.close()
    dist.destroy_process_group()
    return steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--slow-rank", type=int, default=-1, help="Rank whose compute is stretched (-1: none).")
    parser.add_argument("--slowdown", type=float, default=0.2, help="Extra compute of the slow rank (0.2 = 20%%).")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--device-ms", type=float, default=80.0,
                        help="Accelerator time per step, spent waiting like a CUDA synchronize (0: CPU only).")
    args = parser.parse_args()
    try:
        import torch  # noqa: F401  (imported by train(); checked here to name the extra)
    except ImportError:
        raise SystemExit("fleetscope_sim.gloo_job needs PyTorch: pip install './sim[torch]'") from None
    steps = train(args.seconds, args.slow_rank, args.slowdown, args.width, args.batch, args.device_ms / 1000)
    print(f"rank {os.environ.get('RANK')}: {steps} steps", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
