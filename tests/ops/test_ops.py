"""Every attention implementation against the reference: outputs and gradients.

Shapes are tiny and lengths odd (they do not divide the tile sizes), so the padding,
broadcast bias/mask slicing and causal tile skipping are all exercised. Tolerances follow one
rule derived from float32 error analysis (`tests/numerics.py`), so they hold on any x86 CPU;
`test_planted_bugs_fail` shows that the rule still catches real bugs by orders of magnitude.
"""

import itertools

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from hypernet_attention import errors
from hypernet_attention import presets
from hypernet_attention.ops import blockwise
from hypernet_attention.ops import dispatch
from hypernet_attention.ops import factored
from hypernet_attention.ops import kernel_cost
from hypernet_attention.ops import mosaic_kernel
from hypernet_attention.ops import reference
from hypernet_attention.ops import tiling

from numerics import NAMES
from numerics import assert_close
from numerics import assert_close_narrow
from numerics import compare
from numerics import error_bound
from numerics import float64_value_and_grads
from numerics import reduction_length
from numerics import rel_err
from numerics import value_and_grads


def make_inputs(seed, batch=2, q_len=19, k_len=13, heads=3, depth=8, v_dim=5,
                bias_shape=None, mask_shape=None, dtype=jnp.float32):
  """Random (q, k, v, bias, mask, output cotangent); numpy RNG (no per-shape compiles)."""
  rng = np.random.default_rng(seed)
  normal = lambda shape, dt=dtype: jnp.asarray(rng.standard_normal(shape), dt)
  q = normal((batch, q_len, heads, depth))
  k = normal((batch, k_len, heads, depth))
  v = normal((batch, k_len, heads, v_dim))
  bias = None if bias_shape is None else normal(bias_shape, jnp.float32)
  mask = None if mask_shape is None else jnp.asarray(rng.random(mask_shape) < 0.75)
  cot = normal((batch, q_len, heads, v_dim))
  return q, k, v, bias, mask, cot


def reference_fn(mask, is_causal, **kw):
  """The reference with the causal mask built here, independently of `dispatch`."""
  def fn(q, k, v, bias):
    m = mask
    if is_causal:
      tril = np.tril(np.ones((q.shape[1], k.shape[1]), bool))
      m = tril if m is None else jnp.logical_and(m, tril)
    return reference.attention(q, k, v, bias=bias, mask=m, **kw)
  return fn


# (normalization, value network, activation): everything the reference computes, so a new
# entry is tested on every path; TILED: the ones the tiled kernels declare.
VARIANTS = [(n, vn, "relu") for n, vn in itertools.product(
    reference.NORMALIZATIONS, reference.VALUE_NETWORKS)]
TILED = [v for v in VARIANTS if blockwise.COMPUTES.covers(*v[:2])]
CASES = {
    # name: (q_len, k_len, is_causal, bias_shape, mask_shape)
    "plain_q_ne_k": (19, 13, False, None, None),
    "causal_bias_mask": (23, 23, True, (1, 3, 23, 23), (2, 1, 1, 23)),
    "full_bias_pair_mask": (17, 21, False, (2, 3, 17, 21), (2, 3, 17, 21)),
    "broadcast_bias_causal": (21, 21, True, (3, 1, 21), None),
    "key_bias_head_mask": (19, 13, False, (2, 1, 19, 1), (1, 3, 19, 13)),
    # Causal with keys past the last query: key tiles no query sees (dk, dv, dbias 0 there).
    "causal_fewer_queries": (9, 23, True, (1, 3, 9, 23), None),
}


@pytest.mark.parametrize("normalization,value_network,activation", TILED)
@pytest.mark.parametrize("case", ["causal_bias_mask", "plain_q_ne_k"])
def test_blockwise_matches_reference(normalization, value_network, activation, case):
  q_len, k_len, causal, bias_shape, mask_shape = CASES[case]
  inputs = make_inputs(0, q_len=q_len, k_len=k_len, bias_shape=bias_shape,
                       mask_shape=mask_shape)
  kw = dict(normalization=normalization, value_network=value_network, activation=activation)
  fn = lambda q, k, v, b: blockwise.attention(
      q, k, v, bias=b, mask=inputs[4], is_causal=causal, block_q=8, block_k=5, **kw)
  assert_close(fn, reference_fn(inputs[4], causal, **kw), inputs)


