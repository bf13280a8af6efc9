"""What the Mosaic GPU HYLA kernels share: their SMEM buffers, Hopper's limits, layouts.

`mosaic_kernel.py` (forward, and the custom VJP) and `mosaic_kernel_bwd.py` (the backward's kernels)
both build on these, so neither imports the other's internals: the import order is this module, then
the backward, then the forward, which wires the two into one differentiable op."""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import jax
import jax.numpy as jnp

from hypernet_attention.errors import BadInput

_F32 = jnp.float32


# Hopper's shared memory per thread block (227 KiB): what Mosaic's lowering checks a kernel
# against ("exceeds available shared memory: smem_bytes=... > max_smem_bytes=232448").
HOPPER_SMEM_BYTES = 232_448


# A TMA copy's SMEM address must be 128-byte aligned (PTX `cp.async.bulk.tensor`): each slot
# of a ring written by TMA spans a multiple of 128 bytes, though only its first bk are used
# (measure/hopper_rules.py checks this on a CPU).
TMA_SMEM_ALIGNMENT = 128


@dataclasses.dataclass(frozen=True)
class Buffer:
  """One SMEM buffer of a kernel: its shape, dtype and, for a wgmma operand, the minor
  dimension its tiling and swizzle are made for (None: plain)."""
  name: str
  shape: tuple[int, ...]
  dtype: jnp.dtype
  swizzled_minor: Optional[int] = None

  @property
  def nbytes(self) -> int:
    return math.prod(self.shape) * jnp.dtype(self.dtype).itemsize


def check_tiles(buffers, what: str) -> None:
  """BadInput in one line, before lowering, for tiles compiled Mosaic cannot take: a swizzled
  operand whose rows are under 32 bytes (Mosaic's smallest swizzle; e.g. block_k = 8 in
  bf16) and buffers over Hopper's shared memory. The sum is a lower bound of what Mosaic
  allocates (it adds barriers and alignment: ~1-3 KiB), so nothing that fits is refused.
  Interpret mode has neither limit (its float32 tests use tiles that would not fit)."""
  for b in buffers:
    row_bytes = None if b.swizzled_minor is None else (
        b.swizzled_minor * jnp.dtype(b.dtype).itemsize)
    if row_bytes is not None and (min(128, row_bytes) not in (32, 64, 128)
                                  or row_bytes % min(128, row_bytes)):
      raise BadInput(f"{what}: SMEM buffer {b.name} {b.shape} has {row_bytes}-byte rows; "
                     "allowed: 32, 64 or a multiple of 128 (Mosaic's swizzles), e.g. "
                     "block_k and block_v of 16, 32 or a multiple of 64 for 16-bit inputs")
  total = sum(b.nbytes for b in buffers)
  if total > HOPPER_SMEM_BYTES:
    largest = ", ".join(f"{b.name} {b.nbytes // 1024} KiB" for b in
                        sorted(buffers, key=lambda b: -b.nbytes)[:3])
    raise BadInput(f"{what}: needs at least {total:,} bytes of shared memory ({largest}, "
                   f"...); allowed: at most {HOPPER_SMEM_BYTES:,} (Hopper, 227 KiB)")


def allocate(plgpu, buffers):
  return tuple(plgpu.SMEM(b.shape, b.dtype, transforms=() if b.swizzled_minor is None
                          else smem_transforms(plgpu, b.swizzled_minor, b.dtype))
               for b in buffers)


