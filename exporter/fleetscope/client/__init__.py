"""Training-side client: time steps in a training loop and push them to the node's fleetscope daemon.

Standard library only (no FastAPI, pydantic or prometheus_client), so any
training image can use it::

    from fleetscope.client import StepTracker

    tracker = StepTracker()          # job, rank, local_rank from torchrun or Slurm
    for batch in loader:
        with tracker.step(tokens=batch_tokens) as s:
            with tracker.phase("data"):
                ...
            with tracker.phase("compute"):
                ...
            s.loss = loss.item()
    tracker.close()

Or ``tracker.report(step_seconds=..., data_seconds=..., ...)`` with your own
timings. Hooks: :mod:`fleetscope.client.hf` (transformers ``TrainerCallback``)
and :mod:`fleetscope.client.lightning` (Lightning ``Callback``).

Environment:

* ``FLEETSCOPE_PUSH_URL``: the daemon (default ``http://127.0.0.1:9402``). In a
  Kubernetes pod, the daemon listens on the node's IP; set it from the
  downward API::

      env:
        - name: HOST_IP
          valueFrom: {fieldRef: {fieldPath: status.hostIP}}
        - name: FLEETSCOPE_PUSH_URL
          value: "http://$(HOST_IP):9402"

* ``FLEETSCOPE_PUSH_TOKEN``: bearer token, when the daemon sets ``push.token``.
* ``FLEETSCOPE_JOB``: job id; otherwise ``SLURM_JOB_ID``, then torchrun's
  ``TORCHELASTIC_RUN_ID``. Ranks: ``RANK``/``LOCAL_RANK``/``WORLD_SIZE``
  (torchrun), else ``SLURM_PROCID``/``SLURM_LOCALID``/``SLURM_NTASKS``.

Delivery never blocks or raises into the loop: records go to a bounded buffer
(oldest dropped and counted when full) drained by a background thread that
batches, retries with backoff, and gives up on records the daemon refuses.
"""

from __future__ import annotations

from fleetscope.client.placement import DEFAULT_URL, Placement, detect
from fleetscope.client.sender import SenderStats
from fleetscope.client.tracker import PHASES, StepTracker

__all__ = ["DEFAULT_URL", "PHASES", "Placement", "SenderStats", "StepTracker", "detect"]
