"""Starting child processes that never outlive the tool that started them.

Every tool that starts a process (the campaign's cells and probes, `launch/run_local.py`'s
points, `launch/gpu_window.py`'s stages, the test helpers) starts it with `spawn` (a
`subprocess.Popen`) or `run` (a `subprocess.run`): on Linux the child asks the kernel, before
it executes the program, for `signum` when its parent dies (prctl PR_SET_PDEATHSIG), also
when the parent is SIGKILLed and cannot stop it itself. SIGTERM by default: a trainer treats
it as a preemption (checkpoint, exit 75), so a rerun resumes where it stopped.

The signal follows the parent *thread* that started the child: start a child from a thread
that outlives it (the one that waits for it). Elsewhere (no prctl) the options are unchanged.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from typing import Callable, Optional

_PR_SET_PDEATHSIG = 1


def _die_with_parent(signum: int) -> Optional[Callable[[], None]]:
  """The `preexec_fn` that arms `signum` for the parent's death; None off Linux. prctl is
  looked up here, in the parent: the child, between fork and exec, only calls it."""
  if not sys.platform.startswith("linux"):
    return None
  prctl, parent = ctypes.CDLL(None, use_errno=True).prctl, os.getpid()

  def arm() -> None:
    prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)
    if os.getppid() != parent:  # The parent died before prctl: nobody would tell us.
      os._exit(128 + signum)  # As if the signal had ended it (before exec).
  return arm


def spawn(args, *, signum: int = signal.SIGTERM, **kwargs) -> subprocess.Popen:
  """`subprocess.Popen(args, **kwargs)` whose process gets `signum` when this one dies."""
  return subprocess.Popen(args, preexec_fn=_die_with_parent(signum), **kwargs)


def run(args, *, signum: int = signal.SIGTERM, **kwargs) -> subprocess.CompletedProcess:
  """`subprocess.run(args, **kwargs)` whose process gets `signum` when this one dies."""
  return subprocess.run(args, preexec_fn=_die_with_parent(signum), **kwargs)
