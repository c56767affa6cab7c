"""``tracker.watch(model)``: book the exposed collective waits of DDP and FSDP as ``comm``.

Imported only by :meth:`StepTracker.watch <fleetscope.client.StepTracker.watch>`,
so torch is imported when a model is watched, never before. Written against
torch 2.13 (``torch.distributed.fsdp``); what each integration measures:

* **DDP** (and any model whose gradients are all-reduced when backward ends,
  such as the one a Hugging Face or Lightning trainer wraps): DDP overlaps
  its bucketed all-reduces with the rest of backward, then waits for them
  all before ``backward()`` returns. A gradient hook on every parameter
  notes when the last gradient was computed; an autograd callback queued
  behind DDP's own runs once DDP has waited. The time between is the wait
  the overlap did not hide. The rank is in ``comm`` meanwhile.
* **FSDP2** (``fully_shard``): each module's all-gather and reduce-scatter
  go through a timed wrapper of the module's collective
  (``set_custom_all_gather``/``set_custom_reduce_scatter``, wrapping the one
  set before, if any).
* **FSDP1** (``FullyShardedDataParallel``): each handle's unshard (the
  all-gather) is timed, and the root's communication hook (the
  reduce-scatter) wraps torch's default one; a hook registered before is
  kept and its reduce-scatters are not timed.

On the CPU (gloo) every wait is on the host and measured exactly. On a GPU
(NCCL) collectives are asynchronous: the host only launches them, so the
waits are timed with CUDA events on the stream that waits (read later,
without synchronising the device): for DDP the stall of the compute stream
between the last gradient and the end of DDP's wait, which is exactly the
exposed wait; for FSDP the time each collective occupies its stream, which
includes the part overlapped with compute. That FSDP figure is larger than
the exposed wait on every rank alike, while the extra time a rank spends
waiting for a slow peer still lands in its own collectives and not in its
compute, so ranks still compare. See docs/instrumentation.md.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

try:
    import torch
except ImportError as exc:  # an optional part: say which extra brings it
    raise ImportError("fleetscope.client.distributed needs torch: pip install 'fleetscope[torch]'") from exc

from fleetscope.client.timeline import Mark, Marker

if TYPE_CHECKING:
    from fleetscope.client.tracker import StepTracker

logger = logging.getLogger(__name__)


class _Timing:
    """Times one region as ``comm`` on the tracker's timeline (device events where it has a GPU)."""

    def __init__(self, tracker: StepTracker) -> None:
        self.tracker = tracker
        self.timeline = tracker.timeline

    def begin(self, host_started: float | None = None) -> Mark:
        return self.timeline.enter("comm", since=host_started)

    def end(self, mark: Mark) -> None:
        self.timeline.leave(mark)


def cuda_marker(device: torch.device) -> Marker:
    """Records a timing event on ``device``'s current stream (the one the work being timed runs on)."""

    def mark() -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(device))
        return event

    return mark


def _device(module: torch.nn.Module) -> torch.device | None:
    for param in module.parameters():
        return param.device
    return None


def watch(tracker: StepTracker, model: torch.nn.Module) -> None:
    device = _device(model)
    if device is not None and device.type == "cuda":
        if device.index is not None:
            tracker.use_gpu(device.index)
        if tracker.cuda_events:
            tracker.timeline.use_device(cuda_marker(device))
    timing = _Timing(tracker)
    if _watch_fsdp2(model, timing) or _watch_fsdp1(model, timing):
        return
    module = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
    _GradientWaits(module, timing)


