"""HYLA's forward with the value network on the CUDA cores, its per-pair tensors in registers.

Why a second forward: `mosaic_kernel.py`'s forward runs the value network on the tensor
cores, which needs the code head-minor per key; Mosaic could only build that by permutation
matmuls (S_cat @ P_k, C[k] @ B_h) that cost ~9x the value network's own work, and the
forward measured no faster than XLA (8.66 ms vs blockwise's 8.63 at T=4096, B=4, H=8,
D=V=64, bf16, causal, an H200, 2026-11-27). Here the code never leaves the registers the
score wgmmas leave it in, as flash attention keeps its scores, and the value network is
elementwise arithmetic in that same layout: no permutation, no SMEM round trip per key.

Program: (batch b, query tile of bq, value slice of bv columns). Per key tile of bk keys:
  s_h  = q_h k_h^T                                 H wgmmas, (bq, bk) f32 accumulators
  c_h  = s_h / rms_h(s)   (masked -> 0)            registers, all heads at hand (Eq. 7)
  for each column j of the slice:
    u_j  = sum_h c_h * v_hj[None, :]               (bq, bk): v_hj, key k's value of head h,
                                                   column j, broadcast down the rows
    z_j  = relu(u_j)
    y_hj += sum over 8-column chunks of c_h * z_j  (bq, 8) per (h, j): FMAs within a thread
At the end y_hj is summed over its 8 columns (the one cross-thread reduction) and stored.
Per pair and column that is 2H+1 multiply-adds, the value network's own count (Eqs. 6-7),
with no shuffles in the key loop.

What it trades: the scores are recomputed once per value slice (V / bv times), H*D
tensor-core multiply-adds per pair each time, against (2H+1)*bv vector ones; registers
bound bk and bv (per thread, bq=64: H*bk/2 for the code, H*bv*4 for y; ptxas's counts
beside `mosaic_kernel.REGISTERS_BLOCKS`, the largest tiles that do not spill). Which tiles
are fastest, and whether this beats the tensor-core forward at all, is for a GPU window to
measure (`launch/gpu_window.py`); until then `mosaic_kernel.attention` runs it only when
asked (`forward="registers"`).

The ceiling, by arithmetic: per causal pair HYLA's value network is (2H+1)V multiply-adds
forward and ~3.4x that backward (u and dz recomputed; dz, du, dc = dy z + du v, dv); at
T=4096, B=4, H=8, V=64 that is ~37 G forward and ~160 G in all: 1.1 ms and ~4.8 ms at an
H100's float32 CUDA-core peak (~33.5 T FMA/s), ~6.3x cuDNN's softmax fwd+bwd (0.76 ms on
an H200) before any overhead. A kernel within 4x of cuDNN needs packed 16-bit arithmetic (two
multiply-adds per instruction) for the per-pair work, near peak; this float32 forward is the
step that shows whether the layout runs near its floor at all.

Precision: scores, code, u, z and y in float32 from input-dtype operands (Q, K, V); the code
is not rounded to the input dtype (the tensor-core forward rounds it once).
Shape letters: B, H, Q, K, D, V as in `mosaic_kernel.py`; J value slices, Hv heads padded so
each V ring slot spans a multiple of 128 bytes (TMA's SMEM alignment).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from hypernet_attention.ops import mosaic_smem

_F32 = jnp.float32
CHUNK = 8  # columns per thread-local accumulator: the WGMMA layout's column tile


def heads_padded(heads: int, blocks, dtype) -> int:
  """Hv >= H so that one V ring slot (Hv, bv, bk) spans a multiple of 128 bytes."""
  row = blocks.block_v * blocks.block_k * jnp.dtype(dtype).itemsize
  unit = mosaic_smem.TMA_SMEM_ALIGNMENT // math.gcd(row, mosaic_smem.TMA_SMEM_ALIGNMENT)
  return mosaic_smem.round_up(heads, unit)


def smem(blocks, heads: int, depth: int, dtype) -> tuple[mosaic_smem.Buffer, ...]:
  """This forward's SMEM buffers, in the kernel's order (depth: D padded to 128-byte rows).
  At bq=64, bk=8, bv=4, H=8, D=64, bf16: ~82 KiB (Q 64, K ring 16), under half the other
  forward's: the code and the value network never touch SMEM."""
  bq, bk, bv = blocks.block_q, blocks.block_k, blocks.block_v
  return (
      mosaic_smem.Buffer("Q", (heads, bq, depth), dtype, depth),
      mosaic_smem.Buffer("K ring", (2, heads, bk, depth), dtype, depth),
      mosaic_smem.Buffer("V ring", (2, heads_padded(heads, blocks, dtype), bv, bk), dtype),
      mosaic_smem.Buffer("key validity ring", (2, mosaic_smem.key_valid_slot(bk)), _F32),
      mosaic_smem.Buffer("output", (heads, bv, bq), _F32),
  )


