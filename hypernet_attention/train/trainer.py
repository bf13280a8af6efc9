"""`Trainer`: the jitted train chunk and evaluation of one (config, objective, mesh).

Data comes from the objective's source (`data.py`), of one of two kinds:
  on device (synthetic tasks): the models are small, so host overhead per step would
    dominate on an accelerator. One jitted call runs `length` optimizer steps in a
    `lax.scan`, generating each step's batch on device from `fold_in(seed, step)`.
    Because a batch is a pure function of (seed, step), resuming replays exactly the data.
  on the host (language modeling): each process reads its slice, `data.to_global` makes
    global arrays, and one jitted step per batch takes it as an argument with its
    sharding; the next batch is read and transferred while the device runs the current
    step. The iterator's position is saved in every checkpoint and restored with it.
Either way the state is donated and its shardings are explicit, and metrics stay on device until a
log step, as `clu.metrics` collections (`metrics.py`). A population (`population.py`) maps
`train_step` and `eval_split` over its member axis; the loop that drives either is `loop.py`."""

from __future__ import annotations

import functools
import os
import traceback
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from hypernet_attention.train import build
from hypernet_attention.train import data
from hypernet_attention.train import metrics as metrics_lib
from hypernet_attention.train import sharding
from hypernet_attention.train import state as state_lib


def _constrain_batch(tree: Any, mesh) -> Any:
  return jax.tree.map(
      lambda x: jax.lax.with_sharding_constraint(x, sharding.batch_sharding(mesh, x.ndim)), tree)


