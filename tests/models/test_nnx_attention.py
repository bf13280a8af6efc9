"""The NNX attention module against the Linen one, Flax's own attention and the NNX bridge.

The Linen module is tested against the paper's formulas in tests/models/test_attention.py; here
the NNX shell must give the same numbers on the same weights, for every preset of Table A1:
outputs, gradients, decode step by step, masks and dropout with the same key (float64).
"""

import os
import sys

from flax import nnx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hypernet_attention import attention
from hypernet_attention import nnx_attention
from hypernet_attention import presets
from hypernet_attention.ops import dispatch as ops_dispatch

import train_testlib as tl

B, Q, K, E, H = 2, 5, 7, 8, 2
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# A position per preset, so that both T5 and RoPE meet every kind of value network.
POSITION = {name: ("none", "t5", "rope")[i % 3] for i, name in enumerate(presets.PRESETS)}


def pair(preset, position="none", **kw):
  """(Linen module, its params, NNX module holding the same params)."""
  kw = dict(qk_features=4, v_features=6, out_features=3, position=position, **kw)
  linen = attention.MultiHeadAttention(num_heads=H, attention=preset, **kw)
  x = jnp.zeros((B, Q, E))
  params = nn.meta.unbox(linen.init(jax.random.key(1), x)["params"])
  params = jax.tree.map(lambda p: jax.random.normal(jax.random.key(p.size), p.shape, p.dtype)
                        * 0.5, params)
  qkv = kw.pop("qk_features")
  module = nnx_attention.MultiHeadAttention(
      H, E, qkv, kw.pop("out_features"), attention=preset, rngs=nnx.Rngs(0), **kw)
  return linen, params, nnx_attention.load_params(module, params)


def data(dtype=jnp.float32):
  keys = jax.random.split(jax.random.key(7), 4)
  x = jax.random.normal(keys[0], (B, Q, E), dtype)
  kv = jax.random.normal(keys[1], (B, K, E), dtype)
  mask = jax.random.bernoulli(keys[2], 0.7, (B, 1, Q, K)).at[..., 0].set(True)
  bias = jax.random.normal(keys[3], (1, H, Q, K), dtype)
  return x, kv, mask, bias


def assert_trees_close(a, b, rtol=1e-10):
  jax.tree.map(lambda u, v: np.testing.assert_allclose(u, v, rtol=rtol, atol=rtol), a, b)


@pytest.mark.parametrize("preset", list(presets.PRESETS))
def test_same_outputs_and_gradients_as_linen(preset, x64):
  linen, params, module = pair(preset, POSITION[preset], param_dtype=jnp.float64)
  x, kv, mask, bias = data(jnp.float64)
  cotangent = jax.random.normal(jax.random.key(3), (B, Q, 3), jnp.float64)

  def linen_loss(p, x):
    return jnp.sum(cotangent * linen.apply({"params": p}, x, kv, mask=mask, bias=bias))

  def nnx_loss(m, x):
    return jnp.sum(cotangent * m(x, kv, mask=mask, bias=bias))

  expected = linen.apply({"params": params}, x, kv, mask=mask, bias=bias)
  np.testing.assert_allclose(module(x, kv, mask=mask, bias=bias), expected, rtol=1e-12)
  grads_linen = jax.grad(linen_loss, argnums=(0, 1))(params, x)
  grads_nnx = nnx.grad(nnx_loss, argnums=(0, 1))(module, x)
  assert_trees_close(nnx_attention.linen_params(grads_nnx[0]), grads_linen[0])
  assert_trees_close(grads_nnx[1], grads_linen[1])
  # Causal self-attention takes the fast path (ops.dispatch) in both.
  np.testing.assert_allclose(
      module(x, is_causal=True), linen.apply({"params": params}, x, is_causal=True),
      rtol=1e-12)


@pytest.mark.parametrize("preset", list(presets.PRESETS))
def test_decode_step_by_step_as_linen(preset, x64):
  linen, params, module = pair(preset, POSITION[preset], decode=True,
                               param_dtype=jnp.float64)
  x = data(jnp.float64)[0]
  cache = linen.init(jax.random.key(0), x)["cache"]
  module.init_cache(x.shape, jnp.float64)
  steps = []
  for t in range(Q):
    expected, updated = linen.apply({"params": params, "cache": cache}, x[:, t:t + 1],
                                    mutable=["cache"])
    cache = updated["cache"]
    steps.append(module(x[:, t:t + 1]))
    np.testing.assert_allclose(steps[-1], expected, rtol=1e-12)
  # And the steps together are causal attention over the whole sequence.
  full = pair(preset, POSITION[preset], param_dtype=jnp.float64)[2]
  nnx.update(full, nnx.state(module, nnx.Param))
  np.testing.assert_allclose(jnp.concatenate(steps, 1), full(x, is_causal=True), rtol=1e-10)


