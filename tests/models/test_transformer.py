"""Transformer: the paper's parameter counts, shapes, axes, latent codes, decode, MoE."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hypernet_attention import feed_forward
from hypernet_attention import transformer
from hypernet_attention.train import state as state_lib

ALLOWED_AXES = {"embed", "heads", "kv", "mlp", "vocab", "input", "output", "relpos_buckets",
                "experts", "norm", None}


def tiny(**changes):
  base = dict(num_layers=2, emb_dim=8, num_heads=2, qk_dim=4, v_dim=4, mlp_dim=16,
              output_dim=3, num_buckets=5, max_distance=5)
  return transformer.TransformerConfig(**{**base, **changes})


def abstract_params(config, shape, dtype=jnp.float32):
  model = transformer.Transformer(config)
  return jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros(shape, dtype)))[
      "params"]


@pytest.mark.parametrize("attention", ["softmax", "linear", "hyla"])
def test_paper_parameter_counts(attention):
  fuzzy = abstract_params(transformer.fuzzy_logic_config(16, attention=attention), (1, 16, 5))
  sraven = abstract_params(transformer.sraven_config(attention=attention), (1, 36, 8))
  assert state_lib.count_params(fuzzy) == 151_009
  assert state_lib.count_params(sraven) == 402_824


def test_hyla_deep_adds_one_value_hidden_per_layer():
  params = abstract_params(transformer.sraven_config(attention="hyla_deep"), (1, 36, 8))
  assert state_lib.count_params(params) == 402_824 + 4 * 16 * 4 * 4


@pytest.mark.parametrize("feed_forward_kind", ["gelu_mlp", "swiglu", "moe"])
def test_shapes_axes_and_latent_codes(feed_forward_kind):
  config = tiny(feed_forward=feed_forward_kind, attention="hyla")
  model = transformer.Transformer(config)
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 5, 7))
  variables = model.init(jax.random.PRNGKey(1), x)
  specs = jax.tree.leaves(nn.get_partition_spec(variables["params"]),
                          is_leaf=lambda s: isinstance(s, jax.sharding.PartitionSpec))
  assert specs and all(set(s) <= ALLOWED_AXES for s in specs)
  out, state = model.apply(variables, x, mutable=["intermediates"])
  assert out.shape == (2, 5, 3)
  for i in range(config.num_layers):
    (code,) = state["intermediates"][f"layers_{i}"]["attention"]["latent_code"]
    assert code.shape == (2, 2, 5, 5)


def test_inputs_of_another_width_than_the_parameters_are_one_line():
  """Parameters of a width-7 model applied to width-5 inputs (a model of another task or
  size): one line naming both widths, not flax's ScopeParamShapeError."""
  model = transformer.Transformer(tiny())
  variables = model.init(jax.random.PRNGKey(1), jnp.zeros((2, 5, 7)))
  with pytest.raises(ValueError, match=r"^inputs of shape \(2, 5, 5\) \(width 5\); allowed: "
                     r"width 7, that of these parameters \(input_dense kernel \(7, 8\)\)"):
    model.apply(variables, jnp.zeros((2, 5, 5)))
  assert model.apply(variables, jnp.zeros((2, 5, 7))).shape == (2, 5, 3)


def test_embedding_input_and_tied_readout():
  config = tiny(input_kind="embed", vocab_size=11, tied_embedding=True, position="rope",
                causal=True)
  model = transformer.Transformer(config)
  tokens = jax.random.randint(jax.random.PRNGKey(0), (2, 5), 0, 11)
  params = model.init(jax.random.PRNGKey(1), tokens)["params"]
  assert "readout" not in params and "relative_position" not in params["layers_0"]["attention"]
  logits = model.apply({"params": params}, tokens)
  assert logits.shape == (2, 5, 11)
  # Causal: changing the last token leaves earlier logits alone.
  changed = model.apply({"params": params}, tokens.at[:, -1].set((tokens[:, -1] + 1) % 11))
  np.testing.assert_allclose(changed[:, :-1], logits[:, :-1], rtol=1e-5, atol=1e-6)


def test_padding_mask_hides_padded_tokens():
  model = transformer.Transformer(tiny(attention="hyla"))
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 5, 7))
  padding = jnp.array([[True] * 5, [True] * 3 + [False] * 2])
  params = model.init(jax.random.PRNGKey(1), x)
  base = model.apply(params, x, padding_mask=padding)
  moved = model.apply(params, x.at[1, 3:].set(9.0), padding_mask=padding)
  np.testing.assert_allclose(moved[1, :3], base[1, :3], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attention,position", [("softmax", "rope"), ("linear", "t5"),
                                                ("hyla", "t5"), ("hyla", "rope")])
