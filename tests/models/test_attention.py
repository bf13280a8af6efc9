"""MultiHeadAttention: presets, flax compatibility, masks, RMSHead, dropout, decode cache."""

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hypernet_attention import attention
from hypernet_attention import positions
from hypernet_attention import presets
from hypernet_attention.ops import reference

B, T, E, H = 2, 6, 8, 2

# Table A1 rows as (normalization, value network), written out from the paper (Table A1, Eqs. 2-7).
TABLE_A1 = {
    "softmax": ("softmax", "linear"),
    "linear": ("linear", "linear"),
    "hyla": ("rms_head", "mlp"),
    "linear_rmshead": ("rms_head", "linear"),
    "hyla_no_rmshead": ("linear", "mlp"),
    "hyla_linear_value": ("rms_head", "mlp"),
    "hyla_linear_value_no_rmshead": ("linear", "mlp"),
    "softmax_hyla": ("softmax", "mlp"),
    "hyla_deep": ("rms_head", "deep_mlp"),
}


def inputs(seed=0, length=T, batch=B):
  return jax.random.normal(jax.random.PRNGKey(seed), (batch, length, E))


def make(preset="hyla", **kw):
  kw = {"num_heads": H, "qk_features": 4, "v_features": 6, **kw}
  return attention.MultiHeadAttention(attention=preset, **kw)


def test_presets_cover_table_a1():
  for name, (norm, network) in TABLE_A1.items():
    preset = presets.PRESETS[name]
    assert (preset.normalization, preset.value_network) == (norm, network), name
  assert presets.PRESETS["hyla"].activation == "relu"
  assert presets.PRESETS["hyla_linear_value"].activation == "identity"
  assert presets.PRESETS["linear_rmshead_nonlinear_value"] == (
      "rms_head", "nonlinear_value", "relu")
  assert attention.resolve_preset("hyla", "silu").activation == "silu"


def test_presets_name_what_the_ops_compute():
  # `presets.py` is plain data without JAX: each row must name entries the ops define.
  for name, preset in presets.PRESETS.items():
    assert preset.normalization in reference.NORMALIZATIONS, name
    assert preset.value_network in attention.VALUE_NETWORKS, name
    assert preset.activation in reference.ACTIVATIONS, name
    assert attention.resolve_preset(name) == preset


def test_flax_weights_reproduce_flax_output():
  flax_mha = nn.MultiHeadDotProductAttention(
      num_heads=H, qkv_features=4, out_features=5)
  x, kv = inputs(0), inputs(1, length=T + 1)
  mask = jax.random.bernoulli(jax.random.PRNGKey(2), 0.7, (B, 1, T, T + 1))
  mask = mask.at[..., 0].set(True)  # no fully masked rows (flax averages those)
  flax_params = flax_mha.init(jax.random.PRNGKey(3), x, kv)["params"]
  expected = flax_mha.apply({"params": flax_params}, x, kv, mask=mask)
  ours = make("softmax", v_features=4, out_features=5)
  our_params = nn.meta.unbox(ours.init(jax.random.PRNGKey(4), x, kv)["params"])
  chex.assert_trees_all_equal_shapes(our_params, flax_params)
  for impl in ("auto", "reference"):
    got = ours.clone(implementation=impl).apply({"params": flax_params}, x, kv, mask=mask)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_logical_axis_names():
  params = make("hyla_deep", position="t5", num_buckets=4, max_distance=4).init(
      jax.random.PRNGKey(0), inputs())["params"]
  specs = nn.get_partition_spec(params)
  assert specs["query"]["kernel"] == jax.sharding.PartitionSpec("embed", "heads", "kv")
  assert specs["out"]["kernel"] == jax.sharding.PartitionSpec("heads", "kv", "embed")
  assert specs["relative_position"]["rel_embedding"] == jax.sharding.PartitionSpec(
      "heads", "relpos_buckets")
  assert nn.meta.unbox(params)["value_hidden"].shape == (H, 3, 3)


