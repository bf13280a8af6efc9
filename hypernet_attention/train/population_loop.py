"""A population's `Program` for `loop.run`: the single run's loop, with per-member outputs.

Layout of a population workdir (what `launch.collect`, probing and TensorBoard read):

  <workdir>/config.json                the population's config (resume guard)
  <workdir>/checkpoints/               one stacked state (leading member axis)
  <workdir>/population_summary.json    members' names, frozen members, throughput
  <workdir>/<member name>/config.json  the single run each member is
  <workdir>/<member name>/summary.json as a single run's summary (+ `frozen_at_step`)
  <workdir>/<member name>/events...    TensorBoard scalars of the member

So a sweep root holding populations tabulates exactly as one holding separate runs, and
`restore.restore_params(workdir, member=i)` reads one member's parameters. Order of work, resume,
SIGTERM and bad input are as for a single run: `loop.run` drives both. A member whose step turns
NaN/Inf is frozen (`population.PopulationTrainer`): its summary records `frozen_at_step` and its
last finite state's metrics; the run stops with FloatingPointError only when every member is frozen.
"""

from __future__ import annotations

import os
import time
from typing import Any, Optional

from absl import logging
import jax
import numpy as np

from hypernet_attention.runs import console
from hypernet_attention.runs import events
from hypernet_attention.runs import run_files
from hypernet_attention.train import metrics as metrics_lib
from hypernet_attention.train import population
from hypernet_attention.train import state as state_lib
from hypernet_attention.train import trainer as trainer_lib


