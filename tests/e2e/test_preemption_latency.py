"""A preemption notice is answered at the end of the chunk that runs when it arrives.

Real SIGTERMs to the entry point in a subprocess (smoke sizes, CPU): the run stops at the
end of the running chunk (not one later), evaluates and logs nothing after the notice, and
the rerun ends with the parameters of an uninterrupted run, for a single run and a
population alike. A chunk too long for `preemption_grace_s` is split into a divisor of
`steps_per_loop` (`preemption.ChunkBound`) without changing the result.
"""

import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from hypernet_attention.runs import curves
from hypernet_attention.train import loop
from hypernet_attention.train import preemption
from hypernet_attention.train import restore
from hypernet_attention.train import trainer as trainer_lib

import train_testlib as tl

pytestmark = pytest.mark.e2e  # Drives the whole training loop (tests/pytest.ini).

CHUNK = 100  # Steps per chunk; long enough that the notice lands inside one.
STEPS = 4 * CHUNK
OVERRIDES = {"num_train_steps": STEPS, "steps_per_loop": CHUNK, "log_every_steps": CHUNK,
             "eval_every_steps": 2 * CHUNK, "checkpoint_every_steps": STEPS,
             "eval.ceiling_problems": 0, "eval.num_problems": 16, "preemption_grace_s": 0}
POPULATION = "({'seed': 0}, {'seed': 1})"
NOTICE = "SIGTERM received"  # Logged when the process handles the signal.


def _command(workdir, population: bool, overrides=OVERRIDES):
  command = [sys.executable, os.path.join(tl.REPO, "experiments", "sraven_scaling.py"),
             "--config=" + os.path.join(tl.REPO, "experiments/configs/sraven.py") +
             ":model=hyla,size=smoke", f"--workdir={workdir}"]
  command += [f"--config.{k}={v}" for k, v in overrides.items()]
  if population:
    command.append(f"--config.population.members={POPULATION}")
  return command


def _run(command, log_path, signal_after=None):
  """Runs `command`; with `signal_after` (a regex), SIGTERMs it once its output matches.
  Returns (exit code, output, output at the signal, seconds from signal to exit)."""
  env = tl.subprocess_env()
  env["JAX_PLATFORMS"] = "cpu"
  with open(log_path, "w") as log:
    proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                            cwd=tl.REPO)
    seen, latency = "", None
    ended = lambda: proc.poll() is not None  # noqa: E731

    def ended_or_matched():
      nonlocal seen
      with open(log_path) as f:
        seen = f.read()
      return ended() or re.search(signal_after, seen)

    try:
      # Waited for while the run progresses (a loaded CPU compiles for minutes).
      if signal_after:
        tl.wait_until(ended_or_matched, [proc], f"output matching {signal_after!r}",
                      [log_path], poll_s=0.02)
        if not ended():
          sent = time.time()
          proc.send_signal(signal.SIGTERM)
          tl.wait_until(ended, [proc], "the exit after SIGTERM", [log_path], poll_s=0.02)
          latency = time.time() - sent
      tl.wait_until(ended, [proc], "the run", [log_path])
    finally:
      if proc.poll() is None:
        proc.kill()
        proc.wait()
  with open(log_path) as f:
    return proc.returncode, f.read(), seen, latency


def _logged_steps(text: str, pattern: str) -> list[int]:
  """The steps of the lines `pattern` (with `N` for the step) matches in `text`."""
  number = r"(\d[\d,]*)"
  return [int(s.replace(",", "")) for s in re.findall(pattern.replace("N", number), text)]


def _eval_steps(directory) -> list[int]:
  try:
    return curves.read_scalars(str(directory), ["test/accuracy"])["test/accuracy"][0].tolist()
  except ValueError:  # No evaluation written at all.
    return []


def _final_params(workdir, member=None):
  return tl.flat_params(restore.restore_params(str(workdir), STEPS, member=member).params)


