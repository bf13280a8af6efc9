"""Position information for attention: T5 relative-position bias and rotary embeddings.

Shape letters:
  B batch, Q query positions, K key positions, T positions, H heads, D per-head width,
  N buckets of relative distance.

The T5 bias is what the paper's synthetic-task models use (the paper's appendix): one learned (heads
x buckets) table per layer, added to the scores before the normalization. The authors set
num_buckets = max_distance = sequence length and `bidirectional=False` even though those tasks
attend non-causally, so every key *after* the query falls into bucket 0 together with the query
itself. We keep that default for fidelity; it is configurable. RoPE (used by the C4 language model)
rotates queries and keys instead and has no parameters."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from hypernet_attention import partitioning

Dtype = Any


def relative_position_bucket(relative_position: jax.Array, *, bidirectional: bool,
                             num_buckets: int, max_distance: int) -> jax.Array:
  """T5's bucketing of relative_position = key_position - query_position.

  Half of the buckets (per direction) hold the exact distances 0..max_exact-1; the rest
  cover distances up to `max_distance` on a log scale; farther distances share the last
  bucket. With `bidirectional=False` only keys at or before the query are distinguished:
  keys after it (positive relative positions) all land in bucket 0."""
  distance = -jnp.asarray(relative_position, jnp.int32)
  bucket = jnp.zeros_like(distance)
  if bidirectional:
    num_buckets //= 2
    bucket = bucket + (distance < 0).astype(jnp.int32) * num_buckets
    distance = jnp.abs(distance)
  else:
    distance = jnp.maximum(distance, 0)
  max_exact = num_buckets // 2
  # Float32 and the tiny epsilon as in T5, so that bucket boundaries match it exactly.
  log_ratio = (jnp.log(distance.astype(jnp.float32) / max_exact + np.finfo(np.float32).eps)
               / np.log(max_distance / max_exact))
  if_large = max_exact + (log_ratio * (num_buckets - max_exact)).astype(jnp.int32)
  if_large = jnp.minimum(if_large, num_buckets - 1)
  return bucket + jnp.where(distance < max_exact, distance, if_large)


def check_buckets(num_buckets: int, max_distance: int, bidirectional: bool) -> None:
  smallest = 4 if bidirectional else 2
  if num_buckets < smallest:
    raise ValueError(f"num_buckets={num_buckets} is too small; allowed: >= {smallest} "
                     f"(bidirectional={bidirectional}).")
  if max_distance < 1:
    raise ValueError(f"max_distance={max_distance}; allowed: >= 1.")


class RelativePositionBias(nn.Module):
  """T5 relative-position bias, (1, H, Q, K), from a learned (H, N) table `rel_embedding`."""

  num_heads: int
  num_buckets: int
  max_distance: int
  bidirectional: bool = False
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32
  embedding_init: Any = nn.linear.default_embed_init

  @nn.compact
  def __call__(self, query_positions_Q: jax.Array, key_positions_K: jax.Array) -> jax.Array:
    check_buckets(self.num_buckets, self.max_distance, self.bidirectional)
    table_HN = self.param(
        "rel_embedding",
        partitioning.with_logical_partitioning(self.embedding_init, ("heads", "relpos_buckets")),
        (self.num_heads, self.num_buckets), self.param_dtype)
    return relative_position_bias(
        table_HN, query_positions_Q, key_positions_K, bidirectional=self.bidirectional,
        max_distance=self.max_distance, dtype=self.dtype)


def relative_position_bias(table_HN: jax.Array, query_positions_Q: jax.Array,
                           key_positions_K: jax.Array, *, bidirectional: bool, max_distance: int,
                           dtype: Dtype = jnp.float32) -> jax.Array:
  """(1, H, Q, K) T5 bias read from the (H, N) table; shared by the Linen and NNX modules."""
  num_buckets = table_HN.shape[1]
  relative_QK = key_positions_K[None, :] - query_positions_Q[:, None]
  bucket_QK = relative_position_bucket(relative_QK, bidirectional=bidirectional,
                                       num_buckets=num_buckets, max_distance=max_distance)
  # A one-hot contraction instead of a gather: cheap at these sizes and shards cleanly.
  one_hot_QKN = jax.nn.one_hot(bucket_QK, num_buckets, dtype=dtype)
  bias_HQK = jnp.einsum("hn,qkn->hqk", jnp.asarray(table_HN, dtype), one_hot_QKN)
  return bias_HQK[None]


def apply_rope(x_BTHD: jax.Array, positions_T: jax.Array,
               max_wavelength: float = 10_000.0) -> jax.Array:
  """Rotary position embedding (split-half form, as in Gemma/NanoDo).

  Channel i of the first half and channel i of the second half form a 2-D pair rotated by
  the angle position / max_wavelength^(2i/D). Needs an even per-head width D."""
  depth = x_BTHD.shape[-1]
  if depth % 2:
    raise ValueError(f"RoPE needs an even per-head width; got {depth}.")
  half = depth // 2
  # At least float32: bf16 angles are far too coarse for positions in the thousands.
  dtype = jnp.promote_types(x_BTHD.dtype, jnp.float32)
  inv_freq = max_wavelength ** (-jnp.arange(half, dtype=dtype) * 2 / depth)
  angle_TD = positions_T.astype(dtype)[:, None] * inv_freq[None, :]
  sin = jnp.sin(angle_TD)[None, :, None, :]
  cos = jnp.cos(angle_TD)[None, :, None, :]
  x1, x2 = jnp.split(x_BTHD.astype(dtype), 2, axis=-1)
  rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return rotated.astype(x_BTHD.dtype)
