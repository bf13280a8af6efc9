"""`train_and_evaluate` of a population: the single run's loop, with per-member outputs.

Layout of a population workdir (what `launch.collect`, probing and TensorBoard read):

  <workdir>/config.json                the population's config (resume guard)
  <workdir>/checkpoints/               one stacked state (leading member axis)
  <workdir>/population_summary.json    members' names, frozen members, throughput
  <workdir>/<member name>/config.json  the single run each member is
  <workdir>/<member name>/summary.json as a single run's summary (+ `frozen_at_step`)
  <workdir>/<member name>/events...    TensorBoard scalars of the member

So a sweep root holding populations tabulates exactly as one holding separate runs, and
`restore.restore_params(workdir, member=i)` reads one member's parameters. Order of work,
resume, SIGTERM and bad input are as in `loop.train_and_evaluate`. A member whose step turns
NaN/Inf is frozen (`population.PopulationTrainer`): its summary records `frozen_at_step`
and its last finite state's metrics; the run stops with FloatingPointError only when every
member is frozen.
"""

from __future__ import annotations

import os
import time
from typing import Any, Optional

from absl import logging
import jax
import ml_collections
import numpy as np

from hypernet_attention.train import console
from hypernet_attention.train import events
from hypernet_attention.train import loop
from hypernet_attention.train import population
from hypernet_attention.train import preemption
from hypernet_attention.train import state as state_lib
from hypernet_attention.train import workdir as workdir_lib

SUMMARY = "population_summary.json"


def member_dirs(config: ml_collections.ConfigDict, workdir: str) -> list[str]:
  return [str(workdir_lib.path(workdir) / name) for name in population.member_names(config)]


def _check_workdirs(config, p: population.PopulationSetup, workdir: str) -> None:
  """The population's workdir guard, then each member's; all pass before any config.json
  is recorded."""
  for record in (False, True):
    workdir_lib.check(workdir, config, record=record)
    for member_dir, member_config in zip(member_dirs(config, workdir), p.member_configs):
      workdir_lib.check(member_dir, member_config, population=workdir, record=record)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                       devices=None) -> dict[str, Any]:
  """Trains every member (resuming from `workdir`), evaluates, writes their summaries.

  Returns {"members": [member summary, ...], "state": stacked final state}. Raises
  `config_lib.BadInput` before any work, `preemption.Preempted` after checkpointing.
  """
  start_time = time.time()
  p = population.setup(config, devices)
  with loop.session(config, workdir, lambda w: _check_workdirs(config, p, w)) as run:
    dirs = member_dirs(config, run.workdir)
    return _Run(config, run.workdir, dirs, p, run.ckpt, start_time).train(run.watcher)