@pytest.mark.parametrize("normalization,value_network,activation", TILED)
@pytest.mark.parametrize("case", sorted(CASES))
def test_blockwise_float64_matches_reference(normalization, value_network, activation, case):
  """The tiling logic in float64, where rounding cannot hide a small bug: the float64 bound is
  the float32 rule's worst case with u64 (kappa estimated from the float32 reference's error)."""
  q_len, k_len, causal, bias_shape, mask_shape = CASES[case]
  inputs = make_inputs(10, q_len=q_len, k_len=k_len, bias_shape=bias_shape,
                       mask_shape=mask_shape)
  kw = dict(normalization=normalization, value_network=value_network, activation=activation)
  fn = lambda q, k, v, b: blockwise.attention(
      q, k, v, bias=b, mask=inputs[4], is_causal=causal, block_q=8, block_k=5, **kw)
  ref_fn = reference_fn(inputs[4], causal, **kw)
  q, k, v, bias, _, cot = inputs
  got = float64_value_and_grads(fn, q, k, v, bias, cot)
  ref64 = float64_value_and_grads(ref_fn, q, k, v, bias, cot)
  ref32 = value_and_grads(ref_fn, q, k, v, bias, cot)
  n = reduction_length(q, k, v)
  for name, x, r32, r64 in zip(NAMES, (got[0], *got[1]), (ref32[0], *ref32[1]),
                               (ref64[0], *ref64[1])):
    assert x.dtype == np.float64, name
    bound = max(n * rel_err(r32, r64) * 2.0**-29, n * 2.0**-53)
    assert rel_err(x, r64) < bound, (name, rel_err(x, r64), bound)


PLANTED_BUGS = {
    # name: (what the buggy kernel is called with instead) -> (q, k, v, bias, is_causal)
    "causal_mask_dropped": lambda q, k, v, b: (q, k, v, b, False),
    "bias_ignored": lambda q, k, v, b: (q, k, v, None, True),
    "head_axis_reversed": lambda q, k, v, b: (q, k[:, :, ::-1], v, b, True),
}


@pytest.mark.parametrize("bug", sorted(PLANTED_BUGS))
def test_planted_bugs_fail(bug):
  """The tolerance rule is loose enough for any CPU's rounding, yet a real bug in a kernel
  exceeds it by more than two orders of magnitude in some quantity."""
  q_len, k_len, _, bias_shape, mask_shape = CASES["causal_bias_mask"]
  inputs = make_inputs(11, q_len=q_len, k_len=k_len, heads=2, bias_shape=(1, 2, 23, 23),
                       mask_shape=mask_shape)
  kw = dict(normalization="rms_head", value_network="mlp", activation="relu")

  def buggy(q, k, v, b):
    q, k, v, b, causal = PLANTED_BUGS[bug](q, k, v, b)
    return blockwise.attention(q, k, v, bias=b, mask=inputs[4], is_causal=causal,
                               block_q=16, block_k=16, **kw)

  ref_fn = reference_fn(inputs[4], True, **kw)
  ratios = {name: err / bound for name, (err, bound) in compare(buggy, ref_fn, inputs).items()}
  assert max(ratios.values()) > 100, ratios
  with pytest.raises(AssertionError):
    assert_close(buggy, ref_fn, inputs)


@pytest.mark.parametrize("case,activation", [
    ("full_bias_pair_mask", "gelu"), ("broadcast_bias_causal", "sigmoid"),
    ("key_bias_head_mask", "tanh"), ("broadcast_bias_causal", "silu")])
