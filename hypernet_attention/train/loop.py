"""`train_and_evaluate(config, workdir)`: the program every experiment runs.

Data comes from the objective's source (`data.py`), of one of two kinds:
  on device (synthetic tasks): the models are small, so host overhead per step would
    dominate on an accelerator. One jitted call runs `steps_per_loop` optimizer steps in
    a `lax.scan`, generating each step's batch on device from `fold_in(seed, step)`.
    Because a batch is a pure function of (seed, step), resuming replays exactly the data.
  on the host (language modeling): each process reads its slice, `data.to_global` makes
    global arrays, and one jitted step per batch takes it as an argument with its
    sharding; the next batch is read and transferred while the device runs the current
    step. The iterator's position is saved in every checkpoint and restored with it.
Either way the state is donated and its shardings are explicit, and metrics stay on
device until a log step.

Order of work: validate everything (config, mesh, batch divisibility, workdir) -> build the
state abstractly -> restore or initialize it sharded -> train / evaluate / checkpoint ->
summary.json. Only process 0 writes logs and the summary.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from typing import Any, Callable, Optional

from absl import logging
from clu import parameter_overview  # No TensorFlow (unlike clu.metric_writers).
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from hypernet_attention.train import build
from hypernet_attention.train import checkpointing
from hypernet_attention.train import config_lib
from hypernet_attention.train import console
from hypernet_attention.train import data
from hypernet_attention.train import events
from hypernet_attention.train import lock
from hypernet_attention.train import objectives
from hypernet_attention.train import preemption
from hypernet_attention.train import sharding
from hypernet_attention.train import state as state_lib
from hypernet_attention.train import workdir as workdir_lib


def _constrain_batch(tree: Any, mesh) -> Any:
  return jax.tree.map(
      lambda x: jax.lax.with_sharding_constraint(x, sharding.batch_sharding(mesh, x.ndim)), tree)


class Trainer:
  """Jitted train chunks and evaluation for one (config, objective, mesh).

  For a host source it owns this process's training iterator (`self.data_iterator`),
  whose position the checkpoints save and restore.
  """

  def __init__(self, config, objective: objectives.Objective, model: nn.Module, tx, mesh,
               state_shardings):
    self.config, self.objective, self.model, self.tx, self.mesh = (
        config, objective, model, tx, mesh)
    self.state_shardings = state_shardings
    self.rng = jax.random.key(config.seed)
    self.eval_splits = tuple(config.eval.splits)
    self.source = objective.source
    self.data_iterator = None
    if not self.source.on_device:
      self.data_iterator = self.source.train(
          config.seed, data.local_batch_size(config.batch_size), jax.process_index(),
          jax.process_count())

  def _loss(self, params, batch, dropout_key):
    inputs, _ = self.objective.encode(batch)
    outputs = self.model.apply({"params": params}, inputs, deterministic=False,
                               rngs={"dropout": dropout_key})
    metrics = self.objective.metrics_fn(outputs, batch)
    return metrics["loss"].mean(), jax.tree.map(jnp.mean, metrics)

  def _train_step(self, state: state_lib.TrainState, host_batch=None):
    """One optimizer step; the batch is sampled on device unless `host_batch` is given."""
    key = jax.random.fold_in(jax.random.fold_in(self.rng, 1), state.step)
    data_key, dropout_key = jax.random.split(key)
    if host_batch is None:
      batch = self.source.sample(data_key, self.config.batch_size, "train")
      batch = _constrain_batch(batch, self.mesh)
    else:
      batch = host_batch
    grads, metrics = jax.grad(self._loss, has_aux=True)(state.params, batch, dropout_key)
    updates, opt_state = self.tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics["grad_norm"] = optax.tree.norm(grads)
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

  @functools.cached_property
  def _train_chunk_jit(self):
    def chunk(state, length):
      return jax.lax.scan(self._train_step, state, None, length=length)
    return jax.jit(chunk, static_argnums=1, donate_argnums=0,
                   in_shardings=(self.state_shardings,),
                   out_shardings=(self.state_shardings, sharding.replicated(self.mesh)))

  @functools.cached_property
  def _host_step_jit(self):
    batch_shardings = data.global_shardings(self.source.example(self.config.batch_size),
                                            self.mesh)
    return jax.jit(self._train_step, donate_argnums=0,
                   in_shardings=(self.state_shardings, batch_shardings),
                   out_shardings=(self.state_shardings, sharding.replicated(self.mesh)))

  def _next_batch(self):
    return data.to_global(next(self.data_iterator), self.mesh, self.config.batch_size)

  def train_chunk(self, state, length: int):
    """`length` steps; returns the new state and per-step metrics {name: (length,)}.

    Host source: the iterator advances by exactly `length` batches, so at a chunk end its
    position matches `state.step` (what a checkpoint there records). Traced and run with
    the mesh in context (`jax.set_mesh`), so the tiled attention kernels run per device
    on their batch shard (`ops/sharded.py`) instead of being gathered.
    """
    with jax.set_mesh(self.mesh):
      return self._train_chunk(state, length)

  def _train_chunk(self, state, length: int):
    if self.source.on_device:
      return self._train_chunk_jit(state, length)
    per_step, batch = [], self._next_batch()
    for i in range(length):
      state, metrics = self._host_step_jit(state, batch)  # Dispatched asynchronously.
      per_step.append(metrics)
      if i + 1 < length:
        batch = self._next_batch()  # Read and transfer while the device works.
    return state, jax.tree.map(lambda *xs: jnp.stack(xs), *per_step)

  def compiled_chunk_text(self, state, length: int) -> str:
    """Optimized HLO text of the scanned `length`-step chunk (on-device data sources)."""
    if not self.source.on_device:
      raise ValueError(f"experiment {self.config.experiment!r} reads host-side data, so it "
                       "has no scanned chunk; allowed: on-device (synthetic) experiments.")
    return self._train_chunk_jit.lower(state, length).compile().as_text()

  def _batch_sums(self, params, batch):
    inputs, _ = self.objective.encode(batch)
    outputs = self.model.apply({"params": params}, inputs, deterministic=True)
    return jax.tree.map(jnp.sum, self.objective.metrics_fn(outputs, batch))

  def _eval_split(self, params, split_index: int, split: str):
    num_batches = self.config.eval.num_problems // self.config.eval.batch_size
    split_key = jax.random.fold_in(jax.random.fold_in(self.rng, 2), split_index)

    def batch_sums(i):
      batch = self.source.sample(
          jax.random.fold_in(split_key, i), self.config.eval.batch_size, split)
      return self._batch_sums(params, _constrain_batch(batch, self.mesh))

    def body(sums, i):
      return jax.tree.map(jnp.add, sums, batch_sums(i)), None

    sums, _ = jax.lax.scan(body, batch_sums(0), jnp.arange(1, num_batches))
    return jax.tree.map(lambda s: s / self.config.eval.num_problems, sums)

  @functools.cached_property
  def _eval_jit(self):
    def evaluate(params):
      return {split: self._eval_split(params, i, split)
              for i, split in enumerate(self.eval_splits)}
    return jax.jit(evaluate, in_shardings=(self.state_shardings.params,),
                   out_shardings=sharding.replicated(self.mesh))

  @functools.cached_property
  def _host_eval_jit(self):
    example = self.source.example(self.config.eval.batch_size)
    return jax.jit(self._batch_sums, in_shardings=(
        self.state_shardings.params, data.global_shardings(example, self.mesh)),
                   out_shardings=sharding.replicated(self.mesh))

  def _host_evaluate(self, params) -> dict[str, dict[str, jax.Array]]:
    """Sums over the split's first `eval.num_problems` rows, read by every process."""
    eval_config = self.config.eval
    results = {}
    for split in self.eval_splits:
      sums = None
      for local in self.source.evaluate(
          split, data.local_batch_size(eval_config.batch_size, "eval.batch_size"),
          eval_config.num_problems // eval_config.batch_size, jax.process_index(),
          jax.process_count()):
        batch_sums = self._host_eval_jit(
            params, data.to_global(local, self.mesh, eval_config.batch_size))
        sums = batch_sums if sums is None else jax.tree.map(jnp.add, sums, batch_sums)
      results[split] = jax.tree.map(lambda x: x / eval_config.num_problems, sums)
    return results

  def evaluate(self, params) -> dict[str, float]:
    """Mean metrics on a fixed set of `eval.num_problems` problems per split (and what
    the objective derives from them)."""
    with jax.set_mesh(self.mesh):  # As in `train_chunk`.
      results = jax.device_get(self._eval_jit(params) if self.source.on_device
                               else self._host_evaluate(params))
    return {f"{split}/{k}": float(v) for split, ms in results.items()
            for k, v in self.objective.finalize(ms).items()}


