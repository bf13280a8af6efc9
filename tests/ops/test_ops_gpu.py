"""Attention on a GPU against the float64 reference: blockwise in bf16 and `auto`.

Only a GPU compiles blockwise with its own fusions and summation order. Every test here is
marked `gpu` and skips cleanly where JAX sees no GPU. The float32 reference runs at full
float32 matmul precision (XLA would use TF32 on the GPU by default, which would make `err32`,
and with it the bound, ~1000x looser); the tolerance rule is tests/numerics.py's. The Mosaic
kernel is checked in interpret mode by tests/ops/test_mosaic_kernel.py and on hardware by
the GPU window (launch/gpu_window.py).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hypernet_attention.ops import blockwise
from hypernet_attention.ops import dispatch

from numerics import assert_close
from numerics import assert_close_narrow
from test_ops import make_inputs
from test_ops import reference_fn

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a CUDA GPU"),
]


@pytest.fixture(autouse=True)
def _float32_matmuls():
  with jax.default_matmul_precision("float32"):
    yield


def test_blockwise_bfloat16():
  """Blockwise in bf16 on the GPU; per-pair tensors in bf16, hence the narrow rule."""
  inputs = make_inputs(22, batch=2, q_len=157, k_len=157, heads=4, depth=32, v_dim=16,
                       bias_shape=(1, 4, 157, 157), dtype=jnp.bfloat16)
  inputs = inputs[:3] + (inputs[3].astype(jnp.bfloat16),) + inputs[4:]
  kw = dict(normalization="rms_head", value_network="mlp", activation="relu")
  fn = lambda q, k, v, b: blockwise.attention(q, k, v, bias=b, is_causal=True, block_q=64,
                                              block_k=64, **kw)
  assert jax.jit(fn)(*inputs[:4]).dtype == jnp.bfloat16
  assert_close_narrow(fn, reference_fn(None, True, **kw), inputs)


def test_auto_uses_the_choice_for_gpu():
  """On this GPU `auto` runs what `choose_implementation` picks, and matches the reference."""
  inputs = make_inputs(25, q_len=64, k_len=64, heads=2)
  kw = dict(normalization="rms_head", value_network="mlp", activation="relu")
  assert dispatch.choose_implementation(64, 64, "rms_head", "mlp") == "blockwise"
  fn = lambda q, k, v, b: dispatch.attention(q, k, v, bias=b, is_causal=True, **kw)
  assert_close(fn, reference_fn(None, True, **kw), inputs)
  np.testing.assert_array_equal(jnp.isfinite(jax.jit(fn)(*inputs[:4])), True)