def test_blockwise_bias_shapes_and_activations(case, activation):
  q_len, k_len, causal, bias_shape, mask_shape = CASES[case]
  inputs = make_inputs(1, q_len=q_len, k_len=k_len, bias_shape=bias_shape,
                       mask_shape=mask_shape)
  kw = dict(normalization="rms_head", value_network="mlp", activation=activation)
  fn = lambda q, k, v, b: blockwise.attention(
      q, k, v, bias=b, mask=inputs[4], is_causal=causal, block_q=6, block_k=16, **kw)
  assert_close(fn, reference_fn(inputs[4], causal, **kw), inputs)


@pytest.mark.parametrize("normalization", ["rms_head", "softmax"])
def test_bfloat16(normalization):
  """bf16 inputs, float32 accumulation: close to the reference on the same inputs. Blockwise
  keeps its per-pair tensors in bf16 (`assert_close_narrow`)."""
  inputs = make_inputs(2, q_len=33, k_len=33, heads=2, bias_shape=(1, 2, 33, 33),
                       dtype=jnp.bfloat16)
  kw = dict(normalization=normalization, value_network="mlp", activation="relu")
  fn = lambda q, k, v, b: blockwise.attention(
      q, k, v, bias=b, is_causal=True, block_q=16, block_k=16, **kw)
  out = jax.jit(fn)(*inputs[:4])
  assert out.dtype == jnp.bfloat16
  assert_close_narrow(fn, reference_fn(None, True, **kw), inputs)


def test_fully_masked_rows_are_zero():
  q, k, v, _, _, _ = make_inputs(3, q_len=9, k_len=7)
  mask = np.ones((1, 1, 9, 7), bool)
  mask[..., 4, :] = False
  for normalization in ("rms_head", "softmax"):
    out = jax.jit(lambda q, k, v: blockwise.attention(
        q, k, v, mask=mask, normalization=normalization, block_q=4, block_k=4))(q, k, v)  # noqa: B023
    ref = reference.attention(q, k, v, mask=mask, normalization=normalization)
    np.testing.assert_array_equal(np.asarray(out[:, 4]), 0.0)
    assert rel_err(out, ref) < error_bound(0.0, reduction_length(q, k, v), out.dtype)


def _temp_bytes(fn, seq_len):
  shape = (1, seq_len, 2, 16)
  spec = jax.ShapeDtypeStruct(shape, jnp.float32)
  grad = jax.jit(jax.grad(lambda q, k, v: jnp.sum(fn(q, k, v)), (0, 1, 2)))
  return grad.lower(spec, spec, spec).compile().memory_analysis().temp_size_in_bytes


def test_blockwise_memory_is_subquadratic():
  """Forward+backward temp memory: reference grows ~T^2 (x16 for 4x T), blockwise ~T."""
  blk = lambda q, k, v: blockwise.attention(q, k, v, is_causal=True, block_q=32, block_k=32)
  ref = reference_fn(None, True)
  ref = (lambda f: lambda q, k, v: f(q, k, v, None))(ref)
  short, long = 128, 512
  blk_growth = _temp_bytes(blk, long) / _temp_bytes(blk, short)
  ref_growth = _temp_bytes(ref, long) / _temp_bytes(ref, short)
  assert ref_growth > 10, ref_growth
  assert blk_growth < 6, blk_growth
  assert _temp_bytes(blk, long) * 10 < _temp_bytes(ref, long)


