"""`launch.run_local`: a 2-point smoke sweep end to end, killed mid-way and resumed."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from hypernet_attention import errors
from launch import collect
from launch import jobs
from launch import run_local
from launch import sweeps

import train_testlib as tl


def _run_local(root, log_path, **popen):
  """run_local on the smoke sweep, its output (stdout and stderr) to `log_path`."""
  with open(log_path, "w") as log:
    return subprocess.Popen(
        [sys.executable, "-m", "launch.run_local", "--sweep=smoke_fuzzy", "--jobs=1",
         f"--root={root}"], cwd=tl.REPO, env=tl.subprocess_env(), stdout=log,
        stderr=subprocess.STDOUT, **popen)


def _output(proc, log_path) -> str:
  """`proc`'s output once it has exited, waited for while it progresses."""
  tl.wait_for([proc], "launch.run_local", [log_path])
  with open(log_path) as f:
    return f.read()


def test_smoke_sweep_runs_resumes_after_kill_and_skips_finished(tmp_path):
  root = str(tmp_path / "sweep")
  first, second = (os.path.join(root, jobs.point_name(p))
                   for p in sweeps.load("smoke_fuzzy").get_sweep())
  # Kill the executor and its training process once the first point's step-4 checkpoint
  # (of 8 steps) is committed: a half-done point.
  marker = os.path.join(first, "checkpoints", "4", "commit_success.txt")
  killed = _run_local(root, tmp_path / "killed.log", start_new_session=True)
  tl.wait_until(lambda: os.path.exists(marker) or killed.poll() is not None, [killed],
                "the first point's step-4 checkpoint", [tmp_path / "killed.log"], poll_s=0.05)
  os.killpg(killed.pid, signal.SIGKILL)
  killed.wait()
  assert os.path.exists(marker)
  assert not os.path.exists(os.path.join(first, "summary.json")), "killed too late"

  resumed = _run_local(root, tmp_path / "resumed.log")
  out = _output(resumed, tmp_path / "resumed.log")
  assert resumed.returncode == 0, out
  assert out.splitlines()[-1].startswith("2 finished, 0 skipped (done before), 0 failed"), out
  with open(os.path.join(first, "run_local.log")) as f:
    log = f.read()
  assert log.count("New run in") == 1  # The rerun resumed instead.
  assert "from step 4 of 8" in log
  for workdir in (first, second):
    with open(os.path.join(workdir, "summary.json")) as f:
      assert json.load(f)["step"] == 8

  again = _run_local(root, tmp_path / "again.log")
  out = _output(again, tmp_path / "again.log")
  assert again.returncode == 0 and out.splitlines()[-1].startswith(
      "0 finished, 2 skipped (done before), 0 failed"), out
  assert "2 finished runs" in collect.report(root, "smoke_fuzzy", "ood", str(tmp_path / "t"))


