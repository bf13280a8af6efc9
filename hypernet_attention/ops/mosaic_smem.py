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