def _call(q_BHQD, k_BHKD, v_BJHVK, key_valid_BK, *, scale, is_causal, eps, blocks, interpret):
  """The kernel on padded inputs; V as (B, J, Hv, bv, Kp). Returns (B, J, H, bv, Qp) f32."""
  import jax.experimental.pallas as pl  # pylint: disable=g-import-not-at-top
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=g-import-not-at-top

  batch, heads, q_padded, depth = q_BHQD.shape
  num_slices, num_k_tiles = v_BJHVK.shape[1], k_BHKD.shape[2] // blocks.block_k
  bq, bk, bv = blocks.block_q, blocks.block_k, blocks.block_v
  mask_batched = key_valid_BK.shape[0] > 1
  along_rows = plgpu.Layout.WGMMA.reduce(0)  # a (bk,) vector by key, broadcast down rows

  def kernel(q_ref, k_ref, v_ref, kval_ref, out_ref, q_smem, k_smem, v_smem, kval_smem,
             o_smem, q_bar, k_bar, v_bar, kval_bar):
    b, q0, vj, bm, steps = mosaic_smem.forward_program(
        block_q=bq, block_k=bk, num_k_tiles=num_k_tiles, is_causal=is_causal,
        mask_batched=mask_batched)

    load_tile = functools.partial(
        mosaic_smem.copy_key_tile, refs=(k_ref, kval_ref), rings=(k_smem, v_smem, kval_smem),
        bars=(k_bar, v_bar, kval_bar), v_tile=lambda k0: v_ref.at[b, vj, :, :, pl.ds(k0, bk)],
        b=b, bm=bm)

    plgpu.copy_gmem_to_smem(q_ref.at[b, :, pl.ds(q0, bq)], q_smem, q_bar.at[0])
    for step in range(2):  # the two-slot ring's prologue
      pl.when(step < steps)(functools.partial(load_tile, step, step))
    plgpu.barrier_wait(q_bar.at[0])

    def key_tile(step, y_HJ):
      slot = jax.lax.rem(step, 2)
      c_h = mosaic_smem.code_tile(q_smem, k_smem, kval_smem, k_bar, kval_bar, slot=slot,
                                  q0=q0, k0=step * bk, is_causal=is_causal, scale=scale,
                                  eps=eps)
      plgpu.barrier_wait(v_bar.at[slot])
      y_HJ = list(y_HJ)
      for j in range(bv):
        u = sum(c * jax.lax.broadcast_in_dim(
            plgpu.load(v_smem.at[slot, h, j], layout=along_rows).astype(_F32), (bq, bk), [1])
                for h, c in enumerate(c_h))
        z = jnp.maximum(u, 0.0)
        for h, c in enumerate(c_h):
          cz = c * z
          y_HJ[h * bv + j] = sum((cz[:, i:i + CHUNK] for i in range(0, bk, CHUNK)),
                                 y_HJ[h * bv + j])

      # Every thread's reads of this slot (V, key validity) done before TMA overwrites it:
      # without this barrier interpret mode's race detector sees the prefetch race them.
      plgpu.commit_smem()

      @pl.when(step + 2 < steps)
      def _prefetch():  # this slot is free again: its wgmmas and loads have completed
        load_tile(step + 2, slot)

      return tuple(y_HJ)

    y_HJ = tuple(plgpu.layout_cast(jnp.zeros((bq, CHUNK), _F32), plgpu.Layout.WGMMA)
                 for _ in range(heads * bv))
    y_HJ = jax.lax.fori_loop(0, steps, key_tile, y_HJ)
    for h in range(heads):
      for j in range(bv):
        o_smem[h, j] = jnp.sum(y_HJ[h * bv + j], axis=1)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(o_smem, out_ref.at[b, vj, :, :, pl.ds(q0, bq)])
    plgpu.wait_smem_to_gmem(0)

  def entry(*refs):
    buffers = mosaic_smem.allocate(plgpu, smem(blocks, heads, depth, q_BHQD.dtype))
    barriers = (plgpu.Barrier(num_barriers=1), *(plgpu.Barrier(num_barriers=2)
                                                 for _ in range(3)))
    pl.run_scoped(lambda *scoped: kernel(*refs, *scoped), *buffers, *barriers)

  return plgpu.kernel(
      entry,
      out_type=jax.ShapeDtypeStruct((batch, num_slices, heads, bv, q_padded), _F32),
      grid=(batch, q_padded // bq, num_slices),
      grid_names=("batch", "q_tile", "v_slice"),
      interpret=interpret,
  )(q_BHQD, k_BHKD, v_BJHVK, key_valid_BK)


def forward(query_BQHD, key_BKHD, value_BKHV, mask, is_causal, eps, blocks, interpret):
  """Pads and lays out the inputs in XLA, runs the kernel, returns (B, Q, H, V) in the
  input dtype: `mosaic_kernel._forward`'s contract."""
  batch, q_len, heads, depth = query_BQHD.shape
  k_len, v_dim, dtype = key_BKHD.shape[1], value_BKHV.shape[-1], query_BQHD.dtype
  bq, bk, bv = blocks.block_q, blocks.block_k, blocks.block_v
  round_up = mosaic_smem.round_up
  q_padded, k_padded, v_padded = round_up(q_len, bq), round_up(k_len, bk), round_up(v_dim, bv)
  d_padded = mosaic_smem.depth_padded(depth, dtype)
  pad = lambda x, length, heads_to, width: jnp.pad(x, (
      (0, 0), (0, length - x.shape[1]), (0, heads_to - heads), (0, width - x.shape[3])))
  q_BHQD = jnp.transpose(pad(query_BQHD, q_padded, heads, d_padded), (0, 2, 1, 3))
  k_BHKD = jnp.transpose(pad(key_BKHD, k_padded, heads, d_padded), (0, 2, 1, 3))
  hv = heads_padded(heads, blocks, dtype)
  v_BJHVK = jnp.transpose(pad(value_BKHV, k_padded, hv, v_padded).reshape(
      batch, k_padded, hv, v_padded // bv, bv), (0, 3, 2, 4, 1))
  out_BJHVQ = _call(q_BHQD, k_BHKD, v_BJHVK, mosaic_smem.key_valid(mask, k_len, k_padded),
                    scale=1.0 / math.sqrt(depth), is_causal=is_causal, eps=eps, blocks=blocks,
                    interpret=interpret)
  out_BQHV = jnp.transpose(out_BJHVQ, (0, 4, 2, 1, 3)).reshape(batch, q_padded, heads, v_padded)
  return out_BQHV[:, :q_len, :, :v_dim].astype(dtype)
