"""Dropout on the latent code from a counter-based hash: keep(seed, q, k), any tile, any time.

The paper's dropout (`attention.py` says whose and where) needs one (Q, K) keep-mask per step,
shared by batch and heads. Here the mask of pair (q, k) is a pure function of (seed, q, k): a
tiled kernel recomputes exactly the mask of the tile it is working on, in the forward and again
in the backward pass, and nothing quadratic is stored. The reference draws the same mask from
the same function, so every implementation drops the same pairs.

Hash: two rounds of `lowbias32` (a 32-bit integer bijection with low bias, from Chris
Wellons' hash-prospector), h = mix(mix(seed ^ q) + k); the pair is kept when the top 24 bits
of h are >= rate * 2^24. Integer arithmetic is int32 with wrap-around and logical shifts
(the same bits as uint32), which XLA does natively."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

_BITS = 24
_M1 = int(np.uint32(0x7FEB352D).view(np.int32))
_M2 = int(np.uint32(0x846CA68B).view(np.int32))


def _mix32(x):
  for shift, multiplier in ((16, _M1), (15, _M2)):
    x = (x ^ jax.lax.shift_right_logical(x, jnp.int32(shift))) * jnp.int32(multiplier)
  return x ^ jax.lax.shift_right_logical(x, jnp.int32(16))


def check_rate(rate: float, name: str = "dropout_rate") -> None:
  """One rule for every dropout rate (ops, both attention modules, the training config's
  `model.attention_dropout`): a number in [0, 1). A negative rate would silently mean no
  dropout, 1 drops everything, NaN nothing predictable."""
  try:
    ok = not isinstance(rate, bool) and 0.0 <= rate < 1.0
  except TypeError:  # None, a string, an array of several values.
    ok = False
  if not ok:
    raise ValueError(f"{name}={rate!r}; allowed: a number in [0, 1)")


def seed_from_rng(rng: jax.Array) -> jax.Array:
  """An int32 scalar seed drawn from a JAX PRNG key (one per step and dropout site)."""
  return jax.lax.bitcast_convert_type(jax.random.bits(rng, (), jnp.uint32), jnp.int32)


def grid_keep_scale(seed, q_len: int, k_len: int, rate: float, q_start=0, k_start=0):
  """float32 keep(seed, q, k) / (1 - rate) of a (q_len, k_len) grid of pairs, its first
  (q_start, k_start): the whole mask, or any tile of it."""
  q_pos = q_start + jax.lax.broadcasted_iota(jnp.int32, (q_len, k_len), 0)
  k_pos = k_start + jax.lax.broadcasted_iota(jnp.int32, (q_len, k_len), 1)
  h = _mix32(_mix32(jnp.asarray(seed, jnp.int32) ^ q_pos.astype(jnp.int32))
             + k_pos.astype(jnp.int32))
  keep = (jax.lax.shift_right_logical(h, jnp.int32(32 - _BITS))
          >= jnp.int32(round(rate * (1 << _BITS))))
  return jnp.where(keep, jnp.float32(1.0 / (1.0 - rate)), jnp.float32(0.0))
