"""One rank of a real ``torch.distributed`` (gloo, CPU) job, instrumented exactly as the README shows.

Run one process per rank with torchrun's environment (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) and ``FLEETSCOPE_PUSH_URL``
pointing at the node's daemon::

    python -m tests.e2e.gloo_rank --model ddp --steps 600 [--slow-rank 6 --slowdown 0.2]

The model is an MLP wrapped in DDP, FSDP2 (``fully_shard``) or FSDP1. Between
its layers, :class:`Accelerator` stands for the GPU kernels of a real model:
its forward and backward wait ``--device-ms`` in all (as the host would wait
on a CUDA synchronize), so several ranks sharing two cores do not steal that
time from each other. A slow rank (a throttled GPU) stretches only that wait,
by ``--slowdown``; its host work is unchanged, and nothing here writes a phase
or a duration: the client measures what happens.

Faults, each on one rank: ``--data-rank`` gets batches from DataLoader workers
slower than the step (an input-bound rank); ``--stall-rank`` stops getting
batches after ``--fault-step`` steps (its loader hangs: a real hang, the other
ranks wait in the all-reduce); ``--die-rank`` kills itself with SIGKILL after
``--fault-step`` steps (the others' next collective fails). A faulted rank
prints ``fault <unix time>`` when it happens.

Pauses that are not hangs (#26 item 3), after ``--pause-step`` steps, for
``--pause-seconds``: ``checkpoint`` (rank 0 saves the model to storage that takes
that long while the others wait in a barrier, all inside the step),
``checkpoint-declared`` (rank 0 saves inside ``tracker.phase("checkpoint")``
while the others go on and wait in the next step's all-reduce) and
``evaluation`` (every rank runs forward passes over an evaluation set, then the
ranks all-reduce the metric). Under ``torchrun --max-restarts``, ``--fail-rank``
raises after ``--fault-step`` steps of the first attempt (an elastic restart
follows) and each attempt resumes from the checkpoint rank 0 writes every
``--save-every`` steps; ``--slow-load-rank`` reads it ``--load-seconds`` longer.
Each rank prints ``pause <start> <end>`` and ``restart <unix time>``.
"""

from __future__ import annotations

import argparse
import gc
import os
import signal
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

from fleetscope.client import StepTracker

STALL_SECONDS = 3600.0


class _Wait(torch.autograd.Function):
    """Identity whose backward waits: the backward kernels' time."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, seconds: float) -> torch.Tensor:
        ctx.seconds = seconds
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        time.sleep(ctx.seconds)
        return grad, None


class Accelerator(torch.nn.Module):
    """The accelerator's share of a layer: ``seconds`` in forward, as much again in backward."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.seconds)
        return _Wait.apply(x, self.seconds)


class Batches(torch.utils.data.Dataset[torch.Tensor]):
    """Random batches; ``delay`` seconds each (in a loader worker); none after ``stop_after`` on a stall."""

    def __init__(self, count: int, batch: int, width: int, delay: float, stop_after: int | None) -> None:
        self.count, self.batch, self.width, self.delay, self.stop_after = count, batch, width, delay, stop_after

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.stop_after is not None and index >= self.stop_after:
            print(f"fault {time.time():.3f}", flush=True)
            time.sleep(STALL_SECONDS)  # the shard's storage stopped answering
        if self.delay:
            time.sleep(self.delay)
        return torch.randn(self.batch, self.width, generator=torch.Generator().manual_seed(index))


def build(kind: str, width: int, device_seconds: float, rank: int) -> torch.nn.Module:
    torch.manual_seed(0)  # the same initial weights on every rank
    layers: list[torch.nn.Module] = []
    for _ in range(3):
        layers += [torch.nn.Linear(width, width), Accelerator(device_seconds / 6), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(width, 1))
    if kind == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    if kind == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        return fully_shard(model)
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    return FullyShardedDataParallel(
        model, auto_wrap_policy=ModuleWrapPolicy({torch.nn.Linear}), device_id=torch.device("cpu")
    )


def evaluate(model: torch.nn.Module, seconds: float, width: int, batch: int) -> None:
    """Forward passes for about ``seconds`` (each costs the accelerator's forward time), then the metric's
    all-reduce: what a trainer's evaluation loop does on every rank."""
    total = torch.zeros(1)
    deadline = time.monotonic() + seconds
    with torch.no_grad():
        while time.monotonic() < deadline:
            total += model(torch.randn(batch, width)).pow(2).mean()
    dist.all_reduce(total)