def naive_hyla_float64(q, k, v, mask):
  """Loops over (q, k) pairs in float64: RMSHead + ReLU MLP value network (the paper's Eqs. 6-7)."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  batch, q_len, heads, depth = q.shape
  out = np.zeros((batch, q_len, heads, v.shape[-1]))
  for b, i in itertools.product(range(batch), range(q_len)):
    for j in range(k.shape[1]):
      if not mask[i, j]:
        continue
      s = np.array([q[b, i, h] @ k[b, j, h] for h in range(heads)]) / np.sqrt(depth)
      a = s / np.sqrt(np.mean(s**2) + reference.RMS_HEAD_EPS)
      z = np.maximum(np.einsum("h,hv->v", a, v[b, j]), 0.0)
      out[b, i] += a[:, None] * z[None, :]
  return out


@pytest.mark.parametrize("implementation", ["reference", "blockwise", "auto"])
def test_dispatch_against_float64_loops(implementation):
  q, k, v, _, _, _ = make_inputs(5, batch=1, q_len=11, k_len=11)
  out = dispatch.attention(q, k, v, is_causal=True, normalization="rms_head",
                           value_network="mlp", implementation=implementation)
  expected = naive_hyla_float64(q, k, v, np.tril(np.ones((11, 11), bool)))
  # A well-conditioned forward pass: the worst-case float32 reordering bound n * u.
  assert rel_err(out, expected) < error_bound(0.0, reduction_length(q, k, v), out.dtype)


def test_blockwise_float64_accumulates_in_float64(x64):
  q, k, v, _, _, _ = make_inputs(9, batch=1, q_len=11, k_len=11, dtype=jnp.float64)
  out = blockwise.attention(q, k, v, is_causal=True, block_q=4, block_k=3)
  assert out.dtype == jnp.float64
  expected = naive_hyla_float64(q, k, v, np.tril(np.ones((11, 11), bool)))
  assert rel_err(out, expected) < 1e-12


def test_dispatch_auto_softmax_uses_dot_product_attention_numerics():
  inputs = make_inputs(6, q_len=15, k_len=15, v_dim=8, bias_shape=(1, 3, 15, 15))
  kw = dict(normalization="softmax", value_network="linear", activation="relu")
  fn = lambda q, k, v, b: dispatch.attention(q, k, v, bias=b, is_causal=True, **kw)
  assert_close(fn, reference_fn(None, True, **kw), inputs)


def _value_weight(v):
  """A (H, V, V) W'_h for deep_mlp (the other value networks ignore it)."""
  heads, width = v.shape[2:]
  return jnp.asarray(np.random.default_rng(0).standard_normal((heads, width, width)), v.dtype)


@pytest.mark.parametrize("normalization,value_network,activation", VARIANTS)
@pytest.mark.parametrize("implementation", ["auto", *dispatch.FAST_PATHS])
def test_every_path_computes_or_refuses(implementation, normalization, value_network,
                                        activation):
  """Every name the reference computes, on every path: a fast path it declares matches the
  reference; an explicit fast path that does not declare it refuses in one line naming it;
  `auto` always matches the reference. `auto` runs at T=40, where it takes blockwise for
  what blockwise declares; explicit paths at T=12 (one tile: their tiling is tested above)."""
  length = 40 if implementation == "auto" else 12
  inputs = make_inputs(13, batch=1, q_len=length, k_len=length, heads=2, depth=4, v_dim=3,
                       bias_shape=(1, 2, length, length))
  kw = dict(normalization=normalization, value_network=value_network, activation=activation,
            value_weight_HVV=_value_weight(inputs[2]))
  fn = lambda q, k, v, b: dispatch.attention(q, k, v, bias=b, is_causal=True,
                                             implementation=implementation, **kw)
  path = dispatch.FAST_PATHS.get(implementation)
  if path is not None and not path.covers(normalization, value_network):
    name = normalization if normalization not in path.normalizations else value_network
    with pytest.raises(errors.BadInput, match=f"{implementation}.*'{name}'") as refusal:
      fn(*inputs[:4])
    assert "\n" not in str(refusal.value)
    return
  assert_close(fn, reference_fn(None, True, **kw), inputs)


def _fake_normalization(scores_BHQK, mask, eps):
  """tanh of the scores: a normalization no fast path implements."""
  return reference.NORMALIZATIONS["linear"](jnp.tanh(scores_BHQK), mask, eps)


def _fake_value_network(code_BHQK, value_BKHV, phi, value_weight_HVV):
  """The linear value network on phi(values): one no fast path implements."""
  return reference.VALUE_NETWORKS["linear"](code_BHQK, phi(value_BKHV), phi, value_weight_HVV)


