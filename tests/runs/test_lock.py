"""One writer per workdir (`runs/lock.py`), writability at the start, a failed save.

Unit cases run in-process on the lock alone (no training); the race starts a real trainer
and a second one on its workdir.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from hypernet_attention import errors
from hypernet_attention.runs import lock
from hypernet_attention.train import loop

import train_testlib as tl


def _record(path, **changes):
  record = json.loads(path.read_text())
  record.update(changes)
  path.write_text(json.dumps(record))


def test_second_holder_is_refused_naming_the_first(tmp_path):
  with lock.WorkdirLock(str(tmp_path)) as first:
    holder = lock.read_holder(first.path)
    assert (holder.host, holder.pid) == (socket.gethostname(), os.getpid())
    with pytest.raises(errors.BadInput, match=(
        rf"is in use by another training process \(host {socket.gethostname()}, pid "
        rf"{os.getpid()}, started .* UTC, heartbeat 0 s ago; lock .*lock.json\)")):
      lock.WorkdirLock(str(tmp_path)).acquire()
    assert lock.read_holder(first.path).token == first.token  # Untouched by the refusal.
  assert not (tmp_path / lock.LOCK_FILE).exists()  # Released on exit.


def test_released_when_the_block_raises(tmp_path):
  with pytest.raises(RuntimeError):
    with lock.hold(str(tmp_path)):
      raise RuntimeError("boom")
  assert not (tmp_path / lock.LOCK_FILE).exists()


def test_lock_of_a_dead_process_is_taken_over(tmp_path):
  dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True, check=True)
  first = lock.WorkdirLock(str(tmp_path)).acquire()
  first._stop.set()  # pylint: disable=protected-access
  _record(first.path, pid=int(dead.stdout), proc_start=None)
  second = lock.WorkdirLock(str(tmp_path)).acquire()
  assert lock.read_holder(second.path).token == second.token
  second.release()


def test_reused_pid_and_silent_holders_are_stale():
  now = time.time()
  me = lock.Holder(socket.gethostname(), os.getpid(), lock._proc_start(os.getpid()),  # pylint: disable=protected-access
                   now, now, "t")
  assert not lock.is_stale(me, now)
  reused = lock.Holder(me.host, me.pid, "1", now, now, "t")  # Same pid, other process.
  assert lock.is_stale(reused, now)
  other_host = lock.Holder("elsewhere", 1, None, now, now - 60, "t")
  assert not lock.is_stale(other_host, now, stale_after_s=600)  # No pid check possible.
  assert lock.is_stale(other_host, now + 600, stale_after_s=600)  # Heartbeat too old.


def test_heartbeat_refreshes_the_lock(tmp_path):
  held = lock.WorkdirLock(str(tmp_path), heartbeat_s=0.05).acquire()
  first = lock.read_holder(held.path).heartbeat
  time.sleep(0.5)
  assert lock.read_holder(held.path).heartbeat > first
  held.release()
  assert not held.path.exists()


def test_unwritable_checkpoints_directory_is_refused_at_start(tmp_path):
  """A read-only checkpoints/ is found before training, not at the first save."""
  workdir = tmp_path / "wd"
  workdir.mkdir()
  if os.geteuid() == 0:  # chmod does not stop root: point it at a read-only filesystem.
    read_only = "/sys/kernel/iommu_groups"
  else:
    read_only = str(tmp_path / "ro")
    os.mkdir(read_only, 0o555)
  os.symlink(read_only, workdir / "checkpoints")
  with pytest.raises(errors.BadInput, match=r"checkpoints' is not writable"):
    loop.train_and_evaluate(tl.smoke("sraven", **{"eval.ceiling_problems": 0}), str(workdir))
  assert os.listdir(workdir) == ["checkpoints"]  # Refused before config.json or the lock.


def _trainer(workdir, *flags):
  return [sys.executable, os.path.join("experiments", "sraven_scaling.py"),
          "--config=experiments/configs/sraven.py:model=hyla,size=smoke",
          f"--workdir={workdir}", "--config.eval.ceiling_problems=0", *flags]


def test_two_trainers_on_one_workdir(tmp_path):
  """The second gets one line naming the first, and changes nothing."""
  workdir = tmp_path / "wd"
  first = subprocess.Popen(_trainer(workdir, "--config.num_train_steps=100000"),
                           cwd=tl.REPO, env=tl.subprocess_env(), stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
  def locked():
    assert first.poll() is None
    return (workdir / lock.LOCK_FILE).exists()

  try:
    tl.wait_until(locked, [first], "the first trainer's lock file", poll_s=0.2)
    holder = lock.read_holder(workdir / lock.LOCK_FILE)
    assert holder.pid == first.pid
    second = tl.run(_trainer(workdir, "--config.num_train_steps=100000"),
                    cwd=tl.REPO, env=tl.subprocess_env(), capture_output=True,
                    text=True)
    assert second.returncode == 2, second.stderr[-2000:]
    assert "Traceback" not in second.stderr
    last = second.stderr.strip().splitlines()[-1]
    assert last.startswith("sraven_scaling.py: error: workdir ") and (
        f"is in use by another training process (host {holder.host}, pid {first.pid}") in last
    assert lock.read_holder(workdir / lock.LOCK_FILE).token == holder.token
  finally:
    first.send_signal(signal.SIGINT)  # Ctrl-C: a checkpoint, one line, exit 75.
    tl.wait_for([first], "the first trainer to exit after Ctrl-C")
  assert first.returncode == 75
  assert not (workdir / lock.LOCK_FILE).exists()


def test_failed_save_stops_the_run_at_once(tmp_path):
  """Checkpoints that stop being writable after the start: one line naming the failure,
  exit 1, within seconds (not after Orbax's 5-minute timeouts)."""
  workdir = tmp_path / "wd"
  workdir.mkdir()
  os.symlink("/sys/kernel/iommu_groups" if os.geteuid() == 0 else str(tmp_path),
             workdir / "checkpoints")
  if os.geteuid() != 0:
    os.chmod(tmp_path, 0o555)
  program = ("import sys; from hypernet_attention.runs import lock, cli; "
             "lock.check_writable = lambda d: None; "  # As if it broke after the start.
             "sys.argv[0] = 'sraven_scaling.py'; "
             "import runpy; runpy.run_path('experiments/sraven_scaling.py', "
             "run_name='__main__')")
  start = time.time()
  result = tl.run([sys.executable, "-c", program, *_trainer(workdir)[2:]],
                  cwd=tl.REPO, env=tl.subprocess_env(), capture_output=True,
                  text=True)
  elapsed = time.time() - start
  if os.geteuid() != 0:
    os.chmod(tmp_path, 0o755)
  assert result.returncode == 1, result.stderr[-2000:]
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith("sraven_scaling.py: error: checkpoint write failed while"), last
  assert "finalized steps none are intact" in last
  assert elapsed < 200, elapsed  # Orbax's timeouts alone are 300 s.
  assert not os.path.exists(workdir / "summary.json")


def test_heartbeat_in_the_future_says_how_to_clear_it(tmp_path):
  """Another host's clock ahead of ours: its lock looks fresh for hours. One line naming
  the skew and the file to remove (issue 25, point 7); the lock is left as it is."""
  first = lock.WorkdirLock(str(tmp_path)).acquire()
  first._stop.set()  # pylint: disable=protected-access
  _record(first.path, host="other-host", heartbeat=time.time() + 3600)
  before = first.path.read_text()
  with pytest.raises(errors.BadInput, match=(
      r"has a lock whose heartbeat is 3[56]\d\d s in the future \(host other-host, .*; the "
      r"clocks of this host and other-host differ\); allowed: if no trainer runs there, "
      r"remove .*lock.json, else wait for it to end")):
    lock.WorkdirLock(str(tmp_path)).acquire()
  assert first.path.read_text() == before
  first.path.unlink()