def linen_dropout_key(rng):
  """The key `make_rng('dropout')` gives a top-level Linen module's first call."""

  class Probe(nn.Module):
    def __call__(self):
      return self.make_rng("dropout")

  return Probe().apply({}, rngs={"dropout": rng})


@pytest.mark.parametrize("preset", ["softmax", "hyla", "hyla_deep"])
@pytest.mark.parametrize("broadcast", [True, False])
def test_dropout_with_the_same_key_as_linen(preset, broadcast, x64):
  linen, params, module = pair(preset, dropout_rate=0.3, broadcast_dropout=broadcast,
                               param_dtype=jnp.float64)
  x, kv, mask, _ = data(jnp.float64)
  rng = jax.random.key(5)
  expected = linen.apply({"params": params}, x, kv, mask=mask, deterministic=False,
                         rngs={"dropout": rng})
  got = module(x, kv, mask=mask, deterministic=False, rngs=linen_dropout_key(rng))
  np.testing.assert_allclose(got, expected, rtol=1e-12)
  clean = module(x, kv, mask=mask, deterministic=True)
  assert np.abs(got - clean).max() > 1e-3  # dropout did something
  # The module's own stream: a new mask per call, and no stream, no dropout without a flag.
  assert np.abs(module(x, deterministic=False) - module(x, deterministic=False)).max() > 1e-3
  with pytest.raises(ValueError, match="deterministic"):
    module(x)
  assert not nnx.state(module, nnx.Intermediate)  # Dropout sows nothing unasked.


def test_sown_latent_code_as_linen(x64):
  linen, params, module = pair("hyla", param_dtype=jnp.float64)
  x, kv, mask, _ = data(jnp.float64)
  _, inter = linen.apply({"params": params}, x, kv, mask=mask, mutable=["intermediates"])
  out, sown = nnx.capture(module, nnx.Intermediate)(x, kv, mask=mask, sow_weights=True)
  (code,) = sown["latent_code"].get_value()
  assert code.shape == (B, H, Q, K)
  np.testing.assert_allclose(code, inter["intermediates"]["latent_code"][0], rtol=1e-12)
  np.testing.assert_allclose(out, module(x, kv, mask=mask), rtol=1e-12)  # fast path agrees
  assert not nnx.state(module, nnx.Intermediate)  # nothing sown without sow_weights


def test_softmax_preset_equals_flax_attention():
  x, kv, mask, _ = data()
  theirs = nnx.MultiHeadAttention(H, E, 4, 3, rngs=nnx.Rngs(2), decode=False)
  ours = nnx_attention.load_params(
      nnx_attention.MultiHeadAttention(H, E, 4, 3, rngs=nnx.Rngs(0)), theirs)
  np.testing.assert_allclose(ours(x, kv, mask=mask), theirs(x, kv, mask=mask),
                             rtol=1e-5, atol=1e-6)
  # Linen: flax's own module's params drive our NNX module, and ours drive flax's Linen.
  flax_linen = nn.MultiHeadDotProductAttention(num_heads=H, qkv_features=4, out_features=3)
  variables = {"params": nnx_attention.linen_params(ours)}
  np.testing.assert_allclose(flax_linen.apply(variables, x, kv, mask=mask),
                             ours(x, kv, mask=mask), rtol=1e-5, atol=1e-6)


def test_standard_weights_switch_to_hyla_in_one_call():
  theirs = nnx.MultiHeadAttention(H, E, 4, rngs=nnx.Rngs(2), decode=False)
  hyla = nnx_attention.load_params(
      nnx_attention.MultiHeadAttention(H, E, 4, attention="hyla", rngs=nnx.Rngs(0)), theirs)
  assert_trees_close(nnx_attention.linen_params(hyla), nnx_attention.linen_params(theirs), 0)
  x = data()[0]
  assert np.abs(hyla(x) - theirs(x)).max() > 1e-3  # a different attention on the same weights
  deep = nnx_attention.MultiHeadAttention(H, E, 4, attention="hyla_deep", rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"missing \['value_hidden'\]"):
    nnx_attention.load_params(deep, theirs)
  hidden = np.asarray(deep.value_hidden[...])
  nnx_attention.load_params(deep, theirs, strict=False)
  np.testing.assert_array_equal(deep.value_hidden[...], hidden)


def test_bad_params_named_before_any_change():
  module = nnx_attention.MultiHeadAttention(H, E, 4, rngs=nnx.Rngs(0))
  before = nnx_attention.linen_params(module)
  wrong = nnx_attention.MultiHeadAttention(H, E, 6, rngs=nnx.Rngs(1))
  with pytest.raises(ValueError, match=r"query/kernel \(8, 2, 3\) \(allowed: \(8, 2, 2\)\)"):
    nnx_attention.load_params(module, wrong)
  assert_trees_close(nnx_attention.linen_params(module), before, 0)
  with pytest.raises(ValueError, match="Unknown attention preset 'hyla2'; allowed: softmax"):
    nnx_attention.MultiHeadAttention(H, E, attention="hyla2", rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="inputs_q has width 3; allowed: in_features=8"):
    module(jnp.zeros((1, 2, 3)))
  with pytest.raises(ValueError, match="init_cache"):
    module(jnp.zeros((1, 1, E)), decode=True)