def test_decode_matches_full_forward(attention, position):
  config = tiny(attention=attention, position=position, causal=True, input_kind="embed",
                vocab_size=13)
  tokens = jax.random.randint(jax.random.PRNGKey(0), (2, 5), 0, 13)
  params = transformer.Transformer(config).init(jax.random.PRNGKey(1), tokens)["params"]
  expected = transformer.Transformer(config).apply({"params": params}, tokens)
  decoder = transformer.Transformer(config.replace(decode=True))
  cache = decoder.init(jax.random.PRNGKey(1), tokens)["cache"]
  step = jax.jit(lambda c, t: decoder.apply({"params": params, "cache": c}, t,
                                            mutable=["cache"]))
  for t in range(tokens.shape[1]):
    logits, state = step(cache, tokens[:, t:t + 1])
    cache = state["cache"]
    np.testing.assert_allclose(logits[:, 0], expected[:, t], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("attention", ["softmax", "hyla_deep"])
def test_jit_grad_with_dropout(attention):
  config = tiny(attention=attention, feed_forward="moe", num_experts=3, top_k=2)
  model = transformer.Transformer(config)
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 5, 7))
  params = model.init(jax.random.PRNGKey(1), x)["params"]

  @jax.jit
  def loss_and_grad(p, rng):
    def loss(p):
      out = model.apply({"params": p}, x, deterministic=False, rngs={"dropout": rng})
      return jnp.mean(out**2)
    return jax.value_and_grad(loss)(p)

  loss1, grads = loss_and_grad(params, jax.random.PRNGKey(2))
  loss2, _ = loss_and_grad(params, jax.random.PRNGKey(3))
  assert np.isfinite(loss1) and loss1 != loss2  # dropout is live
  leaves = jax.tree.leaves(nn.meta.unbox(grads))
  assert all(np.all(np.isfinite(g)) for g in leaves)
  assert np.any(nn.meta.unbox(grads)["layers_0"]["attention"]["query"]["kernel"] != 0)


def test_moe_routes_to_top_k_experts():
  moe = feed_forward.MoE(num_experts=4, top_k=2, hidden_dim=6)
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 5))
  variables = moe.init(jax.random.PRNGKey(1), x)
  out, state = moe.apply(variables, x, mutable=["intermediates"])
  (gates,) = state["intermediates"]["router_gates"]
  np.testing.assert_array_equal((gates > 0).sum(-1), 2)
  np.testing.assert_allclose(gates.sum(-1), 1.0, rtol=1e-6)
  p = jax.tree.map(np.asarray, nn.meta.unbox(variables["params"]))
  logits = np.asarray(x) @ p["router"]["kernel"]
  expected = np.zeros(x.shape)
  for b in range(2):
    for t in range(3):
      top = np.argsort(logits[b, t])[-2:]
      w = np.exp(logits[b, t, top] - logits[b, t, top].max())
      w /= w.sum()
      for weight, e in zip(w, top):
        h = np.asarray(jax.nn.gelu(x[b, t] @ p["up_kernel"][e] + p["up_bias"][e]))
        expected[b, t] += weight * (h @ p["down_kernel"][e] + p["down_bias"][e])
  np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)


def test_bad_config_errors():
  with pytest.raises(ValueError, match="attention preset 'hila'"):
    tiny(attention="hila")
  with pytest.raises(ValueError, match="v_features=6 is not divisible by num_heads=4"):
    tiny(num_heads=4, qk_dim=8, v_dim=6)
  with pytest.raises(ValueError, match="feed_forward 'mlp'.*gelu_mlp, swiglu, moe"):
    tiny(feed_forward="mlp")
  with pytest.raises(ValueError, match="decode=True needs causal=True"):
    tiny(decode=True)
  with pytest.raises(ValueError, match="top_k=3"):
    tiny(feed_forward="moe", num_experts=2, top_k=3)
  with pytest.raises(ValueError, match="activation 'elu'"):
    tiny(activation="elu")
  model = transformer.Transformer(tiny())
  with pytest.raises(ValueError, match=r"inputs of shape \(2, 5\)"):
    model.init(jax.random.PRNGKey(0), jnp.zeros((2, 5)))
