"""What the blockwise program asks an accelerator for, read from its HLO on the CPU.

Issue 41 measured blockwise HYLA on an H100/H200 at 10-55x cuDNN softmax and found two
causes that show in the program itself, so a CPU can check them:
  - loops of unknown trip count (the causal stop was a traced bound): XLA:GPU runs such a
    while loop by copying its predicate to the host and waiting, on every iteration;
  - float32 per-pair tensors (B, bq, bk, V) for bf16 inputs: V times the score tile, the
    HBM traffic that dominates the step at C4's batch.
Shapes are chosen so that no other tensor has the per-pair tensor's sizes (B=2, bq=16,
bk=8, V=5; H=3, D=4, T=48).
"""

import re

import jax
import jax.numpy as jnp
import pytest

from hypernet_attention.ops import blockwise

B, T, H, D, V, BQ, BK = 2, 48, 3, 4, 5, 16, 8


def _programs(normalization):
  """{name: jitted fn} for the causal bf16 forward and forward+backward, and their specs."""
  fwd = lambda q, k, v: blockwise.attention(
      q, k, v, is_causal=True, normalization=normalization, value_network="mlp",
      block_q=BQ, block_k=BK)
  grad = jax.grad(lambda q, k, v: jnp.sum(fwd(q, k, v).astype(jnp.float32)), (0, 1, 2))
  qk = jax.ShapeDtypeStruct((B, T, H, D), jnp.bfloat16)
  v = jax.ShapeDtypeStruct((B, T, H, V), jnp.bfloat16)
  return {"forward": jax.jit(fwd), "forward+backward": jax.jit(grad)}, (qk, qk, v)


@pytest.mark.parametrize("normalization", ["rms_head", "softmax"])
def test_every_loop_has_a_trip_count_known_at_compile_time(normalization):
  """Every while loop of the compiled program carries XLA's `known_trip_count`.

  The criterion: XLA's WhileLoopTripCountAnnotator (run by the CPU and GPU pipelines alike)
  writes `"known_trip_count":{"n":...}` into a while loop's backend config when it can
  prove the count from a constant bound, as for a `lax.scan` or a `fori_loop` over Python
  ints; XLA:GPU's while thunk then runs the body that many times without reading the
  predicate back. A loop bounded by a traced value (the old causal `fori_loop`) has none.
  At least one loop must exist (the schedule has 12 tiles), or the check would be vacuous.
  """
  fns, specs = _programs(normalization)
  for name, fn in fns.items():
    hlo = fn.lower(*specs).compile().as_text()
    loops = [line for line in hlo.splitlines() if " while(" in line]
    assert loops, name
    unknown = [line.split(" = ")[0].strip() for line in loops
               if '"known_trip_count":{"n":' not in line]
    assert not unknown, f"{name}: while loops without a known trip count: {unknown}"


def _float32_shapes(stablehlo: str) -> set[tuple[int, ...]]:
  """Shapes of every float32 tensor type in a StableHLO module (`tensor<2x16x8x5xf32>`)."""
  return {tuple(map(int, dims.split("x")))
          for dims in re.findall(r"tensor<([0-9x]+)xf32>", stablehlo)}


@pytest.mark.parametrize("normalization", ["rms_head", "softmax"])
def test_no_float32_per_pair_tensor_for_bfloat16_inputs(normalization):
  """No float32 value of the per-pair shape (B, bq, bk, V), in any axis order, anywhere in
  the lowered program (StableHLO, before any backend pass).

  The criterion reads the lowered module, not the CPU's compiled one: XLA:CPU has no bf16
  matmul and computes every bf16 dot in float32 (its compiled HLO shows float32 buffers for
  any bf16 program), while the lowered module is what the GPU and TPU compilers receive;
  they run a bf16 -> bf16 dot with float32 accumulation and store bf16. The old code cast v
  to float32, so u, z, dz and du were float32 values of this shape.
  """
  per_pair = sorted((B, BQ, BK, V))
  fns, specs = _programs(normalization)
  for name, fn in fns.items():
    shapes = _float32_shapes(fn.lower(*specs).as_text())
    assert shapes, name  # The accumulators are float32: the parse found them.
    bad = [s for s in shapes if sorted(s) == per_pair]
    assert not bad, f"{name}: float32 per-pair tensors {bad}"