def smem_transforms(plgpu, minor: int, dtype):
  """Tiling and swizzle for a wgmma operand whose minor dimension is `minor` elements."""
  swizzle = min(128, minor * jnp.dtype(dtype).itemsize)
  return (plgpu.TilingTransform((8, swizzle // jnp.dtype(dtype).itemsize)),
          plgpu.SwizzleTransform(swizzle))


def round_up(n: int, m: int) -> int:
  return -(-n // m) * m


def depth_padded(depth: int, dtype) -> int:
  """D padded with zeros (scores unchanged) to a multiple of one 128-byte swizzle row: the
  width both forwards lay Q and K out in, and so what `check_tiles` budgets."""
  return round_up(depth, 128 // jnp.dtype(dtype).itemsize)


def heads_padded(heads: int, per_head: int, dtype) -> int:
  """Hv >= H so that one ring slot of Hv heads, `per_head` elements each, spans a multiple
  of 128 bytes (TMA's SMEM alignment); the padded heads are zeros."""
  row = per_head * jnp.dtype(dtype).itemsize
  return round_up(heads, TMA_SMEM_ALIGNMENT // math.gcd(row, TMA_SMEM_ALIGNMENT))


def key_valid_slot(block_k: int) -> int:
  """Floats in one slot of a key-validity ring: block_k, rounded up to 128 bytes."""
  return round_up(block_k, TMA_SMEM_ALIGNMENT // 4)  # float32


def key_valid(mask, k_len: int, k_padded: int) -> jax.Array:
  """(Bm, Kp) float32: 1 where key k may be attended, 0 for masked and padded keys."""
  if mask is None:
    valid = jnp.ones((1, k_len), _F32)
  else:
    shape = (1,) * (4 - mask.ndim) + tuple(mask.shape)
    mask4 = mask.reshape(shape)
    valid = jnp.broadcast_to(mask4[:, 0, 0, :], (shape[0], k_len)).astype(_F32)
  return jnp.pad(valid, ((0, 0), (0, k_padded - k_len)))


def query_program(*, block_q: int, block_k: int, num_q_tiles: int, num_k_tiles: int,
                  is_causal: bool, mask_batched: bool):
  """Inside a program whose rows are queries (grid: batch, q_tile, and a third axis): (b, q0, bm,
  steps): example, first query, mask row, and the key tiles it reads (all, or to the causal
  diagonal). Causal, the query tiles run last first: the GPU starts the CTAs in grid order, and
  the longest (the last queries, which read every key) would otherwise start last and run alone
  (modeled: kernels.md)."""
  import jax.experimental.pallas as pl  # pylint: disable=g-import-not-at-top
  b = jax.lax.axis_index("batch")
  q_tile = jax.lax.axis_index("q_tile")
  q0 = (num_q_tiles - 1 - q_tile if is_causal else q_tile) * block_q
  steps = jnp.int32(num_k_tiles)
  if is_causal:
    steps = jnp.minimum(num_k_tiles, pl.cdiv(q0 + block_q, jnp.int32(block_k)))
  return b, q0, b if mask_batched else 0, steps


def copy_key_tile(step, slot, *, refs, rings, bars, v_tile, b, bm) -> None:
  """TMA copies of a forward's key tile `step` into ring slot `slot`: K (H, bk, D) of
  example b, V's tile `v_tile(k0)` (each forward lays V out its own way) and the key
  validity (bk,) of mask row bm. refs: (K, key validity) in HBM; rings and bars: (K, V,
  key validity) SMEM rings and their barriers."""
  import jax.experimental.pallas as pl  # pylint: disable=g-import-not-at-top
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=g-import-not-at-top
  (k_ref, kval_ref), (k_smem, v_smem, kval_smem), (k_bar, v_bar, kval_bar) = refs, rings, bars
  bk = k_smem.shape[2]
  k0 = step * bk
  plgpu.copy_gmem_to_smem(k_ref.at[b, :, pl.ds(k0, bk)], k_smem.at[slot], k_bar.at[slot])
  plgpu.copy_gmem_to_smem(v_tile(k0), v_smem.at[slot], v_bar.at[slot])
  plgpu.copy_gmem_to_smem(kval_ref.at[bm, pl.ds(k0, bk)], kval_smem.at[slot, pl.ds(0, bk)],
                          kval_bar.at[slot])


# Columns per thread-local accumulator: the WGMMA layout's column tile. A (rows, 8) float32
# accumulator sums a (rows, N) tile over its columns with FMAs inside each thread, no
# shuffles; the one cross-thread sum happens once, at the end (`store_row_sums`).
CHUNK = 8


def chunk_accumulators(rows: int, count: int) -> tuple[jax.Array, ...]:
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=g-import-not-at-top
  return tuple(plgpu.layout_cast(jnp.zeros((rows, CHUNK), _F32), plgpu.Layout.WGMMA)
               for _ in range(count))


def add_chunks(acc: jax.Array, x: jax.Array) -> jax.Array:
  """acc (rows, 8) plus x (rows, N) summed over its 8-column chunks, in-thread."""
  return sum((x[:, i:i + CHUNK] for i in range(0, x.shape[1], CHUNK)), acc)


def swap_pairs(x: jax.Array, interpret) -> jax.Array:
  """x (rows, N) in the WGMMA layout with each pair of columns (2m, 2m+1) exchanged. One thread
  holds both columns of a pair (the layout's 2-vectors), so nothing moves between threads and ptxas
  only renames registers; Mosaic's layout inference cannot express it in jnp (a reshape, or slices
  and a concatenate: "Failed to infer a possible set of layouts", jax 0.11.2), so compiled it is
  inline Mosaic GPU, which interpret mode cannot run: there it is the same exchange in jnp."""
  rows, width = x.shape
  if interpret:
    return x.reshape(rows, width // 2, 2)[..., ::-1].reshape(rows, width)
  import jax.experimental.mosaic.gpu as mgpu  # pylint: disable=g-import-not-at-top
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=g-import-not-at-top
  from jaxlib.mlir.dialects import vector  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  wgmma = plgpu.Layout.WGMMA

  @plgpu.inline_mgpu(arg_types=(wgmma,),
                     return_type=plgpu.ShapeDtypeStruct(x.shape, x.dtype, layout=wgmma))
  def swapped(_ctx, fragments):
    if fragments.layout.vector_length != 2:  # a pair per register is what makes it free
      raise ValueError(f"swap_pairs needs 2-vectors per register, got {fragments.layout}")
    registers = np.empty_like(fragments.registers)
    for index, pair in np.ndenumerate(fragments.registers):
      registers[index] = vector.shuffle(pair, pair, [1, 0])
    return mgpu.FragmentedArray(_registers=registers, _layout=fragments.layout, _is_signed=None)
  return swapped(x)


def store_row_sums(accs, o_smem, dst, paired: bool = False) -> None:
  """Each accumulator's row sums into o_smem (H, J, rows), in order, then one TMA store to
  the HBM ref `dst`. `paired`: each accumulator holds two columns j, j+1, in its even and
  its odd columns (`mosaic_kernel.Blocks.paired`)."""
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=g-import-not-at-top
  heads, per_head = o_smem.shape[:2]
  if paired:
    rows = o_smem.shape[2]
    even = plgpu.broadcasted_iota(jnp.int32, (rows, CHUNK), 1, layout=plgpu.Layout.WGMMA) % 2 == 0
    for h in range(heads):
      for p in range(per_head // 2):
        acc = accs[h * (per_head // 2) + p]
        o_smem[h, 2 * p] = jnp.sum(jnp.where(even, acc, 0.0), axis=1)
        o_smem[h, 2 * p + 1] = jnp.sum(jnp.where(even, 0.0, acc), axis=1)
  else:
    for h in range(heads):
      for j in range(per_head):
        o_smem[h, j] = jnp.sum(accs[h * per_head + j], axis=1)
  plgpu.commit_smem()
  plgpu.copy_smem_to_gmem(o_smem, dst)
  plgpu.wait_smem_to_gmem(0)


def scores_tile(a_smem, b_smem):
  """H score wgmmas a_h b_h^T inside a kernel: a (H, M, D) and b (H, N, D) in SMEM, each (M, N)
  float32 in the WGMMA layout. The forwards and the dS kernel pass (Q, K); the dV kernel (K, Q), so
  that its rows are keys."""
  import jax.experimental.pallas as pl  # pylint: disable=g-import-not-at-top
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=g-import-not-at-top
  heads, rows, _ = a_smem.shape

  def scores(*accs):
    for h, acc in enumerate(accs):
      plgpu.wgmma(acc, a_smem.at[h], b_smem.at[h].transpose((1, 0)))
    return [acc[...] for acc in accs]

  return pl.run_scoped(scores, *[plgpu.ACC((rows, b_smem.shape[1]), _F32) for _ in range(heads)])


def causal(valid, *, q0, k0, keys_are_rows: bool = False):
  """`valid` (M, N) with the pairs whose query precedes the key set to 0; q0 and k0 the
  tile's first query and key, rows queries (or keys, if keys_are_rows)."""
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=g-import-not-at-top
  rows = plgpu.broadcasted_iota(jnp.int32, valid.shape, 0, layout=plgpu.Layout.WGMMA)
  cols = plgpu.broadcasted_iota(jnp.int32, valid.shape, 1, layout=plgpu.Layout.WGMMA)
  if keys_are_rows:
    return jnp.where(q0 + cols >= k0 + rows, valid, 0.0)
  return jnp.where(q0 + rows >= k0 + cols, valid, 0.0)


def rms_code(s_h, valid, *, scale: float, eps: float):
  """Eq. 7 on one tile, per pair across heads: (c_h, inv_rms) from the raw scores s_h and the 0/1
  validity of each pair (masked pairs: c = 0; their inv_rms, finite, is unused). Scale and validity
  fold into one factor per pair: one multiply per head and pair, not two."""
  inv_rms = jax.lax.rsqrt(sum(s * s for s in s_h) * (scale * scale / len(s_h)) + eps)
  factor = inv_rms * (scale * valid)
  return [s * factor for s in s_h], inv_rms


def code_tile(q_smem, k_smem, kval_smem, k_bar, kval_bar, *, slot, q0, k0, is_causal: bool,
              scale: float, eps: float):
  """RMSHead's code of one (bq, bk) tile inside a kernel whose rows are queries: once ring slot
  `slot` has arrived, the scores of Q (H, bq, D) and the slot's K (H, bk, D), the key mask (the
  slot's key validity) and the causal mask, then Eq. 7 (`rms_code`): (c_h, inv_rms) float32 in the
  WGMMA layout. The forward and the dS kernel start each key tile with it."""
  import jax.experimental.pallas as pl  # pylint: disable=g-import-not-at-top
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=g-import-not-at-top
  bq, bk = q_smem.shape[1], k_smem.shape[2]
  plgpu.barrier_wait(k_bar.at[slot])
  plgpu.barrier_wait(kval_bar.at[slot])
  s_h = scores_tile(q_smem, k_smem.at[slot])
  valid = jax.lax.broadcast_in_dim(plgpu.load(
      kval_smem.at[slot, pl.ds(0, bk)], layout=plgpu.Layout.WGMMA.reduce(0)), (bq, bk), [1])
  if is_causal:
    valid = causal(valid, q0=q0, k0=k0)
  return rms_code(s_h, valid, scale=scale, eps=eps)
