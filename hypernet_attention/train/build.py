"""Building a run from its config: validated, nothing materialized, no CLU or TensorFlow.

`setup(config)` turns a config into a `Setup` (objective, model, optimizer, mesh, the
abstract train state and its shardings) and raises `errors.BadInput` for anything
unusable, before any work. `init_state` materializes a fresh state with its shardings.
Training (`loop.py`), read-only restore for probing (`restore.py`) and the benchmarks all
start here, so analysis never imports the training loop or its writers."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from hypernet_attention import errors
from hypernet_attention import transformer
from hypernet_attention.runs import config_checks
from hypernet_attention.train import checkpointing
from hypernet_attention.train import data
from hypernet_attention.train import objectives
from hypernet_attention.train import sharding
from hypernet_attention.train import state as state_lib


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
    return checkpointing.abstract_with_shardings(nn.meta.unbox(self.abstract_state), self.shardings)


@contextlib.contextmanager
def as_bad_input():
  """A `ValueError` raised in the block as the `errors.BadInput` it is (one line, exit 2)."""
  try:
    yield
  except errors.BadInput:
    raise
  except ValueError as e:
    raise errors.BadInput(str(e)) from e


def setup(checked: config_checks.Checked, devices=None, members: int | None = None) -> Setup:
  """Everything that needs the devices or the task: objective, model, optimizer, mesh. No
  side effects. `checked` is `config_checks.validate(config)`, checked where it entered (a
  `config_checks.Checked`); any problem with the task or the devices is a `errors.BadInput`.
  A population (`population.setup`) builds its member 0's run with `members` = its size (None:
  a single run), which allows a `member` mesh axis and weighs the host's memory for all."""
  if not isinstance(checked, config_checks.Checked):
    raise TypeError(f"build.setup takes config_checks.validate(config), not a "
                    f"{type(checked).__name__}")
  config, experiment = checked.config, checked.experiment
  with as_bad_input():
    objective = objectives.build(config, experiment, members=members or 1)
    mesh = sharding.make_mesh(config.mesh, devices)
    if mesh.shape["member"] > 1 and members is None:
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
    model_config = transformer_config(
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


def transformer_config(model: Mapping[str, Any], **overrides: Any):
  """`config.model` (+ task-derived fields) -> `transformer.TransformerConfig`."""
  fields = {f.name for f in dataclasses.fields(transformer.TransformerConfig)}
  kwargs = dict(model)
  kwargs.update(overrides)
  unknown = sorted(set(kwargs) - fields)
  if unknown:
    raise ValueError(f"unknown model config keys {unknown}; allowed: {sorted(fields)}")
  for key in ("dtype", "param_dtype"):
    if isinstance(kwargs.get(key), str):
      kwargs[key] = jnp.dtype(kwargs[key])
  return transformer.TransformerConfig(**kwargs)


def init_state(config, init_fn, shardings) -> state_lib.TrainState:
  """A fresh state, materialized directly with its shardings (never whole on one device),
  traced with their mesh in context as the train step is (`Trainer.train_chunk`)."""
  init = jax.jit(lambda r: nn.meta.unbox(init_fn(r)), out_shardings=shardings)
  with jax.set_mesh(jax.tree.leaves(shardings)[0].mesh):
    return init(jax.random.fold_in(jax.random.key(config.seed), 0))


