"""Preemption with a real signal: SIGTERM -> checkpoint at a chunk boundary -> exit 75 ->
rerunning the same command ends with the parameters of an uninterrupted run, bit for bit.

Single process (Python SIGTERM handler) and two processes on 127.0.0.1 (JAX's preemption
sync manager agrees on the step), each against an uninterrupted run on the same topology.
"""

import os
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest

from hypernet_attention.train import preemption
from hypernet_attention.train import restore

import train_testlib as tl

pytestmark = pytest.mark.e2e  # Drives the whole training loop (tests/pytest.ini).

# The run must still be going when the stop comes, after the test sees step 8. One
# process stops at the chunk (4 steps) after its SIGTERM: its 312 further steps are a few
# seconds. Two processes agree on the step through JAX's preemption sync manager (a
# key-value barrier between their notifier threads), seen to stop at the next chunk too
# under load 6 on 2 cores; their steps run Gloo collectives (3-15 steps/s seen there), so
# fewer steps leave them as long: 152 further steps are 10 s or more at 15 steps/s.
STEPS = 320
TWO_PROCESS_STEPS = 160


def _command(workdir, process_id=None, port=None, steps=STEPS):
  command = [sys.executable, os.path.join(tl.REPO, "experiments", "sraven_scaling.py"),
             "--config=" + os.path.join(tl.REPO, "experiments/configs/sraven.py") +
             ":model=hyla,size=smoke", f"--workdir={workdir}"]
  overrides = {"num_train_steps": steps, "log_every_steps": 4, "eval_every_steps": steps,
               "checkpoint_every_steps": steps, "eval.ceiling_problems": 0,
               "eval.num_problems": 16}
  command += [f"--config.{k}={v}" for k, v in overrides.items()]
  if process_id is not None:
    command += [f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
                f"--process_id={process_id}", "--cpu_collectives=gloo"]
  return command


def _env(devices, multi_process=False):
  env = tl.multiprocess_env() if multi_process else tl.subprocess_env()
  env["JAX_NUM_CPU_DEVICES"] = str(devices)  # jax's own option (no XLA flag string)
  env["JAX_PLATFORMS"] = "cpu"
  return env


def _start(workdir, log_path, devices=1, **kw):
  log = open(log_path, "w")
  proc = subprocess.Popen(_command(workdir, **kw), env=_env(devices, "process_id" in kw),
                          stdout=log, stderr=subprocess.STDOUT, cwd=tl.REPO)
  return proc, log


def _finish(procs):
  """Waits for every process (killing stragglers); returns exit codes and logs."""
  texts = tl.reap(procs, "the training processes")
  return [proc.returncode for proc, _ in procs], texts


def _wait_for_training(log_path, procs):
  def trained():
    with open(log_path) as f:
      if "step 8/" in f.read():
        return True
    assert all(p.poll() is None for p, _ in procs), "a process ended before training"
    return False

  tl.wait_until(trained, [p for p, _ in procs], "training to log step 8",
                [log for _, log in procs], poll_s=0.1)


def _preempt_then_rerun(tmp_path, workdir, launch, steps=STEPS):
  """SIGTERM every process after step 8, check the clean exit, rerun to the end."""
  procs = launch(tmp_path / "first")
  _wait_for_training(procs[0][1].name, procs)
  for proc, _ in procs:
    proc.send_signal(signal.SIGTERM)
  codes, texts = _finish(procs)
  assert codes == [preemption.EXIT_CODE] * len(procs), (codes, tl.tails(texts))
  saved = [int(d) for d in os.listdir(workdir / "checkpoints") if d.isdigit()]
  stopped = max(saved)
  assert 8 <= stopped < steps, saved
  assert not (workdir / "summary.json").exists()
  assert not [d for d in os.listdir(workdir / "checkpoints") if "tmp" in d]
  for text in texts:
    assert f"preempted: checkpoint saved at step {stopped}" in text, text[-2000:]
  codes, texts = _finish(launch(tmp_path / "second"))
  assert codes == [0] * len(procs), tl.tails(texts)
  assert restore.restore_params(str(workdir)).step == steps
  return stopped


def _assert_same_params(workdir_a, workdir_b, steps=STEPS):
  a = tl.flat_params(restore.restore_params(str(workdir_a), steps).params)
  b = tl.flat_params(restore.restore_params(str(workdir_b), steps).params)
  assert a.keys() == b.keys()
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_sigterm_checkpoints_exits_75_and_rerun_is_bit_identical(tmp_path):
  workdir = tmp_path / "preempted"
  launch = lambda log_stem: [_start(workdir, f"{log_stem}.log")]  # noqa: E731
  _preempt_then_rerun(tmp_path, workdir, launch)
  reference = tmp_path / "uninterrupted"
  codes, texts = _finish([_start(reference, tmp_path / "reference.log")])
  assert codes == [0], texts[0][-3000:]
  _assert_same_params(workdir, reference)


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.mark.slow
@tl.multiprocess_slot()
def test_two_processes_agree_on_the_preemption_step(tmp_path):
  def launch_pair(workdir):
    def launch(log_stem):
      port = _free_port()
      return [_start(workdir, f"{log_stem}_{i}.log", devices=2, process_id=i, port=port,
                     steps=TWO_PROCESS_STEPS) for i in (0, 1)]
    return launch

  workdir = tmp_path / "preempted"
  _preempt_then_rerun(tmp_path, workdir, launch_pair(workdir), TWO_PROCESS_STEPS)
  reference = tmp_path / "uninterrupted"
  codes, texts = _finish(launch_pair(reference)(tmp_path / "reference"))
  assert codes == [0, 0], tl.tails(texts)
  _assert_same_params(workdir, reference, TWO_PROCESS_STEPS)


_EARLY = """
import os, signal, sys, time
from hypernet_attention.runs import cli
def main(argv):
  os.kill(os.getpid(), signal.SIGTERM)  # Before any training loop: flags, config, setup.
  time.sleep(30)
  print("not stopped")
cli.run(main)
"""

_AFTER_NOTICE = """
import contextlib, os, signal, time
from hypernet_attention.train import preemption
with contextlib.closing(preemption.Watcher()) as watcher:
  os.kill(os.getpid(), signal.SIGINT)  # A first Ctrl-C: the loop would checkpoint now.
  time.sleep(0.5)
  assert watcher.reached()
os.kill(os.getpid(), signal.SIGTERM)  # Then SIGTERM, while the process is on its way out.
time.sleep(0.5)
print("exited cleanly")
raise SystemExit(75)
"""


def test_sigterm_before_the_loop_exits_75_in_one_line():
  out = tl.run([sys.executable, "-c", _EARLY, "--verbosity=0"], capture_output=True,
               text=True, cwd=tl.REPO)
  assert out.returncode == preemption.EXIT_CODE, out
  assert "not stopped" not in out.stdout
  assert out.stderr.strip().count("\n") == 0 and "SIGTERM before any training step" in out.stderr


def test_sigint_then_sigterm_still_exits_75_not_killed():
  out = tl.run([sys.executable, "-c", _AFTER_NOTICE], capture_output=True, text=True,
               cwd=tl.REPO)
  assert out.returncode == preemption.EXIT_CODE and "exited cleanly" in out.stdout, out
