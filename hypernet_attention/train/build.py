"""Building a run from its config: validated, nothing materialized, no CLU or TensorFlow.

`setup(config)` turns a config into a `Setup` (objective, model, optimizer, mesh, the
abstract train state and its shardings) and raises `config_lib.BadInput` for anything
unusable, before any work. `init_state` materializes a fresh state with its shardings.
Training (`loop.py`), read-only restore for probing (`restore.py`) and the benchmarks all
start here, so analysis never imports the training loop or its writers.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from hypernet_attention import transformer
from hypernet_attention.tasks import sraven
from hypernet_attention.train import checkpointing
from hypernet_attention.train import config_lib
from hypernet_attention.train import data
from hypernet_attention.train import objectives
from hypernet_attention.train import sharding
from hypernet_attention.train import state as state_lib


def _check_intervals(config: ml_collections.ConfigDict) -> None:
  if config.eval.num_problems % config.eval.batch_size:
    raise ValueError(f"config.eval.num_problems={config.eval.num_problems} is not a multiple of "
                     f"config.eval.batch_size={config.eval.batch_size}")


def memory_budget() -> int:
  """Bytes a run may plan for: half of this host's physical memory (the task tables and the
  accuracy-ceiling readings live on the host; a larger estimate would swap or be killed)."""
  return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2


# Experiment -> bytes its task needs on the host, from the config alone (before building it).
TASK_MEMORY = {"sraven": lambda config: sraven.memory_estimate(
    config.task.num_features, config.task.num_values, config.task.get("grid_size", 3),
    ceiling_batch=1024 if config.eval.ceiling_problems > 0 else 0)}


def check_task_memory(config: ml_collections.ConfigDict, budget: int | None = None) -> None:
  """Refuses task sizes whose tables would not fit in memory (e.g. SRAVEN's K! readings)."""
  estimate = TASK_MEMORY.get(config.experiment)
  if estimate is None:
    return
  try:
    need = estimate(config)
  except (TypeError, ValueError):
    return  # Wrong types: the task's own constructor names them.
  budget = memory_budget() if budget is None else budget
  if need > budget:
    sizes = ", ".join(f"task.{k}={v!r}" for k, v in config.task.items()
                      if k in ("num_features", "num_values", "grid_size"))
    raise config_lib.BadInput(
        f"config {sizes} with eval.ceiling_problems={config.eval.ceiling_problems} needs "
        f"~{need / 2**30:,.1f} GiB for the task's tables; allowed: at most "
        f"{budget / 2**30:,.1f} GiB (half this host's memory): fewer features, or "
        "--config.eval.ceiling_problems=0 (the ceilings' readings grow as K!**(G-1))")


@dataclasses.dataclass(frozen=True)
class Setup:
  """Everything built from a config before any work: validated, nothing materialized."""
  objective: objectives.Objective
  model: nn.Module
  tx: Any  # optax.GradientTransformation
  mesh: jax.sharding.Mesh
  init_fn: Any  # rng -> boxed TrainState
  abstract_state: Any  # boxed TrainState of ShapeDtypeStructs (logical axes)
  shardings: Any  # NamedSharding per leaf of the unboxed TrainState

  def restore_target(self) -> Any:
    """The abstract state with its shardings: what Orbax restores onto."""
    return checkpointing.abstract_with_shardings(nn.meta.unbox(self.abstract_state),
                                                 self.shardings)


def setup(config: ml_collections.ConfigDict, devices=None,
          member_of_population: bool = False) -> Setup:
  """Everything that validates input: objective, model, optimizer, mesh. No side effects.

  Any problem with the config or the devices is a `config_lib.BadInput`. A population
  (`population.setup`) builds its members' run with `member_of_population=True`, which
  allows a mesh with a `member` axis.
  """
  try:
    return _setup(config, devices, member_of_population)
  except config_lib.BadInput:
    raise
  except ValueError as e:
    raise config_lib.BadInput(str(e)) from e


def _setup(config: ml_collections.ConfigDict, devices, member_of_population: bool) -> Setup:
  config_lib.validate(config)
  _check_intervals(config)
  state_lib.check_schedule(config)
  check_task_memory(config)
  objective = objectives.build(config)
  mesh = sharding.make_mesh(config.mesh, devices)
  if mesh.shape["member"] > 1 and not member_of_population:
    raise ValueError(f"config.mesh.member={config.mesh.member} spreads population members "
                     "over devices; a single run needs mesh.member=1")
  sharding.check_batch_size(config.batch_size, mesh)
  sharding.check_batch_size(config.eval.batch_size, mesh, "eval.batch_size")
  if not objective.source.on_device:  # Every process reads an equal slice.
    data.local_batch_size(config.batch_size)
    data.local_batch_size(config.eval.batch_size, "eval.batch_size")
  unknown = sorted(set(config.eval.splits) - set(objective.source.splits))
  if unknown:
    raise ValueError(f"unknown eval splits {unknown}; allowed: {list(objective.source.splits)}")
  example = jax.eval_shape(lambda b: objective.encode(b)[0],
                           objective.source.example(config.batch_size))
  model_config = config_lib.transformer_config(
      {k: v for k, v in config.model.items() if v is not None}, **objective.model_overrides)
  model = transformer.Transformer(model_config)
  tx = state_lib.make_optimizer(config)
  # One example per batch shard initializes the parameters: a batch-sized zeros array
  # would be allocated for nothing (and a huge batch_size would fail here, unnamed).
  shards = int(np.prod([mesh.shape[a] for a in sharding.BATCH_AXES]))
  init_fn = state_lib.make_init_fn(
      model, jnp.zeros((shards,) + example.shape[1:], example.dtype), tx)
  abstract_boxed = jax.eval_shape(init_fn, jax.random.key(0))
  shardings = sharding.state_shardings(abstract_boxed, mesh)
  return Setup(objective, model, tx, mesh, init_fn, abstract_boxed, shardings)


def init_state(config, init_fn, shardings) -> state_lib.TrainState:
  """A fresh state, materialized directly with its shardings (never whole on one device),
  traced with their mesh in context as the train step is (`Trainer.train_chunk`)."""
  init = jax.jit(lambda r: nn.meta.unbox(init_fn(r)), out_shardings=shardings)
  with jax.set_mesh(jax.tree.leaves(shardings)[0].mesh):
    return init(jax.random.fold_in(jax.random.key(config.seed), 0))


