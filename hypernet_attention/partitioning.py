"""Logical-axis annotations that also survive `flax.nnx.bridge.ToNNX` outside a mesh.

Linen's `nn.with_logical_partitioning` boxes each parameter with its logical axis names
('embed', 'heads', ...), which the training stack maps to a mesh. Under NNX, which shards
variables eagerly, the bridge turns those names into an `out_sharding` that needs a mesh:
without one, `ToNNX(...).lazy_init(x)` fails with "An auto mesh context or metadata is
required". Our box keeps the names either way and asks for eager sharding only where a mesh
is there to shard on (a `jax.set_mesh` / `jax.sharding.use_mesh` context, or the box's own).
Under a mesh, Linen's `DenseGeneral` draws a multi-axis kernel flat and unboxes that 2-D
value to reshape it, which Flax's box constrains with the 3 names and fails ("only valid
for values of rank at least 3"); ours constrains only values of the names' rank."""

from __future__ import annotations

import functools
from typing import Any, Callable

from flax.core import meta
import flax.linen as nn
import jax.numpy as jnp


class LogicallyPartitioned(nn.LogicallyPartitioned):
  """`nn.LogicallyPartitioned` whose NNX form shards eagerly only under a mesh."""

  def unbox(self, apply_constraint: bool = True) -> Any:
    apply_constraint = apply_constraint and jnp.ndim(self.value) == len(self.names)
    return super().unbox(apply_constraint)

  def to_nnx_metadata(self) -> dict[str, Any]:
    metadata = super().to_nnx_metadata()
    if self.mesh is None and meta.get_global_mesh() is None:
      metadata["eager_sharding"] = False
    return metadata


def with_logical_partitioning(
    fn: Callable[..., Any], names: meta.LogicalNames
) -> Callable[..., LogicallyPartitioned]:
  """`nn.with_logical_partitioning(fn, names)`, boxed as our `LogicallyPartitioned`."""

  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    return LogicallyPartitioned(fn(*args, **kwargs), names)

  return wrapper