@pytest.mark.parametrize("population", [False, True], ids=["single", "population"])
def test_notice_stops_after_the_running_chunk_without_evaluating(tmp_path, population):
  workdir = tmp_path / "preempted"
  # Signalled once step CHUNK is logged: the chunk to 2 * CHUNK runs (or is about to be
  # dispatched), and its end is an evaluation boundary.
  code, text, _, _ = _run(_command(workdir, population), tmp_path / "first.log",
                          signal_after=rf"step {CHUNK}/")
  assert code == preemption.EXIT_CODE, text[-3000:]
  # Judged from where the process handled the notice (a starved test process may send it
  # late; Python runs the handler once the main thread is back from XLA).
  before, after = text.split(NOTICE, 1)
  last_logged = max(_logged_steps(before, "step N/"))
  saved = max(int(d) for d in os.listdir(workdir / "checkpoints") if d.isdigit())
  # At most the chunk running at the notice: its end, never a chunk later.
  assert saved % CHUNK == 0 and last_logged <= saved <= last_logged + CHUNK, (
      last_logged, saved, text[-2000:])
  assert f"checkpoint saved at step {saved}" in after
  # Nothing evaluated or logged after the notice: no eval line, no training line, and no
  # eval scalars past the last step logged before it.
  assert not _logged_steps(after, "eval at step N"), after[-2000:]
  assert not _logged_steps(after, "step N/"), after[-2000:]
  members = ([workdir / f"member{i}" for i in range(2)] if population else [workdir])
  for directory in members:
    assert all(s <= last_logged for s in _eval_steps(directory)), directory
  assert not (workdir / "summary.json").exists()

  code, text, _, _ = _run(_command(workdir, population), tmp_path / "second.log")
  assert code == 0, text[-3000:]
  reference = tmp_path / "uninterrupted"
  code, text, _, _ = _run(_command(reference, population), tmp_path / "reference.log")
  assert code == 0, text[-3000:]
  for member in ((0, 1) if population else (None,)):
    a, b = _final_params(workdir, member), _final_params(reference, member)
    assert a.keys() == b.keys()
    for k in a:
      np.testing.assert_array_equal(a[k], b[k], err_msg=f"member {member}: {k}")


def test_chunk_bound_probes_short_chunks_then_picks_the_largest_divisor_that_fits():
  bound = preemption.ChunkBound(250, 30.0)
  assert bound.length == 50  # The largest divisor of 250 up to PROBE_STEPS, until measured.
  bound.observe(50, 100.0)  # The first chunk of a length compiles: not a step time.
  assert bound.length == 50
  bound.observe(50, 5.0)  # 0.1 s per step, a new length compiles in 95 s: 50 stays.
  assert bound.length == 50
  bound.observe(50, 0.01)  # Decided once.
  assert bound.length == 50
  cheap = preemption.ChunkBound(250, 30.0)
  cheap.observe(50, 6.0)
  cheap.observe(50, 5.0)  # 0.1 s per step, 1 s to compile: 1 + 125 * 0.1 <= 15 < 250 * 0.1.
  assert cheap.length == 125
  fast = preemption.ChunkBound(250, 30.0)
  fast.observe(50, 3.0)
  fast.observe(50, 1.0)  # 0.02 s per step, 2 s to compile: 2 + 250 * 0.02 <= 15.
  assert fast.length == 250
  slow = preemption.ChunkBound(250, 30.0)
  slow.observe(50, 60.0)
  slow.observe(50, 40.0)  # 0.8 s per step: only divisors of up to 18 steps fit.
  assert slow.length == 10
  small = preemption.ChunkBound(40, 30.0)  # At most PROBE_STEPS: one length, one compile.
  assert small.length == 40
  off = preemption.ChunkBound(250, 0)
  assert off.length == 250
  off.observe(250, 1e6)
  off.observe(250, 1e6)
  assert off.length == 250


