"""Ops accept only what they compute (issue 67): on every path of `dispatch.attention`.

- A mask is boolean: an additive float mask (0 = keep, -1e9 = drop), cast to bool, had meant
  0 -> drop and -1e9 -> keep (attention inverted, no error).
- `eps` is finite and > 0: -1, NaN, Inf and 0 gave non-finite outputs.
- bias and mask broadcast to (B, H, Q, K): checked, in one line, on every path.
- A masked key or value contributes exactly nothing: a NaN or Inf there (a future key under
  causal attention, a padded one) had reached every earlier output (0 x NaN in the value
  network's sums) and the gradients. Here outputs and gradients must equal the same call with
  the masked entries zeroed; a query that does see the non-finite entry still gets a
  non-finite output (nothing is hidden).

Shapes are tiny (B=1, T=6): these run on every CI leg.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hypernet_attention import errors
from hypernet_attention import presets
from hypernet_attention.ops import dispatch

HYLA = dict(normalization="rms_head", value_network="mlp")
SOFTMAX = dict(normalization="softmax", value_network="linear")
# (implementation, what it is asked to compute): every path `dispatch` has on a CPU; `auto`
# takes jax.nn.dot_product_attention for softmax and `factored` for HYLA at these shapes.
COMPUTING = [("reference", HYLA), ("reference", SOFTMAX), ("factored", HYLA),
             ("blockwise", HYLA), ("blockwise", SOFTMAX), ("auto", HYLA), ("auto", SOFTMAX)]


def _operands(batch=1, length=6, heads=2, depth=4, v_dim=3, seed=0):
  rng = np.random.default_rng(seed)
  return tuple(jnp.asarray(rng.standard_normal((batch, length, heads, width)), jnp.float32)
               for width in (depth, depth, v_dim))


def _refused(message, implementation, **kwargs):
  q, k, v = _operands()
  with pytest.raises(errors.BadInput, match=message) as refused:
    dispatch.attention(q, k, v, implementation=implementation, **HYLA, **kwargs)
  assert "\n" not in str(refused.value)


@pytest.mark.parametrize("implementation", presets.IMPLEMENTATIONS)
@pytest.mark.parametrize("mask", [
    np.where(np.tril(np.ones((6, 6))), 0.0, -1e9).astype(np.float32),  # additive
    np.tril(np.ones((6, 6), np.float32)),  # flax's make_causal_mask default
    np.tril(np.ones((6, 6), np.int32)),
], ids=["additive", "float_0_1", "int_0_1"])
def test_a_mask_that_is_not_boolean_is_refused(implementation, mask):
  """One line naming the dtype, the additive alternatives and flax's `dtype=bool`, before any
  kernel runs (`mosaic` would otherwise refuse this CPU first)."""
  _refused(rf"mask has dtype {mask.dtype}; allowed: bool, True = attend \(.*bias=.*"
           r"dtype=bool", implementation, mask=jnp.asarray(mask))


@pytest.mark.parametrize("implementation", presets.IMPLEMENTATIONS)
@pytest.mark.parametrize("eps", [-1.0, 0.0, float("nan"), float("inf")])
def test_eps_must_be_finite_and_positive(implementation, eps):
  _refused(rf"eps={eps}; allowed: a finite number > 0", implementation, eps=eps)


@pytest.mark.parametrize("implementation", presets.IMPLEMENTATIONS)
@pytest.mark.parametrize("name,value,says", [
    ("mask", np.ones((1, 1, 1, 1, 6), bool), r"mask has shape \(1, 1, 1, 1, 6\)"),
    ("mask", np.ones((1, 2, 6, 7), bool), r"mask has shape \(1, 2, 6, 7\)"),
    ("mask", np.ones((3, 6, 6), bool), r"mask has shape \(3, 6, 6\)"),
    ("bias", np.zeros((2, 1, 6, 6), np.float32), r"bias has shape \(2, 1, 6, 6\)"),
    ("bias", np.zeros((6, 5), np.float32), r"bias has shape \(6, 5\)"),
])
def test_bias_and_mask_must_broadcast_to_the_scores(implementation, name, value, says):
  _refused(says + r"; allowed: broadcastable to \(B, H, Q, K\) = \(1, 2, 6, 6\)",
           implementation, **{name: jnp.asarray(value)})


@pytest.mark.parametrize("implementation", presets.IMPLEMENTATIONS)
def test_a_bias_that_is_not_floating_is_refused(implementation):
  _refused(r"bias has dtype bool; allowed: a floating dtype", implementation,
           bias=jnp.ones((6, 6), bool))


def _value_and_grads(implementation, computes, mask, is_causal, rows):
  """One compiled function: output, and d<out[:, rows], weights>/d(q, k, v)."""
  def loss(q, k, v):
    out = dispatch.attention(q, k, v, mask=mask, is_causal=is_causal,
                             implementation=implementation, **computes)
    weights = jnp.linspace(-1.0, 1.0, out[:, rows].size).reshape(out[:, rows].shape)
    return jnp.sum(out[:, rows] * weights), out
  grad = jax.jit(jax.value_and_grad(loss, (0, 1, 2), has_aux=True))
  return lambda operands: (lambda result: (result[0][1], result[1]))(grad(*operands))


@pytest.mark.parametrize("implementation,computes", COMPUTING)
@pytest.mark.parametrize("operand,bad,masked_by", [
    ("value", np.nan, "causal"), ("value", np.inf, "padding"),
    ("key", np.nan, "padding"), ("key", -np.inf, "causal")])
def test_a_masked_key_or_value_contributes_nothing(implementation, computes, operand, bad,
                                                   masked_by):
  """Key 4 of 6 holds NaN or Inf, in its key or its value; it is in the future of queries 0-3
  (causal) or padding (a (B, 1, 1, K) mask). The rows that cannot see it, and the gradients of
  a loss on them, equal the same call with key 4's entries zeroed, and are finite; rows 4-5
  (causal) do see it, and must not come out finite."""
  q, k, v = _operands()
  which = 1 if operand == "key" else 2
  zeroed = [q, k, v]
  zeroed[which] = zeroed[which].at[:, 4].set(0.0)
  poisoned = list(zeroed)
  poisoned[which] = zeroed[which].at[:, 4].set(bad)
  mask, rows = None, slice(0, 4)
  if masked_by == "padding":
    mask, rows = jnp.arange(6)[None, None, None, :] != 4, slice(None)
  run = _value_and_grads(implementation, computes, mask, masked_by == "causal", rows)
  (out, grads), (want, want_grads) = run(poisoned), run(zeroed)
  for name, got, expected in zip(("output", "dq", "dk", "dv"), (out[:, rows], *grads),
                                 (want[:, rows], *want_grads)):
    assert np.isfinite(got).all(), f"{name} is not finite"
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6, err_msg=name)
  if masked_by == "causal":
    assert not np.isfinite(out[:, 4:]).all(axis=(0, 2, 3)).any()