def test_parallel_jobs_share_gpu_memory():
  from launch import run_local  # pylint: disable=g-import-not-at-top
  assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in run_local.child_env(1, {})
  assert run_local.child_env(3, {})["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.300"
  assert run_local.child_env(3, {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.2"})[
      "XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.2"  # The user's choice wins.


def test_killed_run_local_takes_its_trainer_with_it(tmp_path):
  """SIGKILL to run_local alone (not its process group): the kernel sends its trainer
  SIGTERM (PR_SET_PDEATHSIG), which checkpoints and exits 75; a rerun resumes there. Under
  load the signal can land before the first step (the lock is taken before compiling): then
  the trainer says it had nothing to save and exits 75 just the same, lock released."""
  root = str(tmp_path / "sweep")
  first = os.path.join(root, jobs.point_name(sweeps.load("smoke_fuzzy").get_sweep()[0]))
  lock_file = os.path.join(first, "lock.json")
  launcher = _run_local(root, tmp_path / "launcher.log")

  def trainer_pid():  # The lock is created, then written.
    assert launcher.poll() is None
    try:
      with open(lock_file) as f:
        return json.load(f)["pid"]
    except (FileNotFoundError, json.JSONDecodeError):
      return None

  tl.wait_until(trainer_pid, [launcher], "the trainer's lock file", poll_s=0.05)
  trainer = trainer_pid()
  launcher.kill()
  launcher.wait()
  # The trainer checkpoints and exits: waited for while it progresses (or fails, if not).
  tl.wait_until(lambda: not os.path.exists(f"/proc/{trainer}"), [trainer],
                "the trainer to exit after run_local was killed", poll_s=0.1)
  assert not os.path.exists(lock_file)  # It ended through the loop: lock released.
  with open(os.path.join(first, "run_local.log")) as f:
    log = f.read()
  assert "SIGTERM received" in log or "preempted: not started yet" in log, log[-3000:]


def test_sweep_runs_as_populations_and_collects_as_runs(tmp_path):
  """4 points -> 2 population jobs; every member is collected as a finished run."""
  root = str(tmp_path / "sweep")
  proc = tl.run(
      [sys.executable, "-m", "launch.run_local", "--sweep=smoke_population_fuzzy",
       f"--root={root}"], cwd=tl.REPO, env=tl.subprocess_env(), capture_output=True,
      text=True, check=False)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert proc.stdout.splitlines()[-1].startswith("2 finished, 0 skipped"), proc.stdout
  assert collect.missing_jobs(root, "smoke_population_fuzzy") == []
  runs = [r for r in collect.load_runs(root) if r.summary is not None]
  assert sorted((r.config["model.attention"], r.config["seed"]) for r in runs) == [
      ("hyla", 0), ("hyla", 1), ("softmax", 0), ("softmax", 1)]
  assert "4 finished runs" in collect.report(root, "smoke_population_fuzzy", "ood",
                                             str(tmp_path / "t"))


def _finished(workdir, population_summary=None):
  os.makedirs(workdir, exist_ok=True)
  name = "population_summary.json" if population_summary is not None else "summary.json"
  with open(os.path.join(workdir, name), "w") as f:
    f.write(population_summary if population_summary is not None else '{"step": 8}')


def test_points_finished_either_way_are_skipped(tmp_path):
  """--single_runs after a population job (and a population after single runs) trains
  nothing: each point is done, wherever it was trained (issue 25, point 4)."""
  points = sweeps.load("smoke_fuzzy").get_sweep()
  names = [jobs.point_name(p) for p in points]
  population_root, single_root = str(tmp_path / "pops"), str(tmp_path / "singles")
  _finished(os.path.join(population_root, "pop"), json.dumps({"members": names}))
  for name in names:
    _finished(os.path.join(population_root, "pop", name))
    _finished(os.path.join(single_root, name))
  lines = []
  outcomes = run_local.run_sweep(points, "fuzzy_logic", population_root, log=lines.append)
  assert [o.status for o in outcomes] == ["skipped"] * len(points)
  assert lines == [f"{len(points)} points in {population_root}: {len(points)} already "
                   "finished, running the other 0, 1 at a time"]
  job = {**points[0], "population.members": ({"seed": 0}, {"seed": 1}),
         "population.member_names": tuple(names)}
  assert run_local.is_done(job, single_root, run_local.finished_points(single_root))


def test_zero_jobs_is_refused_before_anything_is_read_or_started(tmp_path):
  """`--jobs` is checked once, where every caller passes (`run_sweep`): one BadInput line
  (what the CLI prints, exit 2), no log line, no workdir."""
  lines = []
  with pytest.raises(errors.BadInput, match=r"^--jobs=0; allowed: an integer >= 1$"):
    run_local.run_sweep(sweeps.load("smoke_fuzzy").get_sweep(), "fuzzy_logic",
                        str(tmp_path / "root"), num_jobs=0, log=lines.append)
  assert lines == [] and not os.path.exists(tmp_path / "root")


def test_truncated_population_summary_is_named_and_rerun(tmp_path):
  workdir = str(tmp_path / "pop")
  _finished(workdir, '{"members": ["a"')
  lines = []
  assert not run_local.is_finished(workdir, lines.append)
  assert len(lines) == 1 and lines[0].startswith(
      f"warning: {workdir}/population_summary.json is not a readable population summary")
  assert lines[0].endswith("rerunning that job")


def test_rerun_waits_for_the_previous_trainer_to_let_go(tmp_path):
  """A rerun right after a killed run_local: its trainer is still checkpointing on its way
  out, holding the lock; the point waits for it instead of failing."""
  holder = subprocess.Popen(["sleep", "3"])
  reaper = threading.Thread(target=holder.wait, daemon=True)  # Reaped when it exits.
  reaper.start()
  record = {"host": socket.gethostname(), "pid": holder.pid, "proc_start": None,
            "start_time": time.time(), "heartbeat": time.time(), "token": "t"}
  (tmp_path / "lock.json").write_text(json.dumps(record))
  lines, start = [], time.time()
  run_local.wait_for_previous_trainer(str(tmp_path), lines.append)
  waited_s = time.time() - start
  # The reaper may still hold Popen's lock between reaping and recording the exit status
  # (poll() then says None), so read the status only once it is done.
  reaper.join(timeout=10)
  assert waited_s >= 2 and holder.returncode == 0  # Waited for it to exit on its own.
  assert lines == [f"waiting for the previous trainer of {tmp_path.name} (pid {holder.pid}) "
                   "to stop"]
  (tmp_path / "lock.json").write_text(json.dumps({**record, "host": "elsewhere", "pid": 1,
                                                  "heartbeat": time.time()}))
  start = time.time()
  run_local.wait_for_previous_trainer(str(tmp_path), lines.append)  # Another host's lock:
  assert time.time() - start < 1  # the trainer judges it by its heartbeat.