def pause(kind: str, seconds: float, rank: int, model: torch.nn.Module, tracker: StepTracker, directory: str,
          width: int, batch: int) -> None:
    started = time.time()
    if kind == "evaluation":
        evaluate(model, seconds, width, batch)
    elif kind == "checkpoint":
        if rank == 0:
            torch.save(model.state_dict(), os.path.join(directory, "model.pt"))
            time.sleep(seconds)  # the storage takes its time
        dist.barrier()
    elif rank == 0:  # checkpoint-declared: the others go on to their next all-reduce and wait there
        with tracker.phase("checkpoint"):
            torch.save(model.state_dict(), os.path.join(directory, "model.pt"))
            time.sleep(seconds)
    print(f"pause {started:.3f} {time.time():.3f}", flush=True)


def train(args: argparse.Namespace, rank: int, attempt: int) -> None:
    """The training loop; what it made (the model, DDP's reducer with it) is freed when it returns."""
    device_seconds = args.device_ms / 1000 * (1 + args.slowdown if rank == args.slow_rank else 1)
    data_rank = rank == args.data_rank
    dataset = Batches(
        args.steps, args.batch, args.width, args.data_ms / 1000 if data_rank else 0.0,
        args.fault_step if rank == args.stall_rank else None,
    )
    workers = 2 if data_rank or rank == args.stall_rank else 0
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=workers)
    model = build(args.model, args.width, device_seconds, rank)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

    tracker = StepTracker()                         # job, rank, GPU from the environment
    model = tracker.watch(model)                    # collective waits are comm
    saved = os.path.join(args.checkpoint_dir, "resume.pt")
    if attempt and os.path.exists(saved):  # an elastic restart: resume where the last checkpoint was
        print(f"restart {time.time():.3f}", flush=True)
        model.load_state_dict(torch.load(saved))
        if rank == args.slow_load_rank:
            time.sleep(args.load_seconds)  # its node reads the checkpoint slower
    for step, batch in enumerate(tracker.steps(loader), 1):  # one step per batch; its fetch is data
        loss = model(batch).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if rank == args.die_rank and step == args.fault_step:
            print(f"fault {time.time():.3f}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)  # the OOM killer, a segfault in a kernel, a node's reboot
        if rank == args.fail_rank and step == args.fault_step and not attempt:
            print(f"fault {time.time():.3f}", flush=True)
            raise RuntimeError("NCCL error: unhandled system error")  # torchrun restarts every rank
        if rank == 0 and args.fail_rank >= 0 and step % args.save_every == 0:
            torch.save(model.state_dict(), saved + ".tmp")
            os.replace(saved + ".tmp", saved)
        if args.pause and step == args.pause_step:
            pause(args.pause, args.pause_seconds, rank, model, tracker, args.checkpoint_dir, args.width, args.batch)
    tracker.close()


def end_process_group() -> None:
    """``dist.destroy_process_group()`` once nothing else holds the group.

    torch 2.13 (gloo): a DDP reducer that holds the group's last reference, freed with the GIL held (a model
    that outlives the group, freed when main() returns), destroys the group there and waits for its worker
    thread, which may be waiting for the GIL to free its last work: the rank finishes its steps and never
    exits (fresh-clone run 92, a DDP rank of tests/e2e/test_training_jobs.py). Freed while the group is still
    registered, the reducer only drops a reference, and the group's own destructor releases the GIL."""
    gc.collect()  # a model in a reference cycle goes now, not at some later collection
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["ddp", "fsdp2", "fsdp1"], default="ddp")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--device-ms", type=float, default=120.0, help="Accelerator time per step.")
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--slowdown", type=float, default=0.2)
    parser.add_argument("--data-rank", type=int, default=-1)
    parser.add_argument("--data-ms", type=float, default=0.0, help="Time a loader worker takes per batch.")
    parser.add_argument("--stall-rank", type=int, default=-1)
    parser.add_argument("--die-rank", type=int, default=-1)
    parser.add_argument("--fault-step", type=int, default=100)
    parser.add_argument("--pause", choices=["checkpoint", "checkpoint-declared", "evaluation"])
    parser.add_argument("--pause-step", type=int, default=100)
    parser.add_argument("--pause-seconds", type=float, default=180.0)
    parser.add_argument("--checkpoint-dir", default=".")
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--save-every", type=int, default=50)
    parser.add_argument("--slow-load-rank", type=int, default=-1)
    parser.add_argument("--load-seconds", type=float, default=0.0)
    args = parser.parse_args()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    torch.set_num_threads(1)  # several ranks share a few cores: no oversubscription
    if attempt and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # torchrun's agent keeps one store across restarts, and gloo's full mesh of the new attempt read the old
        # ranks' addresses from it (torch 2.13: 3 of 3 restarts of 4 ranks failed to connect): a prefix per attempt.
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
        dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt-{attempt}", store),
                                rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    else:
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    train(args, rank, attempt)
    end_process_group()
    print(f"rank {rank}: {args.steps} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
