"""Training-side client: time steps in a training loop and push them to the node's fleetscope daemon.

Standard library only at import time (no FastAPI, pydantic, prometheus_client
or torch), so any training image can use it. Three lines instrument a DDP or
FSDP loop::

    from fleetscope.client import StepTracker

    tracker = StepTracker()                  # job, rank, GPU from torchrun or Slurm
    model = tracker.watch(model)             # DDP, FSDP2 or FSDP1: collective waits are comm
    for batch in tracker.steps(loader):      # one step per batch; its fetch is data
        loss = model(batch).loss
        loss.backward()
        optimizer.step()

The rest of each step is compute, the rank's own work. For steps of several
batches, ``for batch in tracker.loader(loader):`` books fetches as data and
``with tracker.step(tokens=...) as s:`` marks the step (``s.loss = ...``);
``tracker.phase("data"/"comm")`` times a block, ``tracker.add(phase, seconds)``
books a duration measured elsewhere, ``tracker.report(step_seconds=...)``
pushes a step you timed yourself. Hooks: :mod:`fleetscope.client.hf`
(transformers ``TrainerCallback``) and :mod:`fleetscope.client.lightning`
(Lightning ``Callback``). docs/instrumentation.md says what is measured.

While the process lives, a background thread reports the rank's position (the
step it is in, its phase and since when) once a second; the node's daemon
exports it so a hang names the rank that is not waiting in a collective.

Environment:

* ``FLEETSCOPE_PUSH_URL``: the daemon (default ``http://127.0.0.1:9402``). In a
  Kubernetes pod, the daemon listens on the node's IP; set it from the
  downward API::

      env:
        - name: HOST_IP
          valueFrom: {fieldRef: {fieldPath: status.hostIP}}
        - name: FLEETSCOPE_PUSH_URL
          value: "http://$(HOST_IP):9402"

* ``FLEETSCOPE_PUSH_TOKEN``: bearer token, when the daemon sets ``push.token``
  (surrounding whitespace, such as ``echo``'s newline, is trimmed; empty is
  none). A token no HTTP header can carry, or one the daemon refuses, is an
  error retrying cannot fix: logged once at error, in ``tracker.stats().error``,
  the records counted as rejected.
* ``FLEETSCOPE_JOB``: job id; otherwise ``SLURM_JOB_ID``, then torchrun's
  ``TORCHELASTIC_RUN_ID``, then ``torchrun-<MASTER_ADDR>-<MASTER_PORT>`` (the same on
  every rank, never two running jobs'), else ``<host>-<pid>-<start time>``. An id the
  daemon would refuse (over 128 characters, a control character) is said once, at
  construction, in ``tracker.stats().error``, and nothing is sent. Ranks: ``RANK``/``LOCAL_RANK``/``WORLD_SIZE``
  (torchrun), else ``SLURM_PROCID``/``SLURM_LOCALID``/``SLURM_NTASKS``.

Each process sends a random lease with its reports: while it lives, the daemon
refuses steps, phases and job ends for its rank from any other process (409).

Delivery never blocks or raises into the loop: records go to a bounded buffer
(oldest dropped and counted when full) drained by a background thread that
batches, retries with backoff, and gives up on records the daemon refuses.
The training thread writes one attribute per phase change for the position.
"""

from __future__ import annotations

from fleetscope.client.placement import DEFAULT_URL, Placement, detect
from fleetscope.client.sender import SenderStats
from fleetscope.client.tracker import PHASES, StepTracker

__all__ = ["DEFAULT_URL", "PHASES", "Placement", "SenderStats", "StepTracker", "detect"]