class PopulationRun:
  """One invocation of a population's loop: its state, writers and per-member records."""

  def __init__(self, config, workdir: str, p: population.PopulationSetup, start_time: float,
               trainer: population.PopulationTrainer):
    self.config, self.workdir, self.p, self.start_time = config, workdir, p, start_time
    self.dirs = [str(run_files.path(workdir) / name) for name in p.member_names]
    self.trainer = trainer
    self.data_iterator = None  # On-device data only.
    self.frozen: list[Optional[int]] = [None] * p.size
    self.last_train: list[dict[str, float]] = [{} for _ in self.dirs]
    self.eval_metrics: list[dict[str, float]] = [{} for _ in self.dirs]
    self.evaluated = False
    self.writers, self.ceilings = [], []
    self.rewrite_summary = False  # population_summary.json was unreadable.

  def restore_or_init(self, ckpt):
    state = ckpt.restore_latest(self.p.restore_target())
    if state is None:
      logging.info("New population of %d members in %s", self.p.size, run_files.shown(self.workdir))
      return self.trainer.init_state(), 0
    step = int(ckpt.latest_step())
    self._read_frozen()
    logging.info("Resuming population %s from step %d of %d", run_files.shown(self.workdir),
                 step, self.config.num_train_steps)
    return state, step

  def _read_frozen(self):
    try:
      recorded = run_files.read_json(run_files.path(self.workdir) / run_files.POPULATION_SUMMARY)
    except ValueError as e:  # Written again below; a frozen member is found again.
      logging.warning("%s (rewritten by this run)", e)
      self.rewrite_summary = True
      return
    if recorded is not None:
      self.frozen = recorded.get("frozen_at_step", self.frozen)

  def finished(self, state):
    if not all((run_files.path(d) / run_files.SUMMARY).exists() for d in self.dirs):
      return None  # Every member's summary: whether population_summary.json reads or not.
    logging.info("%s already holds a finished population (step %d)",
                 run_files.shown(self.workdir), self.config.num_train_steps)
    if self.rewrite_summary:
      self._write_population_summary(self.config.num_train_steps, self.config.num_train_steps)
    return {"members": [run_files.read_summary(d) for d in self.dirs], "state": state}

  def open(self, step: int, state) -> None:
    del state
    self.writers = [events.EventsWriter(d, just_logging=jax.process_index() != 0)
                    for d in self.dirs]
    self.ceilings = [o.run_metrics(c, d) for o, c, d in zip(
        self.p.member_objectives, self.p.member_configs, self.dirs)]
    for writer, config, c in zip(self.writers, self.p.member_configs, self.ceilings):
      events.write_run_start(writer, step, config, c)

  def check_finite(self, pending, ckpt) -> None:
    """Records each member's first non-finite step; raises when every member is frozen."""
    for i in range(self.p.size):
      if self.frozen[i] is None:
        bad = trainer_lib.first_nonfinite(
            [(start, metrics_lib.member(m.per_step, i)) for start, m in pending])
        if bad is not None:
          self.frozen[i] = bad
          logging.warning("member %s: non-finite training loss at step %d; frozen at its "
                          "last finite state", os.path.basename(self.dirs[i]), bad)
    if all(f is not None for f in self.frozen):
      ckpt.wait()
      raise trainer_lib.diverged(
          f"non-finite training loss in every member (steps {self.frozen})", ckpt.latest_step())

  def saved(self, step: int, start_step: int) -> None:
    self._write_population_summary(step, start_step)

  def log(self, step: int, pending, progress: console.Progress) -> None:
    objective = self.p.single.objective
    logged = []
    window = metrics_lib.merge_all([m.window for _, m in pending])
    for i, (config, writer) in enumerate(zip(self.p.member_configs, self.writers)):
      member = metrics_lib.member(window, i)  # A frozen member: its finite steps only.
      if not metrics_lib.count(member):
        continue
      train = {f"train/{k}": float(v)
               for k, v in objective.finalize(metrics_lib.means(member)).items()}
      train["train/learning_rate"] = float(state_lib.learning_rate_schedule(config)(step))
      self.last_train[i] = train
      logged.append((writer, train))
    losses = [t["train/loss"] for t in self.last_train if t]
    logging.info("%s", progress.line(step, (
        f"train/loss over {len(losses)} members: mean {np.mean(losses):.4f}, "
        f"min {np.min(losses):.4f}, max {np.max(losses):.4f}")))
    for writer, train in logged:  # Each member's steps/s, as a single run logs its own.
      writer.write_scalars(step, {**train, "steps_per_sec": progress.rate})

  def evaluate(self, step: int, state) -> None:
    self.eval_metrics = self.trainer.evaluate(state.params)
    self.evaluated = True
    for writer, metrics in zip(self.writers, self.eval_metrics):
      writer.write_scalars(step, metrics)
    metric = self.p.single.objective.main_metric
    main = [k for k in self.eval_metrics[0] if k.endswith(f"/{metric}")]
    logging.info("eval at step %s | %s", f"{step:,}", " | ".join(
        f"{k} mean {np.mean([m[k] for m in self.eval_metrics]):.4f}" for k in sorted(main)))

  def close(self) -> None:
    for writer in self.writers:
      writer.close()

  def summarize(self, step: int, start_step: int, state) -> dict[str, Any]:
    wall_time = time.time() - self.start_time
    num_params = state_lib.count_params(self.p.single.abstract_state.params)
    summaries = []
    for i in range(self.p.size):
      summary = {"step": step, "wall_time_s": wall_time, "params": num_params,
                 "steps_per_s_overall": (step - start_step) / wall_time,
                 "num_devices": jax.device_count(), "num_processes": jax.process_count(),
                 "population": {"workdir": self.workdir, "member": i, "size": self.p.size},
                 **self.last_train[i], **self.eval_metrics[i], **self.ceilings[i]}
      if self.frozen[i] is not None:
        summary["frozen_at_step"] = self.frozen[i]
      summaries.append(summary)
    if step >= self.config.num_train_steps and jax.process_index() == 0:
      for d, summary in zip(self.dirs, summaries):
        run_files.write_summary(d, summary)
      self._write_population_summary(step, start_step)
      logging.info("Population of %d members done after %s steps in %s: %s", self.p.size,
                   f"{step:,}", console.duration(time.time() - self.start_time),
                   ", ".join(map(run_files.shown, self.dirs)))
    return {"members": summaries, "state": state}

  def _write_population_summary(self, step: int, start_step: int) -> None:
    if jax.process_index() != 0:
      return
    wall_time = time.time() - self.start_time
    run_files.write_json(run_files.path(self.workdir) / run_files.POPULATION_SUMMARY, {
        "step": step, "members": [os.path.basename(d) for d in self.dirs],
        "frozen_at_step": self.frozen,
        "member_steps_per_s_overall": self.p.size * (step - start_step) / wall_time})
