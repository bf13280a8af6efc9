"""The attention modules accept only what the ops compute (issue 67), Linen and NNX, on both
paths: the fast one (`ops.dispatch`) and the probing one that materializes and sows the code.

tests/ops/test_operand_checks.py holds the same rules for every implementation of the ops;
here they must hold where the modules call them: a float mask (flax's `make_causal_mask`
default, or an additive one) is refused, not cast; eps must be finite and > 0; a NaN in a
masked (padded, future) key/value input reaches no output and no gradient.
"""

from flax import nnx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hypernet_attention import attention
from hypernet_attention import errors
from hypernet_attention import nnx_attention

B, T, E, H = 1, 5, 8, 2
MODULES = [(kind, path) for kind in ("linen", "nnx") for path in ("fast", "probing")]


def _module(kind, path, preset="hyla", **kw):
  """fn(inputs_q, inputs_kv, **call arguments) -> output of the module `kind` on `path`."""
  if kind == "linen":
    module = attention.MultiHeadAttention(num_heads=H, attention=preset, qk_features=4,
                                          v_features=4, **kw)
    params = module.init(jax.random.key(0), jnp.ones((B, T, E)))
    if path == "probing":
      return lambda x, kv, **call: module.apply(params, x, kv, mutable=["intermediates"],
                                                **call)[0]
    return lambda x, kv, **call: module.apply(params, x, kv, **call)
  graph, state = nnx.split(nnx_attention.MultiHeadAttention(
      H, E, 4, attention=preset, rngs=nnx.Rngs(0), **kw))
  if path == "probing":  # A fresh module per call: differentiable, nothing kept.
    return lambda x, kv, **call: nnx.capture(nnx.merge(graph, state), nnx.Intermediate)(
        x, kv, sow_weights=True, **call)[0]
  return lambda x, kv, **call: nnx.merge(graph, state)(x, kv, **call)


def _inputs(seed=0):
  keys = jax.random.split(jax.random.key(seed))
  return tuple(jax.random.normal(key, (B, T, E)) for key in keys)


@pytest.mark.parametrize("kind,path", MODULES)
@pytest.mark.parametrize("additive", [False, True])
def test_a_mask_that_is_not_boolean_is_refused(kind, path, additive):
  mask = nn.make_causal_mask(jnp.ones((B, T)))  # float32 0/1 unless dtype=bool
  if additive:
    mask = jnp.where(mask > 0, 0.0, -1e9)
  x, kv = _inputs()
  with pytest.raises(errors.BadInput, match=r"mask has dtype float32; allowed: bool") as refused:
    _module(kind, path)(x, kv, mask=mask)
  assert "\n" not in str(refused.value)
  _module(kind, path)(x, kv, mask=mask.astype(bool))  # what the line asks for runs


@pytest.mark.parametrize("kind,path", MODULES)
@pytest.mark.parametrize("eps", [-1.0, float("nan")])
def test_eps_must_be_finite_and_positive(kind, path, eps):
  x, kv = _inputs()
  with pytest.raises(errors.BadInput, match=rf"eps={eps}; allowed: a finite number > 0"):
    _module(kind, path, eps=eps)(x, kv)


@pytest.mark.parametrize("kind,path", MODULES)
@pytest.mark.parametrize("preset", ["softmax", "hyla"])
@pytest.mark.parametrize("masked_by", ["causal", "padding"])
def test_a_nan_in_a_masked_key_and_value_reaches_nothing(kind, path, preset, masked_by):
  """Cross-attention whose key/value input 3 of 5 is NaN, masked as padding or in the future
  of queries 0-2: those rows and the gradient of a loss on them wrt the queries' input equal
  the same call with input 3 zeroed (the keys' own projections are not differentiated: a NaN
  input times a zero cotangent is NaN in any dense layer's weight gradient)."""
  run = _module(kind, path, preset)
  x, kv = _inputs()
  rows, call = slice(0, 3), dict(is_causal=True)
  if masked_by == "padding":
    rows, call = slice(None), dict(mask=(jnp.arange(T) != 3)[None, None, None, :])

  def loss(x, kv):
    out = run(x, kv, **call)
    return jnp.sum(out[:, rows] * jnp.linspace(-1.0, 1.0, out[:, rows].size).reshape(
        out[:, rows].shape)), out

  (_, out), grad = jax.value_and_grad(loss, has_aux=True)(x, kv.at[:, 3].set(jnp.nan))
  (_, want), want_grad = jax.value_and_grad(loss, has_aux=True)(x, kv.at[:, 3].set(0.0))
  for name, got, expected in (("output", out[:, rows], want[:, rows]), ("grad", grad, want_grad)):
    assert np.isfinite(got).all(), f"{name} is not finite"
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6, err_msg=name)
  if masked_by == "causal":  # rows 3-4 see it
    assert not np.isfinite(out[:, 3:]).all(axis=(0, 2)).any()