def test_bridge_without_a_mesh():
  """Flax's bridge guide on the Linen module: initializes and runs outside any mesh."""
  linen = attention.MultiHeadAttention(num_heads=4, attention="hyla", position="t5")
  x = data()[0]
  bridged = nnx.bridge.ToNNX(linen, rngs=nnx.Rngs(0)).lazy_init(x)
  params = nnx.to_pure_dict(nnx.state(bridged, nnx.Param))
  np.testing.assert_allclose(bridged(x), linen.apply({"params": params}, x), rtol=1e-6)
  kernel = nnx.state(bridged, nnx.Param)["query"]["kernel"]
  assert kernel.get_metadata()["out_sharding"] == ("embed", "heads", "kv")


MESH_SCRIPT = """
import jax, jax.numpy as jnp, numpy as np
import flax.linen as nn
from flax import nnx
from hypernet_attention import attention
mesh = jax.make_mesh((2, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
rules = (("embed", None), ("heads", "model"), ("kv", None), ("relpos_buckets", None))
linen = attention.MultiHeadAttention(num_heads=4, attention="hyla", position="t5")
x = jax.random.normal(jax.random.key(0), (4, 5, 8))
with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
  bridged = nnx.bridge.ToNNX(linen, rngs=nnx.Rngs(0)).lazy_init(x)
  params = nnx.state(bridged, nnx.Param)
  y = nnx.jit(lambda m, x: m(x))(bridged, x)
P = jax.sharding.PartitionSpec
annotated = {("query", "kernel"): P(None, "model", None), ("out", "kernel"): P("model", None, None),
             ("relative_position", "rel_embedding"): P("model", None)}
specs = [params[a][b][...].sharding.is_equivalent_to(jax.NamedSharding(mesh, spec), len(spec))
         for (a, b), spec in annotated.items()]
plain = nnx.to_pure_dict(nnx.state(bridged, nnx.Param))
print(specs, float(np.abs(y - linen.apply({"params": plain}, x)).max()))
"""


def test_bridge_with_a_mesh_shards_as_annotated():
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
             PYTHONPATH=REPO, JAX_PLATFORMS="cpu")
  proc = tl.run([sys.executable, "-c", MESH_SCRIPT], env=env, capture_output=True,
                text=True, cwd=REPO)
  assert proc.returncode == 0, proc.stderr[-3000:]
  specs, err = proc.stdout.strip().rsplit(" ", 1)
  assert specs == "[True, True, True]"
  assert float(err) < 1e-5


LIGHT_IMPORT = """
import sys
import hypernet_attention
from hypernet_attention import attention, nnx_attention
heavy = ("clu", "orbax", "tensorboard", "tensorflow", "tensorboardX", "seqio", "tensorstore")
print(sorted(m for m in sys.modules if m.split(".")[0] in heavy))
"""


def test_import_is_light():
  proc = tl.run([sys.executable, "-c", LIGHT_IMPORT], capture_output=True, text=True,
                cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO))
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.strip() == "[]"


# Issue 46: the edges of the NNX module (and the Linen one it shares its math with).


def test_decode_past_the_cache_is_refused():
  """Five steps into a 3-long cache wrote steps 4 and 5 silently onto the last slot (as
  Flax's own module does). Eagerly: one line naming the step and the cache's length; under
  jit (the step is not known while tracing): NaN, never a plausible output."""
  module = nnx_attention.MultiHeadAttention(H, E, 4, rngs=nnx.Rngs(0), decode=True)
  module.init_cache((1, 3, E))
  x = jnp.ones((1, 1, E))
  for _ in range(3):
    assert np.isfinite(module(x)).all()
  with pytest.raises(ValueError, match=r"^decode step 4 does not fit the cache of length 3; "
                     r"allowed: at most 3 decode steps per cache"):
    module(x)
  module.init_cache((1, 3, E))
  step = nnx.jit(lambda m, x: m(x))
  outs = [np.asarray(step(module, x)) for _ in range(4)]
  assert all(np.isfinite(o).all() for o in outs[:3]) and np.isnan(outs[3]).all()


