"""The tiled kernels under a 4-device mesh (fake CPU devices, in a subprocess) equal 1 device.

`ops/sharded.py` runs the tiled kernels (blockwise here) inside `jax.shard_map` over
the training mesh's batch axes; values and gradients (bias included, whose gradient sums
over the shards) must match the single-device call, with dropout on. The training loop
sets the mesh in context, so a data x fsdp-sharded training run takes that path too.
"""


import jax.numpy as jnp

from hypernet_attention.ops import sharded
from hypernet_attention.train import sharding

import numerics
import train_testlib as tl

SCRIPT = r"""
import json, sys
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from hypernet_attention.ops import dispatch

impl = sys.argv[1]
mesh = jax.make_mesh((2, 2), ("data", "fsdp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
rng = np.random.default_rng(0)
B, T, H, D = 4, 21, 2, 8
q, k, v, cot = (jnp.asarray(rng.standard_normal((B, T, H, D)), jnp.float32) for _ in range(4))
bias = jnp.asarray(rng.standard_normal((1, H, T, T)), jnp.float32)
mask = jnp.asarray(rng.random((B, 1, 1, T)) < 0.8)

def loss(q, k, v, bias):
  out = dispatch.attention(q, k, v, bias=bias, mask=mask, is_causal=True,
                           implementation=impl, dropout_rate=0.1, dropout_seed=jnp.int32(7))
  return jnp.sum(out * cot), out

step = jax.jit(jax.value_and_grad(loss, (0, 1, 2, 3), has_aux=True))
(_, out1), grads1 = step(q, k, v, bias)
with jax.set_mesh(mesh):
  batch = NamedSharding(mesh, P(("data", "fsdp")))
  args = [jax.device_put(x, batch) for x in (q, k, v)] + [bias]
  (_, out4), grads4 = step(*args)
  hlo = step.lower(*args).compile().as_text()
rel = lambda a, b: float(np.linalg.norm(np.asarray(a) - np.asarray(b)) / np.linalg.norm(b))
print(json.dumps(dict(
    devices=jax.device_count(),
    errors=[rel(a, b) for a, b in zip((out4, *grads4), (out1, *grads1))],
    out_spec=str(out4.sharding.spec),
    all_gathers=hlo.count("all-gather("))))
"""


# Training: the SRAVEN smoke model (HYLA, dropout on) forced onto blockwise, 1 device and a
# 2 x 2 (data x fsdp) mesh; records which batch axes `sharded` split the kernels over.
TRAIN_SCRIPT = r"""
import json
import jax
from experiments.configs import sraven
from hypernet_attention.ops import sharded
from hypernet_attention.runs import config_checks
from hypernet_attention.train import build, trainer as trainer_lib

seen = []
batch_axes = sharded.batch_axes
sharded.batch_axes = lambda batch: seen.append(batch_axes(batch)) or seen[-1]

def losses(mesh, devices, steps=2):
  config = sraven.get_config("model=hyla,size=smoke")
  with config.unlocked():
    config.model.implementation = "blockwise"
    config.mesh.update(mesh)
  s = build.setup(config_checks.validate(config), devices)
  trainer = trainer_lib.Trainer(config, s)
  state = build.init_state(config, s.init_fn, s.shardings)
  seen.clear()  # Only the calls traced by the training step.
  state, metrics = trainer.train_chunk(state, steps)
  example = jax.eval_shape(lambda b: s.objective.encode(b)[0],
                           s.objective.source.example(config.batch_size))
  return (list(seen), [float(x) for x in jax.device_get(metrics.per_step["loss"])],
          config.batch_size * example.shape[1])

axes_one, one, tokens = losses(dict(data=1, fsdp=1), jax.devices()[:1])
axes_four, four, _ = losses(dict(data=2, fsdp=2), jax.devices())
print(json.dumps(dict(one=one, four=four, tokens=tokens, axes_one=axes_one,
                      axes_four=axes_four)))
"""


def test_four_devices_match_one():
  result = tl.run_on_cpu_devices(SCRIPT, 4, "blockwise")
  assert result["devices"] == 4
  # Each device runs the same per-example arithmetic; only dbias sums shards in another order.
  assert max(result["errors"]) < 1e-5, result
  assert "data" in result["out_spec"] and "fsdp" in result["out_spec"], result
  assert result["all_gathers"] == 0, result


def test_batch_axes_match_training_mesh():
  assert sharded.BATCH_AXES == sharding.BATCH_AXES


def test_sharded_training_runs_kernels_per_device_and_matches_one_device():
  result = tl.run_on_cpu_devices(TRAIN_SCRIPT, 4)
  # Traced under the loop's mesh: every attention call split over both batch axes.
  assert result["axes_four"] and all(a == ["data", "fsdp"] for a in result["axes_four"]), result
  assert result["axes_one"] and all(a == [] for a in result["axes_one"]), result
  # Per-example arithmetic is the same; the batch sums of loss and gradients (over
  # batch x tokens terms) run in another order: numerics' worst-case reordering bound.
  bound = numerics.error_bound(0.0, result["tokens"], jnp.float32)
  assert numerics.rel_err(result["four"], result["one"]) < bound, result
