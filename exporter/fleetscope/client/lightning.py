"""PyTorch Lightning hook: report every optimizer step from every rank.

    from fleetscope.client.lightning import FleetscopeCallback
    trainer = L.Trainer(..., callbacks=[FleetscopeCallback()])

Importing this module imports Lightning (``lightning.pytorch``, or the older
``pytorch_lightning``); :mod:`fleetscope.client` itself does not. A step is
one optimizer update (``trainer.global_step`` advancing, so gradient
accumulation is counted once), from the end of the previous step to the end
of its last micro-batch. ``data_seconds`` sums the gaps between one batch's
end and the next batch's start, where Lightning fetches the batch (on a GPU,
the device's idle time over those gaps; ``fetch_seconds`` the host's). The model
the strategy trains (DDP-wrapped, or FSDP) is watched
(:meth:`StepTracker.watch`), so collective waits are ``comm_seconds`` and the
rest is ``compute_seconds``. The loss is reported only when it is already on
the host (or with ``report_loss=True``): reading a GPU loss would synchronise
the device every step.
"""

from __future__ import annotations

import time
from typing import Any

try:
    from lightning.pytorch import Callback
except ImportError:  # the standalone package name
    try:
        from pytorch_lightning import Callback
    except ImportError as exc:  # an optional hook: say which extra brings it
        raise ImportError("fleetscope.client.lightning needs lightning: pip install 'fleetscope[lightning]'") from exc

from fleetscope.client.tracker import Step, StepTracker, batch_size


class FleetscopeCallback(Callback):
    def __init__(
        self, tracker: StepTracker | None = None, report_loss: bool = False, **tracker_kwargs: Any
    ) -> None:
        self.tracker = tracker
        self.report_loss = report_loss
        self._tracker_kwargs = tracker_kwargs
        self._watched = False
        self._reset()

    def _reset(self) -> None:
        self._step: Step | None = None
        self._last_end: float | None = None
        self._last_end_event: Any = None  # the device event recorded at the last batch's end (on a GPU)
        self._samples = 0
        self._last_global_step: int | None = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if self.tracker is None:
            options = {
                "rank": trainer.global_rank,
                "local_rank": trainer.local_rank,
                "world_size": trainer.world_size,
                **self._tracker_kwargs,
            }
            self.tracker = StepTracker(**options)
        if not self._watched:
            self.tracker.watch(getattr(trainer.strategy, "model", None) or pl_module)
            self._watched = True
        self._reset()
        self._last_global_step = trainer.global_step

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self.tracker is None:
            return
        timeline = self.tracker.timeline
        if self._last_end is not None:  # Lightning fetched this batch since the last one ended: a data phase
            # (before a step, it counts in the step's wall time; in one, a later micro-batch's fetch is inside it)
            timeline.leave(timeline.enter("data", since=self._last_end, event=self._last_end_event))
        if self._step is None:
            self._step = self.tracker.step(trainer.global_step + 1)
            self._step.__enter__()

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        size = batch_size(batch)
        if size:
            self._samples += size
        step = self._step
        if trainer.global_step == self._last_global_step or step is None:
            self._batch_ended()
            return  # an accumulation micro-batch: the optimizer has not stepped yet
        self._last_global_step = trainer.global_step
        step.step = trainer.global_step
        step.samples = self._samples or None
        step.loss = self._loss(outputs)
        step.__exit__(None, None, None)
        self._step = None
        self._samples = 0
        self._batch_ended()

    def _batch_ended(self) -> None:
        self._last_end = time.perf_counter()
        self._last_end_event = self.tracker.timeline.mark() if self.tracker is not None else None

    def _loss(self, outputs: Any) -> float | None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is None or not hasattr(loss, "detach"):
            return None
        if not self.report_loss and getattr(getattr(loss, "device", None), "type", "cpu") != "cpu":
            return None
        return float(loss.detach().item())

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.tracker is not None:
            self.tracker.close()
