"""No process outlives the tool that started it (`hypernet_attention/runs/children.py`), also
when the tool is SIGKILLed and cannot stop its children itself: a GPU window's stage, a
campaign's trainer. Every process these tests start is killed, with its process group, on
any exit; they wait on progress (a line, a pid), never on a fixed wall-clock budget."""

import contextlib
import os
import signal
import subprocess
import sys

import pytest

from hypernet_attention.runs import lock

import train_testlib as tl

REPO = tl.REPO

# A tool that runs one GPU-window stage (a Python process that says its pid, then sleeps)
# and waits for it, as `launch/gpu_window.py` does.
WINDOW = """
import math, sys
from launch import gpu_window
window = gpu_window.Window(sys.argv[1], gpu_window.GPU, math.inf)
child = "import os, time; print(os.getpid(), flush=True); time.sleep(10**6)"
stage = gpu_window.Stage("sleeper", 10**6, lambda w, limit: [sys.executable, "-c", child],
                         parse=lambda w, line: print("stage", line, flush=True), min_s=0)
gpu_window.run_stage(window, stage, dict(PYTHONPATH=sys.path[0]))
"""


def _children(pid: int) -> list[int]:
  """The pids whose parent is `pid` (/proc)."""
  found = []
  for entry in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{entry}/stat") as f:
        if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
          found.append(int(entry))
    except (OSError, IndexError, ValueError):
      continue
  return found


def _assert_ends(pid: int, what: str) -> None:
  """Waits, while `pid` still uses CPU time (a trainer checkpointing on SIGTERM), for it to
  end; fails naming it if it idles for `tl.IDLE_S` instead."""
  try:
    tl.wait_until(lambda: not lock.pid_alive(pid), [pid], what)
  finally:
    with contextlib.suppress(ProcessLookupError):
      os.kill(pid, signal.SIGKILL)  # Never left behind, even by a failing test.


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_a_sigkilled_gpu_window_leaves_no_stage_running(tmp_path):
  env, out = dict(os.environ, PYTHONPATH=REPO), tmp_path / "window.out"
  with open(out, "w") as f, tl.started([sys.executable, "-c", WINDOW, str(tmp_path)], env=env,
                                       cwd=REPO, stdout=f, stderr=subprocess.STDOUT) as window:
    def started():
      assert window.poll() is None, f"the window exited: {out.read_text()}"
      return out.read_text().startswith("stage ")
    tl.wait_until(started, [window], "the window's stage to say its pid", [str(out)])
    stage = int(out.read_text().split()[1])
    assert lock.pid_alive(stage)
    window.send_signal(signal.SIGKILL)  # Its own group only: the stage has a session of its own.
    window.wait()
    _assert_ends(stage, f"the stage (pid {stage}) of a SIGKILLed GPU window to end")


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_a_sigkilled_campaign_leaves_no_trainer_running(tmp_path):
  """The campaign runner SIGKILLed once its smoke cell's trainer runs: the trainer ends
  (SIGTERM from the kernel: it checkpoints as on a preemption, or ends before its loop)."""
  root, out = tmp_path / "root", tmp_path / "runner.out"
  with open(out, "w") as f, tl.started([sys.executable, "-m", "launch.campaign", "--set=smoke",
                   "--cells=smoke_sraven_hyla", "--budget_minutes=20", f"--root={root}",
                   f"--results_dir={tmp_path / 'results'}"], env=tl.subprocess_env(),
                  cwd=REPO, stdout=f, stderr=subprocess.STDOUT) as runner:
    trainer = []

    def trainer_runs():
      assert runner.poll() is None, f"the campaign runner exited: {out.read_text()}"
      trainer[:] = [pid for pid in _children(runner.pid)
                    if "smoke_sraven_hyla" in _cmdline(pid)]
      return bool(trainer)

    tl.wait_until(trainer_runs, [runner], "the campaign to start its smoke cell's trainer",
                  [str(out)])
    runner.send_signal(signal.SIGKILL)
    runner.wait()
    _assert_ends(trainer[0], f"the trainer (pid {trainer[0]}) of a SIGKILLed campaign "
                 "runner to end")


def _cmdline(pid: int) -> str:
  try:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
      return f.read().replace(b"\0", b" ").decode(errors="replace")
  except OSError:
    return ""
