"""Train state and optimizer: AdamW, linear warmup from 0, cosine decay to 0.1x peak.

`optimizer.authors_schedule=True` reproduces the authors' code exactly: they pass
`decay_steps = num_train_steps - warmup_steps` to optax, which counts the warmup inside
`decay_steps`, so their learning rate reaches its floor `warmup_steps` steps before the end
(ours is up to 2.4% higher at SRAVEN paper size). Default: off (the floor at the last step).

As the paper (its appendix): no weight decay on 1-D parameters (biases, norm scales);
optional global-norm gradient clipping. The state is a plain pytree (step, params,
opt_state) so Orbax saves and restores it without custom handlers."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import optax


@flax.struct.dataclass
class TrainState:
  """What a checkpoint holds. `step` is the number of optimizer updates applied."""
  step: jax.Array
  params: Any
  opt_state: Any


def decay_steps(config: ml_collections.ConfigDict, warmup_steps=None):
  """The `decay_steps` handed to optax's `warmup_cosine_decay_schedule`, which counts the
  warmup inside it (the cosine part lasts `decay_steps - warmup_steps`).

  Ours: the run's length, so the learning rate reaches its floor at the last step. With
  `optimizer.authors_schedule` the authors' choice, `num_train_steps - warmup_steps`: their
  cosine ends `warmup_steps` early and the floor holds for the last `warmup_steps` steps.
  `warmup_steps` may be a traced value (a population member's)."""
  opt = config.optimizer
  warmup = opt.warmup_steps if warmup_steps is None else warmup_steps
  if opt.get("authors_schedule", False):
    return config.num_train_steps - warmup
  return jnp.maximum(config.num_train_steps, warmup + 1) if isinstance(
      warmup, jax.Array) else max(config.num_train_steps, warmup + 1)


def learning_rate_schedule(config: ml_collections.ConfigDict) -> optax.Schedule:
  """0 -> peak over `warmup_steps`, then cosine to `end_lr_fraction` x peak (`decay_steps`)."""
  opt = config.optimizer
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=opt.learning_rate, warmup_steps=opt.warmup_steps,
      decay_steps=decay_steps(config), end_value=opt.learning_rate * opt.end_lr_fraction)


def traced_learning_rate_schedule(config: ml_collections.ConfigDict, learning_rate: jax.Array,
                                  warmup_steps: jax.Array) -> optax.Schedule:
  """`learning_rate_schedule` with the peak and the warmup as traced values (a population
  member's), the same operations as optax's linear warmup joined to its cosine decay."""
  warmup = jnp.asarray(warmup_steps, jnp.int32)
  cosine_steps = (decay_steps(config, warmup) - warmup).astype(jnp.float32)
  alpha = config.optimizer.end_lr_fraction

  def schedule(count):
    rising = jnp.clip(count, 0, warmup)
    linear = -learning_rate * (1 - rising / jnp.maximum(warmup, 1)) + learning_rate
    after = jnp.minimum((count - warmup).astype(jnp.float32), cosine_steps)
    cosine = 0.5 * (1 + jnp.cos(jnp.pi * after / cosine_steps))
    return jnp.where(count < warmup, linear, learning_rate * ((1 - alpha) * cosine + alpha))
  return schedule


def weight_decay_mask(params: Any) -> Any:
  """True where weight decay applies: parameters with more than one dimension."""
  return jax.tree.map(lambda p: jnp.ndim(p) > 1, params)


def make_optimizer(config: ml_collections.ConfigDict,
                   member: Optional[Mapping[str, jax.Array]] = None
                   ) -> optax.GradientTransformation:
  """AdamW from `config.optimizer`; `member` (traced `learning_rate`, `weight_decay`,
  `warmup_steps`) overrides those three for one population member. Either way the optimizer state
  has the same tree, so a member's slice of a population state is a single run's state."""
  opt = config.optimizer
  if member is None:
    schedule, weight_decay = learning_rate_schedule(config), opt.weight_decay
  else:
    schedule = traced_learning_rate_schedule(config, member["learning_rate"],
                                             member["warmup_steps"])
    weight_decay = member["weight_decay"]
  adamw = optax.adamw(schedule, b1=opt.b1, b2=opt.b2, eps=opt.eps,
                      weight_decay=weight_decay, mask=weight_decay_mask)
  if opt.grad_clip_norm:
    return optax.chain(optax.clip_by_global_norm(opt.grad_clip_norm), adamw)
  return adamw


def make_init_fn(model: nn.Module, example_inputs: jax.Array,
                 tx: optax.GradientTransformation) -> Callable[[jax.Array], TrainState]:
  """Returns `rng -> TrainState` with *boxed* (logically partitioned) leaves.

  Call it under `jax.eval_shape` to read shapes and logical axes for free, then jit it
  with `out_shardings` (see `sharding.state_shardings`) to materialize it sharded."""
  def init(rng):
    params = model.init({"params": rng}, example_inputs, deterministic=True)["params"]
    # optax maps over the boxed tree, so moments carry the same logical axes as params.
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))
  return init


def count_params(params: Any) -> int:
  return int(sum(x.size for x in jax.tree.leaves(nn.meta.unbox(params))))
