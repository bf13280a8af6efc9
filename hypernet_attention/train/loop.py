"""`train_and_evaluate(config, workdir)`: the program every experiment runs.

One loop (`run`) drives a `Program`: a single run (`SingleRun`, below) or a population
(`population_loop.PopulationRun`). It trains in chunks (`trainer.py`), and at each chunk
boundary checks the metrics for NaN/Inf before any save, saves, logs, answers a preemption
notice and evaluates; the program decides what each of those writes.

Order of work: validate everything (config, mesh, batch divisibility, workdir) -> build the
state abstractly -> restore or initialize it sharded -> train / evaluate / checkpoint ->
summary.json. Only process 0 writes logs and the summary."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any, Callable, NamedTuple, Optional, Protocol

from absl import logging
from clu import parameter_overview  # No TensorFlow (unlike clu.metric_writers).
import jax
from jax.experimental import multihost_utils
import ml_collections
import numpy as np

from hypernet_attention import errors
from hypernet_attention import multihost
from hypernet_attention.runs import cli
from hypernet_attention.runs import config_checks
from hypernet_attention.runs import console
from hypernet_attention.runs import events
from hypernet_attention.runs import lock
from hypernet_attention.runs import run_files
from hypernet_attention.train import build
from hypernet_attention.train import checkpointing
from hypernet_attention.train import memory
from hypernet_attention.train import metrics as metrics_lib
from hypernet_attention.train import population
from hypernet_attention.train import population_loop
from hypernet_attention.train import preemption
from hypernet_attention.train import state as state_lib
from hypernet_attention.train import trainer as trainer_lib


class Program(Protocol):
  """What `run` asks of a single run or a population. `pending` is the list of
  (start step, `metrics.ChunkMetrics`) of the chunks since the last log, on the host."""
  data_iterator: Any  # Saved with every checkpoint (host data sources), else None.
  evaluated: bool  # Whether `evaluate` ran in this invocation.
  trainer: Any  # `train_chunk(state, length)`: `trainer.Trainer` or `population.PopulationTrainer`.

  def restore_or_init(self, ckpt: checkpointing.Checkpointer) -> tuple[Any, int]: ...
  def finished(self, state) -> Optional[dict[str, Any]]: ...  # The result if already done.
  def open(self, step: int, state) -> None: ...  # Writers, hparams, ceilings.
  def check_finite(self, pending, ckpt: checkpointing.Checkpointer) -> None: ...
  def saved(self, step: int, start_step: int) -> None: ...
  def log(self, step: int, pending, progress: console.Progress) -> None: ...
  def evaluate(self, step: int, state) -> None: ...
  def close(self) -> None: ...
  def summarize(self, step: int, start_step: int, state) -> dict[str, Any]: ...


def train_and_evaluate(config: ml_collections.ConfigDict | config_checks.Checked,
                       workdir: str, devices=None) -> dict[str, Any]:
  """Trains (resuming from `workdir` if it holds this run), evaluates, writes summary.json.

  `devices` (default: all) is the device set the mesh is built from. A single run returns
  its summary, which also carries the final state under the key `state` (not written to
  disk); a population (`config.population.members`) returns {"members": [member summary,
  ...], "state": stacked final state}. Raises `errors.BadInput` before any work for
  unusable input, and `preemption.Preempted` after checkpointing when a SIGTERM arrived.
  `config`: the entry point's `config_checks.Checked`, taken as it is; a plain config (a
  library caller that skips the entry) is validated here, the one library door."""
  start_time = time.time()
  checked = config_checks.validate(config)
  config = checked.config
  if checked.members:
    p = population.setup(checked, devices)
    trainer, target, members = population.PopulationTrainer(p), p.restore_target(), p.size
    make = lambda workdir: population_loop.PopulationRun(config, workdir, p, start_time, trainer)
  else:
    s = build.setup(checked, devices)
    trainer = trainer_lib.Trainer(config, s)
    target, members = s.restore_target(), 1
    make = lambda workdir: SingleRun(config, workdir, s, start_time, trainer)

  def fits() -> FirstChunk:
    """The first chunk compiled ahead of time (a fresh run's; a resume whose first chunk is
    shorter compiles that one too), refused with one line when it cannot fit in memory."""
    length = _next_boundary(0, config, _chunk_bound(config).length)
    compile_start = time.time()
    compiled = trainer.compile_chunk(target, length)
    fit = memory.check_fits(compiled, list(trainer.mesh.devices.flat), config.batch_size, members)
    seconds = time.time() - compile_start
    logging.info("First chunk (%d steps) compiled in %.1fs; %s", length, seconds, fit.describe())
    return FirstChunk(length, seconds)

  runs = tuple(zip(checked.member_names, checked.members))  # A population's member runs.
  check = lambda workdir, record: run_files.check_run_dirs(workdir, config, runs, record)
  with session(config, workdir, check, fits) as sess:
    return run(make(sess.workdir), config, sess)


def _chunk_bound(config: ml_collections.ConfigDict) -> preemption.ChunkBound:
  return preemption.ChunkBound(config.steps_per_loop, config.get("preemption_grace_s"))


class FirstChunk(NamedTuple):
  """The chunk compiled before the session (`memory.py`), and how long that took."""
  length: int
  compile_s: float


@dataclasses.dataclass(frozen=True)
class Session:
  """What one invocation of a training loop holds while it runs."""
  workdir: str  # `~` expanded
  watcher: preemption.Watcher
  ckpt: checkpointing.Checkpointer
  release: Callable[[], None]  # Frees the workdir's lock (for an exit without unwinding).
  first_chunk: FirstChunk  # Compiled before the session; its time counts for ChunkBound.


@contextlib.contextmanager
def session(config: ml_collections.ConfigDict, workdir: str,
            check: Callable[[str, bool], None], fits: Callable[[], FirstChunk]):
  """The signal handlers; the workdir guard (`check(workdir, record)`, whose ValueError becomes
  BadInput), dry; the one-writer lock (`lock.py`), so that a second trainer is refused in one line
  before any compilation; `fits` (the memory check: a notice during its compilation exits at once);
  the guard again, recording the config; a writable checkpoints/ and the checkpointer; all released
  on any exit. Single runs and populations (`population_loop.py`) train inside one."""
  cli.announce_workdir(workdir)
  workdir = run_files.workdir_path(workdir)
  checkpoints = str(run_files.path(workdir) / run_files.CHECKPOINTS)
  is_chief = jax.process_index() == 0
  made = []  # The directories the lock will create: removed again if nothing is trained.
  for directory in (run_files.path(workdir), *run_files.path(workdir).parents):
    if directory.exists():
      break
    made.append(directory)
  checked = is_chief and run_files.path(checkpoints).is_dir()
  if checked:
    lock.check_writable(checkpoints)  # Before `check` records anything.
  not_started = f"not started yet; nothing in {workdir} was written"
  agree = _chief_outcome if jax.process_count() > 1 else None
  # The signal handlers first: a SIGTERM from here on is a preemption. `config.debug_nans`
  # (JAX re-runs a call that made a NaN op by op) from here on too: JAX donates no buffers
  # only in what it compiles with the flag on, `fits` included, and the re-run needs them.
  with contextlib.closing(preemption.Watcher()) as watcher, jax.debug_nans(
      bool(config.get("debug_nans", False))):
    with watcher.nothing_to_save(not_started, lambda: None), build.as_bad_input():
      check(workdir, False)
      multihost.sync("lock")  # The lock's broadcast may be the first collective: Gloo's 30 s.
    with lock.hold(workdir, is_chief, agree) as held:
      try:
        with watcher.nothing_to_save(not_started, held.release), build.as_bad_input():
          first_chunk = fits()
          check(workdir, is_chief)  # Process 0 records the config; the others wait for it.
          multihost.sync("check_workdir")
      except errors.BadInput:
        held.release()
        for directory in made if is_chief else ():  # Only the lock made them: leave none.
          with contextlib.suppress(OSError):
            directory.rmdir()
        raise
      if is_chief and not checked:  # A new checkpoints/: found now, not at the first save.
        lock.check_writable(checkpoints)
      ckpt = checkpointing.Checkpointer(
          workdir, save_every=config.checkpoint_every_steps, keep=config.keep_checkpoints,
          use_async=config.async_checkpoints)
      try:
        yield Session(workdir, watcher, ckpt, held.release, first_chunk)
      finally:
        ckpt.close()


def _chief_outcome(held: bool) -> bool:
  """Process 0's `held`, on every process (the lock's outcome: all refuse together)."""
  return bool(multihost_utils.broadcast_one_to_all(np.int32(held)))


def _next_boundary(step: int, config, steps_per_loop: int) -> int:
  ends = [config.num_train_steps, step + steps_per_loop]
  for every in (config.log_every_steps, config.eval_every_steps, config.checkpoint_every_steps):
    ends.append((step // every + 1) * every)
  if config.get("stop_after_steps"):
    ends.append(max(config.stop_after_steps, step + 1))
  return min(ends)


def run(program: Program, config: ml_collections.ConfigDict, sess: Session) -> dict[str, Any]:
  """The loop proper: restore, train in chunks, check, save, log, evaluate, summarize."""
  ckpt, watcher = sess.ckpt, sess.watcher
  # A notice with nothing unsaved exits at once (`preemption.py`): while restoring,
  # initializing and opening (ceilings, writers), and until a chunk is done.
  unchanged = f"the checkpoints in {sess.workdir} are unchanged"
  with watcher.nothing_to_save(f"nothing trained yet; {unchanged}", sess.release):
    state, step = program.restore_or_init(ckpt)
    if step >= config.num_train_steps:
      finished = program.finished(state)
      if finished is not None:
        return finished
    program.open(step, state)
  start_step = step
  progress = console.Progress(step, config.num_train_steps)
  chunks = _chunk_bound(config)
  chunks.compiled(sess.first_chunk.length, sess.first_chunk.compile_s)
  pending, last_saved = [], start_step  # `last_saved`: the newest step saved (or restored).

  def idle(step: int):
    """Exits at a notice (one process) while nothing was trained since the last save."""
    if last_saved != step or ckpt.saving():
      return contextlib.nullcontext()
    return watcher.nothing_to_save(f"nothing trained yet since step {step}; {unchanged}",
                                   sess.release)

  def save(step: int, state, force: bool):
    nonlocal pending, last_saved
    # Checked before any save, so a checkpoint never holds a diverged state.
    pending = jax.device_get(pending)
    program.check_finite(pending, ckpt)
    if ckpt.save(step, state, force=force, data_iterator=program.data_iterator):
      last_saved = step
      program.saved(step, start_step)
      logging.info("saving checkpoint at step %s -> %s", f"{step:,}",
                   run_files.shown(ckpt.directory))

  def stop(step: int, state) -> None:
    """The preemption path: save at `step`, wait for it, nothing else (no log, no eval)."""
    save(step, state, force=True)
    ckpt.wait()
    raise preemption.Preempted(step, sess.workdir, watcher.reason)

  try:
    while step < config.num_train_steps:
      if config.get("stop_after_steps") and step >= config.stop_after_steps:
        break
      if watcher.reached():  # A notice during an evaluation or a log: nothing dispatched.
        with idle(step) if step == start_step else contextlib.nullcontext():
          stop(step, state)  # Nothing trained by this process: `idle` exits first.
      end = _next_boundary(step, config, chunks.length)
      if chunks.compile_may_outlast_bound(end - step):
        if last_saved != step:  # Committed first, so that a notice during this chunk's
          save(step, state, force=True)  # compilation can exit at once.
        ckpt.wait()
      chunk_start = time.time()
      with idle(step):
        try:
          state, metrics = program.trainer.train_chunk(state, end - step)
        except FloatingPointError as e:  # `config.debug_nans` found the op: one line.
          ckpt.wait()
          raise trainer_lib.diverged(str(e), ckpt.latest_step()) from e
        # The chunk ends before the notice is read, so one that came during it stops the
        # run here, with no chunk queued behind it (`preemption.py`).
        jax.block_until_ready(metrics)
      chunks.observe(end - step, time.time() - chunk_start)
      ckpt.check()  # A failed asynchronous save stops the run here.
      pending.append((step, metrics))
      step = end
      if watcher.reached():
        stop(step, state)
      is_last = step == config.num_train_steps
      if ckpt.should_save(step) or is_last:
        save(step, state, force=is_last)
      elif step % config.log_every_steps == 0:
        pending = jax.device_get(pending)
        program.check_finite(pending, ckpt)
      if step % config.log_every_steps == 0 or is_last:
        program.log(step, pending, progress)
        pending = []
      if step % config.eval_every_steps == 0 or is_last:
        eval_start = time.time()
        program.evaluate(step, state)
        progress.excluded += time.time() - eval_start
    if step >= config.num_train_steps and not program.evaluated:
      program.evaluate(step, state)  # Killed after the final save, before the summary.
    ckpt.wait()
  finally:
    program.close()
  return program.summarize(step, start_step, state)


class SingleRun:
  """One run's `Program`: its trainer, TensorBoard writer and summary.json."""

  def __init__(self, config, workdir: str, s: build.Setup, start_time: float,
               trainer: trainer_lib.Trainer):
    self.config, self.workdir, self.setup, self.start_time = config, workdir, s, start_time
    self.trainer, self.data_iterator = trainer, trainer.data_iterator
    self.main_metric = s.objective.main_metric
    self.writer = None
    self.ceilings, self.last_train, self.eval_metrics = {}, {}, {}
    self.evaluated = False
    self.num_params = 0

  def restore_or_init(self, ckpt):
    state = ckpt.restore_latest(self.setup.restore_target(), data_iterator=self.data_iterator)
    if state is None:
      logging.info("New run in %s", run_files.shown(self.workdir))
      state = build.init_state(self.config, self.setup.init_fn, self.setup.shardings)
    else:
      logging.info("Resuming %s from step %d of %d", run_files.shown(self.workdir),
                   int(jax.device_get(state.step)), self.config.num_train_steps)
    return state, int(jax.device_get(state.step))

  def finished(self, state):
    if not run_files.is_finished(self.workdir):
      return None
    summary = run_files.read_summary(self.workdir)
    logging.info("%s already holds a finished run (step %d); nothing to do",
                 run_files.shown(self.workdir), summary["step"])
    return {**summary, "state": state}

  def open(self, step: int, state) -> None:
    self.writer = events.EventsWriter(self.workdir, just_logging=jax.process_index() != 0)
    self.num_params = state_lib.count_params(state.params)
    logging.info("Model: %s attention, %s parameters", self.config.model.attention,
                 f"{self.num_params:,}")
    logging.debug("Parameters:\n%s", parameter_overview.get_parameter_overview(
        state.params, include_stats=False))
    self.ceilings = self.setup.objective.run_metrics(self.config, self.workdir)
    events.write_run_start(self.writer, step, self.config, self.ceilings)

  def check_finite(self, pending, ckpt) -> None:
    bad = trainer_lib.first_nonfinite([(start, m.per_step) for start, m in pending])
    if bad is not None:
      ckpt.wait()
      raise trainer_lib.diverged(f"non-finite training loss at step {bad:,} "
                                 "(--config.debug_nans=true finds the first op)",
                                 ckpt.latest_step())

  def saved(self, step: int, start_step: int) -> None:
    del step, start_step

  def log(self, step: int, pending, progress: console.Progress) -> None:
    window = metrics_lib.merge_all([m.window for _, m in pending])
    self.last_train = {f"train/{k}": float(v) for k, v in self.setup.objective.finalize(
        metrics_lib.means(window)).items()}
    self.last_train["train/learning_rate"] = float(
        state_lib.learning_rate_schedule(self.config)(step))
    metrics = " ".join(f"{k} {self.last_train[f'train/{k}']:.4f}" for k in dict.fromkeys(
        ("loss", self.main_metric)) if f"train/{k}" in self.last_train)
    logging.info("%s", progress.line(step, metrics))
    self.writer.write_scalars(step, {**self.last_train, "steps_per_sec": progress.rate})

  def evaluate(self, step: int, state) -> None:
    self.eval_metrics = self.trainer.evaluate(state.params)
    self.evaluated = True
    self.writer.write_scalars(step, self.eval_metrics)
    logging.info("%s", _eval_line(step, self.eval_metrics, self.ceilings, self.main_metric))

  def close(self) -> None:
    if self.writer is not None:
      self.writer.close()

  def summarize(self, step: int, start_step: int, state) -> dict[str, Any]:
    wall_time = time.time() - self.start_time
    summary = {"step": step, "wall_time_s": wall_time, "params": self.num_params,
               # Including compilation, evaluation and checkpointing.
               "steps_per_s_overall": (step - start_step) / wall_time,
               "num_devices": jax.device_count(), "num_processes": jax.process_count(),
               **self.last_train, **self.eval_metrics, **self.ceilings}
    if step >= self.config.num_train_steps:
      if jax.process_index() == 0:
        run_files.write_summary(self.workdir, summary)
      logging.info("%s", _result_line(summary, self.main_metric, self.workdir))
    return {**summary, "state": state}