class Trainer:
  """Jitted train chunks and evaluation for one config and its `build.setup` (objective, model,
  optimizer, mesh, state shardings); for a host source, this process's training iterator too
  (`self.data_iterator`)."""

  def __init__(self, config, s: build.Setup):
    self.config, self.objective, self.model, self.tx, self.mesh = (
        config, s.objective, s.model, s.tx, s.mesh)
    # One jitted step per call for a host source, and under `config.debug_nans`: JAX's op-by-op
    # re-run of the call that made a NaN names the op, not the scan around it.
    self.stepwise = not s.objective.source.on_device or bool(config.get("debug_nans", False))
    self.state_shardings = s.shardings
    self.rng = jax.random.key(config.seed)
    self.eval_splits = tuple(config.eval.splits)
    self.source = s.objective.source
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
    return metrics["loss"].mean(), metrics

  def train_step(self, state: state_lib.TrainState, host_batch=None):
    """One optimizer step; the batch is sampled on device unless `host_batch` is given.
    Returns the new state and (per-step loss and gradient norm, the step's collection)."""
    key = jax.random.fold_in(jax.random.fold_in(self.rng, 1), state.step)
    data_key, dropout_key = jax.random.split(key)
    if host_batch is None:
      batch = self.source.sample(data_key, self.config.batch_size, "train")
      batch = _constrain_batch(batch, self.mesh)
    else:
      batch = host_batch
    grads, per_example = jax.grad(self._loss, has_aux=True)(state.params, batch, dropout_key)
    updates, opt_state = self.tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = metrics_lib.step_metrics(per_example, optax.tree.norm(grads))
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

  @functools.cached_property
  def _train_chunk_jit(self):
    def chunk(state, length):
      step = lambda st, _: self.train_step(st)
      state, (per_step, collections) = jax.lax.scan(step, state, None, length=length)
      return state, metrics_lib.ChunkMetrics(per_step, collections.reduce())
    return jax.jit(chunk, static_argnums=1, donate_argnums=0, in_shardings=(self.state_shardings,),
                   out_shardings=(self.state_shardings, sharding.replicated(self.mesh)))

  @functools.cached_property
  def _step_jit(self):
    batch_shardings = None if self.source.on_device else data.global_shardings(
        self.source.example(self.config.batch_size), self.mesh)
    return jax.jit(self.train_step, donate_argnums=0,
                   in_shardings=(self.state_shardings, batch_shardings),
                   out_shardings=(self.state_shardings, sharding.replicated(self.mesh)))

  def _next_batch(self):
    return data.to_global(next(self.data_iterator), self.mesh, self.config.batch_size)

  def train_chunk(self, state, length: int):
    """`length` steps; returns the new state and their `metrics.ChunkMetrics`.

    Host source: the iterator advances by exactly `length` batches, so at a chunk end its
    position matches `state.step` (what a checkpoint there records). Traced and run with
    the mesh in context (`jax.set_mesh`), so the tiled attention kernels run per device
    on their batch shard (`ops/sharded.py`) instead of being gathered."""
    with jax.set_mesh(self.mesh):
      return self._train_chunk(state, length)

  def _train_chunk(self, state, length: int):
    if not self.stepwise:
      return self._train_chunk_jit(state, length)
    next_batch = (lambda: None) if self.source.on_device else self._next_batch
    per_step, collections, batch = [], [], next_batch()
    for i in range(length):
      try:
        state, (scalars, collection) = self._step_jit(state, batch)  # Asynchronous.
      except FloatingPointError as e:  # `config.debug_nans` named the op; `state` is kept.
        raise FloatingPointError(f"{e} in training step {int(state.step) + 1:,}, at "
                                 f"{_made_at(e)}") from None
      per_step.append(scalars)
      collections.append(collection)
      if i + 1 < length:
        batch = next_batch()  # Read and transfer while the device works.
    return state, metrics_lib.ChunkMetrics(jax.tree.map(lambda *xs: jnp.stack(xs), *per_step),
                                           metrics_lib.merge_all(collections))

  def compile_chunk(self, state, length: int) -> jax.stages.Compiled:
    """Compiles the first `length`-step chunk for `state` (arrays or shape/sharding structs)
    ahead of time; the jitted call with those shapes then reuses it (`memory.py`). A host
    source, and any under `config.debug_nans`, compiles its one-step function (a host
    source's for a batch of `example`'s shapes)."""
    with jax.set_mesh(self.mesh):
      if not self.stepwise:
        return self._train_chunk_jit.lower(state, length).compile()
      batch = None
      if not self.source.on_device:
        example = self.source.example(self.config.batch_size)
        batch = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                             example, data.global_shardings(example, self.mesh))
      return self._step_jit.lower(state, batch).compile()

  def _batch_metrics(self, params, batch):
    inputs, _ = self.objective.encode(batch)
    outputs = self.model.apply({"params": params}, inputs, deterministic=True)
    return metrics_lib.collect(self.objective.metrics_fn(outputs, batch))

  def eval_split(self, params, split_index: int, split: str):
    """The split's collection over `eval.num_problems // eval.batch_size` batches."""
    num_batches = self.config.eval.num_problems // self.config.eval.batch_size
    split_key = jax.random.fold_in(jax.random.fold_in(self.rng, 2), split_index)

    def batch_metrics(i):
      batch = self.source.sample(
          jax.random.fold_in(split_key, i), self.config.eval.batch_size, split)
      return self._batch_metrics(params, _constrain_batch(batch, self.mesh))

    def body(collection, i):
      return collection.merge(batch_metrics(i)), None

    collection, _ = jax.lax.scan(body, batch_metrics(0), jnp.arange(1, num_batches))
    return collection

  @functools.cached_property
  def _eval_jit(self):
    def evaluate(params):
      return {split: self.eval_split(params, i, split) for i, split in enumerate(self.eval_splits)}
    return jax.jit(evaluate, in_shardings=(self.state_shardings.params,),
                   out_shardings=sharding.replicated(self.mesh))

  @functools.cached_property
  def _host_eval_jit(self):
    example = self.source.example(self.config.eval.batch_size)
    return jax.jit(self._batch_metrics, in_shardings=(
        self.state_shardings.params, data.global_shardings(example, self.mesh)),
                   out_shardings=sharding.replicated(self.mesh))

  def _host_evaluate(self, params) -> dict[str, Any]:
    """Each split's collection over its first `eval.num_problems` rows, read by every process."""
    eval_config = self.config.eval
    return {split: metrics_lib.merge_all([
        self._host_eval_jit(params, data.to_global(local, self.mesh, eval_config.batch_size))
        for local in self.source.evaluate(
            split, data.local_batch_size(eval_config.batch_size, "eval.batch_size"),
            eval_config.num_problems // eval_config.batch_size, jax.process_index(),
            jax.process_count())]) for split in self.eval_splits}

  def evaluate(self, params) -> dict[str, float]:
    """Mean metrics on a fixed set of `eval.num_problems` problems per split (and what
    the objective derives from them)."""
    with jax.set_mesh(self.mesh):  # As in `train_chunk`.
      results = jax.device_get(self._eval_jit(params) if self.source.on_device
                               else self._host_evaluate(params))
    return {f"{split}/{k}": float(v) for split, collection in results.items()
            for k, v in self.objective.finalize(metrics_lib.means(collection)).items()}


def first_nonfinite(chunks) -> Optional[int]:
  """1-based number of the first step whose training loss is NaN/Inf, or None (`chunks`:
  (start step, per-step {'loss', 'grad_norm': (steps,)}))."""
  for start, per_step in chunks:
    # A finite loss with a non-finite gradient would make the *next* state non-finite.
    finite = np.isfinite(per_step["loss"]) & np.isfinite(per_step["grad_norm"])
    bad = np.flatnonzero(~finite)
    if bad.size:
      return start + int(bad[0]) + 1
  return None


def _made_at(error: BaseException) -> str:
  """The innermost line of this package in the traceback of JAX's op-by-op re-run (a
  library's op, e.g. optax's, is named by the line that called it)."""
  package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  *_, f = [f for f in traceback.extract_tb(error.__traceback__) if f.filename.startswith(package)]
  return f"{os.path.relpath(f.filename, os.path.dirname(package))}:{f.lineno} ({f.name})"


def diverged(what: str, latest_step: Optional[int]) -> FloatingPointError:
  """A diverged run's one line (`cli.run`). Saves check the losses first (`loop.py`)."""
  return FloatingPointError(f"{what}; stopped (" + (
      "no checkpoint was saved before it: nothing to resume from" if latest_step is None else
      f"the checkpoints, up to step {latest_step:,}, were saved before it and are intact") + ")")
