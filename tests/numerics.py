"""How close a float32/bfloat16 attention kernel must be to the exact answer (not a test module).

The rule, and why it holds on any x86 CPU:
  Every implementation (reference einsums, blockwise tiles, Pallas kernels) computes the same
  function with different summation orders. Standard error analysis bounds any ordering by
  kappa * gamma_n, where kappa is the input's condition number, n the length of the longest
  reduction feeding one output entry and gamma_n ~ n * u (u: unit roundoff of the accumulation
  dtype); rounding that behaves like a random walk gives kappa * u * O(sqrt(n)) instead. We do
  not know kappa (RMSHead's gradient amplifies rounding when a pair's scores are ~0 across
  heads), but the float32 *reference's* own error against float64, `err32`, measures
  kappa * u * O(sqrt(n)) for exactly this input. So

      bound = max(sqrt(n) * err32, n * u_accumulate, output_floor)

  admits the worst-case reordering (kappa * n * u) whatever the CPU's vector width, FMA use or
  thread split, while a real bug (a wrong mask, a missing bias, a transposed head axis) is off by
  O(0.1-1) and fails by orders of magnitude: `tests/ops/test_ops.py::test_planted_bugs_fail` plants
  such bugs and checks the margin. `output_floor` is four roundings of the output dtype (only
  bfloat16 outputs need it). Errors are relative: ||x - exact|| / ||exact|| over the whole array.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np

U_FLOAT32 = 2.0**-24  # Unit roundoff of float32: all kernels accumulate in float32.


def rel_err(x, ref) -> float:
  x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
  return float(np.linalg.norm(x - ref) / max(np.linalg.norm(ref), 1e-30))


def reduction_length(q, k, v) -> int:
  """Longest reduction into one entry of the output or a gradient: keys x width x heads."""
  return k.shape[1] * max(q.shape[-1], v.shape[-1]) * q.shape[2]


def error_bound(err32: float, n: int, out_dtype) -> float:
  """The rule above for one quantity whose float32 reference is `err32` from exact."""
  output_floor = 4 * float(jnp.finfo(out_dtype).eps) / 2 if out_dtype == jnp.bfloat16 else 0.0
  return max(math.sqrt(n) * err32, n * U_FLOAT32, output_floor)


def value_and_grads(fn, q, k, v, bias, cot):
  """Output and d<out, cot>/d(q, k, v[, bias]) from one compiled function."""
  def run(q, k, v, bias):
    primals = (q, k, v) if bias is None else (q, k, v, bias)
    out, vjp = jax.vjp(lambda *a: fn(*a, *(() if bias is not None else (None,))), *primals)
    return out, vjp(cot.astype(out.dtype))
  return jax.jit(run)(q, k, v, bias)


def float64_value_and_grads(fn, q, k, v, bias, cot):
  """`value_and_grads` of `fn` with every input (and the computation) in float64."""
  previous = jax.config.jax_enable_x64
  jax.config.update("jax_enable_x64", True)
  try:
    as64 = lambda x: None if x is None else jnp.asarray(np.asarray(x, np.float64))
    result = value_and_grads(fn, as64(q), as64(k), as64(v), as64(bias), as64(cot))
    return jax.tree.map(np.asarray, result)
  finally:
    jax.config.update("jax_enable_x64", previous)


NAMES = ("out", "dq", "dk", "dv", "dbias")


def compare(fn, ref_fn, inputs) -> dict[str, tuple[float, float]]:
  """{quantity: (error of `fn`, bound)} for the output and every gradient.

  Exact = `ref_fn` in float64; err32 = `ref_fn` in float32 on the same (possibly bf16) inputs.
  """
  q, k, v, bias, _, cot = inputs
  out, grads = value_and_grads(fn, q, k, v, bias, cot)
  as32 = lambda x: None if x is None else x.astype(jnp.float32)
  ref32 = value_and_grads(ref_fn, as32(q), as32(k), as32(v), as32(bias), as32(cot))
  ref64 = float64_value_and_grads(ref_fn, q, k, v, bias, cot)
  n = reduction_length(q, k, v)
  result = {}
  for name, x, r32, r64 in zip(NAMES, (out, *grads), (ref32[0], *ref32[1]),
                               (ref64[0], *ref64[1])):
    assert x.shape == r64.shape, (name, x.shape, r64.shape)
    result[name] = (rel_err(x, r64), error_bound(rel_err(r32, r64), n, x.dtype))
  return result


def assert_close(fn, ref_fn, inputs) -> None:
  """Every quantity of `fn` within its bound (the rule in the module docstring)."""
  for name, (err, bound) in compare(fn, ref_fn, inputs).items():
    assert err < bound, f"{name}: relative error {err:.3g} >= bound {bound:.3g}"


def assert_close_narrow(fn, ref_fn, inputs, slack: float = 2.0) -> None:
  """`assert_close` for a kernel that keeps its per-pair intermediates in the inputs' narrow
  dtype (blockwise with bf16 inputs: the hidden u, z, dz, du and the code operands are bf16,
  accumulation float32). Rounding those to bf16 costs more than the rule above allows for
  float32 intermediates; the reference run on the same bf16 inputs rounds its intermediates
  to bf16 too, so each quantity may also be off by `slack` times that reference's own error
  (both against float64). A bug (O(0.1-1)) still fails: the float32 and float64 tests check
  the same tile logic at full precision.
  """
  q, k, v, bias, _, cot = inputs
  narrow = value_and_grads(ref_fn, q, k, v, bias, cot)
  exact = float64_value_and_grads(ref_fn, q, k, v, bias, cot)
  for (name, (err, bound)), r16, r64 in zip(compare(fn, ref_fn, inputs).items(),
                                            (narrow[0], *narrow[1]), (exact[0], *exact[1])):
    bound = max(bound, slack * rel_err(r16, r64))
    assert err < bound, f"{name}: relative error {err:.3g} >= bound {bound:.3g}"