def _next_boundary(step: int, config) -> int:
  ends = [config.num_train_steps, step + config.steps_per_loop]
  for every in (config.log_every_steps, config.eval_every_steps, config.checkpoint_every_steps):
    ends.append((step // every + 1) * every)
  if config.get("stop_after_steps"):
    ends.append(max(config.stop_after_steps, step + 1))
  return min(ends)


def _first_nonfinite(chunks) -> Optional[int]:
  """1-based number of the first step whose training loss is NaN/Inf, or None."""
  for start, metrics in chunks:
    # A finite loss with a non-finite gradient would make the *next* state non-finite.
    finite = np.isfinite(metrics["loss"]) & np.isfinite(metrics["grad_norm"])
    bad = np.flatnonzero(~finite)
    if bad.size:
      return start + int(bad[0]) + 1
  return None


@contextlib.contextmanager
def _debug_nans(enabled: bool):
  """`config.debug_nans`: JAX re-runs the first op that makes a NaN un-jitted and raises
  there (slow: for hunting the op, not for production runs)."""
  previous = jax.config.jax_debug_nans
  jax.config.update("jax_debug_nans", bool(enabled))
  try:
    yield
  finally:
    jax.config.update("jax_debug_nans", previous)


def _restore_or_init(config, s: build.Setup, ckpt: checkpointing.Checkpointer, workdir: str,
                     data_iterator=None):
  state = ckpt.restore_latest(s.restore_target(), data_iterator=data_iterator)
  if state is None:
    logging.info("New run in %s", workdir)
    return build.init_state(config, s.init_fn, s.shardings)
  logging.info("Resuming %s from step %d of %d", workdir, int(jax.device_get(state.step)),
               config.num_train_steps)
  return state


class _Progress:
  """Steps/s over the last log interval (evaluation time excluded) and the ETA."""

  def __init__(self, step: int, total: int):
    self.total, self.step, self.time, self.excluded = total, step, time.time(), 0.0
    self.rate = 0.0

  def line(self, step: int, train: dict[str, float], main_metric: str) -> str:
    now = time.time()
    self.rate = rate = (step - self.step) / max(now - self.time - self.excluded, 1e-9)
    self.step, self.time, self.excluded = step, now, 0.0
    metrics = " ".join(f"{k} {train[f'train/{k}']:.4f}" for k in dict.fromkeys(
        ("loss", main_metric)) if f"train/{k}" in train)
    return (f"step {step:,}/{self.total:,} | {metrics} | {rate:.2f} steps/s | "
            f"ETA {console.duration((self.total - step) / max(rate, 1e-9))}")


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
          f"{workdir_lib.path(workdir) / workdir_lib.SUMMARY}; TensorBoard: tensorboard "
          f"--logdir {workdir}")


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                       devices=None) -> dict[str, Any]:
  """Trains (resuming from `workdir` if it holds this run), evaluates, writes summary.json.

  `devices` (default: all) is the device set the mesh is built from. Returns the summary;
  it also carries the final state under the key `state` (not written to disk). Raises
  `config_lib.BadInput` before any work for unusable input, and `preemption.Preempted`
  after checkpointing when a SIGTERM arrived.
  """
  if config.get("population") and config.population.get("members"):
    from hypernet_attention.train import population_loop  # pylint: disable=g-import-not-at-top
    return population_loop.train_and_evaluate(config, workdir, devices)
  start_time = time.time()
  s = build.setup(config, devices)
  with session(config, workdir, lambda w: workdir_lib.check(w, config)) as run:
    return _train(config, run.workdir, s, run.ckpt, run.watcher, start_time)


