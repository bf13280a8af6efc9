"""Blockwise's tile plumbing: tile sizes, padding, the static schedule, rank-4 bias / mask.

Blockwise tiles the (Q, K) plane; this module decides the tile sizes, pads the sequences so
they divide, and brings `bias` / `mask` (broadcastable to (B, H, Q, K)) to a rank-4 form whose
size-1 dimensions stay size 1, so that a tile of them is a cheap slice that still broadcasts.

Shape letters: B batch, H heads, Q / K query / key positions (padded: Qp, Kp), D per-head
query/key width, V per-head value width.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from hypernet_attention.ops import dropout
from hypernet_attention.ops import reference


@dataclasses.dataclass(frozen=True)
class TileConfig:
  """Static description of one tiled attention call (hashable: a custom_vjp nondiff arg)."""
  normalization: str
  value_network: str
  activation: str
  eps: float
  is_causal: bool
  scale: float
  q_len: int
  k_len: int
  block_q: int
  block_k: int
  # Accumulation dtype: float32, or float64 for float64 inputs (x64 tests).
  compute_dtype: jnp.dtype = jnp.dtype("float32")
  # The per-pair tensors' dtype (blockwise's code operands and hidden u, z, dz, du): the
  # inputs' dtype when narrower than float32 (bf16 in, bf16 per-pair tensors, float32
  # accumulation), else `compute_dtype`.
  pair_dtype: jnp.dtype = jnp.dtype("float32")
  # Dropout on the latent code (`dropout.py`); the seed travels as an array argument.
  dropout_rate: float = 0.0

  @property
  def num_q_blocks(self) -> int:
    return -(-self.q_len // self.block_q)

  @property
  def num_k_blocks(self) -> int:
    return -(-self.k_len // self.block_k)

  @property
  def q_padded(self) -> int:
    return self.num_q_blocks * self.block_q

  @property
  def k_padded(self) -> int:
    return self.num_k_blocks * self.block_k


def balanced_block(length: int, block: int) -> int:
  """Largest useful tile <= `block` that splits `length` into equal-ish tiles.

  Splitting 130 into tiles of 128 would pad to 256; two tiles of 65 pad nothing.
  """
  if block < 1:
    raise ValueError(f"block size must be >= 1, got {block}.")
  length = max(length, 1)
  num = -(-length // block)
  return -(-length // num)


def make_config(
    q_len, k_len, depth, *, computes: reference.Computes, normalization, value_network,
    activation, eps, is_causal, block_q, block_k, dtype=jnp.float32, dropout_rate=0.0,
) -> TileConfig:
  """Validates the choices against what the kernel `computes`; tiles balanced (`balanced_block`)."""
  computes.check(normalization, value_network)
  reference.get_activation(activation)
  dropout.check_rate(dropout_rate)
  compute_dtype = jnp.dtype(jnp.promote_types(dtype, jnp.float32))
  narrow = jnp.dtype(dtype).itemsize < compute_dtype.itemsize
  return TileConfig(
      normalization=normalization, value_network=value_network, activation=activation,
      eps=float(eps), is_causal=bool(is_causal), scale=1.0 / math.sqrt(depth),
      q_len=q_len, k_len=k_len,
      block_q=balanced_block(q_len, block_q), block_k=balanced_block(k_len, block_k),
      compute_dtype=compute_dtype, pair_dtype=jnp.dtype(dtype) if narrow else compute_dtype,
      dropout_rate=float(dropout_rate))


def as_rank4(x: Optional[jax.Array], dtype=None):
  """Left-pads a bias's or mask's rank to 4 (as `dtype` if given); `reference.check_operands`
  has found it broadcasting to (B, H, Q, K)."""
  if x is None:
    return None
  x4 = x.reshape((1,) * (4 - x.ndim) + x.shape)
  return x4 if dtype is None else x4.astype(dtype)


def pad_axis(x: jax.Array, axis: int, size: int, value=0) -> jax.Array:
  """Pads `x` along `axis` to `size`, unless that axis is a broadcast (size-1) axis."""
  if x.shape[axis] == 1 or x.shape[axis] == size:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, size - x.shape[axis])
  return jnp.pad(x, widths, constant_values=value)


def pad_pair_operand(x4: Optional[jax.Array], cfg: TileConfig, value) -> Optional[jax.Array]:
  if x4 is None:
    return None
  return pad_axis(pad_axis(x4, 2, cfg.q_padded, value), 3, cfg.k_padded, value)


def pair_tile(x4: Optional[jax.Array], q_start, k_start, cfg: TileConfig) -> Optional[jax.Array]:
  """The (.., bq, bk) tile of a rank-4 bias/mask; broadcast axes stay size 1."""
  if x4 is None:
    return None
  sizes = (*x4.shape[:2], 1 if x4.shape[2] == 1 else cfg.block_q,
           1 if x4.shape[3] == 1 else cfg.block_k)
  starts = (0, 0, 0 if x4.shape[2] == 1 else q_start, 0 if x4.shape[3] == 1 else k_start)
  return jax.lax.dynamic_slice(x4, starts, sizes)


def tile_schedule(cfg: TileConfig, key_major: bool = False
                  ) -> tuple[int, np.ndarray, np.ndarray]:
  """The static schedule, compactly: (count, ends, offsets). Tile pair p (0 <= p < count)
  of the query-major (or key-major) order lies in major tile i, the first with p < ends[i],
  and its minor tile is p + offsets[i]. Every visible (query tile, key tile) pair appears
  once; causal attention skips the tiles above the diagonal.

  Known at trace time, so a scan over range(count) has a static trip count: XLA:GPU runs a
  while loop of unknown trip count by copying its predicate to the host and waiting, on
  every iteration. Two arrays of one entry per major tile are kept, not the pairs (at
  T=10^6 those would be ~10^8); `schedule_tile` finds a pair's tiles on device.
  """
  if key_major:  # Causal: key tile j's first query tile holds its first key (or none does).
    firsts = np.minimum(np.arange(cfg.num_k_blocks, dtype=np.int64) * cfg.block_k // cfg.block_q,
                        cfg.num_q_blocks)
    firsts = firsts if cfg.is_causal else np.zeros_like(firsts)
    counts = cfg.num_q_blocks - firsts
  else:
    firsts = np.zeros(cfg.num_q_blocks, np.int64)
    counts = np.array([visible_k_blocks(i, cfg.block_q, cfg.block_k, cfg.num_k_blocks,
                                        cfg.is_causal) for i in range(cfg.num_q_blocks)], np.int64)
  ends = np.cumsum(counts)
  return int(ends[-1]), ends, firsts - (ends - counts)  # minor = first + (p - start)


def schedule_tile(p: jax.Array, ends: np.ndarray, offsets: np.ndarray
                  ) -> tuple[jax.Array, jax.Array]:
  """(major, minor) tile indices of pair `p` (traced) of a `tile_schedule`: one vector
  compare over the major tiles, no loop."""
  major = jnp.searchsorted(jnp.asarray(ends), p, side="right",
                           method="compare_all").astype(p.dtype)  # int32 even under x64
  return major, p + jnp.asarray(offsets)[major]


def visible_k_blocks(q_block: int, block_q: int, block_k: int, num_k_blocks: int,
                     is_causal: bool) -> int:
  """Number of key tiles that query tile `q_block` can see (all of them when not causal)."""
  if not is_causal:
    return num_k_blocks
  return min(((q_block + 1) * block_q - 1) // block_k + 1, num_k_blocks)