@pytest.mark.parametrize("rate", [-0.1, 1.0, 1.5, float("nan"), None])
def test_dropout_rates_are_checked_the_same_way_everywhere(rate):
  """-0.1 meant no dropout while 1.5 was refused (NaN: a misleading rngs error); every
  module and the ops now refuse a rate outside [0, 1) in the same words."""
  message = rf"^dropout_rate={rate!r}; allowed: a number in \[0, 1\)"
  with pytest.raises(ValueError, match=message):
    nnx_attention.MultiHeadAttention(H, E, 4, dropout_rate=rate, rngs=nnx.Rngs(0))
  linen = attention.MultiHeadAttention(num_heads=H, qk_features=4, dropout_rate=rate)
  with pytest.raises(ValueError, match=message):
    linen.init(jax.random.key(0), jnp.ones((B, Q, E)))
  x = jnp.ones((B, Q, H, 4))
  with pytest.raises(ValueError, match=message):
    ops_dispatch.attention(x, x, x, dropout_rate=rate, dropout_seed=jnp.int32(1))


SHAPE_CASES = {
    # name: (inputs_q, inputs_k, inputs_v shapes (None: default), the one line)
    "rank_4_query": ((B, Q, 3, E), None, None,
                     r"inputs_q has shape \(2, 5, 3, 8\); allowed: rank 3, \(batch, length, "
                     r"features\)"),
    "rank_2_key": ((B, Q, E), (K, E), None, r"inputs_k has shape \(7, 8\); allowed: rank 3"),
    "key_width": ((B, Q, E), (B, K, 6), None,
                  r"inputs_k has width 6; allowed: in_kv_features=8 \(its last axis\)"),
    "value_width": ((B, Q, E), (B, K, E), (B, K, 6), r"inputs_v has width 6; allowed: "
                    r"in_kv_features=8"),
    "key_batch": ((B, Q, E), (3, K, E), None,
                  r"inputs_k has batch 3 \(axis 0\); allowed: 2, the batch of inputs_q"),
    "value_batch": ((B, Q, E), (B, K, E), (3, K, E),
                    r"inputs_v has batch 3 \(axis 0\); allowed: 2, the batch of inputs_q"),
    "value_length": ((B, Q, E), (B, K, E), (B, 4, E),
                     r"inputs_v has length 4 \(axis 1\); allowed: 7, the length of inputs_k"),
}


@pytest.mark.parametrize("case", sorted(SHAPE_CASES))
@pytest.mark.parametrize("kind", ["nnx", "linen"])
def test_shape_errors_name_the_input_its_axis_and_what_is_allowed(case, kind):
  """Before: 'too many values to unpack' (rank 4), a 30-line dot_general TypeError (key
  width), a key-batch mismatch blamed on the query, and chex lines that named no input.
  Checked on static shapes while tracing: nothing runs on the device for it."""
  *shapes, message = SHAPE_CASES[case]
  q, k, v = (None if s is None else jnp.ones(s) for s in shapes)
  if kind == "linen":
    if "width" in case:
      pytest.skip("the Linen module takes its input widths from its first call")
    call = lambda: attention.MultiHeadAttention(num_heads=H, qk_features=4).init(
        jax.random.key(0), q, k, v)
  else:
    call = lambda: nnx.jit(lambda m, q, k, v: m(q, k, v))(
        nnx_attention.MultiHeadAttention(H, E, 4, rngs=nnx.Rngs(0)), q, k, v)
  with pytest.raises(ValueError, match=message):
    call()


def test_loaded_parameters_are_cast_to_the_module_dtype_or_refused():
  """bf16 weights loaded into an f32 module silently made it a bf16 module."""
  f32 = nnx_attention.MultiHeadAttention(H, E, 4, rngs=nnx.Rngs(0))
  bf16 = nnx_attention.MultiHeadAttention(H, E, 4, param_dtype=jnp.bfloat16, rngs=nnx.Rngs(1))
  nnx_attention.load_params(f32, bf16)
  for ours, theirs in zip(jax.tree.leaves(nnx_attention.linen_params(f32)),
                          jax.tree.leaves(nnx_attention.linen_params(bf16))):
    assert ours.dtype == jnp.float32 and theirs.dtype == jnp.bfloat16
    np.testing.assert_array_equal(ours, theirs.astype(jnp.float32))  # bf16 -> f32 is exact.
  nnx_attention.load_params(bf16, nnx.MultiHeadAttention(H, E, 4, rngs=nnx.Rngs(2),
                                                         decode=False))
  dtypes = {p.dtype for p in jax.tree.leaves(nnx_attention.linen_params(bf16))}
  assert dtypes == {jnp.dtype(jnp.bfloat16)}  # And f32 weights keep a bf16 module bf16.
  before = nnx_attention.linen_params(f32)
  ints = jax.tree.map(lambda p: p.astype(jnp.int32), before)
  with pytest.raises(ValueError, match=r"not floating-point \['key/bias int32', "):
    nnx_attention.load_params(f32, ints)
  assert_trees_close(nnx_attention.linen_params(f32), before, 0)
