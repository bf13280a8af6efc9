"""Values and gradients of every HYLA implementation against the float64 reference.

The first stage of a GPU window (`experiments/benchmark_attention.py --parity_only`,
`launch/gpu_window.py`): a kernel that computes the wrong function on the window's device
must stop the window before anything is timed. Implementations are read from
`presets.IMPLEMENTATIONS` when called, so a kernel added there is checked without an edit.

The bound is tests/numerics.py's rule: the float32 reference's own error against float64, `err32`,
measures the input's conditioning at float32 rounding; any summation order of a correct kernel stays
within max(sqrt(n) err32, n u32, four roundings of a bfloat16 output), n the longest reduction (keys
x width x heads), while a wrong mask, head axis or gradient is off by O(0.1-1). Matmuls run at full
float32 precision (XLA:GPU's default TF32 would make `err32` 1000x looser)."""

from __future__ import annotations

import functools
import math
from typing import Callable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from hypernet_attention import errors
from hypernet_attention import presets
from hypernet_attention.ops import dispatch
from hypernet_attention.ops import reference

U_FLOAT32 = 2.0**-24
HYLA = dict(normalization="rms_head", value_network="mlp", activation="relu")
QUANTITIES = ("out", "dq", "dk", "dv")
NARROW_SLACK = 2.0


def hyla_implementations() -> tuple[str, ...]:
  """Every implementation `dispatch` can be asked for by name, but the reference itself."""
  return tuple(n for n in presets.IMPLEMENTATIONS if n not in ("auto", "reference"))


def hyla_reference(q, k, v):
  """The spec, with the causal mask built here (independently of `dispatch`)."""
  causal_QK = np.tril(np.ones((q.shape[1], k.shape[1]), bool))
  return reference.attention(q, k, v, mask=causal_QK, **HYLA)


def value_and_grads(fn, q, k, v, cot) -> list[np.ndarray]:
  """[out, dq, dk, dv] of <fn(q, k, v), cot> as float64 numpy arrays, one compiled call."""
  def run(q, k, v):
    out, vjp = jax.vjp(fn, q, k, v)
    return (out, *vjp(cot.astype(out.dtype)))
  return [np.asarray(x, np.float64) for x in jax.jit(run)(q, k, v)]


def _rel(x: np.ndarray, exact: np.ndarray) -> float:
  return float(np.linalg.norm(x - exact) / max(np.linalg.norm(exact), 1e-30))


def check(seq_len: int, dtype: str, names: Sequence[str], *, batch: int, heads: int,
          head_dim: int, seed: int = 0) -> Iterator[dict]:
  """One row per implementation, yielded as each is measured (a window cut short keeps the
  rows it has: a kernel that compiles for minutes is named by the rows before it): relative
  error and bound of the output and each gradient, causal, on fresh normal inputs rounded
  to `dtype` (the exact answer is for those). A name is `dispatch`'s."""
  rng = np.random.default_rng([seed, seq_len])
  dims = (batch, seq_len, heads, head_dim)
  rounded = [np.asarray(jnp.asarray(rng.standard_normal(dims), dtype), np.float64)
             for _ in range(4)]  # q, k, v and the output's cotangent.
  inputs = [jnp.asarray(a, dtype) for a in rounded]
  n = seq_len * head_dim * heads
  floor = 4 * float(jnp.finfo(dtype).eps) / 2 if dtype == "bfloat16" else 0.0
  with jax.default_matmul_precision("float32"):
    with jax.enable_x64(True):
      exact = value_and_grads(hyla_reference, *(jnp.asarray(a, jnp.float64) for a in rounded))
    ref32 = value_and_grads(hyla_reference, *(jnp.asarray(a, jnp.float32) for a in rounded))
    bounds = [max(math.sqrt(n) * _rel(r, e), n * U_FLOAT32, floor) for r, e in zip(ref32, exact)]
    if dtype != "float32":
      # A kernel that keeps per-pair intermediates in the narrow dtype (blockwise: u, z,
      # dz, du in bf16, accumulation in f32) may err NARROW_SLACK times as much as the
      # reference run on the same narrow inputs (tests/numerics.py, assert_close_narrow).
      narrow = value_and_grads(hyla_reference, *inputs)
      bounds = [max(b, NARROW_SLACK * _rel(r, e)) for b, r, e in zip(bounds, narrow, exact)]
    for name in names:
      row = dict(implementation=name, seq_len=seq_len, dtype=dtype, batch=batch, heads=heads,
                 head_dim=head_dim, causal=True)
      try:
        # Causal HYLA through `dispatch` by name (it refuses a name it lacks).
        got = value_and_grads(functools.partial(
            dispatch.attention, is_causal=True, implementation=name, **HYLA), *inputs)
      except Exception as err:  # pylint: disable=broad-except
        # A kernel that refuses this device or dtype in one line (BadInput: e.g. `mosaic`
        # off Hopper) is not wrong: "unsupported". One that does not compile here is an
        # "error" row, named; either way the check goes on (only "fail" stops `run`).
        refused = isinstance(err, errors.BadInput)
        yield {**row, "status": "unsupported" if refused else "error",
               "message": f"{type(err).__name__}: {str(err).strip()[:300]}"}
        continue
      for quantity, x, e, bound in zip(QUANTITIES, got, exact, bounds):
        row[f"{quantity}_err"], row[f"{quantity}_bound"] = _rel(x, e), bound
      worst = max(row[f"{q}_err"] / row[f"{q}_bound"] for q in QUANTITIES)
      row["worst_err_over_bound"] = worst
      row["status"] = "pass" if worst < 1 else "fail"
      yield row


def run(seq_lens: Sequence[int], dtype: str, *, batch: int, heads: int, head_dim: int,
        names: Sequence[str] | None = None, on_row: Callable[[dict], None] = lambda r: None,
        log: Callable[[str], None] = print) -> list[dict]:
  """float32 at the shortest T (the tightest check of the math), then `dtype` at every T;
  stops at the first wrong answer ("fail": the window times nothing after it). A kernel
  that does not compile ("error") is recorded and the others are still checked."""
  names = hyla_implementations() if names is None else names
  cases = [(min(seq_lens), "float32")] if dtype != "float32" else []
  cases += [(t, dtype) for t in seq_lens]
  rows = []
  for seq_len, case_dtype in cases:
    for row in check(seq_len, case_dtype, names, batch=batch, heads=heads, head_dim=head_dim):
      rows.append(row)
      on_row(row)
      measured = ", ".join(f"{q} {row[q + '_err']:.2e}/{row[q + '_bound']:.2e}"
                           for q in QUANTITIES if q + "_err" in row)
      log(f"parity T={seq_len} {case_dtype} {row['implementation']}: "
          f"{measured or row.get('message')}  {row['status']}")
      if row["status"] == "fail":
        return rows
  return rows
