"""Preemption: on SIGTERM (or Ctrl-C), finish the chunk, checkpoint, wait for it, exit 75.

Cloud TPU, GKE and SLURM send SIGTERM some time before they take a machine (about 30 s on GCE spot
VMs and by default on Kubernetes). The loop waits for each chunk to end before it dispatches the
next, and asks `Watcher.reached()` after every chunk and before every dispatch; once it says yes,
the loop saves the state at that step (every process at the same step), waits until the checkpoint
is committed, runs no evaluation and logs nothing more, writes no summary.json and raises
`Preempted`; entry points exit with `EXIT_CODE` (75, EX_TEMPFAIL in sysexits.h: "temporary failure,
retry"), which schedulers can map to a requeue. The closing line names the command that resumes from
that step (`cli.resume_hint`), and because every batch is a pure function of (seed, step) the
resumed run ends with the parameters of an uninterrupted run.

Agreement between processes: with `jax.distributed` running, JAX's preemption sync manager
(which listens for SIGTERM itself) tells every process the same sync point, so the call
index passed to it must be the same on all processes: the number of chunk boundaries seen,
not the step (the manager picks "largest index any process reached + 1"). In a single
process a plain Python SIGTERM handler sets a flag.

So the time from the notice to exit is at most one chunk, plus the save and the exit.
`ChunkBound` keeps a chunk under half of `config.preemption_grace_s` (default 30 s: the
other half is for the save and the exit) by running shorter chunks where the configured
`steps_per_loop` would take longer; 0 turns the bound off.

Before the first chunk of an invocation has finished there is nothing to save (the state is
the restored checkpoint, or the seed's initialization), yet that chunk compiles, which takes
minutes for large models. A Python signal handler only runs once the compilation returns,
so in a single process the signal is also written to a pipe (`signal.set_wakeup_fd`) that a
thread watches: a notice in that phase exits at once with status 75 (the lock released, the
checkpoints untouched), and rerunning resumes as after any preemption."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Any, Callable

from absl import logging
import jax
from jax.experimental import multihost_utils
import numpy as np

from hypernet_attention.runs import cli

EXIT_CODE = 75


class Preempted(Exception):
  """The run saved a checkpoint at `step` and stopped because of a preemption notice."""

  def __init__(self, step: int, workdir: str, reason: str = "preempted"):
    super().__init__(f"{reason}: checkpoint saved at step {step} in {workdir}; {cli.resume_hint()}")
    self.step, self.workdir = step, workdir


class Watcher:
  """`reached()` is True on every process at the same chunk boundary after a SIGTERM;
  `close()` puts the previous signal handlers back."""

  def __init__(self):
    self._received = threading.Event()
    self._calls = 0
    self._previous: dict[int, Any] = {}
    self.reason = "preempted"
    self._multi_process = jax.process_count() > 1
    self._exit_now: Callable[[], None] | None = None  # Set while there is nothing to save.
    self._phase = threading.Lock()  # The block's end and an exit at once never overlap.
    self._wakeup: tuple[int, int, int] | None = None  # (read fd, write fd, previous fd)
    if not self._multi_process and threading.current_thread() is threading.main_thread():
      self._previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._on_signal)
      # Ctrl-C takes the same path (a checkpoint, then one line); a second Ctrl-C stops
      # at once (KeyboardInterrupt; the newest committed checkpoint stays).
      self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._on_signal)
      read_fd, write_fd = os.pipe()
      os.set_blocking(write_fd, False)
      previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
      self._wakeup = (read_fd, write_fd, previous)
      threading.Thread(target=self._watch, args=(read_fd,), name="preemption-wakeup",
                       daemon=True).start()

  def _watch(self, read_fd: int) -> None:
    """Runs beside the main thread, which may be inside a compilation for minutes."""
    while True:
      signums = os.read(read_fd, 64)
      if not signums:  # close() closed the writing end.
        os.close(read_fd)
        return
      if {signal.SIGTERM, signal.SIGINT} & set(signums):
        if signal.SIGINT in set(signums):  # Named before the main thread's handler runs.
          self.reason = "interrupted"
        with self._phase:
          if self._exit_now is not None:
            self._exit_now()

  @contextlib.contextmanager
  def nothing_to_save(self, unchanged: str, release: Callable[[], None]):
    """A notice inside this block exits the process at once (status 75): nothing has been trained
    since the state was restored or built (`unchanged` says so in the exit line). `release` frees
    the workdir's lock first. In a single process only (several processes must agree on a step)."""
    def exit_now():
      release()
      print(f"{os.path.basename(sys.argv[0])}: {self.reason}: {unchanged}; "
            f"{cli.resume_hint()}", file=sys.stderr, flush=True)
      os._exit(EXIT_CODE)  # pylint: disable=protected-access
    if self._wakeup is None:
      yield
      return
    with self._phase:
      if self._received.is_set():
        exit_now()  # The notice came before this block (during the restore).
      self._exit_now = exit_now
    try:
      yield
    finally:
      with self._phase:
        self._exit_now = None

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
      # After a notice the process is on its way out with status 75 (its checkpoint is
      # committed): a later SIGTERM or Ctrl-C must not turn that into a kill (-15).
      signal.signal(signum, signal.SIG_IGN if self._received.is_set() else previous)
    self._previous = {}
    if self._wakeup is not None:
      _, write_fd, previous = self._wakeup
      signal.set_wakeup_fd(previous)
      os.close(write_fd)  # The watching thread reads end-of-file, closes `read_fd`, returns.
      self._wakeup = None


