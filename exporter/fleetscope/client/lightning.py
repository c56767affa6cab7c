"""PyTorch Lightning hook: report every optimizer step from every rank.

    from fleetscope.client.lightning import FleetscopeCallback
    trainer = L.Trainer(..., callbacks=[FleetscopeCallback()])

Importing this module imports Lightning (``lightning.pytorch``, or the older
``pytorch_lightning``); :mod:`fleetscope.client` itself does not. A step is
one optimizer update (``trainer.global_step`` advancing, so gradient
accumulation is counted once). ``data_seconds`` sums the gaps between one
batch's end and the next batch's start, where Lightning fetches the batch.
Compute and collective waits are not separable from inside Lightning, so
``compute_seconds`` is not reported. The loss is reported only when it is
already on the host (or with ``report_loss=True``): reading a GPU loss would
synchronise the device every step.
"""

from __future__ import annotations

import time
from typing import Any

try:
    from lightning.pytorch import Callback
except ImportError:  # the standalone package name
    try:
        from pytorch_lightning import Callback  # type: ignore[assignment]
    except ImportError as exc:  # an optional hook: say which extra brings it
        raise ImportError("fleetscope.client.lightning needs lightning: pip install 'fleetscope[lightning]'") from exc

from fleetscope.client.tracker import StepTracker


def _batch_size(batch: Any) -> int | None:
    first = batch[0] if isinstance(batch, (list, tuple)) and batch else batch
    if isinstance(first, dict) and first:
        first = next(iter(first.values()))
    shape = getattr(first, "shape", None)
    return int(shape[0]) if shape else None


class FleetscopeCallback(Callback):
    def __init__(
        self, tracker: StepTracker | None = None, report_loss: bool = False, **tracker_kwargs: Any
    ) -> None:
        self.tracker = tracker
        self.report_loss = report_loss
        self._tracker_kwargs = tracker_kwargs
        self._reset()

    def _reset(self) -> None:
        self._step_started: float | None = None
        self._last_end: float | None = None
        self._data = 0.0
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
        self._reset()
        self._last_global_step = trainer.global_step

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        now = time.perf_counter()
        if self._last_end is not None:
            self._data += now - self._last_end
        if self._step_started is None:
            self._step_started = self._last_end if self._last_end is not None else now

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        now = time.perf_counter()
        self._last_end = now
        size = _batch_size(batch)
        if size:
            self._samples += size
        if (
            trainer.global_step == self._last_global_step
            or self.tracker is None
            or self._step_started is None
        ):
            return  # an accumulation micro-batch: the optimizer has not stepped yet
        self._last_global_step = trainer.global_step
        self.tracker.report(
            now - self._step_started,
            step=trainer.global_step,
            data_seconds=self._data,
            samples=self._samples or None,
            loss=self._loss(outputs),
        )
        self._step_started = None
        self._data = 0.0
        self._samples = 0

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