@dataclasses.dataclass(frozen=True)
class Session:
  """What one invocation of a training loop holds while it runs."""
  workdir: str  # `~` expanded
  watcher: preemption.Watcher
  ckpt: checkpointing.Checkpointer


@contextlib.contextmanager
def session(config: ml_collections.ConfigDict, workdir: str, check: Callable[[str], None]):
  """The workdir guard (`check`, whose ValueError becomes BadInput before anything is
  written), then the signal handlers, the one-writer lock (`lock.py`), a writable
  checkpoints/ and the checkpointer; all released on any exit. Single runs and populations
  (`population_loop.py`) train inside one."""
  workdir = config_lib.workdir_path(workdir)
  checkpoints = str(workdir_lib.path(workdir) / workdir_lib.CHECKPOINTS)
  is_chief = jax.process_index() == 0
  checked = is_chief and workdir_lib.path(checkpoints).is_dir()
  if checked:
    lock.check_writable(checkpoints)  # Before `check` records anything.
  try:
    check(workdir)
  except ValueError as e:
    raise config_lib.BadInput(str(e)) from e
  # The signal handlers first: a SIGTERM once the lock is held is a preemption.
  with preemption.Watcher() as watcher, lock.hold(workdir), \
      _debug_nans(config.get("debug_nans", False)):
    if is_chief and not checked:  # A new checkpoints/: found now, not at the first save.
      lock.check_writable(checkpoints)
    ckpt = checkpointing.Checkpointer(
        workdir, save_every=config.checkpoint_every_steps, keep=config.keep_checkpoints,
        use_async=config.async_checkpoints)
    try:
      yield Session(workdir, watcher, ckpt)
    finally:
      ckpt.close()


