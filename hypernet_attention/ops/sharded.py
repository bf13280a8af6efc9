"""Tiled attention under a device mesh: one kernel call per device via `jax.shard_map`.

XLA's SPMD partitioner cannot split a Pallas call (an opaque custom call) or see through
blockwise's custom-VJP loops well: under a batch-sharded model it would gather the batch
onto every device, or refuse. Attention is independent across batch elements, so we run the
kernel on each device's own batch shard inside `jax.shard_map` over the mesh in context
(`jax.set_mesh`), as maxtext wraps its flash kernels. Heads are not split: HYLA's RMSHead
and MLP value network mix all heads of a (q, k) pair, and the training mesh has no head axis
(`train/sharding.py`: heads are replicated). The dropout mask depends only on (seed, q, k),
so every shard draws the same mask, as the unsharded call does.

Shape letters: B batch, Q / K positions, H heads, D / V widths."""

from __future__ import annotations

import math
from typing import Callable, Optional

import jax
from jax.sharding import PartitionSpec as P

from hypernet_attention.ops import tiling

# The mesh axes a batch is split over; the same names as `train/sharding.BATCH_AXES`.
BATCH_AXES = ("data", "fsdp")


def batch_axes(batch: int) -> tuple[str, ...]:
  """The context mesh's batch axes (size > 1) if they divide `batch`; () otherwise."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return ()
  axes = tuple(a for a in BATCH_AXES if a in mesh.axis_names and mesh.shape[a] > 1)
  shards = math.prod(mesh.shape[a] for a in axes)
  return axes if axes and batch % shards == 0 else ()


def per_device(fn: Callable, query_BQHD, key_BKHD, value_BKHV, bias: Optional[jax.Array],
               mask: Optional[jax.Array], dropout_seed: Optional[jax.Array]):
  """fn(query, key, value, bias, mask, dropout_seed) on each device's batch shard.

  Without a mesh in context (or one whose batch axes do not divide B) calls `fn` as is.
  bias / mask (broadcastable to (B, H, Q, K)) are split where they have a batch axis and
  replicated where it broadcasts."""
  batch = query_BQHD.shape[0]
  axes = batch_axes(batch)
  if not axes:
    return fn(query_BQHD, key_BKHD, value_BKHV, bias, mask, dropout_seed)
  bias4, mask4 = tiling.as_rank4(bias), tiling.as_rank4(mask)
  pair_spec = lambda x4: None if x4 is None else (
      P(axes) if x4.shape[0] == batch and batch > 1 else P())
  in_specs = (P(axes), P(axes), P(axes), pair_spec(bias4), pair_spec(mask4),
              None if dropout_seed is None else P())
  return jax.shard_map(fn, mesh=jax.sharding.get_abstract_mesh(), in_specs=in_specs,
                       out_specs=P(axes), check_vma=False)(
                           query_BQHD, key_BKHD, value_BKHV, bias4, mask4, dropout_seed)