@pytest.mark.parametrize("registry,names", [
    ("NORMALIZATIONS", dict(normalization="fake", value_network="mlp")),
    ("VALUE_NETWORKS", dict(normalization="rms_head", value_network="fake")),
])
@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_a_new_reference_entry_is_never_computed_as_something_else(monkeypatch, registry,
                                                                   names, backend):
  """A normalization / value network added to the reference alone: `auto` runs it on the
  reference at every length (the lengths where it would take factored and blockwise, on
  CPU and a faked GPU backend), and every fast path refuses it, through dispatch and
  called directly."""
  fake = _fake_normalization if registry == "NORMALIZATIONS" else _fake_value_network
  monkeypatch.setitem(getattr(reference, registry), "fake", fake)
  monkeypatch.setattr(jax, "default_backend", lambda: backend)
  for length in (12, 40):  # factored/reference, and blockwise for the known names
    q, k, v, _, _, _ = make_inputs(14, batch=2, q_len=length, k_len=length, depth=4, v_dim=3)
    out = dispatch.attention(q, k, v, is_causal=True, **names)
    ref = reference_fn(None, True, **names)(q, k, v, None)
    assert rel_err(out, ref) < error_bound(0.0, reduction_length(q, k, v), out.dtype)
  for implementation in dispatch.FAST_PATHS:
    with pytest.raises(errors.BadInput, match="'fake'"):
      dispatch.attention(q, k, v, implementation=implementation, **names)
  for module in (blockwise, factored):
    with pytest.raises(ValueError, match="fake"):
      module.attention(q, k, v, **names)


def test_auto_choice_by_shape_and_backend():
  choose = dispatch.choose_implementation
  assert choose(16, 16, "rms_head", "mlp", backend="cpu") == "reference"
  assert choose(36, 36, "rms_head", "mlp", backend="cpu") == "blockwise"
  assert choose(1024, 1024, "rms_head", "mlp", backend="cpu") == "blockwise"
  # Blockwise on GPU too, unless the fused kernels run the call there (`fused`) and are
  # faster for its shape (tests/ops/test_kernel_cost.py).
  assert choose(1024, 1024, "rms_head", "mlp", backend="gpu") == "blockwise"
  assert choose(1024, 1024, "rms_head", "mlp", backend="tpu") == "blockwise"
  assert choose(4096, 4096, "rms_head", "deep_mlp", backend="gpu") == "reference"
  timed = dict(backend="gpu", batch=4, causal=True)
  assert choose(4096, 4096, "rms_head", "mlp", fused=True, **timed) == "mosaic"
  assert choose(4096, 4096, "rms_head", "mlp", **timed) == "blockwise"


class _Hopper:
  platform, compute_capability, device_kind = "gpu", "9.0", "NVIDIA H100 (pretend)"


def test_auto_takes_the_fused_kernels_only_on_hopper_for_what_they_run(monkeypatch):
  """`runs_here` is False off Hopper (this CPU); on a (pretend) Hopper, False for float32,
  anything but HYLA with relu, a bias, dropout, a query-dependent mask or tiles that do not
  fit; and `auto` then calls the kernels where `kernel_cost` says they are faster."""
  zeros = lambda *shape, dtype=jnp.bfloat16: jnp.zeros(shape, dtype)
  q = zeros(1, 32, 8, 64)
  hyla = ("rms_head", "mlp", "relu")
  assert not mosaic_kernel.runs_here(q, q, *hyla)
  monkeypatch.setattr(mosaic_kernel.jax, "devices", lambda: [_Hopper()])
  assert mosaic_kernel.runs_here(q, q, *hyla)
  assert mosaic_kernel.runs_here(q, q, *hyla, mask=zeros(1, 1, 1, 32, dtype=bool))
  assert not mosaic_kernel.runs_here(q.astype(jnp.float32), q, *hyla)
  assert not mosaic_kernel.runs_here(q, q, "rms_head", "mlp", "gelu")
  assert not mosaic_kernel.runs_here(q, q, "softmax", "mlp", "relu")
  assert not mosaic_kernel.runs_here(q, q, *hyla, bias=zeros(1, 8, 32, 32))
  assert not mosaic_kernel.runs_here(q, q, *hyla, dropout_rate=0.1)
  assert not mosaic_kernel.runs_here(q, q, *hyla, mask=zeros(1, 1, 32, 32, dtype=bool))
  assert not mosaic_kernel.runs_here(zeros(1, 32, 32, 128), zeros(1, 32, 32, 128), *hyla)

  calls = []
  def kernel(query, key, value, **kwargs):
    calls.append(kwargs)
    return jnp.zeros(query.shape[:3] + value.shape[-1:], query.dtype)
  monkeypatch.setattr(mosaic_kernel, "attention", kernel)
  run = lambda x, **kw: dispatch.attention(x, x, x, is_causal=True, **kw)
  run(q)  # 32 keys: below kernel_cost.MIN_KEYS, blockwise
  assert not calls
  monkeypatch.setattr(kernel_cost, "MIN_KEYS", 32)
  monkeypatch.setattr(kernel_cost, "BLOCKWISE_FLOOR_MS", 1.0)  # as if blockwise were slow here
  run(q.astype(jnp.float32))
  run(q, dropout_rate=0.1, dropout_seed=jnp.int32(0))
  assert not calls
  run(q)
  assert len(calls) == 1 and calls[0]["is_causal"]