def _train(config, workdir: str, s: build.Setup, ckpt: checkpointing.Checkpointer,
           watcher: preemption.Watcher, start_time: float) -> dict[str, Any]:
  """The loop proper: restore, train in chunks, log, evaluate, checkpoint, summarize."""
  trainer = Trainer(config, s.objective, s.model, s.tx, s.mesh, s.shardings)
  state = _restore_or_init(config, s, ckpt, workdir, trainer.data_iterator)
  step = start_step = int(jax.device_get(state.step))
  finished = workdir_lib.read_summary(workdir) if step >= config.num_train_steps else None
  if finished is not None:
    logging.info("%s already holds a finished run (step %d); nothing to do", workdir, step)
    return {**finished, "state": state}
  is_chief = jax.process_index() == 0
  writer = events.EventsWriter(workdir, just_logging=not is_chief)
  num_params = state_lib.count_params(state.params)
  logging.info("Model: %s attention, %s parameters", config.model.attention, f"{num_params:,}")
  logging.debug("Parameters:\n%s", parameter_overview.get_parameter_overview(
      state.params, include_stats=False))
  if step == 0:
    flat_config = workdir_lib.flatten(workdir_lib.config_to_json(config))
    writer.write_hparams({k: v for k, v in flat_config.items()
                          if isinstance(v, (int, float, str, bool))})

  ceilings = s.objective.run_metrics(config, workdir)
  if ceilings:
    writer.write_scalars(step, ceilings)

  progress = _Progress(step, config.num_train_steps)
  main_metric = s.objective.main_metric
  pending, last_train, eval_metrics = [], {}, {}
  while step < config.num_train_steps:
    if config.get("stop_after_steps") and step >= config.stop_after_steps:
      break
    end = _next_boundary(step, config)
    state, metrics = trainer.train_chunk(state, end - step)
    ckpt.check()  # A failed asynchronous save stops the run here.
    pending.append((step, metrics))
    step = end
    is_last = step == config.num_train_steps
    preempted = watcher.reached()
    saving = ckpt.should_save(step) or is_last or preempted
    if saving or step % config.log_every_steps == 0:
      # Checked before any save, so a checkpoint never holds a diverged state.
      pending = jax.device_get(pending)
      bad = _first_nonfinite(pending)
      if bad is not None:
        ckpt.wait()
        raise FloatingPointError(
            f"non-finite training loss at step {bad}; stopping (checkpoints up to step "
            f"{ckpt.latest_step()} are intact; --config.debug_nans=true finds the first op)")
    if saving and ckpt.save(step, state, force=is_last or preempted,
                            data_iterator=trainer.data_iterator):
      logging.info("saving checkpoint at step %s -> %s", f"{step:,}", ckpt.directory)
    if step % config.log_every_steps == 0 or is_last:
      last_train = {f"train/{k}": float(v) for k, v in s.objective.finalize(
          {k: np.mean(np.concatenate([m[k] for _, m in pending])) for k in pending[0][1]}
      ).items()}
      last_train["train/learning_rate"] = float(
          state_lib.learning_rate_schedule(config)(step))
      logging.info("%s", progress.line(step, last_train, main_metric))
      writer.write_scalars(step, {**last_train, "steps_per_sec": progress.rate})
      pending = []
    if preempted:
      ckpt.wait()
      writer.close()
      raise preemption.Preempted(step, workdir, watcher.reason)
    if step % config.eval_every_steps == 0 or is_last:
      eval_start = time.time()
      eval_metrics = trainer.evaluate(state.params)
      progress.excluded += time.time() - eval_start
      writer.write_scalars(step, eval_metrics)
      logging.info("%s", _eval_line(step, eval_metrics, ceilings, main_metric))
  if step >= config.num_train_steps and not eval_metrics:  # Killed after the final save.
    eval_metrics = trainer.evaluate(state.params)
  ckpt.wait()
  writer.close()

  wall_time = time.time() - start_time
  summary = {"step": step, "wall_time_s": wall_time, "params": num_params,
             # Including compilation, evaluation and checkpointing.
             "steps_per_s_overall": (step - start_step) / wall_time,
             "num_devices": jax.device_count(), "num_processes": jax.process_count(),
             **last_train, **eval_metrics, **ceilings}
  if step >= config.num_train_steps:
    if is_chief:
      workdir_lib.write_summary(workdir, summary)
    logging.info("%s", _result_line(summary, main_metric, workdir))
  return {**summary, "state": state}
