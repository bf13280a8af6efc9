"""The Pallas kernels compiled by Triton on a GPU, against the float64 reference.

CPU runs interpret the same kernels (tests/ops/test_ops.py); only a GPU compiles them, with
Triton's own tile shapes, bf16 matrix units and its own summation order. Every test here
is marked `gpu` and skips cleanly where JAX sees no GPU. The float32 reference runs at
full float32 matmul precision (XLA would use TF32 on the GPU by default, which would make
`err32`, and with it the bound, ~1000x looser); the tolerance rule is tests/numerics.py's.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hypernet_attention.ops import blockwise
from hypernet_attention.ops import dispatch
from hypernet_attention.ops import pallas_kernel

from numerics import assert_close
from numerics import assert_close_narrow
from numerics import compare
from test_ops import CASES
from test_ops import VARIANTS
from test_ops import make_inputs
from test_ops import reference_fn

# What the Pallas kernels declare (`pallas_kernel.COMPUTES`); tests/ops/test_ops.py checks that
# they refuse the rest.
PALLAS_VARIANTS = [v for v in VARIANTS if pallas_kernel.COMPUTES.covers(*v[:2])]

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a CUDA GPU"),
]


@pytest.fixture(autouse=True)
def _float32_matmuls():
  with jax.default_matmul_precision("float32"):
    yield


def _pallas(mask, causal, **kw):
  return lambda q, k, v, b: pallas_kernel.attention(
      q, k, v, bias=b, mask=mask, is_causal=causal, interpret=False, **kw)


@pytest.mark.parametrize("normalization,value_network,activation", PALLAS_VARIANTS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_float32_every_variant_and_mask(normalization, value_network, activation, case):
  """Odd lengths and three heads (neither a power of two), every bias/mask broadcast."""
  q_len, k_len, causal, bias_shape, mask_shape = CASES[case]
  inputs = make_inputs(20, q_len=q_len, k_len=k_len, bias_shape=bias_shape,
                       mask_shape=mask_shape)
  kw = dict(normalization=normalization, value_network=value_network, activation=activation)
  assert_close(_pallas(inputs[4], causal, **kw), reference_fn(inputs[4], causal, **kw),
               inputs)


@pytest.mark.parametrize("normalization,value_network,activation", PALLAS_VARIANTS)
def test_bfloat16_default_tiles(normalization, value_network, activation):
  """bf16 inputs and bias at the default tile sizes, several tiles per axis, causal."""
  inputs = make_inputs(21, batch=2, q_len=157, k_len=157, heads=4, depth=32, v_dim=16,
                       bias_shape=(1, 4, 157, 157), mask_shape=(2, 1, 1, 157),
                       dtype=jnp.bfloat16)
  inputs = inputs[:3] + (inputs[3].astype(jnp.bfloat16),) + inputs[4:]
  kw = dict(normalization=normalization, value_network=value_network, activation=activation)
  out = jax.jit(_pallas(inputs[4], True, **kw))(*inputs[:4])
  assert out.dtype == jnp.bfloat16
  assert_close(_pallas(inputs[4], True, **kw), reference_fn(inputs[4], True, **kw), inputs)


@pytest.mark.parametrize("pair_products", ["dot", "broadcast"])
def test_blockwise_bfloat16_both_pair_forms(pair_products):
  """Blockwise in bf16 on the GPU, with each form of its per-pair products (XLA:CPU cannot
  run the broadcast form in bf16); per-pair tensors in bf16, hence the narrow rule."""
  inputs = make_inputs(22, batch=2, q_len=157, k_len=157, heads=4, depth=32, v_dim=16,
                       bias_shape=(1, 4, 157, 157), dtype=jnp.bfloat16)
  inputs = inputs[:3] + (inputs[3].astype(jnp.bfloat16),) + inputs[4:]
  kw = dict(normalization="rms_head", value_network="mlp", activation="relu")
  fn = lambda q, k, v, b: blockwise.attention(q, k, v, bias=b, is_causal=True, block_q=64,
                                              block_k=64, pair_products=pair_products, **kw)
  assert jax.jit(fn)(*inputs[:4]).dtype == jnp.bfloat16
  assert_close_narrow(fn, reference_fn(None, True, **kw), inputs)


@pytest.mark.parametrize("activation", ["gelu", "silu", "tanh"])
def test_other_activations(activation):
  inputs = make_inputs(22, q_len=45, k_len=45, heads=2, bias_shape=(2, 1, 45, 45))
  kw = dict(normalization="rms_head", value_network="mlp", activation=activation)
  assert_close(_pallas(None, True, **kw), reference_fn(None, True, **kw), inputs)


@pytest.mark.parametrize("normalization,value_network", [("rms_head", "mlp"),
                                                        ("softmax", "linear")])
def test_paper_head_shape_long_sequence(normalization, value_network):
  """A realistic head shape (H=8, d=64) at T=1000: many tiles, causal skipping."""
  inputs = make_inputs(23, batch=1, q_len=1000, k_len=1000, heads=8, depth=64, v_dim=64,
                       dtype=jnp.bfloat16)
  kw = dict(normalization=normalization, value_network=value_network, activation="relu")
  errors = compare(_pallas(None, True, **kw), reference_fn(None, True, **kw), inputs)
  for name, (err, bound) in errors.items():
    assert err < bound, (name, err, bound)


def test_planted_bug_fails_on_gpu():
  """The rule still separates a real bug (causal mask dropped) from rounding on the GPU."""
  inputs = make_inputs(24, q_len=40, k_len=40, heads=2)
  kw = dict(normalization="rms_head", value_network="mlp", activation="relu")
  errors = compare(_pallas(None, False, **kw), reference_fn(None, True, **kw), inputs)
  assert max(err / bound for err, bound in errors.values()) > 100, errors


def _temp_bytes(seq_len):
  spec = jax.ShapeDtypeStruct((1, seq_len, 8, 64), jnp.bfloat16)
  fn = lambda q, k, v: pallas_kernel.attention(q, k, v, is_causal=True, interpret=False)
  grad = jax.jit(jax.grad(lambda q, k, v: jnp.sum(fn(q, k, v).astype(jnp.float32)),
                          (0, 1, 2)))
  return grad.lower(spec, spec, spec).compile().memory_analysis().temp_size_in_bytes


def test_memory_linear_in_length():
  """Forward+backward temp memory grows ~T (x4 for 4x T), not ~T^2 (x16)."""
  growth = _temp_bytes(8192) / _temp_bytes(2048)
  assert growth < 6, growth


def test_auto_uses_the_choice_for_gpu():
  """On this GPU `auto` runs what `choose_implementation` picks, and matches the reference."""
  inputs = make_inputs(25, q_len=64, k_len=64, heads=2)
  kw = dict(normalization="rms_head", value_network="mlp", activation="relu")
  assert dispatch.choose_implementation(64, 64, "rms_head", "mlp") in ("pallas", "blockwise")
  fn = lambda q, k, v, b: dispatch.attention(q, k, v, bias=b, is_causal=True, **kw)
  assert_close(fn, reference_fn(None, True, **kw), inputs)
  np.testing.assert_array_equal(jnp.isfinite(jax.jit(fn)(*inputs[:4])), True)


@pytest.mark.parametrize("normalization,value_network", [("rms_head", "mlp"),
                                                        ("softmax", "linear")])
def test_dropout_matches_reference(normalization, value_network):
  """Dropout's hash mask recomputed inside the Triton kernels equals the reference's."""
  inputs = make_inputs(26, q_len=77, k_len=77, heads=3, bias_shape=(1, 3, 77, 77))
  kw = dict(normalization=normalization, value_network=value_network, activation="relu",
            dropout_rate=0.1, dropout_seed=jnp.int32(5))
  assert_close(_pallas(None, True, **kw), reference_fn(None, True, **kw), inputs)
