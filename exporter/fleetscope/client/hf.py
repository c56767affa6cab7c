"""Hugging Face ``transformers`` hook: report every optimizer step from every rank.

    from fleetscope.client.hf import FleetscopeCallback
    trainer = Trainer(..., callbacks=[FleetscopeCallback()])

Importing this module imports ``transformers``; :mod:`fleetscope.client`
itself does not. A step is one optimizer update (``state.global_step``), from
the Trainer's ``on_step_begin`` to its ``on_step_end``, plus the fetch of its
batches before it: ``data_seconds`` is the time from the end of the previous
step's work (its logging, evaluation or checkpoint included) to this step's
begin, where the Trainer fetches the step's micro-batches (``fetch_seconds``
too; on a GPU ``data_seconds`` is the device's idle time over that gap, from
CUDA events recorded at its two ends). The model the
Trainer trains is watched (:meth:`StepTracker.watch`), so the collective
waits of DDP or FSDP are ``comm_seconds`` and the rest is
``compute_seconds``. The loss is the last one the Trainer logged
(``logging_steps``), already a float: no device sync.
"""

from __future__ import annotations

import time
from typing import Any

try:
    from transformers import TrainerCallback
except ImportError as exc:  # an optional hook: say which extra brings it
    raise ImportError("fleetscope.client.hf needs transformers: pip install 'fleetscope[hf]'") from exc

from fleetscope.client.tracker import Step, StepTracker


class FleetscopeCallback(TrainerCallback):
    def __init__(self, tracker: StepTracker | None = None, **tracker_kwargs: Any) -> None:
        self.tracker = tracker
        self._tracker_kwargs = tracker_kwargs
        self._step: Step | None = None
        self._work_done: float | None = None  # when the previous step's own work last ended
        self._work_done_event: Any = None  # ... and the device event recorded then (on a GPU)
        self._loss: float | None = None
        self._tokens_seen = 0
        self._watched = False

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if self.tracker is None:
            options = {
                "rank": args.process_index,
                "local_rank": args.local_process_index,
                "world_size": args.world_size,
                **self._tracker_kwargs,
            }
            self.tracker = StepTracker(**options)
        if model is not None and not self._watched:
            # DDP wraps this model out of the callback's reach; the gradient hooks watch() places on it
            # see DDP's all-reduce wait all the same. An FSDP model is the wrapper itself.
            self.tracker.watch(model)
            self._watched = True
        self._work_done = None

    def _mark_work_done(self) -> None:
        self._work_done = time.perf_counter()
        self._work_done_event = self.tracker.timeline.mark() if self.tracker is not None else None

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.tracker is None:
            return
        if self._work_done is not None:  # the Trainer fetched the step's batches since: a data phase
            timeline = self.tracker.timeline
            timeline.leave(timeline.enter("data", since=self._work_done, event=self._work_done_event))
        self._step = self.tracker.step(state.global_step + 1)
        self._step.__enter__()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step, self._step = self._step, None
        if self.tracker is None or step is None:
            return
        seen = int(getattr(state, "num_input_tokens_seen", 0) or 0)
        step.tokens = seen - self._tokens_seen if seen > self._tokens_seen else None
        self._tokens_seen = max(seen, self._tokens_seen)
        step.samples = args.per_device_train_batch_size * args.gradient_accumulation_steps
        step.loss = self._loss
        step.step = state.global_step
        step.__exit__(None, None, None)
        self._mark_work_done()

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        if logs and isinstance(logs.get("loss"), (int, float)):
            self._loss = float(logs["loss"])
        self._mark_work_done()

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._mark_work_done()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._mark_work_done()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.tracker is not None:
            self.tracker.close()
