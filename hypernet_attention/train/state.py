"""Train state and optimizer: AdamW, linear warmup from 0, cosine decay to 0.1x peak.

As the paper (its appendix): no weight decay on 1-D parameters (biases, norm scales);
optional global-norm gradient clipping. The state is a plain pytree (step, params,
opt_state) so Orbax saves and restores it without custom handlers.
"""

from __future__ import annotations

from typing import Any, Callable

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


def learning_rate_schedule(config: ml_collections.ConfigDict) -> optax.Schedule:
  """0 -> peak over `warmup_steps`, then cosine to `end_lr_fraction` x peak at the end."""
  opt = config.optimizer
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0,
      peak_value=opt.learning_rate,
      warmup_steps=opt.warmup_steps,
      decay_steps=max(config.num_train_steps, opt.warmup_steps + 1),
      end_value=opt.learning_rate * opt.end_lr_fraction,
  )


def weight_decay_mask(params: Any) -> Any:
  """True where weight decay applies: parameters with more than one dimension."""
  return jax.tree.map(lambda p: jnp.ndim(p) > 1, params)


def make_optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
  opt = config.optimizer
  adamw = optax.adamw(
      learning_rate_schedule(config), b1=opt.b1, b2=opt.b2, eps=opt.eps,
      weight_decay=opt.weight_decay, mask=weight_decay_mask)
  if opt.grad_clip_norm:
    return optax.chain(optax.clip_by_global_norm(opt.grad_clip_norm), adamw)
  return adamw


def make_init_fn(model: nn.Module, example_inputs: jax.Array,
                 tx: optax.GradientTransformation) -> Callable[[jax.Array], TrainState]:
  """Returns `rng -> TrainState` with *boxed* (logically partitioned) leaves.

  Call it under `jax.eval_shape` to read shapes and logical axes for free, then jit it
  with `out_shardings` (see `sharding.state_shardings`) to materialize it sharded.
  """
  def init(rng):
    params = model.init({"params": rng}, example_inputs, deterministic=True)["params"]
    # optax maps over the boxed tree, so moments carry the same logical axes as params.
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))
  return init


def count_params(params: Any) -> int:
  return int(sum(x.size for x in jax.tree.leaves(nn.meta.unbox(params))))
