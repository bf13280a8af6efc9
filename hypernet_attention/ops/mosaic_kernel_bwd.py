"""HYLA backward as a key-stationary Pallas Mosaic GPU kernel plus two XLA matmuls (issue 42).

The forward is `mosaic_kernel.py` (read its docstring first: the layouts and what Mosaic can
and cannot express carry over). For every pair (q, k) and head h, with s = scores * scale
(masked -> 0), r = rsqrt(mean_h s^2 + eps), c = s r (the code), u_k = C[k] V[k] (heads
contracted), z = relu(u) and dy the output's cotangent:

  dz_qk   = sum_h c_h dy_qh                       (the read-out's gradient into z)
  du_qk   = dz_qk * [u_qk > 0]
  dc_h    = <dy_qh, z_qk> + <du_qk, V[k]_h>       (read-out and value network into c)
  ds_h    = r (dc_h - c_h <c, dc> / H)            (RMSHead's Jacobian, per pair)
  dV[k]_h = sum_q c_h du_qk                       (accumulated on chip)
  dS      = scale * ds                            (w.r.t. the raw q.k products)
  dQ = dS K, dK = dS^T Q                          (XLA matmuls over the written dS)

A masked or padded pair has s = 0, so c = u = z = 0 and dc = 0: its dS is exactly 0 with no
mask in the backward (the mask acts through the recomputed scores, as in the reference).

Where it runs. One program per (batch b, key tile of bk = 16 keys); K, V (heads padded to 16)
and the permutation P load once, then the program loops over the query tiles that may see its
keys (causal: from the tile holding k0) and, per query tile:
  scores   s_h = q_h k_h^T, masked, scaled       H wgmmas (bq x W) @ (W x bk) -> S_cat
  dy       the tile's cotangent, loaded into the SMEM buffer Q used (Q is consumed by then)
  per key k of the tile (unrolled: each key keeps its own dV accumulator):
    s[k]   = S_cat @ P_k                         wgmma, exact permutation -> (bq, 16) head-minor
    c      = s * rsqrt(sum_h s^2 / H + eps)      registers (row reductions)
    u      = C[k] @ V[k]                         wgmma
    dz, dc_read                                  registers: per head, a masked row sum of c
                                                 broadcast over W, and a row sum of dy_h * z
    dc_val = du @ V[k]^T                         wgmma (transposed B, like the scores' K)
    dV[k]^T += du^T @ C[k]                       wgmma (transposed A; M = W, a multiple of 64)
    dS[k]  -> HBM as (B, Kp, Qp, 16)             TMA store from a two-slot SMEM ring
After the loop each key's dV^T (W, 16) is stored. XLA then computes dQ = dS K and dK = dS^T Q
(two batched matmuls over the (B, Kp, Qp, 16) dS) and transposes dV^T (linear in T).

This is the issue's "first version": dS goes through HBM, padded to 16 heads (twice the bytes
of H = 8), and dK is an XLA matmul rather than an on-chip accumulation: accumulating
dK_h^T (W, bk) = Q_h^T dS_h needs dS per head, i.e. the inverse permutation of ds[k] back into
(bq, H*bk) tiles (another (bq x 16) @ (16 x H*bk) wgmma per key and 64 KiB more SMEM for P^T),
which does not fit beside the buffers below. Residuals: q, k, v only (no row statistic: RMSHead
needs none). Causal: a key tile's programs never visit query tiles wholly before it; they
write zeros there instead, so XLA's matmuls read a complete dS.

FLOPs per (q, k) pair (W = D = V, H heads, Hp = 16, bk = 16), tensor cores:
  scores 2HW, permutation 2*H*bk*Hp, u 2*Hp*W, dc_val 2*Hp*W, dV 2*Hp*W; XLA: dQ 2HW, dK 2HW.
  With H = 8, W = 64: 1024 + 4096 + 6144 + 2048 = 13.3 kFLOP. The forward at the same sizes
  (bv = 16, so 4 value slices each recomputing scores and permutation) is 4 * (1024 + 4096)
  + 2048 (u) + 16384 (read-out broadcasts) = 38.9 kFLOP. What the math needs (backward with
  recomputed scores and u) is 8 * 2HW = 8.2 kFLOP, of which dz and dc_read (2 * 2HW) run on
  the CUDA cores here: 4*H*W multiply-adds per pair plus H row reductions over W.

Shared memory (bf16, H = 8, W = 64, bq = 64, bk = 16; measured by lowering for an abstract
H100): 215 KiB of Hopper's 227 (Q/dY 64 KiB, K 16, V 32, S_cat 16, P 64, C 2, du 8, dS ring
4, dV ring 4, zeros 2). H = 4: 135 KiB. D = V = 32 pads to W = 64: 215 KiB. H = 16 (375 KiB),
D = V = 128 (339 KiB) and float32 inputs (427 KiB) do not fit: lowering says so ("exceeds
available shared memory"); they run in interpret mode only. Registers: the 16 dV^T
accumulators (W x 16 f32 each) take 128 per thread at W = 64, beside the score tiles: expect
spills on hardware; the GPU window should time it before anything is tuned. Lowering the
backward (16 keys unrolled) takes ~60 s on a 2-core CPU.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from hypernet_attention.ops import mosaic_kernel as fwd

_F32 = jnp.float32
BLOCK_Q = 64   # wgmma M
BLOCK_K = 16   # one (8, 16) SMEM tile column per head in S_cat, as in the forward


def _backward_call(q_BHQW, k_BHKW, v_BKHW, dy_BHQW, key_valid_BK, *, scale, is_causal, eps,
                   interpret):
  """The kernel on padded inputs: dS (B, Kp, Qp, 16) and dV^T (B, Kp, W, 16), input dtype."""
  import jax.experimental.pallas as pl  # pylint: disable=g-import-not-at-top
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=g-import-not-at-top

  batch, heads, q_padded, width = q_BHQW.shape
  k_padded = k_BHKW.shape[2]
  dtype = q_BHQW.dtype
  bq, bk, hp = BLOCK_Q, BLOCK_K, fwd.HEADS_PADDED
  num_q_tiles = q_padded // bq
  mask_batched = key_valid_BK.shape[0] > 1
  perm_KJH, _ = fwd._selection_constants(heads, bk, bk, dtype)  # pylint: disable=protected-access
  wide = fwd._smem_transforms(plgpu, width, dtype)  # pylint: disable=protected-access
  narrow = fwd._smem_transforms(plgpu, hp, dtype)  # pylint: disable=protected-access

  def kernel(q_ref, k_ref, v_ref, dy_ref, kval_ref, perm_ref, ds_ref, dvt_ref, scoped):
    (qdy_smem, k_smem, v_smem, kval_smem, scat_smem, perm_smem, c_smem, du_smem, ds_smem,
     dv_smem, zero_smem), (tile_bar, q_bar, dy_bar) = scoped
    b = jax.lax.axis_index("batch")
    k0 = jax.lax.axis_index("k_tile") * bk
    bm = b if mask_batched else 0
    first = k0 // bq if is_causal else 0

    plgpu.copy_gmem_to_smem(k_ref.at[b, :, pl.ds(k0, bk)], k_smem, tile_bar.at[0])
    plgpu.copy_gmem_to_smem(v_ref.at[b, pl.ds(k0, bk)], v_smem, tile_bar.at[1])
    plgpu.copy_gmem_to_smem(kval_ref.at[bm, pl.ds(k0, bk)], kval_smem, tile_bar.at[2])
    plgpu.copy_gmem_to_smem(perm_ref, perm_smem, tile_bar.at[3])
    zero_smem[...] = jnp.zeros((bq, hp), dtype)
    plgpu.commit_smem()
    for i in range(4):
      plgpu.barrier_wait(tile_bar.at[i])
    key_valid = jax.lax.broadcast_in_dim(
        plgpu.load(kval_smem, layout=plgpu.Layout.WGMMA.reduce(0)), (bq, bk), [1])

    def store_ds(tile_ds, slot, k, q0):
      plgpu.wait_smem_to_gmem(1, wait_read_only=True)  # this slot's previous store has read it
      if tile_ds is not None:
        ds_smem[slot] = tile_ds.astype(dtype)
        plgpu.commit_smem()
      src = zero_smem if tile_ds is None else ds_smem.at[slot]
      plgpu.copy_smem_to_gmem(src, ds_ref.at[b, k0 + k, pl.ds(q0, bq)])

    @pl.loop(0, first)
    def _skipped_tile(qi):  # causal: no query of this tile sees these keys
      for k in range(bk):
        store_ds(None, k % 2, k, qi * bq)

    def scores_tile(q0):
      plgpu.copy_gmem_to_smem(q_ref.at[b, :, pl.ds(q0, bq)], qdy_smem, q_bar.at[0])
      plgpu.barrier_wait(q_bar.at[0])

      def scores(*accs):
        for h, acc in enumerate(accs):
          plgpu.wgmma(acc, qdy_smem.at[h], k_smem.at[h].transpose((1, 0)))
        return [acc[...] for acc in accs]

      s_h = pl.run_scoped(scores, *[plgpu.ACC((bq, bk), _F32) for _ in range(heads)])
      valid = key_valid
      if is_causal:
        rows = plgpu.broadcasted_iota(jnp.int32, (bq, bk), 0, layout=plgpu.Layout.WGMMA)
        cols = plgpu.broadcasted_iota(jnp.int32, (bq, bk), 1, layout=plgpu.Layout.WGMMA)
        valid = jnp.where(q0 + rows >= k0 + cols, valid, 0.0)
      for h, s in enumerate(s_h):
        scat_smem[:, pl.ds(h * bk, bk)] = (s * (scale * valid)).astype(dtype)
      plgpu.commit_smem()
      # Q is consumed (the score wgmmas completed): the cotangent takes its buffer.
      plgpu.copy_gmem_to_smem(dy_ref.at[b, :, pl.ds(q0, bq)], qdy_smem, dy_bar.at[0])
      plgpu.barrier_wait(dy_bar.at[0])

    def one_key(k, q0, dvt):
      """dS of key k0 + k against this query tile (stored) and its dV^T (returned)."""
      def permute(acc):
        plgpu.wgmma(acc, scat_smem, perm_smem.at[k])
        return acc[...]

      s = pl.run_scoped(permute, plgpu.ACC((bq, hp), _F32))
      inv_rms = jax.lax.rsqrt(jnp.sum(s * s, axis=1) * (1.0 / heads) + eps)
      c = s * jax.lax.broadcast_in_dim(inv_rms, (bq, hp), [0])
      c_smem[...] = c.astype(dtype)
      plgpu.commit_smem()

      def value_net(acc):
        plgpu.wgmma(acc, c_smem, v_smem.at[k])
        return acc[...]

      u = pl.run_scoped(value_net, plgpu.ACC((bq, width), _F32))
      z = jnp.maximum(u, 0.0)
      head_col = plgpu.broadcasted_iota(jnp.int32, (bq, hp), 1, layout=plgpu.Layout.WGMMA)
      dz = jnp.zeros((bq, width), _F32)
      dc = jnp.zeros((bq, hp), _F32)
      for h in range(heads):
        dy_h = plgpu.load(qdy_smem.at[h], layout=plgpu.Layout.WGMMA).astype(_F32)
        c_h = jnp.sum(jnp.where(head_col == h, c, 0.0), axis=1)
        dz = dz + jax.lax.broadcast_in_dim(c_h, (bq, width), [0]) * dy_h
        dc_h = jax.lax.broadcast_in_dim(jnp.sum(dy_h * z, axis=1), (bq, hp), [0])
        dc = dc + jnp.where(head_col == h, dc_h, 0.0)
      du_smem[...] = jnp.where(u > 0.0, dz, 0.0).astype(dtype)
      plgpu.commit_smem()

      def grads(dc_acc, dvt_acc):
        plgpu.wgmma(dc_acc, du_smem, v_smem.at[k].transpose((1, 0)))
        plgpu.wgmma(dvt_acc, du_smem.transpose((1, 0)), c_smem)
        return dc_acc[...], dvt_acc[...]

      # Fresh accumulators plus a register add: interpret mode cannot run a wgmma inside
      # pl.run_state (ACC.init), which would save the add on hardware.
      dc_val, dvt_step = pl.run_scoped(grads, plgpu.ACC((bq, hp), _F32),
                                       plgpu.ACC((width, hp), _F32))
      dc, dvt = dc + dc_val, dvt + dvt_step
      along_c = jnp.sum(c * dc, axis=1) * (1.0 / heads)
      ds = (dc - c * jax.lax.broadcast_in_dim(along_c, (bq, hp), [0])) * \
          jax.lax.broadcast_in_dim(inv_rms * scale, (bq, hp), [0])
      store_ds(ds, k % 2, k, q0)
      return dvt

    def q_tile(qi, dvts):
      q0 = qi * bq
      scores_tile(q0)
      return tuple(one_key(k, q0, dvt) for k, dvt in enumerate(dvts))

    dvts = tuple(plgpu.layout_cast(jnp.zeros((width, hp), _F32), plgpu.Layout.WGMMA)
                 for _ in range(bk))
    dvts = jax.lax.fori_loop(first, num_q_tiles, q_tile, dvts)
    for k, dvt in enumerate(dvts):
      plgpu.wait_smem_to_gmem(1, wait_read_only=True)
      dv_smem[k % 2] = dvt.astype(dtype)
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(dv_smem.at[k % 2], dvt_ref.at[b, k0 + k])
    plgpu.wait_smem_to_gmem(0)

  def entry(q_ref, k_ref, v_ref, dy_ref, kval_ref, perm_ref, ds_ref, dvt_ref):
    smem = (
        plgpu.SMEM((heads, bq, width), dtype, transforms=wide),       # Q, then dY
        plgpu.SMEM((heads, bk, width), dtype, transforms=wide),       # K
        plgpu.SMEM((bk, hp, width), dtype, transforms=narrow),        # V, heads padded
        plgpu.SMEM((bk,), _F32),                                      # key validity
        plgpu.SMEM((bq, heads * bk), dtype, transforms=narrow),       # S_cat
        plgpu.SMEM((bk, heads * bk, hp), dtype, transforms=narrow),   # P
        plgpu.SMEM((bq, hp), dtype, transforms=narrow),               # C[k]
        plgpu.SMEM((bq, width), dtype, transforms=narrow),            # du
        plgpu.SMEM((2, bq, hp), dtype),                               # dS ring
        plgpu.SMEM((2, width, hp), dtype),                            # dV^T ring
        plgpu.SMEM((bq, hp), dtype),                                  # zeros
    )
    barriers = (plgpu.Barrier(num_barriers=4), plgpu.Barrier(num_barriers=1),
                plgpu.Barrier(num_barriers=1))
    pl.run_scoped(
        lambda *scoped: kernel(q_ref, k_ref, v_ref, dy_ref, kval_ref, perm_ref, ds_ref, dvt_ref,
                               (scoped[:11], scoped[11:])),
        *smem, *barriers)

  return plgpu.kernel(
      entry,
      out_type=(jax.ShapeDtypeStruct((batch, k_padded, q_padded, hp), dtype),
                jax.ShapeDtypeStruct((batch, k_padded, width, hp), dtype)),
      grid=(batch, k_padded // bk),
      grid_names=("batch", "k_tile"),
      interpret=interpret,
  )(q_BHQW, k_BHKW, v_BKHW, dy_BHQW, key_valid_BK, perm_KJH)


def backward(query_BQHD, key_BKHD, value_BKHV, mask, d_out_BQHV, *, is_causal, eps,
             interpret):
  """(dQ, dK, dV) of `mosaic_kernel.attention` from the inputs and the output's cotangent."""
  batch, q_len, heads, depth = query_BQHD.shape
  k_len, v_dim = key_BKHD.shape[1], value_BKHV.shape[-1]
  dtype = query_BQHD.dtype
  q_padded, k_padded = fwd._round_up(q_len, BLOCK_Q), fwd._round_up(k_len, BLOCK_K)  # pylint: disable=protected-access
  # One width W for Q, K (D) and V, dY (V): Q's buffer holds dY later, and dV^T's wgmma
  # takes W as its M (a multiple of 64).
  width = max(fwd._round_up(depth, 128 // dtype.itemsize), fwd._round_up(v_dim, 64))  # pylint: disable=protected-access
  pad = lambda x, length: jnp.pad(
      x, ((0, 0), (0, length - x.shape[1]), (0, 0), (0, width - x.shape[3])))
  q_BHQW = jnp.transpose(pad(query_BQHD, q_padded), (0, 2, 1, 3))
  k_BHKW = jnp.transpose(pad(key_BKHD, k_padded), (0, 2, 1, 3))
  dy_BHQW = jnp.transpose(pad(d_out_BQHV.astype(dtype), q_padded), (0, 2, 1, 3))
  v_BKHW = jnp.pad(value_BKHV, ((0, 0), (0, k_padded - k_len),
                                (0, fwd.HEADS_PADDED - heads), (0, width - v_dim)))
  ds_BKQH, dvt_BKWH = _backward_call(
      q_BHQW, k_BHKW, v_BKHW, dy_BHQW,
      fwd._key_valid(mask, k_len, k_padded),  # pylint: disable=protected-access
      scale=1.0 / math.sqrt(depth), is_causal=is_causal, eps=eps, interpret=interpret)
  ds_BKQH = ds_BKQH[:, :k_len, :q_len, :heads]
  d_query = jnp.einsum("bkqh,bkhd->bqhd", ds_BKQH, key_BKHD, preferred_element_type=_F32)
  d_key = jnp.einsum("bkqh,bqhd->bkhd", ds_BKQH, query_BQHD, preferred_element_type=_F32)
  d_value = jnp.transpose(dvt_BKWH[:, :k_len, :v_dim, :heads], (0, 1, 3, 2))
  return d_query.astype(dtype), d_key.astype(dtype), d_value