class _GradientWaits:
    """DDP's exposed all-reduce wait: from the last gradient to the end of DDP's own final callback."""

    def __init__(self, module: torch.nn.Module, timing: _Timing) -> None:
        self.timing = timing
        self.last_gradient = 0.0
        self.armed = False
        self.token: Mark | None = None
        params = [p for p in module.parameters() if p.requires_grad]
        for param in params:
            param.register_post_accumulate_grad_hook(self._gradient)
        if not params:
            logger.info("fleetscope: watch() found no trainable parameters; no comm is booked")

    def _gradient(self, param: torch.Tensor) -> None:
        self.last_gradient = time.perf_counter()
        if not self.armed:
            self.armed = True
            # Final callbacks run in order once the graph is done, DDP's finalize (which waits for the
            # all-reduces) among them; one queued from a final callback runs after all of them.
            torch.autograd.Variable._execution_engine.queue_callback(self._graph_done)

    def _graph_done(self) -> None:
        self.armed = False
        try:
            self.token = self.timing.begin(host_started=self.last_gradient)
            torch.autograd.Variable._execution_engine.queue_callback(self._reduced)
        except Exception as exc:
            self.token = None
            self.timing.tracker.count_error(exc)

    def _reduced(self) -> None:
        token, self.token = self.token, None
        if token is not None:
            try:
                self.timing.end(token)
            except Exception as exc:
                self.timing.tracker.count_error(exc)


class _TimedCollective:
    """An FSDP collective (all-gather or reduce-scatter) that times each call."""

    def __init__(self, inner: Any, timing: _Timing) -> None:
        self._inner = inner
        self._timing = timing

    def allocate(self, *args: Any, **kwargs: Any) -> Any:
        return self._inner.allocate(*args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        token = self._timing.begin()
        try:
            return self._inner(*args, **kwargs)
        finally:
            self._timing.end(token)


def _watch_fsdp2(model: torch.nn.Module, timing: _Timing) -> bool:
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives as collectives

    modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for module in modules:
        groups = module._get_fsdp_state()._fsdp_param_groups
        if len(groups) != 1:
            continue  # no parameters of its own (or several meshes: FSDP refuses a custom collective)
        group = groups[0]
        all_gather = getattr(group, "_all_gather_comm", None) or collectives.DefaultAllGather()
        reduce_scatter = getattr(group, "_reduce_scatter_comm", None) or collectives.DefaultReduceScatter()
        if not isinstance(all_gather, _TimedCollective):
            module.set_custom_all_gather(_TimedCollective(all_gather, timing))  # type: ignore[arg-type]
        if not isinstance(reduce_scatter, _TimedCollective):
            module.set_custom_reduce_scatter(_TimedCollective(reduce_scatter, timing))  # type: ignore[arg-type]
    return bool(modules)


def _watch_fsdp1(model: torch.nn.Module, timing: _Timing) -> bool:
    from torch.distributed.algorithms._comm_hooks import default_hooks
    from torch.distributed.fsdp import FullyShardedDataParallel

    states = FullyShardedDataParallel.fsdp_modules(model)
    if not states:
        return False
    for state in states:
        handle = state._handle
        if handle is not None and not getattr(handle.unshard, "_fleetscope", False):
            handle.unshard = _timed_unshard(handle, timing)  # type: ignore[method-assign]
    root = model if isinstance(model, FullyShardedDataParallel) else states[0]
    if root._comm_hook is not None:
        logger.info("fleetscope: this FSDP model has a communication hook already; its reduce-scatters "
                    "are not timed")
        return True

    def reduce(state: Any, grad: torch.Tensor, output: torch.Tensor | None = None) -> None:
        token = timing.begin()
        try:
            if output is None:  # NO_SHARD: an all-reduce
                default_hooks.allreduce_hook(state, grad)
            else:
                default_hooks.reduce_scatter_hook(state, grad, output)
        finally:
            timing.end(token)

    group = root.process_group or torch.distributed.distributed_c10d._get_default_group()
    root.register_comm_hook(default_hooks.DefaultState(group), reduce)
    return True


def _timed_unshard(handle: Any, timing: _Timing) -> Any:
    unshard = handle.unshard

    def timed() -> None:
        if not handle.needs_unshard():
            unshard()
            return
        token = timing.begin()
        try:
            unshard()
        finally:
            timing.end(token)

    timed._fleetscope = True  # type: ignore[attr-defined]
    return timed