def test_rms_head_code_has_unit_rms_across_heads():
  module = make("hyla", num_heads=4, qk_features=8, v_features=8)
  x = inputs()
  mask = jnp.ones((B, 1, T, T), bool).at[:, :, :, -1].set(False)
  params = module.init(jax.random.PRNGKey(0), x)
  _, state = module.apply(params, x, mask=mask, mutable=["intermediates"])
  (code,) = state["intermediates"]["latent_code"]
  assert code.shape == (B, 4, T, T)
  rms = np.sqrt(np.mean(np.square(code), axis=1))  # (B, Q, K)
  np.testing.assert_allclose(rms[..., :-1], 1.0, rtol=1e-4)
  np.testing.assert_array_equal(code[..., -1], 0.0)


@pytest.mark.parametrize("preset", sorted(presets.PRESETS))
def test_masked_keys_contribute_nothing(preset):
  module = make(preset)  # 'auto': XLA's kernel for softmax, the reference for the rest
  x, kv = inputs(0), inputs(1)
  mask = jnp.ones((B, 1, 1, T), bool).at[:, :, :, 2].set(False).at[1, :, :, -1].set(False)
  params = module.init(jax.random.PRNGKey(0), x, kv)
  base = module.apply(params, x, kv, mask=mask)
  noisy_kv = kv.at[:, 2].add(100.0).at[1, -1].add(-50.0)
  np.testing.assert_allclose(module.apply(params, x, noisy_kv, mask=mask), base,
                             rtol=1e-5, atol=1e-5)
  # ...while an unmasked key does change the output.
  assert not np.allclose(module.apply(params, x, kv.at[:, 0].add(1.0), mask=mask), base)


@pytest.mark.parametrize("preset", ["softmax", "hyla", "hyla_deep"])
def test_implementations_agree_on_long_sequences(preset):
  """At T=30 'auto' goes to the blockwise kernel (or XLA's softmax); same outputs."""
  module = make(preset, position="t5", num_buckets=8, max_distance=30)
  x = inputs(length=30)
  params = module.init(jax.random.PRNGKey(0), x)
  ref = module.clone(implementation="reference").apply(params, x, is_causal=True)
  np.testing.assert_allclose(module.apply(params, x, is_causal=True), ref,
                             rtol=2e-5, atol=2e-5)


def test_dropout_mask_is_shared_across_batch_and_heads():
  module = make("hyla", dropout_rate=0.5)
  x = inputs()
  params = module.init(jax.random.PRNGKey(0), x)
  _, clean = module.apply(params, x, mutable=["intermediates"])
  out, noisy = module.apply(params, x, deterministic=False, rngs={"dropout": jax.random.key(1)},
                            mutable=["intermediates"])
  (clean,), (noisy,) = clean["intermediates"]["latent_code"], noisy["intermediates"][
      "latent_code"]
  kept = noisy != 0
  assert kept.all(axis=(0, 1)).sum() == (kept.any(axis=(0, 1))).sum()  # same (q, k) pattern
  assert 0 < kept[0, 0].mean() < 1
  np.testing.assert_allclose(noisy, np.where(kept, 2.0 * clean, 0.0), rtol=1e-6)
  assert out.shape == (B, T, E)


@pytest.mark.parametrize("preset,position", [("softmax", "rope"), ("linear", "t5"),
                                             ("hyla", "t5"), ("hyla", "rope"),
                                             ("hyla_deep", "t5")])
def test_decode_cache_matches_full_forward(preset, position):
  kw = dict(position=position, num_buckets=T, max_distance=T)
  x = inputs()
  full_module = make(preset, **kw)
  params = full_module.init(jax.random.PRNGKey(0), x)["params"]
  expected = full_module.apply({"params": params}, x, is_causal=True)
  decoder = make(preset, decode=True, **kw)
  cache = decoder.init(jax.random.PRNGKey(0), x, is_causal=True)["cache"]
  step = jax.jit(lambda c, xt: decoder.apply({"params": params, "cache": c}, xt,
                                             is_causal=True, mutable=["cache"]))
  for t in range(T):
    out, state = step(cache, x[:, t:t + 1])
    cache = state["cache"]
    np.testing.assert_allclose(out[:, 0], expected[:, t], rtol=1e-5, atol=1e-5)
  assert int(cache["cache_index"]) == T