@pytest.mark.parametrize("kwargs,word", [
    (dict(implementation="flash"), "implementation"),
    (dict(normalization="layer"), "normalization"),
    (dict(value_network="conv"), "value_network"),
    (dict(activation="swish"), "activation"),
    (dict(bias=np.zeros((4, 4, 4))), "bias"),
])
def test_bad_arguments_raise(kwargs, word):
  q, k, v, _, _, _ = make_inputs(8, q_len=4, k_len=4)
  impl = kwargs.pop("implementation", "blockwise")
  with pytest.raises(ValueError, match=word):
    dispatch.attention(q, k, v, implementation=impl, **kwargs)


@pytest.mark.parametrize("activation", ["relu", "gelu", "tanh", "identity"])
def test_reference_mlp_value_network_matches_formula_in_float64(x64, activation):
  """The reference's (re-laid-out) MLP value network and its autodiff gradients against an
  independent formula written with broadcast products instead of einsums, in float64."""
  rng = np.random.default_rng(3)
  code = jnp.asarray(rng.standard_normal((2, 3, 7, 5)))  # (B, H, Q, K)
  value = jnp.asarray(rng.standard_normal((2, 5, 3, 4)))  # (B, K, H, V)
  cot = jnp.asarray(rng.standard_normal((2, 7, 3, 4)))  # (B, Q, H, V)
  phi = reference.get_activation(activation)

  def formula(a, v):
    u = (a[:, :, :, :, None] * jnp.transpose(v, (0, 2, 1, 3))[:, :, None]).sum(1)  # BQKV
    return (a[..., None] * phi(u)[:, None]).sum(3).transpose(0, 2, 1, 3)  # BQHV

  out, vjp = jax.vjp(
      lambda a, v: reference.apply_value_network(a, v, "mlp", activation), code, value)
  want, want_vjp = jax.vjp(formula, code, value)
  np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)
  for got, expected in zip(vjp(cot), want_vjp(cot)):
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("heads,width", [(8, 2), (3, 4)])
def test_reference_deep_mlp_value_network_matches_formula_in_float64(x64, heads, width):
  """HYLA+'s value network (Eq. 10) and its gradients (code, values and W'_h) against broadcast
  products in float64, at H > V (the synthetic tasks' 8 heads of width 2, where the reference
  contracts each pair's (V, V) weight first) and H < V (per-head products first)."""
  rng = np.random.default_rng(4)
  code = jnp.asarray(rng.standard_normal((2, heads, 6, 5)))  # (B, H, Q, K)
  value = jnp.asarray(rng.standard_normal((2, 5, heads, width)))  # (B, K, H, V)
  weight = jnp.asarray(rng.standard_normal((heads, width, width)))  # (H, V, W)
  cot = jnp.asarray(rng.standard_normal((2, 6, heads, width)))  # (B, Q, H, V)
  relu = reference.get_activation("relu")

  def formula(a, v, w):
    a_BQKH = jnp.transpose(a, (0, 2, 3, 1))
    z = relu((a_BQKH[..., None] * v[:, None]).sum(3))  # BQKV
    mixed = (a_BQKH[..., None, None] * w * z[..., None, :, None]).sum((3, 4))  # BQKW
    z = relu(mixed)
    return (jnp.transpose(a, (0, 2, 1, 3))[..., None] * z[:, :, None]).sum(3)  # BQHV

  out, vjp = jax.vjp(lambda a, v, w: reference.apply_value_network(
      a, v, "deep_mlp", "relu", value_weight_HVV=w), code, value, weight)
  want, want_vjp = jax.vjp(formula, code, value, weight)
  np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)
  for got, expected in zip(vjp(cot), want_vjp(cot)):
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


