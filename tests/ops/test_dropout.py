"""Dropout on the latent code inside blockwise's tiles (`ops/dropout.py`).

The keep-mask of pair (q, k) is a hash of (seed, q, k): blockwise recomputes it per tile in
the forward and backward passes, the reference draws it whole. So under one seed every
implementation must compute the same function, in value and gradient (same tolerance rule as
tests/ops/test_ops.py), and the mask must drop the right fraction of pairs, independently
of the seed.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hypernet_attention import attention
from hypernet_attention.ops import blockwise
from hypernet_attention.ops import dispatch
from hypernet_attention.ops import dropout

from numerics import assert_close
from numerics import compare
from test_ops import CASES
from test_ops import make_inputs
from test_ops import reference_fn

RATE = 0.1
SEED = jnp.int32(1234)


def test_keep_rate_and_scale():
  """Kept fraction within 5 binomial sigmas of 1 - rate; kept pairs scaled by 1/(1-rate)."""
  for rate in (0.1, 0.5):
    keep = np.asarray(dropout.grid_keep_scale(SEED, 512, 512, rate))
    n = keep.size
    frac = np.mean(keep > 0)
    assert abs(frac - (1 - rate)) < 5 * np.sqrt(rate * (1 - rate) / n), (rate, frac)
    np.testing.assert_allclose(keep[keep > 0], 1 / (1 - rate), rtol=1e-6)


def test_masks_independent_across_seeds_and_positions():
  """Two seeds agree on a pair with probability (1-r)^2 + r^2 (independent draws); rows of
  one mask are not copies of each other; a tile's mask equals the slice of the full grid."""
  a = np.asarray(dropout.grid_keep_scale(jnp.int32(1), 256, 256, 0.5)) > 0
  b = np.asarray(dropout.grid_keep_scale(jnp.int32(2), 256, 256, 0.5)) > 0
  assert abs(np.mean(a == b) - 0.5) < 5 * 0.5 / 256
  assert abs(np.mean(a[1:] == a[:-1]) - 0.5) < 5 * 0.5 / 256
  assert abs(np.mean(a[:, 1:] == a[:, :-1]) - 0.5) < 5 * 0.5 / 256
  tile = np.asarray(dropout.grid_keep_scale(jnp.int32(1), 16, 32, 0.5, 48, 96)) > 0
  np.testing.assert_array_equal(tile, a[48:64, 96:128])


def _dropout_reference(mask, causal, **kw):
  def fn(q, k, v, b):
    return reference_fn(mask, causal, dropout_rate=RATE, dropout_seed=SEED, **kw)(q, k, v, b)
  return fn


@pytest.mark.parametrize("normalization,value_network", [
    ("rms_head", "mlp"), ("softmax", "mlp"), ("softmax", "linear"), ("linear", "linear")])
@pytest.mark.parametrize("case", ["causal_bias_mask", "plain_q_ne_k"])
def test_blockwise_dropout_matches_reference(normalization, value_network, case):
  q_len, k_len, causal, bias_shape, mask_shape = CASES[case]
  inputs = make_inputs(30, q_len=q_len, k_len=k_len, bias_shape=bias_shape,
                       mask_shape=mask_shape)
  kw = dict(normalization=normalization, value_network=value_network, activation="relu")
  fn = lambda q, k, v, b: blockwise.attention(
      q, k, v, bias=b, mask=inputs[4], is_causal=causal, block_q=8, block_k=5,
      dropout_rate=RATE, dropout_seed=SEED, **kw)
  assert_close(fn, _dropout_reference(inputs[4], causal, **kw), inputs)


def test_dropout_changes_the_function():
  """Kernels without dropout are far outside the bound of the dropped reference: the
  comparison above would notice a kernel that ignored, or misplaced, the mask."""
  q_len, k_len, causal, bias_shape, mask_shape = CASES["causal_bias_mask"]
  inputs = make_inputs(31, q_len=q_len, k_len=k_len, bias_shape=bias_shape,
                       mask_shape=mask_shape)
  kw = dict(normalization="rms_head", value_network="mlp", activation="relu")
  for seed in (None, jnp.int32(99)):
    fn = lambda q, k, v, b, seed=seed: blockwise.attention(
        q, k, v, bias=b, mask=inputs[4], is_causal=causal, block_q=8, block_k=5,
        dropout_rate=RATE if seed is not None else 0.0, dropout_seed=seed, **kw)
    errors = compare(fn, _dropout_reference(inputs[4], causal, **kw), inputs)
    assert max(err / bound for err, bound in errors.values()) > 100, errors


def test_dispatch_needs_a_seed():
  q, k, v, _, _, _ = make_inputs(33, q_len=8, k_len=8)
  with pytest.raises(ValueError, match="dropout_seed"):
    dispatch.attention(q, k, v, dropout_rate=0.1)
  with pytest.raises(ValueError, match=r"dropout_rate=1.0; allowed: a number in \[0, 1\)"):
    dispatch.attention(q, k, v, dropout_rate=1.0, dropout_seed=SEED)


@pytest.mark.parametrize("preset", ["hyla", "softmax"])
def test_module_fast_path_equals_materialized_path_under_dropout(preset):
  """MultiHeadAttention with dropout: the tiled fast path and the materialized path (taken
  when the latent code is sown) drop the same pairs for the same rng, and a new rng (the
  next training step) drops different ones."""
  module = attention.MultiHeadAttention(num_heads=2, attention=preset, dropout_rate=0.3,
                                        implementation="blockwise")
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 29, 8))
  params = module.init(jax.random.PRNGKey(1), x)

  def run(rng, sow):
    return module.apply(params, x, is_causal=True, deterministic=False,
                        rngs={"dropout": rng}, mutable=["intermediates"] if sow else False)

  rng = jax.random.PRNGKey(2)
  fast = run(rng, False)
  slow, _ = run(rng, True)
  np.testing.assert_allclose(fast, slow, rtol=1e-5, atol=1e-5)
  other = run(jax.random.PRNGKey(3), False)
  assert np.max(np.abs(np.asarray(other) - np.asarray(fast))) > 1e-2
  cot = jax.random.normal(jax.random.PRNGKey(4), fast.shape)

  def loss(p, sow):
    out = module.apply(p, x, is_causal=True, deterministic=False, rngs={"dropout": rng},
                       mutable=["intermediates"] if sow else False)
    return jnp.sum((out[0] if sow else out) * cot)

  chex.assert_trees_all_close(jax.grad(loss)(params, False), jax.grad(loss)(params, True),
                              rtol=1e-4, atol=1e-5)


def test_auto_with_dropout_keeps_short_sequences_on_the_reference():
  choose = dispatch.choose_implementation
  assert choose(36, 36, "rms_head", "mlp", backend="cpu", dropout=True) == "reference"
  assert choose(36, 36, "rms_head", "mlp", backend="cpu") == "blockwise"
  assert choose(1024, 1024, "rms_head", "mlp", backend="gpu", dropout=True) == "blockwise"
