"""Preemption: on SIGTERM (or Ctrl-C), finish the chunk, checkpoint, wait for it, exit 75.

Cloud TPU, GKE and SLURM send SIGTERM some time before they take a machine. The loop asks
`Watcher.reached()` at every chunk boundary; once it says yes, the loop saves the state at
that step (every process at the same step), waits until the checkpoint is committed, writes
nothing else (no summary.json) and raises `Preempted`; entry points exit with `EXIT_CODE`
(75, EX_TEMPFAIL in sysexits.h: "temporary failure, retry"), which schedulers can map to a
requeue. Rerunning the same command resumes from that step, and because every batch is a
pure function of (seed, step) it ends with the parameters of an uninterrupted run.

Agreement between processes: with `jax.distributed` running, JAX's preemption sync manager
(which listens for SIGTERM itself) tells every process the same sync point, so the call
index passed to it must be the same on all processes: the number of chunk boundaries seen,
not the step (the manager picks "largest index any process reached + 1"). In a single
process a plain Python SIGTERM handler sets a flag.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

from absl import logging
from jax.experimental import multihost_utils
import jax

EXIT_CODE = 75


class Preempted(Exception):
  """The run saved a checkpoint at `step` and stopped because of a preemption notice."""

  def __init__(self, step: int, workdir: str, reason: str = "preempted"):
    super().__init__(f"{reason}: checkpoint saved at step {step} in {workdir}; rerun the "
                     "same command to resume")
    self.step, self.workdir = step, workdir


class Watcher:
  """`reached()` is True on every process at the same chunk boundary after a SIGTERM."""

  def __init__(self):
    self._received = threading.Event()
    self._calls = 0
    self._previous: dict[int, Any] = {}
    self.reason = "preempted"
    self._multi_process = jax.process_count() > 1
    if not self._multi_process and threading.current_thread() is threading.main_thread():
      self._previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._on_signal)
      # Ctrl-C takes the same path (a checkpoint, then one line); a second Ctrl-C stops
      # at once (KeyboardInterrupt; the newest committed checkpoint stays).
      self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._on_signal)

  def _on_signal(self, signum, frame) -> None:
    del frame
    if signum == signal.SIGINT:
      if self._received.is_set():
        raise KeyboardInterrupt
      self.reason = "interrupted"
    logging.warning("%s received: finishing this chunk, then checkpointing and exiting "
                    "(Ctrl-C again stops at once)", signal.Signals(signum).name)
    self._received.set()

  def reached(self) -> bool:
    """Call once per chunk boundary on every process (a collective when multi-process)."""
    self._calls += 1
    if self._multi_process:
      try:
        return multihost_utils.reached_preemption_sync_point(self._calls)
      except RuntimeError:  # The preemption service is disabled: nobody can be told.
        return False
    return self._received.is_set()

  def close(self) -> None:
    for signum, previous in self._previous.items():
      signal.signal(signum, previous)
    self._previous = {}

  def __enter__(self) -> "Watcher":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
