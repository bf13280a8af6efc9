"""Attention == its hypernetwork form == the paper's equations, for every preset.

The independent formula below is written from the paper's Eqs. 2-7 with numpy loops over query-key
pairs in float64; it shares no code with the package (T5 buckets and RoPE included).
"""

import math

from absl.testing import parameterized
import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hypernet_attention import attention
from hypernet_attention import hypernetwork
from hypernet_attention import presets

BATCH, LENGTH, WIDTH, HEADS, QK, V = 2, 5, 6, 3, 6, 9  # per head: D=2, V=3
ACTIVATIONS = {
    "relu": lambda x: np.maximum(x, 0.0), "identity": lambda x: x,
    "gelu": lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3))),
}


def t5_bucket(relative, bidirectional, num_buckets, max_distance):
  """T5's bucket of relative = key - query, from its published definition."""
  n = -relative
  offset = 0
  if bidirectional:
    num_buckets //= 2
    offset = num_buckets if n < 0 else 0
    n = abs(n)
  else:
    n = max(n, 0)
  exact = num_buckets // 2
  if n < exact:
    return offset + n
  large = exact + int(math.log(n / exact + np.finfo(np.float32).eps)
                      / math.log(max_distance / exact) * (num_buckets - exact))
  return offset + min(large, num_buckets - 1)


def rope(x_TD, wavelength=10_000.0):
  """RoPE with complex numbers: channel m pairs with m + D/2, rotated by t / base^(2m/D)."""
  length, depth = x_TD.shape
  half = depth // 2
  z = x_TD[:, :half] + 1j * x_TD[:, half:]
  theta = np.array([[t / wavelength ** (2 * m / depth) for m in range(half)]
                    for t in range(length)])
  z = z * np.exp(1j * theta)
  return np.concatenate([z.real, z.imag], axis=-1)


def paper_formula(p, x, mask, preset, position, num_buckets, eps=1e-6):
  """y_q = b_out + sum_k (value network of pair (q, k) configured by a_qk)(x_k)."""
  p = jax.tree.map(np.asarray, nn.meta.unbox(p))
  norm, network, act = preset.normalization, preset.value_network, preset.activation
  phi = ACTIVATIONS[act]
  out = np.zeros((BATCH, LENGTH, WIDTH))
  for b in range(BATCH):
    proj = lambda n: np.stack([x[b] @ p[n]["kernel"][:, h] + p[n]["bias"][h]  # noqa: B023
                               for h in range(HEADS)])  # (H, T, .)
    q, k, v = proj("query"), proj("key"), proj("value")
    if position == "rope":
      q = np.stack([rope(qh) for qh in q])
      k = np.stack([rope(kh) for kh in k])
    s = np.einsum("hid,hjd->hij", q, k) / math.sqrt(q.shape[-1])
    if position == "t5":
      for i in range(LENGTH):
        for j in range(LENGTH):
          s[:, i, j] += p["relative_position"]["rel_embedding"][
              :, t5_bucket(j - i, False, num_buckets, num_buckets)]
    visible = np.broadcast_to(mask[b], (HEADS, LENGTH, LENGTH))
    a = np.where(visible, s, 0.0)
    if norm == "softmax":
      e = np.where(visible, np.exp(s - s.max(-1, keepdims=True)), 0.0)
      a = e / e.sum(-1, keepdims=True)
    elif norm == "rms_head":
      a = a / np.sqrt(np.mean(a**2, axis=0, keepdims=True) + eps)
    w_out = [p["out"]["kernel"][h].T for h in range(HEADS)]  # (O, V)
    for i in range(LENGTH):
      y = p["out"]["bias"].copy()
      for j in range(LENGTH):
        c = a[:, i, j]
        if network == "linear":  # W_qk = sum_h a_h W_h^out W_h^v
          y += sum(c[h] * w_out[h] @ v[h, j] for h in range(HEADS))
        elif network == "nonlinear_value":
          y += sum(c[h] * w_out[h] @ phi(v[h, j]) for h in range(HEADS))
        else:
          z = phi(sum(c[h] * v[h, j] for h in range(HEADS)))
          if network == "deep_mlp":
            z = phi(sum(c[h] * p["value_hidden"][h].T @ z for h in range(HEADS)))
          y += sum(c[h] * w_out[h] @ z for h in range(HEADS))
      out[b, i] = y
  return out


