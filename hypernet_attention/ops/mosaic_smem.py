"""What the Mosaic GPU HYLA kernels share: their SMEM buffers, Hopper's limits, layouts.

`mosaic_kernel.py` (forward, and the custom VJP) and `mosaic_kernel_bwd.py` (backward) both
build on these, so neither imports the other's internals: the import order is this module,
then the backward, then the forward, which wires the two into one differentiable op.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from hypernet_attention.errors import BadInput

HEADS_PADDED = 16  # wgmma K for 16-bit operands; also the padded head axis of V and C.
_F32 = jnp.float32


# Hopper's shared memory per thread block (227 KiB): what Mosaic's lowering checks a kernel
# against ("exceeds available shared memory: smem_bytes=... > max_smem_bytes=232448").
HOPPER_SMEM_BYTES = 232_448


# A TMA copy's SMEM address must be 128-byte aligned (PTX `cp.async.bulk.tensor`): each slot
# of a ring written by TMA spans a multiple of 128 bytes, though only its first bk are used.
# The first version's 64-byte slots put slot 1 off by 64: CUDA_ERROR_MISALIGNED_ADDRESS on
# every size of the H100 window of 2026-11-27 (measure/hopper_rules.py checks this on a CPU).
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


def selection_constants(heads: int, block_k: int, block_v: int, dtype):
  """P (bk, H*bk, 16): P[k, h*bk + k, h] = 1, so S_cat @ P[k] = C[k] (bq, 16) head-minor;
  B (H, 16, bv): B[h, h, :] = 1, so C[k] @ B[h] broadcasts column h over bv columns."""
  perm = np.zeros((block_k, heads * block_k, HEADS_PADDED), np.float32)
  for k in range(block_k):
    for h in range(heads):
      perm[k, h * block_k + k, h] = 1.0
  bcast = np.zeros((heads, HEADS_PADDED, block_v), np.float32)
  for h in range(heads):
    bcast[h, h, :] = 1.0
  return jnp.asarray(perm, dtype), jnp.asarray(bcast, dtype)


def forward_program(*, block_q: int, block_k: int, num_k_tiles: int, is_causal: bool,
                    mask_batched: bool):
  """Inside a forward's program (batch, q_tile, v_slice): (b, q0, vj, bm, steps): example,
  first query, value slice, mask row, and the key tiles it reads (all, or to the causal
  diagonal)."""
  import jax.experimental.pallas as pl  # pylint: disable=g-import-not-at-top
  b = jax.lax.axis_index("batch")
  q0 = jax.lax.axis_index("q_tile") * block_q
  steps = jnp.int32(num_k_tiles)
  if is_causal:
    steps = jnp.minimum(num_k_tiles, pl.cdiv(q0 + block_q, jnp.int32(block_k)))
  return b, q0, jax.lax.axis_index("v_slice"), b if mask_batched else 0, steps


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


def code_tile(q_smem, k_smem, kval_smem, k_bar, kval_bar, *, slot, q0, k0, is_causal: bool,
              scale: float, eps: float) -> list[jax.Array]:
  """RMSHead's code of one (bq, bk) tile inside a kernel, per head, float32 in the WGMMA
  layout: once ring slot `slot` has arrived, the H score wgmmas q_h k_h^T from Q (H, bq, D)
  and the slot's K (H, bk, D), the key mask (the slot's key validity) and the causal mask
  (masked pairs -> 0), then Eq. 7's normalization across heads. Both forwards start each
  key tile with it."""
  import jax.experimental.pallas as pl  # pylint: disable=g-import-not-at-top
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=g-import-not-at-top
  heads, bq, _ = q_smem.shape
  bk = k_smem.shape[2]
  plgpu.barrier_wait(k_bar.at[slot])
  plgpu.barrier_wait(kval_bar.at[slot])
  k_smem, kval_smem = k_smem.at[slot], kval_smem.at[slot, pl.ds(0, bk)]

  def scores(*accs):
    for h, acc in enumerate(accs):
      plgpu.wgmma(acc, q_smem.at[h], k_smem.at[h].transpose((1, 0)))
    return [acc[...] for acc in accs]

  s_h = pl.run_scoped(scores, *[plgpu.ACC((bq, bk), _F32) for _ in range(heads)])
  layout = plgpu.Layout.WGMMA
  valid = jax.lax.broadcast_in_dim(plgpu.load(kval_smem, layout=layout.reduce(0)),
                                   (bq, bk), [1])
  if is_causal:
    rows = plgpu.broadcasted_iota(jnp.int32, (bq, bk), 0, layout=layout)
    cols = plgpu.broadcasted_iota(jnp.int32, (bq, bk), 1, layout=layout)
    valid = jnp.where(q0 + rows >= k0 + cols, valid, 0.0)
  s_h = [s * (scale * valid) for s in s_h]
  inv_rms = jax.lax.rsqrt(sum(s * s for s in s_h) * (1.0 / heads) + eps)
  return [s * inv_rms for s in s_h]
