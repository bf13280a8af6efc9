"""`ops/factored.py` (HYLA's value network through per-pair scalars) against the reference.

Outputs and gradients (bias included) with the tolerance rule of `tests/numerics.py`, with and
without dropout (the same (seed, q, k) mask as the reference), float32 and bfloat16 inputs;
and where `auto` sends a call: factored on CPU for short sequences with narrow heads, the
reference when a mask has a head axis or a bias a batch axis.
"""

import jax
import jax.numpy as jnp
import pytest

from hypernet_attention.ops import dispatch
from hypernet_attention.ops import factored
from hypernet_attention.ops import reference

from numerics import assert_close
from numerics import error_bound
from numerics import reduction_length
from numerics import rel_err
from test_ops import CASES
from test_ops import make_inputs
from test_ops import reference_fn

SEED = jnp.int32(1234)
# The CASES whose mask has no head axis and whose bias has no batch axis.
SUPPORTED = ("plain_q_ne_k", "causal_bias_mask", "broadcast_bias_causal")


def _fns(mask, causal, rate, **kw):
  drop = dict(dropout_rate=rate, dropout_seed=SEED if rate else None)
  fn = lambda q, k, v, b: dispatch.attention(q, k, v, bias=b, mask=mask, is_causal=causal,
                                             implementation="factored", **drop, **kw)
  return fn, reference_fn(mask, causal, **drop, **kw)


@pytest.mark.parametrize("normalization,activation,case,rate", [
    *(("rms_head", "relu", case, rate) for case in SUPPORTED for rate in (0.0, 0.25)),
    ("rms_head", "gelu", "causal_bias_mask", 0.25),
    ("linear", "relu", "causal_bias_mask", 0.25)])
def test_factored_matches_reference(normalization, activation, case, rate):
  q_len, k_len, causal, bias_shape, mask_shape = CASES[case]
  inputs = make_inputs(3, q_len=q_len, k_len=k_len, depth=4, v_dim=3,
                       bias_shape=bias_shape, mask_shape=mask_shape)
  fn, ref_fn = _fns(inputs[4], causal, rate, normalization=normalization,
                    value_network="mlp", activation=activation)
  assert_close(fn, ref_fn, inputs)


def test_factored_bfloat16_inputs_match_reference():
  q_len, k_len, causal, bias_shape, mask_shape = CASES["causal_bias_mask"]
  inputs = make_inputs(4, q_len=q_len, k_len=k_len, depth=4, v_dim=4, bias_shape=bias_shape,
                       mask_shape=mask_shape, dtype=jnp.bfloat16)
  fn, ref_fn = _fns(inputs[4], causal, 0.1)
  assert_close(fn, ref_fn, inputs)


def test_auto_picks_factored_only_where_it_applies():
  choose = dispatch.choose_implementation
  kw = dict(backend="cpu", dropout=True, head_dim=4, factorable=True)
  assert choose(36, 36, "rms_head", "mlp", **kw) == "factored"
  assert choose(36, 36, "linear", "mlp", **kw) == "factored"
  assert choose(36, 36, "softmax", "mlp", **kw) == "reference"
  assert choose(36, 36, "rms_head", "linear", **kw) == "reference"
  assert choose(36, 36, "rms_head", "mlp", **{**kw, "factorable": False}) == "reference"
  assert choose(36, 36, "rms_head", "mlp", **{**kw, "head_dim": 64}) == "reference"
  assert choose(36, 36, "rms_head", "mlp", **{**kw, "backend": "gpu"}) == "reference"
  assert choose(64, 64, "rms_head", "mlp", **kw) == "blockwise"


@pytest.mark.parametrize("case", ["full_bias_pair_mask", "key_bias_head_mask"])
def test_auto_sends_head_masks_and_batch_biases_to_the_reference(case):
  q_len, k_len, causal, bias_shape, mask_shape = CASES[case]
  q, k, v, bias, mask, _ = make_inputs(5, q_len=q_len, k_len=k_len, depth=4, v_dim=3,
                                       bias_shape=bias_shape, mask_shape=mask_shape)
  assert not factored.supports("rms_head", "mlp", mask, bias)
  if jax.default_backend() == "cpu":
    out = dispatch.attention(q, k, v, bias=bias, mask=mask, is_causal=causal)
    ref = reference.attention(q, k, v, bias=bias, mask=mask)
    assert rel_err(out, ref) < error_bound(0.0, reduction_length(q, k, v), out.dtype)
  with pytest.raises(ValueError, match="mask without a head axis"):
    factored.attention(q, k, v, bias=bias, mask=mask)