PROBE_STEPS = 50  # The longest first chunk while the bound is on: 50 paper-size steps take
                  # at most ~10 s on a 2-core CPU (SRAVEN, the slowest), far less on a GPU.


def _divisors(n: int) -> list[int]:
  return [d for d in range(1, n + 1) if n % d == 0]


class ChunkBound:
  """The chunk length the loop uses: `steps_per_loop`, or a divisor of it whose chunks
  take at most half of `grace_s` seconds.

  Nothing is known about a step's time before one runs, so with the bound on the loop starts
  with short chunks (the largest divisor of `steps_per_loop` of at most `PROBE_STEPS` steps:
  a notice during the first chunks waits for one of those, not for a long configured one). The first
  chunk of a length compiles, so the decision waits for the second chunk of that length: it gives
  the seconds per step, and the difference to the first chunk the compilation time. The chosen
  length is the largest divisor whose chunks fit the bound, counting for a new length its
  compilation too (its first chunk must fit as well, else the probe length stays); with
  `jax.distributed` process 0's choice is taken. A divisor keeps every boundary of the configured
  chunks (log, eval and checkpoint steps stay where they were, and so do the data and the
  parameters: each step is a pure function of the state and the step), at the cost of one more
  compilation where the choice differs from the probe. `steps_per_loop` <= `PROBE_STEPS` (smoke and
  local configs) compiles once, as without the bound."""

  def __init__(self, steps_per_loop: int, grace_s: float | None):
    self.steps_per_loop, self.grace_s = steps_per_loop, grace_s
    self._decided = not grace_s
    self.length = steps_per_loop if self._decided else max(
        d for d in _divisors(steps_per_loop) if d <= PROBE_STEPS)
    self._first: dict[int, float] = {}  # Seconds of the first (compiling) chunk per length.
    self._ahead: dict[int, float] = {}  # Seconds of compilations ahead of time per length.
    self._compile_s = self._per_step = None  # Measured once decided (with the bound on).

  def compile_may_outlast_bound(self, length: int) -> bool:
    """Whether a chunk of `length` steps compiles now (a length not run yet: the chosen one,
    or a shorter one before a log, eval or checkpoint step) and that compilation plus the
    chunk may take longer than the bound. The loop then commits a checkpoint first, so that
    a notice during the compilation exits at once. Single process only (that exit is; and
    the times are each process's own, while a save must be decided by all together)."""
    if self._compile_s is None or length in self._first or jax.process_count() > 1:
      return False
    return self._compile_s + length * self._per_step > self.grace_s / 2

  def compiled(self, length: int, seconds: float) -> None:
    """A chunk of `length` steps was compiled ahead of time in `seconds`: its first chunk's
    time counts them (the compilation estimate is the first chunk minus the second)."""
    self._ahead[length] = seconds

  def observe(self, length: int, seconds: float) -> None:
    """Records one chunk of `length` steps that took `seconds` (dispatch to finish)."""
    if length not in self._first:
      self._first[length] = seconds + self._ahead.pop(length, 0.0)
      return
    if self._decided:
      return
    self._decided = True
    bound = self.grace_s / 2
    per_step = self._per_step = seconds / length
    compile_s = self._compile_s = max(self._first[length] - seconds, 0.0)
    steady = [d for d in _divisors(self.steps_per_loop) if d * per_step <= bound]
    cheap = [d for d in steady if d == length or compile_s + d * per_step <= bound]
    chosen = max(cheap or steady or [1])
    if jax.process_count() > 1:
      chosen = int(multihost_utils.broadcast_one_to_all(np.int32(chosen)))
    if chosen < self.steps_per_loop:
      logging.info("running chunks of %d steps, not steps_per_loop=%d: %.3fs per step, a new "
                   "chunk length compiles in ~%.1fs, bound %.1fs (half of "
                   "preemption_grace_s=%g)", chosen, self.steps_per_loop, per_step, compile_s,
                   bound, self.grace_s)
    self.length = chosen