def _eval_line(step: int, metrics: dict[str, float], ceilings: dict[str, float],
               main_metric: str) -> str:
  parts = []
  for key in sorted(k for k in metrics if k.endswith(f"/{main_metric}")):
    ceiling = ceilings.get(f"{key}_ceiling")
    parts.append(f"{key} {metrics[key]:.4f}" + (f" (ceiling {ceiling:.4f})" if ceiling else ""))
  return f"eval at step {step:,} | " + " | ".join(parts)


def _result_line(summary: dict[str, Any], main_metric: str, workdir: str) -> str:
  ordered = sorted((k for k in summary if k.endswith(f"/{main_metric}") and
                    not k.startswith("train/")), key=lambda k: (not k.startswith("ood"), k))
  parts = []
  for key in ordered:
    bounds = [f"{name} {summary[f'{key}_{name}']:.4f}" for name in ("ceiling", "chance")
              if summary.get(f"{key}_{name}")]
    parts.append(f"{key} {summary[key]:.4f}" + (f" ({', '.join(bounds)})" if bounds else ""))
  meaning = ""
  if summary.get(f"ood/{main_metric}_chance"):  # Read the held-out split against chance.
    times = summary[f"ood/{main_metric}"] / summary[f"ood/{main_metric}_chance"]
    meaning = (f": {times:.0f}x chance on rule combinations held out of training"
               + (", which the model answers by composing what it learned" if times >= 5
                  else ", close to chance: train longer or larger"))
  return (f"Result: {', '.join(parts)}{meaning}; after {summary['step']:,} steps in "
          f"{console.duration(summary['wall_time_s'])}. Summary: "
          f"{run_files.shown(run_files.path(workdir) / run_files.SUMMARY)}; TensorBoard: "
          f"tensorboard --logdir {run_files.shown(workdir)}")