def test_auto_on_faked_gpu_backend_runs_blockwise(monkeypatch):
  """With JAX reporting a GPU backend, `auto` HYLA calls blockwise, never the Mosaic kernel."""
  calls = []
  real_blockwise = blockwise.attention
  monkeypatch.setattr(blockwise, "attention",
                      lambda *a, **kw: calls.append("blockwise") or real_blockwise(*a, **kw))
  monkeypatch.setattr(mosaic_kernel, "attention",
                      lambda *a, **kw: calls.append("mosaic") or real_blockwise(*a, **kw))
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  q, k, v, _, _, _ = make_inputs(12, batch=1, q_len=40, k_len=40)
  dispatch.attention(q, k, v, is_causal=True, normalization="rms_head",
                     value_network="mlp", implementation="auto")
  assert calls == ["blockwise"]


@pytest.mark.parametrize("bias_shape", [(1, 3, 5, 7), (1, 1, 5, 7), (4, 3, 5, 7), (5, 7),
                                        (4, 1, 1, 7)])
def test_add_bias_gradient_is_the_broadcast_sum(bias_shape):
  """`reference.add_bias` sums a batch-shared bias's gradient as a matmul on CPU: it must
  equal the plain sum over every broadcast axis (numpy, float64)."""
  rng = np.random.default_rng(0)
  scores = jnp.asarray(rng.standard_normal((4, 3, 5, 7)), jnp.float32)
  bias = jnp.asarray(rng.standard_normal(bias_shape), jnp.float32)
  weight = rng.standard_normal((4, 3, 5, 7))
  loss = lambda s, b: jnp.sum(jnp.asarray(weight, jnp.float32) * reference.add_bias(s, b))
  d_scores, d_bias = jax.jit(jax.grad(loss, argnums=(0, 1)))(scores, bias)
  lead = weight.ndim - len(bias_shape)
  axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(bias_shape) if n == 1)
  expected = weight.sum(axis=axes, keepdims=True).reshape(bias_shape)
  assert d_bias.shape == bias_shape
  np.testing.assert_allclose(d_scores, weight.astype(np.float32), rtol=0, atol=0)
  # A sum of 4..12 float32 terms of size ~1: a few roundings.
  np.testing.assert_allclose(np.asarray(d_bias, np.float64), expected, rtol=0, atol=1e-5)
  np.testing.assert_allclose(reference.add_bias(scores, bias),
                             np.asarray(scores) + np.asarray(bias), rtol=0, atol=0)


@pytest.mark.parametrize("backend,length,tiles", [
    # Equal tiles no larger than the backend's: 130 = 5 x 26 = 3 x 44 on CPU (32 x 64), one
    # tile of 130 on a GPU (256; not 128 + 2 padded to 256), 2 x 150, 2 x 65 on a TPU (128).
    ("cpu", 130, (26, 44)), ("gpu", 36, (36, 36)), ("gpu", 130, (130, 130)),
    ("gpu", 300, (150, 150)), ("tpu", 130, (65, 65))])
def test_dispatched_blockwise_runs_the_backends_tiles_balanced(monkeypatch, backend, length,
                                                              tiles):
  configs, make_config = [], tiling.make_config
  monkeypatch.setattr(tiling, "make_config",
                      lambda *a, **kw: configs.append(make_config(*a, **kw)) or configs[-1])
  monkeypatch.setattr(jax, "default_backend", lambda: backend)
  q, k, v, _, _, _ = make_inputs(14, batch=1, q_len=length, k_len=length, heads=1, depth=4,
                                 v_dim=2)
  dispatch.attention(q, k, v, normalization="rms_head", value_network="mlp",
                     implementation="blockwise")
  assert [(c.block_q, c.block_k) for c in configs] == [tiles]