class AttentionHypernetworkFormulaTest(chex.TestCase):
  """The module (the attention core) and its hypernetwork form against the paper's formula,
  each traced under jit and run eagerly (`chex.variants`): the same float64 numbers."""

  def setUp(self):
    super().setUp()
    self.enter_context(jax.enable_x64(True))

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(preset=sorted(presets.PRESETS), position=("t5", "rope"))
  def test_attention_hypernetwork_and_formula_agree(self, preset, position):
    module = attention.MultiHeadAttention(
        num_heads=HEADS, attention=preset, qk_features=QK, v_features=V,
        position=position, num_buckets=LENGTH, max_distance=LENGTH,
        dtype=jnp.float64, param_dtype=jnp.float64, implementation="reference")
    keys = jax.random.split(jax.random.PRNGKey(sum(map(ord, preset))), 4)
    x = jax.random.normal(keys[0], (BATCH, LENGTH, WIDTH), jnp.float64)
    params = module.init(keys[1], x)["params"]
    # Non-zero biases so that the [x; 1] augmentation of the hypernetwork is exercised.
    params = jax.tree.map(lambda a: a + 0.3 * jax.random.normal(keys[2], a.shape, a.dtype),
                          nn.meta.unbox(params))
    causal = np.tril(np.ones((LENGTH, LENGTH), bool))
    padding = np.ones((BATCH, 1, 1, LENGTH), bool)
    padding[1, ..., -2:] = False
    mask = np.logical_and(causal, padding)  # (B, 1, T, T); row 0 of batch 1 keeps key 0

    attend = self.variant(lambda p, x, m: module.apply({"params": p}, x, mask=m,
                                                       is_causal=True))
    hyper = self.variant(lambda p, x, m: hypernetwork.hypernetwork_attention(
        module, p, x, mask=m, is_causal=True))
    expected = paper_formula(params, np.asarray(x), mask, module.preset, position, LENGTH)
    for got in (attend(params, x, jnp.asarray(padding)), hyper(params, x, jnp.asarray(padding))):
      chex.assert_type(got, jnp.float64)
      np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-9, atol=1e-9)


def test_wrong_shapes_fail_with_chex_naming_both():
  """A wrong shape reaches no einsum: chex's message names the shapes."""
  module = attention.MultiHeadAttention(num_heads=HEADS, qk_features=QK, v_features=V)
  x = jnp.ones((BATCH, LENGTH, WIDTH))
  params = nn.meta.unbox(module.init(jax.random.PRNGKey(0), x)["params"])
  with pytest.raises(AssertionError, match=r"shape prefixes: \[\(2,\), \(3,\)\]"):
    hypernetwork.latent_code(module, params, x, jnp.ones((BATCH + 1, LENGTH, WIDTH)))
  # The attention module's own input check: one line naming the input and what is allowed.
  with pytest.raises(ValueError, match=r"rank 2 \(shape \(5, 6\)\) but expected 3.*inputs_q "
                     r"has shape \(5, 6\); allowed: rank 3"):
    module.apply({"params": params}, x[0])
  code = hypernetwork.latent_code(module, params, x)
  with pytest.raises(AssertionError, match=r"dimension equal to '3' on axis '1' but got '2'"):
    hypernetwork.generate_value_network(module, params, code[:, :-1])


@pytest.mark.parametrize("preset", ["softmax", "hyla", "hyla_deep"])
def test_pair_weights_are_the_generated_network(x64, preset):
  """W_qk of a chosen pair, applied to [x_k; 1], is that pair's contribution to y_q."""
  module = attention.MultiHeadAttention(
      num_heads=HEADS, attention=preset, qk_features=QK, v_features=V,
      dtype=jnp.float64, param_dtype=jnp.float64)
  x = jax.random.normal(jax.random.PRNGKey(0), (1, LENGTH, WIDTH), jnp.float64)
  params = nn.meta.unbox(module.init(jax.random.PRNGKey(1), x)["params"])
  pairs = hypernetwork.pair_weights(module, params, x, jnp.array([3, 1]), jnp.array([0, 4]))
  code = hypernetwork.latent_code(module, params, x)
  np.testing.assert_allclose(pairs["latent_code"][0, 0], code[0, :, 3, 0], rtol=1e-12)
  p = jax.tree.map(np.asarray, params)
  x_aug = np.append(np.asarray(x[0, 0]), 1.0)
  c = np.asarray(pairs["latent_code"][0, 0])
  v_h = [np.concatenate([p["value"]["kernel"][:, h].T, p["value"]["bias"][h][:, None]], 1)
         for h in range(HEADS)]
  w_out = [p["out"]["kernel"][h].T for h in range(HEADS)]
  if preset == "softmax":
    expected = sum(c[h] * w_out[h] @ v_h[h] for h in range(HEADS))
    np.testing.assert_allclose(pairs["W"][0, 0], expected, rtol=1e-10, atol=1e-12)
    assert pairs["W"].shape == (1, 2, WIDTH, WIDTH + 1)
  else:
    np.testing.assert_allclose(pairs["W1"][0, 0] @ x_aug,
                               sum(c[h] * v_h[h] @ x_aug for h in range(HEADS)), rtol=1e-10)
    np.testing.assert_allclose(pairs["W2"][0, 0], sum(c[h] * w_out[h] for h in range(HEADS)),
                               rtol=1e-10)
    assert ("W_hidden" in pairs) == (preset == "hyla_deep")