class _Run:
  """One invocation of a population's loop: its state, writers and per-member records."""

  def __init__(self, config, workdir, dirs, p, ckpt, start_time):
    self.config, self.workdir, self.dirs, self.p, self.ckpt = config, workdir, dirs, p, ckpt
    self.start_time = start_time
    self.trainer = population.PopulationTrainer(p)
    self.frozen: list[Optional[int]] = [None] * p.size
    self.last_train: list[dict[str, float]] = [{} for _ in dirs]
    self.eval_metrics: list[dict[str, float]] = [{} for _ in dirs]
    self.rewrite_summary = False  # population_summary.json was unreadable.

  def _restore_or_init(self):
    state = self.ckpt.restore_latest(self.p.restore_target())
    if state is None:
      logging.info("New population of %d members in %s", self.p.size, self.workdir)
      return self.trainer.init_state(), 0
    step = int(self.ckpt.latest_step())
    self._read_frozen()
    logging.info("Resuming population %s from step %d of %d", self.workdir, step,
                 self.config.num_train_steps)
    return state, step

  def _read_frozen(self):
    try:
      recorded = workdir_lib.read_json(workdir_lib.path(self.workdir) / SUMMARY)
    except ValueError as e:  # Written again below; a frozen member is found again.
      logging.warning("%s (rewritten by this run)", e)
      self.rewrite_summary = True
      return
    if recorded is not None:
      self.frozen = recorded.get("frozen_at_step", self.frozen)

  def _finished(self, step: int) -> bool:
    return step >= self.config.num_train_steps and all(
        (workdir_lib.path(d) / workdir_lib.SUMMARY).exists() for d in self.dirs)

  def _note_nonfinite(self, pending) -> None:
    """Records each member's first non-finite step; raises when every member is frozen."""
    for i in range(self.p.size):
      if self.frozen[i] is None:
        bad = loop._first_nonfinite(  # pylint: disable=protected-access
            [(start, jax.tree.map(lambda m: m[i], metrics)) for start, metrics in pending])  # pylint: disable=cell-var-from-loop
        if bad is not None:
          self.frozen[i] = bad
          logging.warning("member %s: non-finite training loss at step %d; frozen at its "
                          "last finite state", os.path.basename(self.dirs[i]), bad)
    if all(f is not None for f in self.frozen):
      self.ckpt.wait()
      raise FloatingPointError(
          f"non-finite training loss in every member (steps {self.frozen}); stopping "
          f"(checkpoints up to step {self.ckpt.latest_step()} are intact)")

  def _log(self, step: int, pending, writers) -> None:
    objective = self.p.single.objective
    steps = np.concatenate([start + 1 + np.arange(m["loss"].shape[1]) for start, m in pending])
    for i, (config, writer) in enumerate(zip(self.p.member_configs, writers)):
      keep = steps < (self.frozen[i] or np.inf)  # A frozen member: its finite steps only.
      if not keep.any():
        continue
      means = {k: float(np.mean(np.concatenate([m[k][i] for _, m in pending])[keep]))
               for k in pending[0][1]}
      train = {f"train/{k}": float(v) for k, v in objective.finalize(means).items()}
      train["train/learning_rate"] = float(state_lib.learning_rate_schedule(config)(step))
      self.last_train[i] = train
      writer.write_scalars(step, train)
    losses = [t["train/loss"] for t in self.last_train if t]
    logging.info("step %s/%s | train/loss over %d members: mean %.4f, min %.4f, max %.4f",
                 f"{step:,}", f"{self.config.num_train_steps:,}", len(losses),
                 np.mean(losses), np.min(losses), np.max(losses))

  def _evaluate(self, step: int, state, writers) -> None:
    self.eval_metrics = self.trainer.evaluate(state.params)
    for writer, metrics in zip(writers, self.eval_metrics):
      writer.write_scalars(step, metrics)
    main = [k for k in self.eval_metrics[0] if k.endswith(f"/{self.p.single.objective.main_metric}")]
    logging.info("eval at step %s | %s", f"{step:,}", " | ".join(
        f"{k} mean {np.mean([m[k] for m in self.eval_metrics]):.4f}" for k in sorted(main)))

  def train(self, watcher: preemption.Watcher) -> dict[str, Any]:
    config = self.config
    state, step = self._restore_or_init()
    start_step = step
    if self._finished(step):
      logging.info("%s already holds a finished population (step %d)", self.workdir, step)
      if self.rewrite_summary:
        self._write_population_summary(step, start_step)
      return {"members": [_read(d) for d in self.dirs], "state": state}
    is_chief = jax.process_index() == 0
    writers = [events.EventsWriter(d, just_logging=not is_chief) for d in self.dirs]
    ceilings = [o.run_metrics(c, d) for o, c, d in zip(
        self.p.member_objectives, self.p.member_configs, self.dirs)]
    for writer, c in zip(writers, ceilings):
      if c:
        writer.write_scalars(step, c)
    pending = []
    try:
      while step < config.num_train_steps:
        if config.get("stop_after_steps") and step >= config.stop_after_steps:
          break
        end = loop._next_boundary(step, config)  # pylint: disable=protected-access
        state, metrics = self.trainer.train_chunk(state, end - step)
        self.ckpt.check()  # A failed asynchronous save stops the run here.
        pending.append((step, metrics))
        step = end
        is_last = step == config.num_train_steps
        preempted = watcher.reached()
        saving = self.ckpt.should_save(step) or is_last or preempted
        if saving or step % config.log_every_steps == 0:
          pending = jax.device_get(pending)
          self._note_nonfinite(pending)
        if saving and self.ckpt.save(step, state, force=is_last or preempted):
          self._write_population_summary(step, start_step)
          logging.info("saving checkpoint at step %s -> %s", f"{step:,}", self.ckpt.directory)
        if step % config.log_every_steps == 0 or is_last:
          self._log(step, pending, writers)
          pending = []
        if preempted:
          self.ckpt.wait()
          raise preemption.Preempted(step, self.workdir, watcher.reason)
        if step % config.eval_every_steps == 0 or is_last:
          self._evaluate(step, state, writers)
      if step >= config.num_train_steps and not self.eval_metrics[0]:
        self._evaluate(step, state, writers)  # Killed after the final save.
      self.ckpt.wait()
    finally:
      for writer in writers:
        writer.close()
    summaries = self._summaries(step, start_step, ceilings)
    if step >= config.num_train_steps and is_chief:
      for d, summary in zip(self.dirs, summaries):
        workdir_lib.write_summary(d, summary)
      self._write_population_summary(step, start_step)
      logging.info("Population of %d members done after %s steps in %s: %s", self.p.size,
                   f"{step:,}", console.duration(time.time() - self.start_time),
                   ", ".join(self.dirs))
    return {"members": summaries, "state": state}

  def _summaries(self, step: int, start_step: int, ceilings) -> list[dict[str, Any]]:
    wall_time = time.time() - self.start_time
    num_params = state_lib.count_params(self.p.single.abstract_state.params)
    out = []
    for i in range(self.p.size):
      summary = {"step": step, "wall_time_s": wall_time, "params": num_params,
                 "steps_per_s_overall": (step - start_step) / wall_time,
                 "num_devices": jax.device_count(), "num_processes": jax.process_count(),
                 "population": {"workdir": self.workdir, "member": i, "size": self.p.size},
                 **self.last_train[i], **self.eval_metrics[i], **ceilings[i]}
      if self.frozen[i] is not None:
        summary["frozen_at_step"] = self.frozen[i]
      out.append(summary)
    return out

  def _write_population_summary(self, step: int, start_step: int) -> None:
    if jax.process_index() != 0:
      return
    wall_time = time.time() - self.start_time
    workdir_lib.write_json(workdir_lib.path(self.workdir) / SUMMARY, {
        "step": step, "members": [os.path.basename(d) for d in self.dirs],
        "frozen_at_step": self.frozen,
        "member_steps_per_s_overall": self.p.size * (step - start_step) / wall_time})


def _read(directory: str) -> dict[str, Any]:
  return workdir_lib.read_summary(directory)