def test_decode_rejects_more_than_one_token():
  decoder = make("hyla", decode=True)
  x = inputs()
  variables = decoder.init(jax.random.PRNGKey(0), x)
  with pytest.raises(ValueError, match="one token per call"):
    decoder.apply(variables, x[:, :2], mutable=["cache"])


def test_decode_past_the_cache_is_refused():
  """issue 46: steps past the cache wrote silently onto its last slot. Applied eagerly: one
  line naming the step and the cache's length; under jit: NaN, never a plausible output."""
  decoder = make("hyla", decode=True)
  x = inputs(length=3)
  variables = decoder.init(jax.random.PRNGKey(0), x)
  params, cache = variables["params"], variables["cache"]
  step = lambda c: decoder.apply({"params": params, "cache": c}, x[:, :1], mutable=["cache"])
  for _ in range(3):
    out, cache = step(cache)
    cache = cache["cache"]
  with pytest.raises(ValueError, match=r"^decode step 4 does not fit the cache of length 3"):
    step(cache)
  out, _ = jax.jit(step)(cache)
  assert np.isnan(out).all()


def test_jit_grad_and_bfloat16():
  module = make("hyla_deep", position="rope", dtype=jnp.bfloat16)
  x = inputs()
  params = module.init(jax.random.PRNGKey(0), x)["params"]
  assert jax.tree.leaves(nn.meta.unbox(params))[0].dtype == jnp.float32
  out = module.apply({"params": params}, x)
  assert out.dtype == jnp.bfloat16 and out.shape == (B, T, E)
  loss = lambda p: jnp.sum(module.apply({"params": p}, x, is_causal=True).astype(
      jnp.float32) ** 2)
  grads = jax.jit(jax.grad(loss))(params)
  for g in jax.tree.leaves(nn.meta.unbox(grads)):
    assert np.all(np.isfinite(g)) and np.any(g != 0)


def test_t5_buckets_unidirectional_default():
  """Keys after the query share bucket 0 with the query itself (the authors' setting)."""
  rel = jnp.arange(-5, 6)
  buckets = positions.relative_position_bucket(rel, bidirectional=False, num_buckets=6,
                                               max_distance=6)
  np.testing.assert_array_equal(buckets, [5, 4, 3, 2, 1, 0, 0, 0, 0, 0, 0])
  # Log-spaced beyond num_buckets // 2 = 3 exact distances; max_distance 12 and beyond share
  # the last bucket (values worked out by hand from T5's formula).
  far = positions.relative_position_bucket(-jnp.arange(16), bidirectional=False,
                                           num_buckets=6, max_distance=12)
  np.testing.assert_array_equal(far, [0, 1, 2, 3, 3, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5])
  both = positions.relative_position_bucket(rel, bidirectional=True, num_buckets=8,
                                            max_distance=8)
  assert both[5] == 0 and both[6] == 5 and both[4] == 1


def test_bad_input_errors():
  x = inputs()
  with pytest.raises(ValueError, match="'soft'.*allowed: softmax, linear, hyla"):
    make("soft").init(jax.random.PRNGKey(0), x)
  with pytest.raises(ValueError, match="activation 'swish'.*relu"):
    make("hyla", activation="swish").init(jax.random.PRNGKey(0), x)
  with pytest.raises(ValueError, match="qk_features=5 is not divisible by num_heads=2"):
    make("hyla", qk_features=5).init(jax.random.PRNGKey(0), x)
  with pytest.raises(ValueError, match="mask has shape \\(2, 1, 5, 6\\); allowed: broadcastable"):
    make("hyla").init(jax.random.PRNGKey(0), x, mask=jnp.ones((B, 1, 5, T), bool))
  with pytest.raises(ValueError, match="position 'alibi'"):
    make("hyla", position="alibi").init(jax.random.PRNGKey(0), x)
  with pytest.raises(ValueError, match="even per-head width"):
    make("hyla", qk_features=6, position="rope").init(jax.random.PRNGKey(0), x)