def test_split_chunks_end_bit_identical(tmp_path):
  """Chunks split by a tiny grace period train exactly what the configured chunks do."""
  overrides = {"num_train_steps": 24, "steps_per_loop": 8, "log_every_steps": 8,
               "eval_every_steps": 24, "checkpoint_every_steps": 24,
               "eval.ceiling_problems": 0}
  split = loop.train_and_evaluate(tl.smoke("sraven", preemption_grace_s=1e-9, **overrides),
                                  str(tmp_path / "split"))
  whole = loop.train_and_evaluate(tl.smoke("sraven", preemption_grace_s=0, **overrides),
                                  str(tmp_path / "whole"))
  assert split["step"] == whole["step"] == 24
  a, b = tl.flat_params(split["state"].params), tl.flat_params(whole["state"].params)
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)
  assert split["train/loss"] == whole["train/loss"]


def test_slow_chunk_is_split_and_the_notice_answered_within_the_bound(tmp_path):
  """Chunks of 800 steps, slower than half the grace period, never run: the probe chunks
  are measured and the run goes on in divisors of 800 that fit; a notice then waits for one
  short chunk, not for the configured one."""
  overrides = {**OVERRIDES, "num_train_steps": 4000, "steps_per_loop": 800,
               "log_every_steps": 800, "eval_every_steps": 4000,
               "checkpoint_every_steps": 4000, "preemption_grace_s": 0.2}
  code, text, _, latency = _run(_command(tmp_path / "wd", False, overrides),
                                tmp_path / "log", signal_after=r"running chunks of \d+ steps")
  assert code == preemption.EXIT_CODE, text[-3000:]
  match = re.search(r"running chunks of (\d+) steps, not steps_per_loop=800: ([\d.]+)s per step",
                    text)
  length, per_step = int(match.group(1)), float(match.group(2))
  full_chunk_s = 800 * per_step
  assert length < 800 and 800 % length == 0
  saved = max(int(d) for d in os.listdir(tmp_path / "wd" / "checkpoints") if d.isdigit())
  if "nothing trained yet since step" in text:
    # The notice came while the new length compiled: the loop had committed the step of
    # the decision (two 50-step probes) before it and exits at once.
    assert saved == 100 and "nothing trained yet since step 100" in text, (saved, text[-2000:])
  else:
    assert saved % length == 0, (saved, length)
  # Without the split the notice would wait for the rest of an 800-step chunk at least.
  print(f"signal to exit: {latency:.2f}s; an 800-step chunk: {full_chunk_s:.2f}s")


def test_notice_during_an_evaluation_dispatches_no_further_chunk(tmp_path, monkeypatch):
  """In-process, a real SIGTERM sent while the step-4 evaluation runs: the run saves at
  step 4 and stops, with no chunk dispatched after the evaluation."""
  chunks, original_chunk = [], trainer_lib.Trainer.train_chunk
  original_evaluate = loop.SingleRun.evaluate

  def train_chunk(self, state, length):
    chunks.append(length)
    return original_chunk(self, state, length)

  def evaluate(self, step, state):
    original_evaluate(self, step, state)
    os.kill(os.getpid(), signal.SIGTERM)  # Handled by the run's `preemption.Watcher`.

  monkeypatch.setattr(trainer_lib.Trainer, "train_chunk", train_chunk)
  monkeypatch.setattr(loop.SingleRun, "evaluate", evaluate)
  config = tl.smoke("sraven", num_train_steps=16, checkpoint_every_steps=16,
                    **{"eval.ceiling_problems": 0})  # Chunks of 4, evaluation every 4.
  with pytest.raises(preemption.Preempted, match="checkpoint saved at step 4 "):
    loop.train_and_evaluate(config, str(tmp_path / "wd"))
  assert chunks == [4]  # Before the fix: a second chunk ran, saved at step 8.
  assert sorted(int(d) for d in os.listdir(tmp_path / "wd" / "checkpoints")
                if d.isdigit()) == [4]