def _loops(jaxpr, found=None):
  """(primitive, trip count or None) of every scan / while loop, nested ones included."""
  found = [] if found is None else found
  for eqn in jaxpr.eqns:
    if eqn.primitive.name in ("scan", "while"):
      found.append((eqn.primitive.name, eqn.params.get("length")))
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      _loops(sub, found)
  return found


@pytest.mark.parametrize("implementation", ["reference", "factored", "blockwise"])
def test_members_under_vmap_add_no_loop(implementation):
  """A population maps its step over a leading member axis (`train/population.py`): the
  vmapped value-and-gradient has exactly the loops of one member's (same kinds, same static
  trip counts), so members batch into each op instead of running one after another. SRAVEN's
  shape per member (T=36, H=4, D=V=4), with dropout as it trains."""
  members = 3
  q, k, v, _, _, _ = make_inputs(15, batch=2, q_len=36, k_len=36, heads=4, depth=4, v_dim=4)
  stack = lambda x: jnp.stack([x] * members)
  loss = lambda q, k, v: jnp.sum(jnp.square(dispatch.attention(
      q, k, v, is_causal=True, implementation=implementation, dropout_rate=0.1,
      dropout_seed=jnp.int32(3))))
  grad = jax.grad(loss, (0, 1, 2))
  one = _loops(jax.make_jaxpr(grad)(q, k, v).jaxpr)
  population = _loops(jax.make_jaxpr(jax.vmap(grad))(stack(q), stack(k), stack(v)).jaxpr)
  assert population == one
  assert implementation != "blockwise" or one  # Blockwise's schedule is a scan.


def test_mosaic_is_asked_for_by_name_and_refuses_what_it_cannot_run():
  """The fused Hopper kernel: by name only (`auto` never takes it before it is measured),
  refusing in one line a pair it does not compute and, before compiling, any other device."""
  assert "mosaic" in presets.IMPLEMENTATIONS and "mosaic" not in dispatch.FAST_PATHS
  q = jnp.ones((1, 64, 8, 16), jnp.bfloat16)
  with pytest.raises(errors.BadInput, match="does not compute normalization='softmax'"):
    dispatch.attention(q, q, q, normalization="softmax", implementation="mosaic")
  if jax.devices()[0].platform == "cpu":
    with pytest.raises(errors.BadInput, match="needs a Hopper GPU"):
      dispatch.attention(q, q, q, implementation="mosaic")


@pytest.mark.parametrize("implementation", presets.IMPLEMENTATIONS)
def test_every_path_refuses_bad_operands_before_any_work(implementation):
  """Keys and values of different lengths, integer or bool operands and empty sequences are
  one BadInput line on every registered path, before a kernel (or Mosaic's device check) runs:
  blockwise had attended over the first 7 of 20 keys, and returned integers."""
  q, k, v = (jnp.ones((1, n, 2, 4)) for n in (5, 20, 7))
  cases = [
      ((q, k, v), r"value has length 7 \(axis 1, shape \(1, 7, 2, 4\)\); allowed: 20, the "
                  r"length of key"),
      ((q.astype(jnp.int32), k, k), "query has dtype int32; allowed: a floating dtype"),
      ((q, k, k.astype(bool)), "value has dtype bool; allowed: a floating dtype"),
      ((q[:, :0], k, k), r"query has length 0 \(shape \(1, 0, 2, 4\)\); allowed: at least one"),
      ((q, k[:, :0], k[:, :0]), r"key has length 0 .*allowed: at least one position"),
  ]
  for operands, message in cases:
    with pytest.raises(errors.BadInput, match=message) as refused:
      dispatch.attention(*operands, implementation=implementation)
    assert "\n" not in str(refused.value)
