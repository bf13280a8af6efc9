"""Mesh, logical-axis shardings and global batches.

One mesh with axes (`member`, `data`, `fsdp`); `member` is a population's member axis
(size 1 for a single run). Batches are split over both (every device holds a
slice of the batch); with `fsdp` > 1 the model width (`embed`) of parameters and optimizer
moments is split over `fsdp` as well (ZeRO-3 style; XLA inserts the all-gathers). The
logical names are the ones `transformer.py` annotates its parameters with.

The synthetic tasks need no host input pipeline: each step's batch is generated inside
the jitted step and constrained to `batch_sharding`, so with JAX's partitionable threefry
every device draws only its own slice, on any number of hosts, and the batch is still a
pure function of (seed, step) independent of the device count."""

from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import ml_collections
import numpy as np

# `member`: a population's members (`population.py`), spread over devices with no
# communication between them; size 1 for a single run.
MESH_AXES = ("member", "data", "fsdp")
BATCH_AXES = ("data", "fsdp")
# Logical parameter axis -> mesh axis. Everything not listed is replicated.
LOGICAL_AXIS_RULES = (
    ("batch", BATCH_AXES),
    ("embed", "fsdp"),
    ("heads", None), ("kv", None), ("mlp", None), ("vocab", None), ("input", None),
    ("output", None), ("relpos_buckets", None), ("experts", None), ("norm", None))


def make_mesh(mesh_config: ml_collections.ConfigDict,
              devices: Sequence[jax.Device] | None = None) -> jax.sharding.Mesh:
  """`mesh_config.member` / `.data` / `.fsdp` sizes; -1 (at most one) takes the remaining
  devices."""
  devices = list(devices if devices is not None else jax.devices())
  sizes = [int(mesh_config.get("member", 1)), int(mesh_config.data), int(mesh_config.fsdp)]
  if sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
    raise ValueError(f"mesh sizes {dict(zip(MESH_AXES, sizes))} invalid: use positive "
                     "sizes and at most one -1")
  known = int(np.prod([s for s in sizes if s != -1]))
  if len(devices) % known:
    raise ValueError(f"mesh {dict(zip(MESH_AXES, sizes))} does not divide the "
                     f"{len(devices)} devices")
  sizes = [len(devices) // known if s == -1 else s for s in sizes]
  if int(np.prod(sizes)) != len(devices):
    raise ValueError(f"mesh {dict(zip(MESH_AXES, sizes))} needs {int(np.prod(sizes))} "
                     f"devices, have {len(devices)}")
  return jax.make_mesh(tuple(sizes), MESH_AXES, devices=devices,
                       # Auto: XLA propagates shardings from the annotated inputs and outputs.
                       axis_types=(jax.sharding.AxisType.Auto,) * len(MESH_AXES))


def check_batch_size(batch_size: int, mesh: jax.sharding.Mesh, what: str = "batch_size"):
  shards = int(np.prod([mesh.shape[a] for a in BATCH_AXES]))
  if batch_size % shards:
    raise ValueError(f"{what}={batch_size} is not divisible by the {shards} devices the "
                     f"batch is split over (mesh {dict(mesh.shape)}); use a multiple of {shards}")


def batch_sharding(mesh: jax.sharding.Mesh, ndim: int = 1) -> NamedSharding:
  """Leading (batch) axis split over all devices, the rest replicated."""
  return NamedSharding(mesh, P(BATCH_AXES, *([None] * (ndim - 1))))


def replicated(mesh: jax.sharding.Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def state_shardings(abstract_boxed_state: Any, mesh: jax.sharding.Mesh,
                    rules=LOGICAL_AXIS_RULES) -> Any:
  """Boxed abstract state (from `jax.eval_shape`) -> NamedSharding per unboxed leaf.

  Raises when a sharded dimension does not divide its mesh axis, naming the parameter."""
  specs = nn.get_partition_spec(abstract_boxed_state)
  shardings = nn.logical_to_mesh_sharding(specs, mesh, rules)
  unboxed = nn.meta.unbox(abstract_boxed_state)
  for (path, leaf), sharding in zip(jax.tree_util.tree_leaves_with_path(unboxed),
                                    jax.tree.leaves(shardings)):
    for dim, axes in zip(leaf.shape, sharding.spec):
      size = int(np.prod([mesh.shape[a] for a in ((axes,) if isinstance(axes, str) else
                                                   (axes or ()))]))
      if dim % size:
        raise ValueError(f"parameter {jax.tree_util.keystr(path)} of shape {leaf.shape} "
                         f"cannot be split {size} ways over mesh axes {axes}; choose a "
                         f"mesh whose fsdp size divides the model width")
  return shardings
