"""Hugging Face ``transformers`` hook: report every optimizer step from every rank.

    from fleetscope.client.hf import FleetscopeCallback
    trainer = Trainer(..., callbacks=[FleetscopeCallback()])

Importing this module imports ``transformers``; :mod:`fleetscope.client`
itself does not. A step is one optimizer update (``state.global_step``); its
wall time runs from the previous step's end, and ``data_seconds`` is the gap
between the previous step's end and this step's begin, where the Trainer
fetches the step's batches. The Trainer does not separate compute from
collective waits, so ``compute_seconds`` is not reported. The loss is the last
one the Trainer logged (``logging_steps``), already a float: no device sync.
"""

from __future__ import annotations

import time
from typing import Any

try:
    from transformers import TrainerCallback
except ImportError as exc:  # an optional hook: say which extra brings it
    raise ImportError("fleetscope.client.hf needs transformers: pip install 'fleetscope[hf]'") from exc

from fleetscope.client.tracker import StepTracker


class FleetscopeCallback(TrainerCallback):
    def __init__(self, tracker: StepTracker | None = None, **tracker_kwargs: Any) -> None:
        self.tracker = tracker
        self._tracker_kwargs = tracker_kwargs
        self._begin: float | None = None
        self._last_end: float | None = None
        self._loss: float | None = None
        self._tokens_seen = 0

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.tracker is None:
            options = {
                "rank": args.process_index,
                "local_rank": args.local_process_index,
                "world_size": args.world_size,
                **self._tracker_kwargs,
            }
            self.tracker = StepTracker(**options)
        self._last_end = None

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._begin = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.tracker is None or self._begin is None:
            return
        now = time.perf_counter()
        started = self._last_end if self._last_end is not None else self._begin
        data = self._begin - self._last_end if self._last_end is not None else None
        seen = int(getattr(state, "num_input_tokens_seen", 0) or 0)
        tokens = seen - self._tokens_seen if seen > self._tokens_seen else None
        self._tokens_seen = max(seen, self._tokens_seen)
        self.tracker.report(
            now - started,
            step=state.global_step,
            data_seconds=data,
            tokens=tokens,
            samples=args.per_device_train_batch_size * args.gradient_accumulation_steps,
            loss=self._loss,
        )
        self._last_end = now

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        if logs and isinstance(logs.get("loss"), (int, float)):
            self._loss = float(logs["loss"])

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.tracker is not None:
            self.tracker.close()
