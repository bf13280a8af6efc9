"""The mesh, the logical-axis shardings and batch splitting, without the loop.

On this process's one CPU device: mesh sizes (-1 takes the rest), their refusals, and the
specs the logical rules give (`embed` over fsdp, the rest replicated; batches over data x
fsdp). With 4 fake CPU devices (set before jax starts, so in a subprocess): parameters and
batches are really split, a width that does not divide fsdp is refused naming the
parameter, and a mesh that leaves devices unused is refused.
"""

import os

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
import ml_collections
import pytest

from hypernet_attention.train import sharding

import train_testlib as tl


class _Tiny(nn.Module):
  """Two parameters with logical names, as `transformer.py` annotates its own."""
  width: int

  @nn.compact
  def __call__(self, x):
    self.param("kernel", nn.with_logical_partitioning(nn.initializers.ones, ("embed", "mlp")),
               (self.width, 3))
    self.param("scale", nn.with_logical_partitioning(nn.initializers.ones, ("norm",)),
               (self.width,))
    return x


def _abstract(width):
  return jax.eval_shape(_Tiny(width).init, jax.random.key(0), jnp.zeros(1))


def _mesh(**sizes):
  return sharding.make_mesh(ml_collections.ConfigDict(sizes))


def test_mesh_sizes_on_one_device():
  mesh = _mesh(data=-1, fsdp=1)
  assert dict(mesh.shape) == {"member": 1, "data": 1, "fsdp": 1}
  assert mesh.axis_names == sharding.MESH_AXES
  for sizes, message in [(dict(data=-1, fsdp=-1), "at most one -1"),
                         (dict(data=0, fsdp=1), "use positive sizes"),
                         (dict(data=-2, fsdp=1), "use positive sizes"),
                         (dict(data=2, fsdp=1), "does not divide the 1 devices")]:
    with pytest.raises(ValueError, match=message):
      _mesh(**sizes)


def test_specs_from_the_logical_rules():
  mesh = _mesh(data=1, fsdp=1)
  specs = sharding.state_shardings(_abstract(8), mesh)["params"]
  assert specs["kernel"].spec == P("fsdp", None) and specs["scale"].spec == P(None)
  assert sharding.batch_sharding(mesh, 3).spec == P(("data", "fsdp"), None, None)
  assert sharding.replicated(mesh).spec == P()
  sharding.check_batch_size(5, mesh)  # One device takes any batch.


_FOUR_DEVICES = r"""
import json, sys
import flax.linen as nn, jax, jax.numpy as jnp, ml_collections, numpy as np
sys.path[:0] = sys.argv[1:3]  # This file and the shared helpers it imports.
import test_sharding as t
from hypernet_attention.train import data, sharding
mesh = t._mesh(data=2, fsdp=-1)
out = {"mesh": dict(mesh.shape)}
shardings = sharding.state_shardings(t._abstract(8), mesh)
state = jax.jit(lambda r: nn.meta.unbox(t._Tiny(8).init(r, jnp.zeros(1))),
                out_shardings=shardings)(jax.random.key(0))
out["kernel_shards"] = sorted({s.data.shape for s in state["params"]["kernel"].addressable_shards})
rows = {"x": np.arange(16, dtype=np.int32).reshape(8, 2)}
batch = data.to_global(rows, mesh, 8)["x"]
out["batch_shards"] = sorted({s.data.shape for s in batch.addressable_shards})
out["batch_equal"] = bool((np.asarray(batch) == rows["x"]).all())
errors = {}
fsdp4 = t._mesh(data=1, fsdp=4)
for name, call in [("width", lambda: sharding.state_shardings(t._abstract(6), fsdp4)),
                   ("batch", lambda: sharding.check_batch_size(6, mesh)),
                   ("unused", lambda: t._mesh(data=1, fsdp=2))]:
  try:
    call()
  except ValueError as e:
    errors[name] = str(e)
out["errors"] = errors
print(json.dumps(out))
"""


def test_four_fake_devices_split_parameters_and_batches():
  here = os.path.dirname(os.path.abspath(__file__))
  out = tl.run_on_cpu_devices(_FOUR_DEVICES, 4, here, tl.TESTS)
  assert out["mesh"] == {"member": 1, "data": 2, "fsdp": 2}
  assert out["kernel_shards"] == [[4, 3]]  # embed 8 split over fsdp 2; mlp 3 whole.
  assert out["batch_shards"] == [[2, 2]] and out["batch_equal"]  # 8 rows over 4 devices.
  assert out["errors"]["width"].startswith("parameter ['params']['kernel'] of shape (6, 3) "
                                           "cannot be split 4 ways over mesh axes fsdp")
  assert "batch_size=6 is not divisible by the 4 devices" in out["errors"]["batch"]
  assert "needs 2 devices, have 4" in out["errors"]["unused"]
