"""Child processes that die with the tool that started them, also a SIGKILLed one.

Every tool starts its children (campaign cells, run_local's points, GPU-window stages, probes)
with `spawn` (`subprocess.Popen`) or `run` (`subprocess.run`): on Linux each child asks the
kernel, before it executes the program, for SIGTERM when its parent thread ends (prctl
PR_SET_PDEATHSIG; start it from the thread that waits for it). A trainer treats SIGTERM as a
preemption (checkpoint, exit 75), so a rerun resumes. Elsewhere: plain `subprocess`."""

import ctypes
import os
import signal
import subprocess
import sys


def _die_with_parent():
  """The `preexec_fn`; prctl is looked up here, in the parent, so the child only calls it."""
  if not sys.platform.startswith("linux"):
    return None
  prctl, parent = ctypes.CDLL(None, use_errno=True).prctl, os.getpid()

  def arm() -> None:
    prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # It died before prctl: as if the signal had come.
      os._exit(128 + signal.SIGTERM)
  return arm


def spawn(args, **kwargs) -> subprocess.Popen:
  return subprocess.Popen(args, preexec_fn=_die_with_parent(), **kwargs)


def run(args, **kwargs) -> subprocess.CompletedProcess:
  return subprocess.run(args, preexec_fn=_die_with_parent(), **kwargs)  # noqa: PLW1510