SLOW_FIRST_CHUNK = """
import runpy, sys, time
from hypernet_attention.train import trainer
original = trainer.Trainer.train_chunk
def train_chunk(self, state, length):  # The first chunk blocks like a long compilation.
  if not getattr(self, "slowed", False):
    self.slowed = True
    print("first chunk dispatched", flush=True)
    time.sleep(600)
  return original(self, state, length)
trainer.Trainer.train_chunk = train_chunk
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_notice_before_the_first_chunk_finished_exits_at_once(tmp_path):
  """A notice while the first chunk compiles (here: a first chunk that blocks for 10
  minutes) exits with 75 at once, writes no checkpoint and leaves the workdir unlocked."""
  workdir = tmp_path / "wd"
  command = [sys.executable, "-c", SLOW_FIRST_CHUNK] + _command(workdir, False)[1:]
  code, text, _, latency = _run(command, tmp_path / "log", signal_after="first chunk dispatched")
  assert code == preemption.EXIT_CODE, text[-3000:]
  assert latency < 60, (latency, text[-3000:])  # Without the exit at once: 600 s and more.
  assert "nothing trained yet since step 0" in text
  assert not (workdir / "lock.json").exists()
  assert not [d for d in os.listdir(workdir / "checkpoints") if d.isdigit()]


SLOW_NEW_LENGTHS = """
import runpy, sys, time
from hypernet_attention.train import trainer
original, seen = trainer.Trainer.train_chunk, set()
def train_chunk(self, state, length):  # Each new chunk length "compiles" slowly.
  if length not in seen:
    seen.add(length)
    print(f"compiling a chunk of {length} steps", flush=True)
    time.sleep(3 if not seen - {length} else 600)
  return original(self, state, length)
trainer.Trainer.train_chunk = train_chunk
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_a_slow_compilation_after_the_first_chunk_is_preceded_by_a_save(tmp_path):
  """Chunks of 50 steps (the probe of steps_per_loop=100) measured with 3 s of compilation
  against a 1 s bound; at step 100 a 20-step chunk (up to the log step 120) compiles anew:
  the run commits step 100 first, so a notice during that compilation exits at once."""
  workdir = tmp_path / "wd"
  overrides = {**OVERRIDES, "num_train_steps": 400, "steps_per_loop": 100,
               "log_every_steps": 120, "eval_every_steps": 400, "checkpoint_every_steps": 400,
               "preemption_grace_s": 2}
  command = [sys.executable, "-c", SLOW_NEW_LENGTHS] + _command(workdir, False, overrides)[1:]
  code, text, _, latency = _run(command, tmp_path / "log",
                                signal_after="compiling a chunk of 20 steps")
  assert code == preemption.EXIT_CODE, text[-3000:]
  assert latency < 60, (latency, text[-3000:])  # Without the save first: 600 s and more.
  assert "nothing trained yet since step 100" in text
  assert max(int(d) for d in os.listdir(workdir / "checkpoints") if d.isdigit()) == 100
  assert not (workdir / "lock.json").exists()


def test_compile_may_outlast_bound_only_for_new_lengths_once_measured():
  bound = preemption.ChunkBound(100, 2.0)
  assert not bound.compile_may_outlast_bound(20)  # Nothing measured yet.
  bound.observe(50, 3.0)
  bound.observe(50, 0.05)  # 0.001 s per step, ~3 s to compile, bound 1 s.
  assert bound.length == 50
  assert bound.compile_may_outlast_bound(20) and not bound.compile_may_outlast_bound(50)
  bound.observe(20, 3.0)
  assert not bound.compile_may_outlast_bound(20)  # Compiled now.
  off = preemption.ChunkBound(100, 0)
  off.observe(100, 3.0)
  off.observe(100, 0.05)
  assert not off.compile_may_outlast_bound(20)
